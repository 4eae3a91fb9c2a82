"""The rules of export's multi-process paths a strategy must follow where it takes them:
pipeline stages across processes (:func:`pipeline_problem`, with tensor-parallel groups
inside stages: :mod:`memflow.strategy.stage_groups`) and per-unit sample degrees as groups of
processes (:func:`sample_problem`); both cut the model where a module is called once
(:func:`uncut`, from the graph's module calls: :func:`sharing`). Part of what
:mod:`memflow.strategy.runnable` declares export runs."""
from __future__ import annotations

import numpy as np

from .policies import M_COMPRESSED, M_HOST, POLICIES
from .shard_levels import S_NONE
from .stage_groups import stage_groups

__all__ = ["sharing", "pipeline_problem", "split_policy_problem", "uncut", "sample_groups",
           "sample_problem"]


def sharing(graph) -> tuple[dict[str, int], dict[str, str]]:
    """Calls per module (whole-module units), and per unit the first weight it shares with
    another module (tied weights: a parameter row with several names)."""
    u = graph.units
    calls = u.loc[u["role"] == "module", "module"].value_counts().to_dict()
    tied: dict[str, str] = {}
    for names, readers in zip(graph.parameters["names"], graph.parameters["readers"]):
        if len(names) > 1:
            for r in readers:
                tied.setdefault(r, names[0])
    return calls, tied


def pipeline_problem(strategy, graph=None) -> str | None:
    """Why export cannot run ``strategy``'s pipeline across processes where it must (None: it
    can, or it need not). With stages, 1F1B runs across processes, one per stage and replica
    (``Schedule1F1B``), and so do stages whose model states are sharded over their replicas,
    in bf16 or with the optimizer on the host (FSDP2 and the model-state policies on each
    stage's data-parallel group, :mod:`memflow.export.pipelining`), each stage of each replica
    on its own device or tensor-parallel group (:mod:`memflow.strategy.stage_groups`); the
    stage-boundary and split-block rules are checked only with ``graph``. With one stage, 1F1B is gradient accumulation — each
    micro-batch's forward, then its backward —, which the training loop runs in each replica's
    process (memflow.export.accumulation).

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0",), ("gpu1",)], stage=[0, 1],
    ...              microbatches=2, schedule="1f1b")
    >>> pipeline_problem(s) is None
    True
    >>> pipeline_problem(s.with_schedule(microbatches=1))[:60]
    '2 stages under 1F1B need at least 2 micro-batches (torch.dis'
    >>> pipeline_problem(s.with_config("b", devices=["gpu0"], stage=0)) is None  # accumulation
    True
    >>> gpipe = s.with_config("b", devices=["gpu0"]).with_schedule(schedule="gpipe")
    >>> pipeline_problem(gpipe) is None, pipeline_problem(gpipe.with_model_states(precision="bf16"))[:56]
    (True, "unit 'b': device 'gpu0' runs stage 1 of replica 0 and an")
    """
    stage = np.asarray(strategy.stage)
    n = int(stage.max()) + 1 if (stage >= 0).any() else 1
    states = ((int(strategy.sample[0]) > 1 and bool((strategy.shard != S_NONE).any()))
              or strategy.precision in ("bf16", "pure-bf16")
              or bool(np.asarray(strategy.offload_optimizer).any()))
    if n == 1 or not (strategy.schedule == "1f1b" or states):
        return None
    if strategy.schedule == "1f1b":
        what, valid = "1F1B", "Valid: schedule 'gpipe'"
        if strategy.microbatches < n:
            return (f"{n} stages under 1F1B need at least {n} micro-batches "
                    f"(torch.distributed.pipelining's Schedule1F1B); the strategy has "
                    f"{strategy.microbatches}. {valid}, or microbatches >= {n}")
    else:
        what = "a pipeline with sharded, bf16 or host-stepped model states"
        valid = ("Valid: shard level 'none', precision 'fp32' and the optimizer on the device "
                 "(stages then run in one process per replica)")
    units = list(strategy.units)
    held = sorted(set(stage.tolist()))
    if held != list(range(n)):
        return (f"the pipeline's stages are {held}: {what} needs every stage 0..{n - 1} to "
                f"hold a unit (a process runs each). {valid}, or renumber the stages")
    wide = np.flatnonzero(np.asarray(strategy.attribute) > 1)
    if len(wide):
        return (f"unit {units[int(wide[0])]!r} is split over its attribute inside a pipeline "
                f"stage; export runs {what} with a stage on one device or tensor-parallel "
                f"group per replica. {valid}, or attribute=1")
    if (np.asarray(strategy.parameter) > 1).any():     # TP x PP: a group per stage
        groups = stage_groups(strategy)
        problem = (f"{groups}. {valid}" if isinstance(groups, str)
                   else split_policy_problem(strategy, graph))
        if problem is not None:
            return problem
    owner: dict[str, tuple[int, int]] = {}
    for i, u in enumerate(units if (np.asarray(strategy.parameter) == 1).all() else ()):
        for r, device in enumerate(strategy.devices[i]):
            if owner.setdefault(device, (r, int(stage[i]))) != (r, int(stage[i])):
                return (f"unit {u!r}: device {device!r} runs stage {int(stage[i])} of replica "
                        f"{r} and another stage or replica; export runs {what} with each stage "
                        f"of each replica in its own process. {valid}, or a device per stage")
    if graph is not None:
        return uncut(units, stage, graph, valid)
    return None


def split_policy_problem(strategy, graph) -> str | None:
    """Why a split unit's memory policy cannot run on tensor-parallel processes (None: it
    can): what it saves are DTensors, which offload and compression do not move, and a split
    block's DTensor conversions recompute cannot replay (block: checked with ``graph``)."""
    mechanism = POLICIES.mechanism_codes[strategy.policy]
    split = np.asarray(strategy.parameter) > 1
    for i in np.flatnonzero(split & np.isin(mechanism, (M_HOST, M_COMPRESSED))):
        return (f"unit {strategy.units[i]!r} is split over parameters and "
                f"{strategy.policies[i]!r} on tensor-parallel processes: what it saves are "
                "DTensors, which export's offload and compression do not move. Valid: keep or "
                "recompute")
    if graph is not None:
        block = graph.units["tensor_degree"].to_numpy() > 0
        for i in np.flatnonzero(split & block & POLICIES.recomputes(strategy.policy)):
            return (f"unit {strategy.units[i]!r} is a block split over parameters and "
                    "recomputed on tensor-parallel processes: DTensor's conversions run inside "
                    "it, which recompute cannot replay. Valid: keep")
    return None


def uncut(units, group: np.ndarray, graph, valid: str) -> str | None:
    """Why the model cannot be cut where ``group`` (per unit: a stage, or a sample group)
    changes: each cut needs a module called once on one side of it, and a unit after it that
    does not write its input in place (None: every cut can).

    A stage's (or group's) input is the activation it receives, which the process makes a
    leaf tensor that requires grad (``torch.distributed.pipelining``'s stage inputs), and
    autograd lets no in-place op write a leaf that requires grad; in one process the same
    unit (an in-place ReLU) writes its producer's output. Capture shows such a unit as one
    that runs ops but makes no tensor."""
    u = graph.units
    calls, _ = sharing(graph)
    role, module = u["role"].to_numpy(), u["module"].to_numpy()
    writes = ((u["fwd_ops"].to_numpy() > 0) & (u["output_bytes"].to_numpy() == 0)
              & (u["input_bytes"].to_numpy() > 0))

    def cut(i: int) -> bool:     # <root> and <loss> are no module calls to cut at
        return (role[i] == "module" and not str(module[i]).startswith("<")
                and calls.get(module[i], 1) == 1)
    for i in np.flatnonzero(np.diff(group) != 0).tolist():
        if not (cut(i + 1) or cut(i)):
            return (f"unit {units[i + 1]!r} starts a new stage or group after unit "
                    f"{units[i]!r}, but neither is a module called once, so the model "
                    f"cannot be cut there. {valid}, or move the boundary next to a module unit")
        if writes[i + 1]:
            return (f"unit {units[i + 1]!r} starts a new stage or group and writes its input "
                    "in place (as an in-place ReLU does); that input is the activation the "
                    "stage receives, a leaf that requires grad, which autograd lets no "
                    f"in-place op write. {valid}, or move the boundary so that "
                    f"{units[i]!r} and {units[i + 1]!r} are on one side of it")
    return None


def sample_groups(strategy) -> np.ndarray:
    """Per unit, its sample group: runs of consecutive units with the same sample degree and
    devices, numbered from 0. The loss unit (``<loss>``) joins the group before it: the loss
    is computed where the model's output is.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b", "c", "<loss>"], sample=[2, 2, 1, 2],
    ...              devices=[("gpu0", "gpu1")] * 2 + [("gpu0",), ("gpu0", "gpu1")])
    >>> sample_groups(s).tolist()
    [0, 0, 1, 1]
    """
    out = np.zeros(len(strategy.units), np.int64)
    for i in range(1, len(out)):
        same = (strategy.units[i] == "<loss>"
                or (strategy.sample[i] == strategy.sample[i - 1]
                    and strategy.devices[i] == strategy.devices[i - 1]))
        out[i] = out[i - 1] + (not same)
    return out


def sample_problem(strategy, graph=None) -> str | None:
    """Why export cannot run ``strategy``'s per-unit sample degrees as groups of processes
    (:mod:`memflow.export.sample_groups`); None when it can. Groups are cut like pipeline
    stages (checked only with ``graph``) and not yet composed with the other splits.

    >>> from memflow.strategy import Strategy
    >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1"), ("gpu0",)], sample=[2, 1])
    >>> sample_problem(s) is None, sample_problem(s.with_schedule(microbatches=2))[:44]
    (True, 'the strategy has 2 micro-batches; export run')
    """
    units = list(strategy.units)
    valid = "Valid: one sample degree for every unit"
    what = ("export runs per-unit sample degrees as groups of processes, not yet composed "
            "with")
    if (np.asarray(strategy.stage) > 0).any():
        return f"the strategy has pipeline stages; {what} pipelines. {valid}, or one stage"
    if strategy.microbatches > 1:
        return (f"the strategy has {strategy.microbatches} micro-batches; {what} micro-batches. "
                f"{valid}, or microbatches=1")
    for field, name in (("parameter", "tensor parallelism"),
                        ("attribute", "attribute splits")):
        split = np.flatnonzero(np.asarray(getattr(strategy, field)) > 1)
        if len(split):
            return (f"unit {units[int(split[0])]!r} has a {field} split; {what} {name}. "
                    f"{valid}, or {field}=1")
    shard = np.flatnonzero(np.asarray(strategy.shard) != S_NONE)
    if len(shard):
        return (f"unit {units[int(shard[0])]!r} shards its model states; {what} FSDP2. "
                f"{valid}, or shard level 'none'")
    if graph is not None:
        return uncut(units, sample_groups(strategy), graph, valid)
    return None
