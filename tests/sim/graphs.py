"""Synthetic graphs, clusters and strategies for the simulator's tests (plain and hypothesis)."""
from __future__ import annotations

import pandas as pd
from hypothesis import strategies as st

import memflow
from memflow.graph import OpGraph
from memflow.strategy import POLICIES, Strategy

INPUT = "<input>"


def chain(saved=(100, 200, 300), internal=(10, 20, 30), params=400, batch=8,
          tmp=None) -> OpGraph:
    """Units u0..u{n-1}: u_i reads u_{i-1}'s output (the input for u0) and saves it, plus an
    internal tensor of ``internal[i]`` bytes that only it saves; the last output is returned."""
    n = len(saved)
    tmp = tmp or (0,) * n
    names = [f"u{i}" for i in range(n)]
    units = pd.DataFrame({"fwd_flops": [1e9] * n, "bwd_flops": [2e9] * n,
                          "param_bytes": [params] * n, "trainable_bytes": [params] * n,
                          "fwd_tmp_bytes": list(tmp), "bwd_tmp_bytes": list(tmp),
                          "fwd_bytes_moved": [1e6] * n, "bwd_bytes_moved": [2e6] * n,
                          "fwd_ops": 3, "bwd_ops": 5}, index=names)
    rows = []
    for i in range(n):
        rows.append(dict(bytes=saved[i], producer=INPUT if i == 0 else names[i - 1],
                         consumers=[names[i]], savers=[names[i]], is_output=False))
        rows.append(dict(bytes=internal[i], producer=names[i], consumers=[], savers=[names[i]],
                         is_output=False))
    rows.append(dict(bytes=50, producer=names[-1], consumers=[], savers=[], is_output=True))
    t = pd.DataFrame(rows)
    t["requires_grad"] = [r["producer"] != INPUT for r in rows]
    return OpGraph(units, t, {"batch_size": batch, "model": "chain"})


@st.composite
def graphs(draw, max_units: int = 7) -> OpGraph:
    """Random DAG-shaped graphs: chains with skip connections, shared savers, temporaries."""
    n = draw(st.integers(2, max_units))
    names = [f"u{i}" for i in range(n)]
    size = st.integers(0, 5000)
    units = pd.DataFrame({
        "fwd_flops": draw(st.lists(st.floats(0, 5e9), min_size=n, max_size=n)),
        "bwd_flops": draw(st.lists(st.floats(0, 1e10), min_size=n, max_size=n)),
        "param_bytes": draw(st.lists(st.integers(0, 1 << 20), min_size=n, max_size=n)),
        "fwd_tmp_bytes": draw(st.lists(size, min_size=n, max_size=n)),
        "bwd_tmp_bytes": draw(st.lists(size, min_size=n, max_size=n)),
        "fwd_bytes_moved": draw(st.lists(st.integers(0, 1 << 24), min_size=n, max_size=n)),
        "bwd_bytes_moved": draw(st.lists(st.integers(0, 1 << 24), min_size=n, max_size=n)),
        "fwd_ops": 2, "bwd_ops": 4,
        "max_parameter_degree": draw(st.lists(st.sampled_from([1, 2, 4]), min_size=n, max_size=n)),
        "max_attribute_degree": draw(st.lists(st.sampled_from([1, 2]), min_size=n, max_size=n)),
    }, index=names)
    units["trainable_bytes"] = units["param_bytes"]
    rows = [dict(bytes=draw(st.integers(1, 4000)), producer=INPUT, consumers=[names[0]],
                 savers=[names[0]] if draw(st.booleans()) else [], is_output=False,
                 requires_grad=False, per_sample=True)]
    for i in range(n):
        later = names[i + 1:]
        cons = ([names[i + 1]] if later else []) + draw(st.lists(st.sampled_from(later),
                                                                 max_size=2, unique=True)
                                                        if later else st.just([]))
        cons = sorted(set(cons), key=names.index)
        pool = [names[i]] + cons
        sav = sorted(set(draw(st.lists(st.sampled_from(pool), max_size=2))), key=names.index)
        out = not later
        rows.append(dict(bytes=draw(st.integers(1, 8000)), producer=names[i], consumers=cons,
                         savers=sav, is_output=out, requires_grad=True,
                         per_sample=draw(st.booleans())))
        if draw(st.booleans()):   # an internal saved tensor
            rows.append(dict(bytes=draw(st.integers(1, 3000)), producer=names[i], consumers=[],
                             savers=[names[i]], is_output=False, requires_grad=True,
                             per_sample=True))
    return OpGraph(units, pd.DataFrame(rows), {"batch_size": 16, "model": "random"})


@st.composite
def strategies_for(draw, graph: OpGraph, devices: list[str]) -> Strategy:
    """Random valid strategies: policies, placements (sample/parameter/attribute splits),
    pipeline stages and micro-batches."""
    n = len(graph)
    s = Strategy.single_device(graph, devices[0])
    pol = {u: draw(st.sampled_from(POLICIES)) for u in graph.names}
    pol = {u: (p + ":0.01" if p == "compress" else p) for u, p in pol.items()}
    s = s.with_policy(pol)
    kind = draw(st.sampled_from(["single", "dp", "mixed", "pipeline"]))
    u = graph.units
    if kind == "dp":
        k = draw(st.sampled_from([2, 4]))
        s = s.with_config(graph.names, sample=k, devices=devices[:k])
    elif kind == "mixed":
        for i, name in enumerate(graph.names):
            sdeg = draw(st.sampled_from([1, 2]))
            pdeg = draw(st.sampled_from([d for d in (1, 2) if d <= u["max_parameter_degree"].iat[i]]))
            adeg = draw(st.sampled_from([d for d in (1, 2) if d <= u["max_attribute_degree"].iat[i]]))
            k = sdeg * pdeg * adeg
            devs = draw(st.permutations(devices))[:k]
            s = s.with_config(name, sample=sdeg, parameter=pdeg, attribute=adeg, devices=devs)
    elif kind == "pipeline":
        stages = draw(st.integers(1, min(n, len(devices))))
        cut = sorted(draw(st.lists(st.integers(1, n - 1), min_size=stages - 1,
                                   max_size=stages - 1, unique=True))) if stages > 1 else []
        stage, cur = [], 0
        for i in range(n):
            if cur < len(cut) and i >= cut[cur]:
                cur += 1
            stage.append(cur)
        for i, name in enumerate(graph.names):
            s = s.with_config(name, stage=stage[i], devices=[devices[stage[i]]])
    mb = draw(st.integers(1, 3))
    return s.with_schedule(microbatches=mb, schedule=draw(st.sampled_from(["gpipe", "1f1b"])))


def cluster(name: str = "4xV100-16GB"):
    return memflow.Cluster.preset(name)
