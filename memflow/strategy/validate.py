"""Check a strategy against its graph and cluster, with errors that name the unit and the fix."""
from __future__ import annotations

import numpy as np

from ..errors import StrategyError
from .policies import POLICIES
from .strategy import Strategy

__all__ = ["validate", "block_limits", "divides_tensor_degree"]


def block_limits(units) -> np.ndarray:
    """Per unit (``units``: a graph's units table), the largest parameter degree of its block
    (the ``block`` column): the smallest ``max_parameter_degree`` of the block's units that
    hold parameters or a head count, 1 for a block without parameters; outside blocks, the
    unit's own. Tensor parallelism splits a block's units alike (Megatron's layer), so its
    parameter-free units (``max_parameter_degree`` 1) may take this degree.

    >>> import pandas as pd
    >>> block_limits(pd.DataFrame({"block": ["", "h", "h", "h"], "param_bytes": [8, 8, 0, 0],
    ...                            "max_parameter_degree": [16, 32, 4, 1]})).tolist()
    [16, 4, 4, 4]
    """
    own = units["max_parameter_degree"].to_numpy(np.int64)
    if "block" not in units.columns:
        return own
    block = units["block"].to_numpy(str)
    out = own.copy()
    counts = (units["param_bytes"].to_numpy() > 0) | (own > 1)
    for b in set(block) - {""}:
        mine = block == b
        limits = own[mine & counts]
        out[mine] = limits.min() if len(limits) and units["param_bytes"][mine].sum() > 0 else 1
    return out


def divides_tensor_degree(tensor_degree, parameter) -> np.ndarray:
    """Per unit, whether its parameter degree splits it evenly: it divides the unit's
    ``tensor_degree`` (capture's record of how far Megatron splits a block: the largest degree
    dividing its heads and sharded widths, :mod:`memflow.graph.slicing`), or the unit has none
    (0: split by ``max_parameter_degree`` alone). Works on arrays and on numbers.

    >>> divides_tensor_degree([12, 12, 0], [4, 8, 3]).tolist()
    [True, False, True]
    """
    td = np.asarray(tensor_degree, np.int64)
    return (td <= 0) | (td % np.maximum(np.asarray(parameter, np.int64), 1) == 0)


def validate(strategy: Strategy, graph, cluster=None) -> Strategy:
    """Raise :class:`~memflow.errors.StrategyError` if ``strategy`` cannot run; else return it.

    Checks: the units are the graph's, in order; each unit's degrees multiply to its number of
    devices, which are distinct (and, given ``cluster``, exist); degrees stay within the
    unit's largest splits, and a parameter degree divides the unit's ``tensor_degree``
    (:func:`divides_tensor_degree`); each unit's sample degree divides the batch (every replica gets an
    equal shard, as DistributedDataParallel and the exported script's ``batch_size // world``
    need) and sample × micro-batches <= batch (micro-batches may be uneven: export splits a
    shard with ``torch.tensor_split``, as pipelining does); recompute only
    where the graph allows it (a ``recomputable`` column, when capture provides one);
    compress has an error bound; pipeline stages are all set or all -1, and never decrease.

    >>> import pandas as pd
    >>> from memflow.graph import OpGraph
    >>> g = OpGraph(pd.DataFrame({"fwd_flops": [1.0], "bwd_flops": [2.0]}, index=["fc"]),
    ...             pd.DataFrame({"bytes": [8], "producer": ["<input>"], "consumers": [["fc"]]}))
    >>> validate(Strategy(["fc"], devices=[("gpu0", "gpu1")], sample=[1]), g)
    Traceback (most recent call last):
    ...
    memflow.errors.StrategyError: unit 'fc': sample × parameter × attribute = 1 × 1 × 1 = 1 but 2 devices are listed; list one device per part
    """
    names = graph.names
    if list(strategy.units) != names:
        unknown = [u for u in strategy.units if u not in set(names)]
        if unknown:
            raise StrategyError(f"unit {unknown[0]!r} is not a unit of the graph; "
                                f"the graph's units start {names[:3]}")
        missing = [u for u in names if u not in set(strategy.units)]
        if missing:
            raise StrategyError(f"unit {missing[0]!r} of the graph has no configuration; "
                                "build the strategy from this graph (e.g. Strategy.single_device(graph))")
        raise StrategyError("the strategy lists the graph's units in another order; "
                            "units must follow the graph's execution order")
    known = set(map(str, cluster.devices.index)) if cluster is not None else None
    u = graph.units
    # a parameter-free unit of a block splits with its block
    max_p = u["max_parameter_degree"].to_numpy()
    max_p = np.where(u["param_bytes"].to_numpy() > 0, max_p, np.maximum(max_p, block_limits(u)))
    max_a = u["max_attribute_degree"].to_numpy()
    td = u["tensor_degree"].to_numpy(np.int64) if "tensor_degree" in u.columns else np.zeros(
        len(u), np.int64)
    even = divides_tensor_degree(td, strategy.parameter)
    for i, name in enumerate(names):
        s, p, a = int(strategy.sample[i]), int(strategy.parameter[i]), int(strategy.attribute[i])
        devs = strategy.devices[i]
        if min(s, p, a) < 1:
            raise StrategyError(f"unit {name!r}: degrees must be >= 1, got sample={s}, "
                                f"parameter={p}, attribute={a}")
        if s * p * a != len(devs):
            raise StrategyError(f"unit {name!r}: sample × parameter × attribute = {s} × {p} × "
                                f"{a} = {s * p * a} but {len(devs)} devices are listed; "
                                "list one device per part")
        if len(set(devs)) != len(devs):
            raise StrategyError(f"unit {name!r}: a device appears twice in {devs}; "
                                "the parts of a unit need distinct devices")
        if known is not None:
            bad = [d for d in devs if d not in known]
            if bad:
                raise StrategyError(f"unit {name!r}: device {bad[0]!r} is not in the cluster; "
                                    f"valid devices: {sorted(known)[:8]}")
        if p > max_p[i]:
            raise StrategyError(f"unit {name!r}: parameter degree {p} is above its "
                                f"max_parameter_degree {int(max_p[i])}; valid: 1..{int(max_p[i])}")
        if not even[i]:
            valid = [d for d in range(1, min(int(td[i]), int(max_p[i])) + 1) if td[i] % d == 0]
            raise StrategyError(f"unit {name!r}: parameter degree {p} does not divide its "
                                f"tensor_degree {int(td[i])} (Megatron splits its heads and "
                                "hidden sizes evenly over the ranks); valid: parameter "
                                f"{', '.join(map(str, valid))}")
        if a > max_a[i]:
            raise StrategyError(f"unit {name!r}: attribute degree {a} is above its "
                                f"max_attribute_degree {int(max_a[i])}; valid: 1..{int(max_a[i])}")
    batch = graph.meta.get("batch_size")
    if batch:
        uneven = np.flatnonzero(int(batch) % strategy.sample)
        if len(uneven):
            i = int(uneven[0])
            s = int(strategy.sample[i])
            raise StrategyError(
                f"unit {names[i]!r}: sample degree {s} does not divide the batch of {batch}; "
                f"the replicas need equal shards: use a sample degree that divides {batch}, "
                f"or a batch that is a multiple of {s}")
        too = np.flatnonzero(strategy.sample * strategy.microbatches > int(batch))
        if len(too):
            i = int(too[0])
            raise StrategyError(
                f"unit {names[i]!r}: sample degree {int(strategy.sample[i])} × "
                f"{strategy.microbatches} micro-batches exceeds the batch of {batch}; "
                f"valid: sample × microbatches <= {batch}")
    if "recomputable" in u.columns:
        recompute = POLICIES.codes("recompute")
        bad = np.flatnonzero(POLICIES.recomputes(strategy.policy)
                             & ~u["recomputable"].to_numpy(bool))
        if len(bad):
            others = [p for p in POLICIES if POLICIES.index(p) not in recompute]
            raise StrategyError(f"unit {names[int(bad[0])]!r} cannot be recomputed (its forward "
                                f"is not replayable); valid policies: {', '.join(others)}")
    bad = np.flatnonzero(POLICIES.with_parameter[strategy.policy] & ~(strategy.error_bound > 0))
    if len(bad):
        i = int(bad[0])
        p = POLICIES[POLICIES[int(strategy.policy[i])]]
        raise StrategyError(f"unit {names[i]!r}: {p.name} needs {p.wording} > 0")
    stage = strategy.stage
    if (stage >= 0).any():
        if (stage < 0).any():
            i = int(np.flatnonzero(stage < 0)[0])
            raise StrategyError(f"unit {names[i]!r} has no pipeline stage while others do; "
                                "give every unit a stage >= 0, or none")
        drop = np.flatnonzero(np.diff(stage) < 0)
        if len(drop):
            i = int(drop[0]) + 1
            raise StrategyError(f"unit {names[i]!r}: stage {int(stage[i])} comes after stage "
                                f"{int(stage[i - 1])}; stages must not decrease along the units")
    return strategy


# Also a method, strategy.validate(graph, cluster), where users look for it (as the constructors
# are); defined here, above the Strategy it checks, so that strategy.py need not import this.
Strategy.validate = validate
