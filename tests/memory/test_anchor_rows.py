"""The per-unit anchor rows of the records' pass: each unit's distinct (kind, key) in sorted
order, whatever the bucket sizes (insertion sort for a few, np.sort above ``_SMALL``), compiled
and interpreted alike."""
import numpy as np
from hypothesis import given, strategies as st

from memflow.memory.anchors import ANCHOR_KINDS
from memflow.memory.record_pass import _SMALL, _anchor_rows


def _by_unique(unit, kind, key, n, n_keys):
    """The definition: the sorted distinct codes, split by unit."""
    code = np.unique((unit * ANCHOR_KINDS + kind) * n_keys + key)
    u, rest = np.divmod(code, ANCHOR_KINDS * n_keys)
    ptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(u, minlength=n), out=ptr[1:])
    return ptr, np.stack(np.divmod(rest, n_keys), axis=1).astype(np.int64).reshape(-1, 2)


@given(st.integers(1, 6), st.integers(1, 9), st.integers(0, 3 * _SMALL), st.integers(0, 2**16))
def test_anchor_rows_are_each_units_sorted_distinct_anchors(n, n_keys, m, seed):
    rng = np.random.default_rng(seed)
    # few units: some buckets above _SMALL (np.sort), with repeats
    unit = rng.integers(0, n, m)
    kind = rng.integers(0, ANCHOR_KINDS, m)
    key = rng.integers(0, n_keys, m)
    want = _by_unique(unit, kind, key, n, n_keys)
    for fn in (_anchor_rows, getattr(_anchor_rows, "py_func", _anchor_rows)):
        ptr, idx = fn(unit, kind, key, n, n_keys)
        assert ptr.dtype == idx.dtype == np.int64 and idx.shape == want[1].shape
        assert np.array_equal(ptr, want[0]) and np.array_equal(idx, want[1])
