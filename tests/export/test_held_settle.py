"""``held_bytes``' waiting for collectives: a gloo worker thread may still hold an output the
forward dropped when the forward ends; the count waits for it, not for outputs autograd keeps."""
import threading
import time

import torch

from memflow.export import measure
from memflow.export.segment import storage_key


def _mode_with(t: torch.Tensor) -> measure._Allocations:
    mode = measure._Allocations()
    mode.note(t)
    mode.collective.add(storage_key(t))
    return mode


def test_a_dropped_collective_output_is_waited_for():
    box = [torch.ones(64)]          # the worker thread's reference, dropped 50 ms later
    mode = _mode_with(box[0])
    threading.Timer(0.05, box.clear).start()
    start = time.monotonic()
    measure._settle(mode, set())
    waited = time.monotonic() - start
    assert all(ref.expired() for ref, _, _ in mode.made.values())
    assert 0.04 < waited < measure.SETTLE_S


def test_a_kept_collective_output_costs_the_wait_and_stays_counted():
    kept = torch.ones(64)
    mode = _mode_with(kept)
    start = time.monotonic()
    measure._settle(mode, set())
    assert time.monotonic() - start >= measure.SETTLE_S
    assert not next(iter(mode.made.values()))[0].expired()


def test_model_states_are_never_waited_for():
    kept = torch.ones(64)
    mode = _mode_with(kept)
    start = time.monotonic()
    measure._settle(mode, {storage_key(kept)})
    assert time.monotonic() - start < measure.SETTLE_S / 2
