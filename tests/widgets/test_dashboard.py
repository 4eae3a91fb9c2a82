"""SearchDashboard driven headlessly: buttons, counters, charts, pins, step, export."""
import asyncio
import threading

import numpy as np
import pytest

import memflow
from memflow_widgets import SearchDashboard

from widget_helpers import Recording, run, until


def buttons(dash):
    return {b.description: not b.disabled for b in
            (dash.start_button, dash.pause_button, dash.resume_button, dash.step_button)}


def test_buttons_follow_the_state(search):
    dash = SearchDashboard(search, flush_seconds=0.02)
    assert buttons(dash) == {"Start": True, "Pause": False, "Resume": False, "Step": True}

    async def scenario():
        dash.start_button.click()
        await until(lambda: search.iteration > 20)
        running = buttons(dash)
        pins_locked = all(r.pin.disabled for r in dash.pins.rows)
        dash.pause_button.click()
        await dash.runner.wait()
        return running, pins_locked

    running, pins_locked = run(scenario())
    assert running == {"Start": False, "Pause": True, "Resume": False, "Step": False}
    assert pins_locked
    assert buttons(dash) == {"Start": False, "Pause": False, "Resume": True, "Step": True}
    assert not any(r.pin.disabled for r in dash.pins.rows)


def test_pause_pin_resume_keeps_pins_in_every_later_strategy(recording):
    search = recording
    dash = SearchDashboard(search, flush_seconds=0.02)

    async def scenario():
        dash.start_button.click()
        await until(lambda: search.iteration >= 60)
        dash.pause_button.click()
        await dash.runner.wait()
        paused_at = search.iteration
        assert paused_at == dash.runner.steps == len(search.history)   # a step boundary
        assert dash.progress_source.data["iteration"][-1] == paused_at  # and drawn
        assert "paused" in dash.counters.value
        dash.pins.rows[3].pin.value = True
        dash.pins.rows[6].pin.value = True
        assert search.pins == {"layer3": "recompute", "layer6": "recompute"}
        dash.resume_button.click()
        await until(lambda: search.iteration >= paused_at + 60)
        dash.pause_button.click()
        await dash.runner.wait()
        return paused_at

    paused_at = run(scenario())
    after = search.strategies[paused_at:]
    assert len(after) >= 60
    for s in after:
        policies = dict(zip(s.units, s.policies))
        assert policies["layer3"] == policies["layer6"] == "recompute"
    assert set(search.history["unit"].iloc[paused_at:]).isdisjoint({"layer3", "layer6"})
    assert list(search.history["iteration"]) == list(range(search.iteration))   # no gap


def test_charts_and_counters_receive_the_progress(search):
    dash = SearchDashboard(search, flush_seconds=0.02, max_iterations=150)

    async def scenario():
        dash.start_button.click()
        await dash.runner.wait()

    run(scenario())
    assert dash.runner.state == "done"
    data = dash.progress_source.data
    its = np.asarray(data["iteration"])
    assert its[0] == 0 and its[-1] == 150 and (np.diff(its) > 0).all()
    assert len(its) >= 3                                     # flushes while it ran
    assert data["best_cost"][-1] == pytest.approx(search.best_cost)
    assert data["cost"][-1] == pytest.approx(search.current_cost)
    best = np.asarray(data["best_cost"])
    assert (np.diff(best) <= 1e-12).all()                    # the best never gets worse
    rate = np.asarray(data["rate"][1:])
    assert ((0 <= rate) & (rate <= 1)).all()
    assert "data-counter='iteration'>150<" in dash.iteration.value
    assert f"{search.acceptance_rate(200):.1%}" in dash.counters.value
    assert "done" in dash.counters.value
    # the memory chart shows the best strategy found
    assert dash.memory.result is search.best_result
    assert dash.states in dash.children and "gpu1" in dash.states.value   # model states follow


def test_a_dashboard_opened_after_a_search_draws_what_it_did(search):
    search.run(120)
    dash = SearchDashboard(search)
    data = dash.progress_source.data
    its = np.asarray(data["iteration"])
    assert len(its) >= 100 and its[0] == 0 and (np.diff(its) > 0).all()
    assert its[-1] == search.iteration          # the replay, then the present's one point
    assert data["best_cost"][-1] == pytest.approx(search.best_cost)
    assert data["cost"][-1] == pytest.approx(search.current_cost)
    rate = np.asarray(data["rate"])
    assert ((0 <= rate) & (rate <= 1)).all()


def test_step_button_runs_the_asked_steps(search):
    dash = SearchDashboard(search)
    dash.steps.value = 7
    dash.step_button.click()
    assert len(search.history) == 7
    assert list(dash.progress_source.data["iteration"]) == [0, 7]
    assert "data-counter='iteration'>7<" in dash.iteration.value


def test_a_failing_search_is_shown(search):
    dash = SearchDashboard(Recording(search, fail_at=40))

    async def scenario():
        dash.start_button.click()
        await dash.runner.wait()

    run(scenario())
    assert "failed (RuntimeError: search stopped on purpose at iteration 40)" in \
        dash.counters.value
    assert buttons(dash)["Resume"]
    dash.steps.value = 1
    dash.step_button.click()                       # still failing: said, not raised
    assert "Step failed" in dash.counters.value


def test_export_writes_the_best_strategy(search, tmp_path):
    dash = SearchDashboard(search, export_path=str(tmp_path / "out" / "best.json"))
    dash.step_button.click()
    dash.export.button.click()
    written = tmp_path / "out" / "best.json"
    assert memflow.Strategy.from_json(written) == search.best
    assert "wrote <code>" in dash.export.status.value
    dash.export.path.value = str(tmp_path)        # a folder: refused, and said so
    dash.export.button.click()
    assert "failed" in dash.export.status.value


@pytest.mark.slow                  # memflow.export imports torch to check the model name
def test_export_script_needs_a_model_it_knows(search, tmp_path):
    dash = SearchDashboard(search, export_path=str(tmp_path / "best.json"))
    assert dash.export.model.value == "hand-built chain"     # the graph's model name
    dash.export.script_button.click()
    assert "script export to" in dash.export.status.value and "failed" in dash.export.status.value
    assert "hand-built chain" in dash.export.status.value
    dash.export.model.value = " "
    dash.export.script_button.click()
    assert "give the model" in dash.export.status.value
    assert not (tmp_path / "best.py").exists()


def test_static_picture(search):
    dash = SearchDashboard(search)
    dash.step_button.click()
    html = dash._repr_mimebundle_()["text/html"]
    assert "iteration 1" in html and html.count("<script") == 2


def test_memory_chart_follows_the_gpus_the_best_uses(search):
    dash = SearchDashboard(search)
    first = dash.memory
    assert list(first.sources) == ["gpu0", "gpu1"]
    # Pinning every unit to one GPU makes the best strategy a single-device one.
    search.pin(search.graph.names, config={"devices": ["gpu1"], "sample": 1})
    dash.steps.value = 3
    dash.step_button.click()
    assert set(search.best.device_names) == {"gpu1"}
    assert list(dash.memory.sources) == ["gpu1"]
    assert dash.memory in dash.children
    assert dash.memory.result is search.best_result
    assert dash.states in dash.children and "gpu1" in dash.states.value   # model states follow
    assert first.comm is None and first.chart.comm is None      # the old chart was closed


def clicked_elsewhere(*actions) -> None:
    """Do ``actions`` on another thread with its own running loop, as ipykernel 7 runs widget
    callbacks from JupyterLab's comm subshells."""
    async def act():
        for action in actions:
            action()
    worker = threading.Thread(target=lambda: asyncio.run(act()))
    worker.start()
    worker.join()


def test_clicks_from_another_thread_reach_the_search_on_its_own(recording):
    search = recording
    threads: set[int] = set()

    async def scenario():
        dash = SearchDashboard(search, flush_seconds=0.02)   # made on the loop, as in a cell
        dash.runner.add_listener(lambda r: threads.add(threading.get_ident()))
        clicked_elsewhere(dash.start_button.click)
        await until(lambda: search.iteration >= 30)
        clicked_elsewhere(dash.pause_button.click)
        await dash.runner.wait()
        paused_at = search.iteration
        clicked_elsewhere(lambda: setattr(dash.pins.rows[2].pin, "value", True),
                          dash.resume_button.click)
        await until(lambda: search.iteration >= paused_at + 30)
        clicked_elsewhere(dash.pause_button.click)
        await dash.runner.wait()
        return dash, paused_at

    dash, paused_at = run(scenario())
    assert threads == {threading.get_ident()}            # listeners ran on the loop's thread
    assert dash.runner.state == "paused" and dash.runner.error is None
    assert search.pins == {"layer2": "recompute"}
    assert {dict(zip(s.units, s.policies))["layer2"]
            for s in search.strategies[paused_at:]} == {"recompute"}
