"""A strategy's layouts: its distinct placements ``(sample, parameter, attribute, devices)``,
numbered by first use, and each unit's layout id.

Interning runs once per strategy the simulator meets, so both ways of making it are on the
search's hot path: from scratch, one pass over the units; from a parent that differs in a few
units (a config, copy or swap move), the parent's look-up with the moved units' added and the
numbers renumbered by first use, which gives what interning from scratch gives.

>>> import numpy as np
>>> ones, devs = np.ones(3, np.int64), [("gpu0",), ("gpu1",), ("gpu0",)]
>>> interned(ones, ones, ones, devs)
([(1, 1, 1, ('gpu0',)), (1, 1, 1, ('gpu1',))], [0, 1, 0])
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Layout = tuple[int, int, int, tuple[str, ...]]


def interned(sample: np.ndarray, parameter: np.ndarray, attribute: np.ndarray,
             devices: Sequence[tuple[str, ...]]) -> tuple[list[Layout], list[int]]:
    """The distinct ``(sample, parameter, attribute, devices)`` of the units, by first use,
    and each unit's index among them."""
    index: dict[tuple, int] = {}
    ids: list[int] = []
    last: tuple = (None, None, None, None)
    for key in zip(sample.tolist(), parameter.tolist(), attribute.tolist(), devices):
        # a unit on the previous unit's devices (the same tuple) with its degrees takes its
        # layout without hashing: most units do, and hashing was 0.2 ms of a proposal
        if key[3] is last[3] and key[0] == last[0] and key[1] == last[1] and key[2] == last[2]:
            ids.append(ids[-1])
        else:
            ids.append(index.setdefault(key, len(index)))
            last = key
    return list(index), ids


def moved(layouts: list[Layout], ids: np.ndarray, index: dict[Layout, int], new,
          units: Sequence[int]) -> tuple[list[Layout], np.ndarray]:
    """The layouts and layout ids of ``new``, a strategy whose units at positions ``units``
    are placed otherwise than in the one with ``layouts``, ``ids`` and ``index`` (its
    layouts' look-up, not changed here)."""
    layouts, ids, index = list(layouts), ids.copy(), dict(index)
    for i in units:
        key = (int(new.sample[i]), int(new.parameter[i]), int(new.attribute[i]), new.devices[i])
        ids[i] = index.setdefault(key, len(layouts))
        if ids[i] == len(layouts):
            layouts.append(key)
    # a layout no unit holds any more, or a new one first used before an old one
    order = list(dict.fromkeys(ids.tolist()))
    if order != list(range(len(layouts))):
        renumber = np.empty(len(layouts), np.int64)
        renumber[order] = np.arange(len(order))
        ids, layouts = renumber[ids], [layouts[j] for j in order]
    return layouts, ids
