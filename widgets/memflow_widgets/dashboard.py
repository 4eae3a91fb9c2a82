"""SearchDashboard: run, watch, pause, steer and export an MCMC search from a notebook.

The search runs through a :class:`~memflow_widgets.runner.SearchRunner` on the kernel's event
loop, in chunks short enough that every click is handled within a fraction of a second. Every
flush (~0.2 s) the dashboard streams one point of progress (a
:class:`~memflow_widgets.feed.ProgressFeed` row) into the acceptance and cost charts, updates
the counters, and — when the best strategy improved, at most every ``best_seconds`` and,
after the first, within 2% of the time — redraws the best strategy's memory over time on every
GPU and its model states (weights, gradients, optimizer per GPU, with its precision and shard
levels). That redraw keeps its own budget: a slow one (hundreds of units on 8 GPUs) does not
space out the progress points. While paused, the unit table pins units in the search. The
dashboard holds the search, the runner and widgets; the search holds all state.
"""
from __future__ import annotations

import html
import math
import time
from typing import Any

import ipywidgets
import numpy as np
from bokeh.layouts import row
from bokeh.models import ColumnDataSource, HoverTool, Range1d
from bokeh.plotting import figure
from jupyter_bokeh import BokehModel

from .export_panel import ExportPanel
from .feed import COLUMNS, ProgressFeed, replay
from .memory import MemoryTimeline
from .pins import PinTable
from .render import Chart, StaticFallback, static_html
from .runner import SearchRunner
from .states import ModelStates

__all__ = ["SearchDashboard"]

_REDRAW_SHARE = 0.02    # the share of the time the best strategy's memory chart may take


def _progress_charts(window: int) -> tuple[Any, ColumnDataSource]:
    """The acceptance-rate and cost charts, over one source of :class:`ProgressFeed` rows."""
    source = ColumnDataSource({c: np.empty(0, np.int64 if c == "iteration" else float)
                               for c in COLUMNS})
    a_fig = figure(width=360, height=220, title=f"acceptance rate (last {window} proposals)",
                   x_axis_label="iteration", y_range=Range1d(0, 1), tools="xpan,reset,save")
    a_fig.line("iteration", "rate", source=source, color="#4c72b0", line_width=2)
    c_fig = figure(width=440, height=220, title="cost", x_axis_label="iteration",
                   x_range=a_fig.x_range, y_axis_type="log", tools="xpan,reset,save")
    c_fig.line("iteration", "cost", source=source, color="#999999", legend_label="current")
    best = c_fig.line("iteration", "best_cost", source=source, color="#4c72b0", line_width=2,
                      legend_label="best")
    c_fig.add_tools(HoverTool(renderers=[best], mode="vline", tooltips=[
        ("iteration", "@iteration"), ("current", "@cost{0.0000}"),
        ("best", "@best_cost{0.0000}")]))
    c_fig.legend.location = "top_right"
    for fig in (a_fig, c_fig):
        fig.toolbar.logo = None
    return row(a_fig, c_fig), source


class SearchDashboard(StaticFallback, ipywidgets.VBox):
    """A live, pausable view of a :class:`memflow.MCMCSearch`.

    Buttons: Start, Pause (stops at the next step boundary), Resume, Step (runs ``steps``
    proposals by hand while paused). Counters: iteration, proposals/s, acceptance rate, best
    cost. Charts: acceptance rate and current/best cost over iterations; memory over time of
    the best strategy on every GPU with its capacity, then its model states per GPU. Below:
    the unit table (pins) and the export of the best strategy.

    Parameters
    ----------
    search:
        a :class:`memflow.MCMCSearch` (anything with its ``step``, ``iteration``,
        ``current_cost``, ``best``, ``best_cost``, ``best_result``, ``acceptance_rate``,
        ``pin``, ``unpin``, ``pins``, ``graph``, ``settings`` and ``history``; what a search
        did before its dashboard opens is drawn from ``history``, thinned).
    max_iterations:
        the runner stops (``done``) after this many proposals; None runs until paused.
    window:
        proposals in the rolling acceptance rate.
    best_seconds:
        the memory chart of the best strategy is redrawn at most this often while running, and
        less often when redrawing it is slow (it may take 2% of the time at most).
    """

    def __init__(self, search: Any, *, max_iterations: int | None = None, window: int = 200,
                 chunk_seconds: float = 0.03, flush_seconds: float = 0.2,
                 best_seconds: float = 1.0, rollover: int = 50_000,
                 export_path: str = "best_strategy.json") -> None:
        self.search = search
        # no_loop="thread": a click handled where no event loop runs still starts the search
        self.runner = SearchRunner(search, chunk_seconds=chunk_seconds,
                                   flush_seconds=flush_seconds, max_iterations=max_iterations,
                                   no_loop="thread")
        self.feed = ProgressFeed(window=window)
        self.window = window
        self.rollover = rollover
        self.best_seconds = best_seconds
        # (the best strategy drawn in the memory chart, when, seconds until the next redraw)
        self._drawn = (search.best, time.perf_counter(), best_seconds)

        self.start_button = ipywidgets.Button(description="Start", icon="play",
                                              button_style="success")
        self.pause_button = ipywidgets.Button(description="Pause", icon="pause")
        self.resume_button = ipywidgets.Button(description="Resume", icon="play")
        self.step_button = ipywidgets.Button(description="Step", icon="step-forward")
        self.steps = ipywidgets.BoundedIntText(value=1, min=1, max=1_000_000,
                                               description="steps",
                                               layout=ipywidgets.Layout(width="150px"))
        self.start_button.on_click(lambda _: self._act("Start", self.runner.start))
        self.pause_button.on_click(lambda _: self._act("Pause", self.runner.pause))
        self.resume_button.on_click(lambda _: self._act("Resume", self.runner.resume))
        # Clicks may arrive on another thread (JupyterLab's comm subshells): everything that
        # touches the search runs on the runner's thread (see SearchRunner.call).
        self.step_button.on_click(lambda _: self.runner.call(self._step))
        self.counters = ipywidgets.HTML()
        self.iteration = ipywidgets.HTML(layout=ipywidgets.Layout(min_width="130px"))

        self.progress_root, self.progress_source = _progress_charts(window)
        if search.iteration:     # it ran before this view: draw what it did, thinned
            self.progress_source.data = replay(search.history, window=window)
        self.progress = Chart(self.progress_root)
        self.memory = MemoryTimeline(search.best_result)
        self.states = ModelStates(search.best_result)
        self.pins = PinTable(search, call=self.runner.call)
        self.export = ExportPanel(search, path=export_path, call=self.runner.call)
        buttons = ipywidgets.HBox([self.start_button, self.pause_button, self.resume_button,
                                   self.step_button, self.steps, self.iteration])
        super().__init__([
            buttons, self.counters, self.progress,
            ipywidgets.HTML("<b>Best strategy so far</b>: memory over one step on every GPU"),
            self.memory, self.states, self.pins, self.export])
        self.add_class("memflow-searchdashboard")
        self.runner.add_listener(self._on_flush)
        # the memory chart keeps its own budget: its redraw must not space out the progress
        self.runner.add_listener(self._draw_best, paced=True)
        self._on_flush(self.runner)

    # ------------------------------------------------------------------ actions
    def _act(self, what: str, action) -> None:
        """Run a button's ``action``; what it raises is shown in the counters, since a click
        must not raise into the void (the front end shows a callback's traceback nowhere)."""
        try:
            action()
        except Exception as exc:
            self.counters.value = (f"<span style='color:#d62728'>{what} failed: "
                                   f"{html.escape(str(exc))}</span>")

    def _step(self) -> None:
        self._act("Step", lambda: self.runner.step(self.steps.value))

    # ------------------------------------------------------------------ flush
    def _on_flush(self, runner: SearchRunner) -> None:
        point = self.feed.take(self.search)
        if point is not None:
            self.progress_source.stream(point, rollover=self.rollover)
        state = runner.state
        self.start_button.disabled = state != "idle"
        self.pause_button.disabled = state != "running"
        self.resume_button.disabled = state not in ("paused", "done", "failed")
        self.step_button.disabled = runner.running
        if not runner.running:       # the table is locked while running: nothing to redraw
            self.pins.set_enabled(True)
            self.pins.refresh()
        elif not self.pins.rows[0].pin.disabled:
            self.pins.set_enabled(False)
        self.iteration.value = (f"iteration <b data-counter='iteration'>"
                                f"{self.search.iteration:,}</b>")
        self.counters.value = self._counters_html()

    def _draw_best(self, runner: SearchRunner) -> None:
        """Redraw the best strategy's charts when it changed: at once when the search stops
        (paused, done, failed), else when the last redraw's budget allows."""
        drawn, when, gap = self._drawn
        now = time.perf_counter()
        best = self.search.best
        if best is not drawn and (not runner.running or now - when >= gap):
            result = self.search.best_result
            self.states.update(result)
            if list(result.capacity.index) == list(self.memory.sources):
                self.memory.update(result)
            else:   # the best now uses other GPUs: a chart per GPU it uses, made anew
                old, self.memory = self.memory, MemoryTimeline(result)
                self.children = tuple(self.memory if c is old else c for c in self.children)
                old.close()
            spent = time.perf_counter() - now
            self._drawn = (best, now, max(self.best_seconds, spent / _REDRAW_SHARE))

    def _counters_html(self) -> str:
        r = self.runner
        state = r.state if r.error is None else f"{r.state} ({type(r.error).__name__}: {r.error})"
        rate = self.search.acceptance_rate(self.window)
        best = float(self.search.best_cost)
        best_text = f"{best:.5g}" if math.isfinite(best) else "none feasible yet"
        color = "#d62728" if r.state == "failed" else "#333333"
        return (f"<span style='color:{color}'>state <b data-counter='state'>"
                f"{html.escape(state)}</b></span> · "
                f"<b data-counter='rate'>{r.rate:,.0f}</b> proposals/s · acceptance "
                f"<b data-counter='acceptance'>{rate:.1%}</b> · best cost "
                f"<b data-counter='best'>{best_text}</b>")

    # ------------------------------------------------------------------ display
    def charts(self) -> list[tuple[BokehModel, Any]]:
        return [(self.progress, self.progress_root), *self.memory.charts()]

    def static_html(self) -> str:
        return (f"<div><p>iteration {self.search.iteration:,} · {self._counters_html()}</p>"
                f"{static_html(self.progress_root)}{self.memory.static_html()}"
                f"{self.states.value}</div>")
