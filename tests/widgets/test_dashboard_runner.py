"""SearchRunner: chunks on the event loop, pause at a step boundary, resume, budget, failure."""
import asyncio
import threading
import time

import pytest

from memflow_widgets import SearchRunner

from widget_helpers import Recording, run, until


class CallLog:
    """A search that records the size of every step() call."""

    def __init__(self, seconds_per_step: float = 0.0):
        self.calls: list[int] = []
        self.seconds_per_step = seconds_per_step

    def step(self, n: int = 1) -> None:
        if self.seconds_per_step:
            time.sleep(self.seconds_per_step * n)
        self.calls.append(n)


def test_pause_stops_at_a_step_boundary_and_resume_continues():
    search = CallLog(seconds_per_step=0.0005)
    runner = SearchRunner(search, chunk_seconds=0.01)

    async def scenario():
        runner.start()
        await until(lambda: runner.steps >= 200)
        runner.pause()
        assert runner.state == "pausing"
        t0 = time.perf_counter()
        assert await runner.wait() == "paused"
        latency = time.perf_counter() - t0
        done = sum(search.calls)
        assert done == runner.steps                    # every step the runner counts, ran whole
        await asyncio.sleep(0.05)
        assert sum(search.calls) == done               # nothing runs while paused
        runner.resume()
        await until(lambda: runner.steps >= done + 100)
        runner.pause()
        await runner.wait()
        return latency

    latency = run(scenario())
    assert latency < 0.25                              # one chunk (~10 ms), not a whole run
    assert max(search.calls) > 1                       # chunks grew past one step


def test_chunks_stay_near_the_target_duration():
    search = CallLog(seconds_per_step=0.001)
    runner = SearchRunner(search, chunk_seconds=0.02, max_iterations=300)
    run(_start_and_wait(runner))
    assert runner.state == "done" and sum(search.calls) == 300
    assert max(search.calls) <= 40                     # ≤ 2x the ~20 steps that fit 20 ms


async def _start_and_wait(runner):
    runner.start()
    return await runner.wait()


def test_budget_ends_in_done_and_start_again_stays_done():
    runner = SearchRunner(CallLog(), max_iterations=50)
    assert run(_start_and_wait(runner)) == "done"
    assert runner.steps == 50
    run(_start_and_wait(runner))
    assert runner.steps == 50 and runner.state == "done"


def test_listeners_hear_state_changes_and_flushes():
    seen: list[str] = []
    runner = SearchRunner(CallLog(seconds_per_step=0.001), flush_seconds=0.02,
                          max_iterations=150)
    runner.add_listener(lambda r: seen.append(r.state))
    run(_start_and_wait(runner))
    assert seen[0] == "running" and seen[-1] == "done"
    assert seen.count("running") >= 3                  # periodic flushes while running
    assert runner.rate > 0


def test_a_failing_step_is_reported_not_raised(search):
    runner = SearchRunner(Recording(search, fail_at=30))
    assert run(_start_and_wait(runner)) == "failed"
    assert "stopped on purpose at iteration 30" in str(runner.error)
    assert runner.steps <= 30 and search.iteration == 30


def test_a_failing_listener_does_not_stop_the_search():
    runner = SearchRunner(CallLog(), max_iterations=20)
    runner.add_listener(lambda r: 1 / 0)
    assert run(_start_and_wait(runner)) == "done"
    assert isinstance(runner.error, ZeroDivisionError)


def test_step_by_hand_only_when_not_running():
    search = CallLog(seconds_per_step=0.0005)
    runner = SearchRunner(search)
    runner.step(3)
    assert search.calls == [3] and runner.state == "idle"
    with pytest.raises(ValueError, match="n must be >= 1"):
        runner.step(0)

    async def scenario():
        runner.start()
        await until(lambda: runner.steps > 10)
        with pytest.raises(RuntimeError, match="pause the search before stepping"):
            runner.step()
        runner.pause()
        await runner.wait()
        runner.step(2)
        assert runner.state == "paused"

    run(scenario())


def test_pause_then_resume_before_the_chunk_ends_keeps_running():
    runner = SearchRunner(CallLog(seconds_per_step=0.001), chunk_seconds=0.05)

    async def scenario():
        runner.start()
        await until(lambda: runner.steps > 0)
        runner.pause()
        runner.resume()                     # still the same task: it just keeps going
        assert runner.state == "running"
        n = runner.steps
        await until(lambda: runner.steps > n + 20)
        runner.pause()
        return await runner.wait()

    assert run(scenario()) == "paused"


def test_start_needs_an_event_loop():
    with pytest.raises(RuntimeError, match="no asyncio event loop is running"):
        SearchRunner(CallLog()).start()


def test_a_search_without_step_is_refused():
    with pytest.raises(TypeError, match="search must have a step"):
        SearchRunner(object())


def test_the_real_search_pauses_between_proposals(search):
    runner = SearchRunner(search, chunk_seconds=0.01)

    async def scenario():
        runner.start()
        await until(lambda: search.iteration >= 20)
        runner.pause()
        await runner.wait()

    run(scenario())
    assert runner.state == "paused"
    assert search.iteration == runner.steps == len(search.history)


@pytest.mark.parametrize("paced", [False, True])
def test_slow_listeners_are_told_less_often_unless_they_pace_themselves(paced):
    """A slow listener spaces the flushes out; a paced one (the dashboard's memory chart, which
    keeps its own budget) must not make the other listeners' points rarer."""
    search = CallLog(seconds_per_step=0.001)
    runner = SearchRunner(search, flush_seconds=0.01, max_overhead=0.1)
    told: list[int] = []
    runner.add_listener(lambda r: told.append(r.steps) if r.state == "running" else None)
    # 20 ms a flush: at most 10% → every 0.2 s, unless paced
    runner.add_listener(lambda r: time.sleep(0.02) if r.state == "running" else None,
                        paced=paced)

    async def scenario():
        runner.start()
        await asyncio.sleep(1.0)
        runner.pause()
        await runner.wait()

    run(scenario())
    if paced:
        assert runner.flush_interval < 0.19 and len(told) > 8
    else:
        assert runner.flush_interval >= 0.19
        assert len(told) <= 8              # not the ~100 that flush_seconds alone would give


def test_a_slow_pause_does_not_slow_the_charts_after_resume():
    runner = SearchRunner(CallLog(seconds_per_step=0.001), flush_seconds=0.01)
    runner.add_listener(lambda r: time.sleep(0.3) if r.state == "paused" else None)

    async def scenario():
        runner.start()
        await until(lambda: runner.steps > 10)
        runner.pause()
        await runner.wait()
        runner.resume()
        await until(lambda: runner.steps > 40)
        runner.pause()
        await runner.wait()

    run(scenario())
    assert runner.flush_interval < 0.1


def _wait_until(predicate, timeout: float = 20.0) -> None:
    """Sleep (no event loop here) until ``predicate()`` holds; fail after ``timeout`` s."""
    end = time.perf_counter() + timeout
    while not predicate():
        assert time.perf_counter() < end, f"condition not reached within {timeout} s"
        time.sleep(0.005)


class ThreadLog(CallLog):
    """A CallLog that also records the thread of every step."""

    def __init__(self, seconds_per_step: float = 0.0):
        super().__init__(seconds_per_step)
        self.threads: set[int] = set()

    def step(self, n: int = 1) -> None:
        self.threads.add(threading.get_ident())
        super().step(n)


def test_without_an_event_loop_it_runs_on_a_thread_of_its_own():
    """Issue 16: Start where no event loop runs did nothing; with no_loop="thread" the runner
    runs its own loop on a daemon thread, and pause, resume and call are handed to it."""
    search = ThreadLog(seconds_per_step=0.0005)
    runner = SearchRunner(search, chunk_seconds=0.01, no_loop="thread")
    heard: set[int] = set()
    runner.add_listener(lambda r: heard.add(threading.get_ident()))
    runner.start()
    assert runner.state == "running"                 # started when start() returns
    _wait_until(lambda: runner.steps >= 100)
    runner.pause()
    _wait_until(lambda: runner.state == "paused")
    done = runner.steps
    assert sum(search.calls) == done                 # stopped at a step boundary
    time.sleep(0.05)
    assert sum(search.calls) == done                 # nothing runs while paused
    ran = []
    runner.call(lambda: ran.append(threading.get_ident()))
    runner.resume()
    _wait_until(lambda: runner.steps >= done + 50)
    runner.pause()
    _wait_until(lambda: runner.state == "paused")
    main = threading.get_ident()
    assert search.threads == heard == set(ran) and main not in search.threads
    assert run(runner.wait()) == "paused"            # wait() from another loop polls


def test_no_loop_is_checked():
    with pytest.raises(ValueError, match="no_loop must be 'raise' or 'thread'"):
        SearchRunner(CallLog(), no_loop="block")


def test_dashboard_start_without_an_event_loop_runs_the_search(search):
    """Clicking Start where no event loop runs (issue 16) runs the search; Pause stops it."""
    from memflow_widgets import SearchDashboard
    dash = SearchDashboard(search, flush_seconds=0.02)
    dash.start_button.click()
    _wait_until(lambda: search.iteration >= 20)
    dash.pause_button.click()
    _wait_until(lambda: dash.runner.state == "paused")
    assert search.iteration == dash.runner.steps == len(search.history)
    _wait_until(lambda: "paused" in dash.counters.value)
    assert not dash.resume_button.disabled


def test_dashboard_says_why_a_click_failed(search):
    """A click whose action raises says so in the counters instead of doing nothing."""
    from memflow_widgets import SearchDashboard
    dash = SearchDashboard(search)
    dash.runner.no_loop = "raise"
    dash.start_button.click()
    assert "Start failed" in dash.counters.value
    assert "no asyncio event loop is running" in dash.counters.value
    assert dash.runner.state == "idle" and search.iteration == 0
