"""The README's main job, `memflow demo`, at small size through `python -m memflow.cli`."""
import json
import subprocess
import sys

import memflow


def test_demo_leaves_strategy_report_and_training_script(tmp_path):
    out = tmp_path / "plan"
    # a chain whose data-parallel peak (2.8 MB per GPU) is over the 2.2 MB cap: memory matters
    proc = subprocess.run(
        [sys.executable, "-m", "memflow.cli", "demo", "--model", "chain", "--option", "n=6",
         "--option", "width=64", "--batch", "2048", "--cluster", "2xV100-16GB",
         "--memory-limit", "2.2MB", "--iterations", "150", "--quiet", "--out", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "does NOT fit" in proc.stdout                    # data parallel, as captured
    for name in ("strategy.json", "report.html", "train.py", "search.json", "summary.json"):
        assert (out / name).is_file(), name
        assert str(out / name) in proc.stdout or name in ("search.json", "summary.json")
    best = memflow.Strategy.from_json(out / "strategy.json")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["feasible"] and summary["moves"] == "memory"
    assert set(best.sample.tolist()) == {2}                 # still data parallel: exportable
    assert "BEGIN bokeh.min.js" in (out / "report.html").read_text()
    compile((out / "train.py").read_text(), "train.py", "exec")


def test_demo_bad_model_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "memflow.cli", "demo", "--model", "nonesuch",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("memflow: error: unknown zoo model 'nonesuch'")
    assert proc.stderr.count("\n") == 1
