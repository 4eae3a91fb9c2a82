"""Charts never mislead: red (``OOM_COLOR``) says "does not fit", so no device, strategy, policy,
memory category or task kind is drawn in it; a memory timeline spans a notebook's column and
its legend is whole."""
from __future__ import annotations

import numpy as np

import memflow
from memflow.report import MemoryChart, style
from memflow.report.compare import strategy_colors
from memflow.strategy import POLICIES


# CIE76 colour difference below which two colours read as the same hue family at a glance
# (ΔE ≈ 2.3 is just noticeable; 30 keeps a muted brick red, ΔE 28 from it, out).
NEAR_RED = 30.0


def _lab(color: str) -> np.ndarray:
    """sRGB hex → CIELAB (D65), the space where Euclidean distance approximates perception."""
    rgb = np.array([int(color[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    linear = np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722],
                    [0.0193, 0.1192, 0.9505]]) @ linear / np.array([0.95047, 1.0, 1.08883])
    f = np.where(xyz > (6 / 29) ** 3, np.cbrt(xyz), xyz / (3 * (6 / 29) ** 2) + 4 / 29)
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def test_the_distance_is_perceptual():
    assert np.linalg.norm(_lab("#ffffff") - [100, 0, 0]) < 0.1
    assert np.linalg.norm(_lab("#c44e52") - _lab(style.OOM_COLOR)) < NEAR_RED   # the old recompute
    assert np.linalg.norm(_lab("#4c72b0") - _lab(style.OOM_COLOR)) > NEAR_RED


def test_no_plan_or_policy_colour_is_near_the_out_of_memory_red():
    tables = {"device": dict(enumerate(style.DEVICE_PALETTE)),
              "strategy": strategy_colors([f"plan {i}" for i in range(40)]),
              "policy": POLICIES.colors, "category": style.CATEGORY_COLORS,
              "task kind": style.KIND_COLORS}
    red = _lab(style.OOM_COLOR)
    for table, colors in tables.items():
        near = {str(name): round(float(np.linalg.norm(_lab(c) - red)), 1)
                for name, c in colors.items() if np.linalg.norm(_lab(c) - red) < NEAR_RED}
        assert not near, f"{table} colours {near} (CIE76 ΔE) read as the out-of-memory red"


def test_a_memory_timeline_is_wide_and_its_legend_whole():
    g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
    for preset in ("1xV100-16GB", "2xV100-16GB", "4xV100-16GB"):
        cluster = memflow.Cluster.preset(preset)
        result = memflow.simulate(g, memflow.Strategy.single_device(g), cluster)
        chart = MemoryChart(result)
        strip = chart.root.children[0]
        assert strip.width == style.CHART_WIDTH, (preset, strip.width)   # not ~400 px
        assert sum(f.width for f in chart.figures.values()) >= style.CHART_WIDTH - 2
        legend = strip.legend[0]
        labels = [i.label.value for i in legend.items]
        assert legend.ncols == style.legend_columns(labels, strip.width, 12)
        rows = -(-len(labels) // legend.ncols)          # every item has a place, none is cut
        assert strip.height >= 20 + 23 * rows
        # a legend row holds at least half the items: two rows at most for every category
        assert style.legend_columns([*style.CATEGORIES, "capacity"], strip.width, 12) * 2 >= \
            len(style.CATEGORIES) + 1
