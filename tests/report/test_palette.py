"""Charts never mislead: red (``OOM_COLOR``) says "does not fit", so no device, strategy, policy,
memory category or task kind is drawn in it; a memory timeline spans a notebook's column and
its legend is whole."""
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
