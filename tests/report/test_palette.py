"""Charts never mislead: red (``OOM_COLOR``) says "does not fit", so no device, strategy, policy,
memory category or task kind is drawn in it; a memory timeline is wide enough for its legend."""
from __future__ import annotations

import memflow
from memflow.report import MemoryChart, style
from memflow.report.compare import strategy_colors
from memflow.strategy import POLICIES


def test_no_plan_or_policy_colour_is_the_out_of_memory_red():
    tables = {"device": dict(enumerate(style.DEVICE_PALETTE)),
              "strategy": strategy_colors([f"plan {i}" for i in range(40)]),
              "policy": POLICIES.colors, "category": style.CATEGORY_COLORS,
              "task kind": style.KIND_COLORS}
    for table, colors in tables.items():
        red = {name for name, c in colors.items() if c.lower() == style.OOM_COLOR}
        assert not red, f"{table} colours {sorted(map(str, red))} use the out-of-memory red"


def test_a_memory_timeline_fits_its_legend_on_one_line():
    g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
    for preset in ("1xV100-16GB", "2xV100-16GB", "4xV100-16GB"):
        cluster = memflow.Cluster.preset(preset)
        result = memflow.simulate(g, memflow.Strategy.single_device(g), cluster)
        strip = MemoryChart(result).root.children[0]
        legend = strip.legend[0]
        labels = [i.label.value for i in legend.items]
        assert legend.ncols == len(labels), (preset, legend.ncols, labels)
        # every category the model can draw, plus the capacity, fits on one line too
        assert style.legend_columns([*style.CATEGORIES, "capacity"], strip.width, 12) == \
            len(style.CATEGORIES) + 1, (preset, strip.width)
