"""SearchRunner: drive a search on the kernel's event loop in short chunks, pausable at any step.

A notebook cell that loops over ``search.step()`` holds the kernel: no click is handled until
it ends. The runner instead runs the search as an asyncio task on the kernel's own loop, a few
steps at a time (sized so a chunk lasts about ``chunk_seconds``), yielding to the loop between
chunks, so a click on Pause is handled within a fraction of a second and the search stops at the
next step boundary. Listeners are told every ``flush_seconds`` (to batch chart updates) and on
every change of state; when they are slow they are told less often (``max_overhead``), except
that a *paced* listener — one that keeps its own budget, such as a chart redrawn only when it is
due — does not count, so that its rare redraw does not stall the cheap ones. This module knows
nothing of widgets, so it is tested without a browser.

One thread does everything: the search's steps, the changes of state and the listeners all run
on the thread of the runner's loop (the kernel's main loop when the runner is made in a cell).
JupyterLab 4.6 sends widget messages over kernel subshells, so ipykernel 7 runs button and
checkbox callbacks on another thread, each with its own loop; :meth:`SearchRunner.start`,
:meth:`~SearchRunner.pause` and :meth:`~SearchRunner.call` called there hand the work to the
runner's loop instead of touching the search (or the charts a listener redraws) while a chunk
of steps runs.

Where no event loop runs (a script, a test, a front end that calls widget callbacks outside
any loop), :meth:`SearchRunner.start` raises, or with ``no_loop="thread"`` (what the dashboard
asks for) starts the runner's own loop on a daemon thread, which then plays the kernel loop's
part: steps, state changes and listeners run there, and calls from elsewhere are handed to it.

States: ``idle`` → ``running`` ⇄ (``pausing`` →) ``paused``; ``done`` when the iteration budget
is spent; ``failed`` when a step raised (the exception is in :attr:`SearchRunner.error`).

>>> import asyncio
>>> class Count:                       # anything with step(n) can be run
...     def __init__(self): self.n = 0
...     def step(self, n=1): self.n += n
>>> async def demo():
...     runner = SearchRunner(Count(), max_iterations=500)
...     runner.start()
...     await runner.wait()
...     return runner.state, runner.search.n
>>> asyncio.run(demo())
('done', 500)
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable, Literal

__all__ = ["SearchRunner", "State"]

State = Literal["idle", "running", "pausing", "paused", "done", "failed"]
Listener = Callable[["SearchRunner"], None]


class SearchRunner:
    """Runs ``search.step(n)`` in chunks on an asyncio loop; see the module docstring.

    Parameters
    ----------
    search:
        an object with ``step(n)``, normally a :class:`memflow.MCMCSearch`.
    chunk_seconds:
        target duration of one chunk of steps: the longest a click waits.
    flush_seconds:
        how often listeners are told while running (chart updates are batched to this).
    max_overhead:
        the share of the time listeners may take: when they are slow (a big redraw, a busy
        machine) they are told less often than ``flush_seconds``, so the search keeps its pace.
    max_iterations:
        stop (state ``done``) after this many steps run by this runner; None runs until paused.
    no_loop:
        what :meth:`start` does where no event loop runs: ``"raise"`` a RuntimeError, or run
        on a ``"thread"`` of the runner's own (see the module docstring).
    """

    def __init__(self, search: Any, *, chunk_seconds: float = 0.03, flush_seconds: float = 0.2,
                 max_overhead: float = 0.03, max_iterations: int | None = None,
                 no_loop: Literal["raise", "thread"] = "raise") -> None:
        if not callable(getattr(search, "step", None)):
            raise TypeError(f"SearchRunner: search must have a step(n) method; "
                            f"got {type(search).__name__}")
        if no_loop not in ("raise", "thread"):
            raise ValueError(f"SearchRunner: no_loop must be 'raise' or 'thread', got "
                             f"{no_loop!r}")
        self.no_loop = no_loop
        self.search = search
        self.chunk_seconds = chunk_seconds
        self.flush_seconds = flush_seconds
        self.max_overhead = max_overhead
        self.max_iterations = max_iterations
        self.state: State = "idle"
        self.error: BaseException | None = None
        self.steps = 0            # steps this runner has run
        self.rate = 0.0           # proposals per second over the last flush period
        self.listeners: list[tuple[Listener, bool]] = []     # (listener, paces itself)
        self._chunk = 1
        self._flush_gap = flush_seconds         # seconds between flushes, see max_overhead
        self._pause_requested = False
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None        # the ident of the thread running _loop
        self._adopt_running_loop()              # made in a notebook cell: the kernel's loop
        self._mark = (time.perf_counter(), 0)   # (time, steps) at the last rate measurement

    # ------------------------------------------------------------------ control
    @property
    def running(self) -> bool:
        """True while the search task is alive (``running`` or ``pausing``)."""
        return self.state in ("running", "pausing")

    @property
    def flush_interval(self) -> float:
        """Seconds between the listeners' periodic calls now (``flush_seconds`` or more)."""
        return self._flush_gap

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the runner's thread: now when called there (or while the
        runner's loop is not running), else as soon as its loop is free, between two chunks.

        Widget callbacks that touch the search (pins, exports, Step) go through here.
        """
        if self._elsewhere():
            self._loop.call_soon_threadsafe(fn, *args)
        else:
            fn(*args)

    def start(self) -> None:
        """Start (or resume) the search on the runner's event loop; returns at once.

        The runner's loop is the one running where the runner was made, else where ``start``
        is first called, else (``no_loop="thread"``) a loop of its own on a daemon thread; from
        another thread the call is handed to that loop (see :meth:`call`).
        """
        if self._elsewhere():
            self._loop.call_soon_threadsafe(self.start)
            return
        if self.state == "pausing":          # the task is still alive: just keep it going
            self._pause_requested = False
            self._set_state("running")
            return
        if self.running:
            return
        if self._budget_left() == 0:
            self._set_state("done")
            return
        if not self._adopt_running_loop():
            if self.no_loop == "thread":
                self._start_on_own_thread()
                return
            raise RuntimeError("SearchRunner.start: no asyncio event loop is running here; "
                               "call it from a notebook cell or a coroutine, or make the "
                               "runner with no_loop='thread'")
        self._pause_requested = False
        self.error = None
        self._set_state("running")
        self._loop.call_soon(self._spawn)

    resume = start

    def pause(self) -> None:
        """Ask the search to stop at the next step boundary (state ``pausing``, then ``paused``).

        From another thread the request is handed to the runner's loop (see :meth:`call`)."""
        if self._elsewhere():
            self._loop.call_soon_threadsafe(self.pause)
        elif self.state == "running":
            self._pause_requested = True
            self._set_state("pausing")

    def step(self, n: int = 1) -> None:
        """Run ``n`` steps now, synchronously; only while the search is not running."""
        if self.running:
            raise RuntimeError("SearchRunner.step: pause the search before stepping it by hand")
        if n < 1:
            raise ValueError(f"SearchRunner.step: n must be >= 1, got {n}")
        t0 = time.perf_counter()
        try:
            self.search.step(n)
        except Exception as exc:
            self.error = exc
            self._set_state("failed")
            raise
        self.steps += n
        self.rate = n / max(time.perf_counter() - t0, 1e-9)
        self._set_state("paused" if self.state != "idle" else "idle")

    async def wait(self) -> State:
        """Wait until the search task has ended (paused, done or failed); return the state."""
        while self.running:
            task = self._task
            if (task is not None and not task.done()
                    and task.get_loop() is asyncio.get_running_loop()):
                await asyncio.shield(task)
            else:      # scheduled by start() but not yet created, or on the runner's thread
                await asyncio.sleep(0.001)
        return self.state

    # ------------------------------------------------------------------ threads
    def _loop_is_running(self) -> bool:
        return self._loop is not None and self._loop.is_running()

    def _adopt_running_loop(self) -> bool:
        """Make the loop running in this thread the runner's, unless the runner's own loop
        still runs (in another thread: then calls from here are handed over, never adopted)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        if loop is not self._loop and self._loop_is_running():
            return False
        self._loop, self._thread = loop, threading.get_ident()
        return True

    def _start_on_own_thread(self) -> None:
        """Run a loop of the runner's own on a daemon thread and start the search there;
        return once it runs (so the state is ``running`` or later when this returns)."""
        loop, ready = asyncio.new_event_loop(), threading.Event()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()       # idle between runs; the thread dies with the process

        thread = threading.Thread(target=main, name="memflow-search-runner", daemon=True)
        thread.start()
        ready.wait()
        self._loop, self._thread = loop, thread.ident

        async def start_there() -> None:
            self.start()
        asyncio.run_coroutine_threadsafe(start_there(), loop).result()

    def _elsewhere(self) -> bool:
        """True when called off the thread of the runner's loop while that loop runs."""
        return self._loop_is_running() and threading.get_ident() != self._thread

    # ------------------------------------------------------------------ listeners
    def add_listener(self, listener: Listener, *, paced: bool = False) -> None:
        """Call ``listener(runner)`` every ``flush_seconds`` while running and on each change of
        state. A listener that raises does not stop the search (the error goes to ``error``).

        ``paced``: the listener keeps its own time budget (it does its costly work only when it
        is due), so its time is left out of the cost that spaces the flushes out."""
        self.listeners.append((listener, paced))

    def _notify(self) -> float:
        """Tell every listener; return the seconds the unpaced ones took."""
        now = time.perf_counter()
        t, s = self._mark
        if now - t > 1e-3 and self.steps > s:
            self.rate = (self.steps - s) / (now - t)
        self._mark = (now, self.steps)
        cost = 0.0
        for listener, paced in list(self.listeners):
            t0 = time.perf_counter()
            try:
                listener(self)
            except Exception as exc:  # a broken chart must not kill the search
                self.error = exc
            if not paced:
                cost += time.perf_counter() - t0
        return cost

    def _set_state(self, state: State) -> None:
        self.state = state
        self._notify()

    # ------------------------------------------------------------------ the task
    def _budget_left(self) -> int | None:
        return None if self.max_iterations is None else max(0, self.max_iterations - self.steps)

    def _spawn(self) -> None:
        if self._task is None or self._task.done():
            assert self._loop is not None
            self._mark = (time.perf_counter(), self.steps)
            self._task = self._loop.create_task(self._run())

    async def _run(self) -> None:
        last_flush = time.perf_counter()
        try:
            while not self._pause_requested:
                left = self._budget_left()
                if left == 0:
                    break
                n = self._chunk if left is None else min(self._chunk, left)
                t0 = time.perf_counter()
                self.search.step(n)
                dt = time.perf_counter() - t0
                self.steps += n
                self._resize_chunk(n, dt)
                if t0 + dt - last_flush >= self._flush_gap:
                    # Slow listeners are told less often (see max_overhead). Only these periodic
                    # flushes count: a pause's redraw is a one-off that must not slow the charts
                    # after the resume.
                    cost = self._notify()
                    self._flush_gap = max(self.flush_seconds, cost / self.max_overhead)
                    last_flush = time.perf_counter()
                await asyncio.sleep(0)   # let the kernel handle clicks and comm messages
        except Exception as exc:
            self.error = exc
            self._set_state("failed")
            return
        self._set_state("done" if self._budget_left() == 0 else "paused")

    def _resize_chunk(self, n: int, dt: float) -> None:
        # Aim each chunk at chunk_seconds; grow at most 2x at a time so one slow step (a big
        # re-simulation) cannot make the next chunk overshoot by much.
        per_step = dt / n if n else 0.0
        want = int(self.chunk_seconds / per_step) if per_step > 0 else 2 * self._chunk
        self._chunk = max(1, min(want, 2 * self._chunk))

    def __repr__(self) -> str:
        return (f"<SearchRunner {self.state}: {self.steps} steps, {self.rate:,.0f} proposals/s, "
                f"chunk {self._chunk}>")
