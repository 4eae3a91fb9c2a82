"""Colours and number formats shared by the report and the Jupyter views, so one category looks
the same everywhere (``memflow_widgets.style`` is this module).

>>> format_bytes(3 * 2**30)
'3.00 GiB'
>>> color_for("gpu3", ["gpu0", "gpu1", "gpu2", "gpu3"]) == DEVICE_PALETTE[3]
True
"""
from __future__ import annotations

from typing import Sequence

from .._units import byte_unit, format_bytes, format_seconds

__all__ = ["CATEGORIES", "CATEGORY_COLORS", "KIND_COLORS", "OOM_COLOR", "DEVICE_PALETTE",
           "STRATEGY_PALETTE", "MULTI_DEVICE_COLOR", "CHART_WIDTH", "GIB", "CAPACITY_IN_VIEW", "format_bytes", "format_seconds",
           "memory_scale", "color_for", "text_width", "legend_columns", "device_list"]

GIB = float(2**30)

# Red says "does not fit": over-capacity bars, OUT OF MEMORY proposals, the capacity line. No
# device, strategy or policy is drawn in it, so a plan that fits is never read as one that does
# not (tests/report/test_palette.py checks every colour table against it).
OOM_COLOR = "#d62728"

# The width of a full-width chart: what a JupyterLab notebook column shows without scrolling
# on a 1280 px screen with the file browser open (a 940 px chart was cut off there).
CHART_WIDTH = 800

# Memory categories of SimResult.memory, bottom of the stack first (persistent ones at the bottom,
# so the per-step activity reads as the moving top layer).
CATEGORIES = ("weights", "optimizer", "communication", "gradients", "activations", "transient")
CATEGORY_COLORS = {
    "weights": "#4c72b0",
    "optimizer": "#937860",
    "communication": "#8172b3",
    "gradients": "#dd8452",
    "activations": "#55a868",
    "transient": "#ccb974",      # not red: red is OOM_COLOR, and the capacity line above it
}

# Task kinds of SimResult.timeline.
KIND_COLORS = {
    "forward": "#4c72b0",
    "backward": "#dd8452",
    "recompute": "#64b5cd",   # far from OOM_COLOR: a recompute plan fits
    "transfer": "#8172b3",
    "allreduce": "#937860",
    "offload": "#55a868",
    "prefetch": "#8fd19e",
    "compress": "#da8bc3",
    "decompress": "#f2b8dc",
    "optimizer": "#8c8c8c",
}
OTHER_COLOR = "#bbbbbb"

# Memory policies: their colours are the policy table's (memflow.strategy.POLICIES.colors).

# One categorical palette (tab10 then tab20's light tones, less the OOM red) for devices and for
# the strategies a comparison draws side by side.
DEVICE_PALETTE = tuple(c for c in (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94") if c != OOM_COLOR)
STRATEGY_PALETTE = DEVICE_PALETTE
MULTI_DEVICE_COLOR = "#444444"  # a unit split over several devices


def device_list(devices: Sequence[str]) -> str:
    """A list of devices for a table cell: up to four named, more as first…last (count).

    >>> device_list(["gpu0", "gpu1"]), device_list([f"gpu{i}" for i in range(8)])
    ('gpu0,gpu1', 'gpu0…gpu7 (8)')
    """
    devs = list(devices)
    return ",".join(devs) if len(devs) <= 4 else f"{devs[0]}…{devs[-1]} ({len(devs)})"


def color_for(device: str, devices: Sequence[str]) -> str:
    """The colour of ``device`` among ``devices`` (cycling through the palette)."""
    return DEVICE_PALETTE[list(devices).index(device) % len(DEVICE_PALETTE)]


# A capacity far above the peak is left off a chart's scale (titles still give it): a 40 KiB
# model on a 16 GiB GPU would otherwise be a hairline at the bottom of the chart.
CAPACITY_IN_VIEW = 4.0


def memory_scale(peak: float, capacity: float) -> tuple[str, float, float]:
    """How to draw memory whose largest peak is ``peak`` on devices of ``capacity`` bytes:
    ``(unit name, unit size, top of the axis in bytes)``; the capacity is in view unless it is
    more than ``CAPACITY_IN_VIEW`` times the peak.

    >>> memory_scale(12 * 2**30, 16 * 2**30)[:2], memory_scale(40 * 1024, 16 * 2**30)[:2]
    (('GiB', 1073741824.0), ('KiB', 1024.0))
    """
    top = max(peak, capacity) if capacity <= CAPACITY_IN_VIEW * peak else peak
    name, size = byte_unit(top)
    return name, size, top


# Charts are laid out before a browser measures any text: widths are estimated, on the wide
# side (0.62 em per character; DejaVu Sans, Debian's default, averages about 0.55 em on names).
_EM_PER_CHAR = 0.62


def text_width(text: str, font_px: float) -> float:
    """About how many pixels ``text`` takes in a sans-serif font of ``font_px`` pixels.

    >>> text_width("layers.1", 10)
    49.6
    """
    return _EM_PER_CHAR * font_px * len(text)


def legend_columns(labels: Sequence[str], width: float, font_px: float) -> int:
    """How many items of a bokeh legend (default glyph and padding, no margin) fit side by
    side in ``width`` pixels: at least one.

    >>> legend_columns(["weights", "activations", "capacity"], 940, 12)
    3
    >>> legend_columns(["weights", "activations", "capacity"], 200, 12)
    1
    """
    item = 20 + 5 + max(text_width(t, font_px) for t in labels) + 3   # glyph, gap, text, spacing
    return max(1, min(len(labels), int((width - 2 * 10) // item)))

