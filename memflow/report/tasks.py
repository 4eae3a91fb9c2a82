"""Tasks of ``SimResult.timeline``, one row per resource they occupy (for the Gantt chart and
the memory chart's hover).

The simulator folds identical replicas, so one task may run on several devices at once
(``resource`` ``"gpu0,gpu1"``), cross several links (``"gpu0->nvsw0,nvsw0->gpu1"``) or use the
communication streams of several devices (``"comm:gpu0,gpu1"``). Views draw per device and per
link, so they split such tasks into one row per device, per communication stream
(``"comm:gpu0"``) and per link.

>>> tl = pd.DataFrame({"task": [0, 1], "kind": ["forward", "allreduce"], "unit": ["fc", ""],
...                    "resource": ["gpu0,gpu1", "comm:gpu0,gpu1"], "start": [0.0, 1.0],
...                    "end": [1.0, 2.0], "bytes": [0.0, 64.0]})
>>> per_resource(tl)[["task", "resource", "label"]]
   task     resource             label
0     0         gpu0     #0 forward fc
1     0         gpu1     #0 forward fc
2     1  comm:gpu0    #1 allreduce
3     1  comm:gpu1    #1 allreduce
"""
from __future__ import annotations

import pandas as pd

__all__ = ["per_resource", "COMM_PREFIX"]

COMM_PREFIX = "comm:"


def _split(resource: str) -> list[str]:
    if resource.startswith(COMM_PREFIX):
        return [COMM_PREFIX + d for d in resource[len(COMM_PREFIX):].split(",")]
    return resource.split(",")


def per_resource(timeline: pd.DataFrame) -> pd.DataFrame:
    """``timeline`` with one row per single resource (device, ``comm:<device>`` or link) and a
    ``label`` naming the task for people: ``"#12 backward layer3"`` (``mb 2`` when the step has
    several micro-batches)."""
    tl = timeline.assign(resource=timeline["resource"].astype(str).map(_split))
    tl = tl.explode("resource", ignore_index=True)
    unit = tl["unit"].fillna("").astype(str)
    label = "#" + tl["task"].astype(str) + " " + tl["kind"].astype(str) + " " + unit
    if "microbatch" in tl.columns and tl["microbatch"].nunique() > 1:
        label = label + " mb " + tl["microbatch"].astype(str)
    return tl.assign(unit=unit, label=label.str.strip())
