"""The order of micro-batch forward and backward passes on each pipeline stage.

GPipe runs every forward, then every backward; 1F1B (PipeDream-flush) runs ``stages - s - 1``
warm-up forwards on stage ``s``, then alternates one forward and one backward. With one stage
and several micro-batches these are gradient accumulation (all forwards first, or one
forward-backward per micro-batch).
"""
from __future__ import annotations

__all__ = ["stage_sequence", "program_order"]


def stage_sequence(stage: int, stages: int, microbatches: int, schedule: str) -> list[tuple[str, int]]:
    """``[("F", m) | ("B", m), ...]`` for one stage.

    >>> stage_sequence(0, 2, 3, "1f1b")
    [('F', 0), ('F', 1), ('B', 0), ('F', 2), ('B', 1), ('B', 2)]
    >>> stage_sequence(0, 1, 2, "gpipe")
    [('F', 0), ('F', 1), ('B', 1), ('B', 0)]
    """
    M = microbatches
    if schedule == "gpipe":
        return [("F", m) for m in range(M)] + [("B", m) for m in reversed(range(M))]
    warm = min(stages - stage - 1, M)
    seq = [("F", m) for m in range(warm)]
    for i in range(M - warm):
        seq += [("F", warm + i), ("B", i)]
    return seq + [("B", m) for m in range(M - warm, M)]


def program_order(stages: int, microbatches: int, schedule: str) -> list[tuple[int, str, int]]:
    """All ``(stage, "F"|"B", microbatch)`` in one order that respects every dependency
    (forward flows to later stages, backward to earlier ones) and each stage's own sequence.

    >>> program_order(2, 1, "1f1b")
    [(0, 'F', 0), (1, 'F', 0), (1, 'B', 0), (0, 'B', 0)]
    """
    seqs = [stage_sequence(s, stages, microbatches, schedule) for s in range(stages)]
    heads = [0] * stages
    done: set[tuple[int, str, int]] = set()
    order: list[tuple[int, str, int]] = []
    total = sum(map(len, seqs))
    while len(order) < total:
        progressed = False
        for s in range(stages):
            while heads[s] < len(seqs[s]):
                op, m = seqs[s][heads[s]]
                if op == "F":
                    ready = s == 0 or (s - 1, "F", m) in done
                else:
                    ready = (s, "F", m) in done and (s == stages - 1 or (s + 1, "B", m) in done)
                if not ready:
                    break
                done.add((s, op, m))
                order.append((s, op, m))
                heads[s] += 1
                progressed = True
        if not progressed:  # pragma: no cover - the schedules above never deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    return order
