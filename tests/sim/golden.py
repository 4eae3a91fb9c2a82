"""Golden records of the simulator: cases (graph, strategy, cluster) and what they gave.

``golden.json`` freezes, for a few hundred cases, the figures a change to the simulator's
internals must not move: iteration time, peak per device and per host, feasibility, per task
kind the count, busy time and bytes of the timeline, per memory category the bytes allocated
over the step and held at each device's peak, and ``memflow.estimate``'s peak for one-device
strategies. Graphs are stored as the numbers the simulator reads (no names), so a change to
capture does not move them.

Cases come from the hypothesis strategies of :mod:`sim.graphs` (drawn once, derandomized) and
from zoo models under constructed strategies with random memory policies.

``python tests/sim/golden.py --write`` recomputes the records of the stored cases (after a
deliberate change of the memory or time model: say which in the commit);
``--new`` draws the cases anew.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
PATH = HERE / "golden.json"

UNIT_NUMBERS = ("fwd_flops", "bwd_flops", "param_bytes", "trainable_bytes", "buffer_bytes",
                "fwd_bytes_moved", "bwd_bytes_moved", "fwd_ops", "bwd_ops", "fwd_tmp_bytes",
                "bwd_tmp_bytes", "max_parameter_degree", "max_attribute_degree")
HALF = ("float16", "bfloat16")


def _short(x: float, digits: int = 6):
    """``x`` to ``digits`` significant digits, as an int when it is one (shorter JSON)."""
    x = float(f"{x:.{digits}g}")
    return int(x) if x.is_integer() and abs(x) < 2 ** 53 else x


def encode_graph(g) -> dict:
    """The numbers of ``g`` the simulator reads, as JSON-ready lists."""
    u, t = g.units, g.tensors
    pos = {name: i for i, name in enumerate(u.index)}
    pos["<input>"] = -1
    half = [int(str(d) in HALF) for d in u["dtype"]]
    out = {"u": [[_short(x) for x in row] + [h] for row, h in
                 zip(u[list(UNIT_NUMBERS)].itertuples(index=False), half)]}
    out["t"] = [[int(r.bytes), pos[r.producer], [pos[c] for c in r.consumers],
                 [pos[s] for s in r.savers], int(r.is_output), int(r.requires_grad),
                 int(r.per_sample)] for r in t.itertuples(index=False)]
    out["meta"] = {k: g.meta[k] for k in ("batch_size", "autocast", "backend")
                   if g.meta.get(k) is not None}
    return out


def decode_graph(d: dict):
    """The :class:`~memflow.graph.OpGraph` :func:`encode_graph` described (units ``u0``…)."""
    from memflow.graph import OpGraph
    names = [f"u{i}" for i in range(len(d["u"]))]
    units = pd.DataFrame([row[:-1] for row in d["u"]], columns=list(UNIT_NUMBERS), index=names)
    units["dtype"] = ["bfloat16" if row[-1] else "float32" for row in d["u"]]

    def name(i: int) -> str:
        return "<input>" if i < 0 else names[i]

    tensors = pd.DataFrame(
        [dict(bytes=b, producer=name(p), consumers=[names[c] for c in cs],
              savers=[names[s] for s in sv], is_output=bool(o), requires_grad=bool(rg),
              per_sample=bool(ps)) for b, p, cs, sv, o, rg, ps in d["t"]])
    return OpGraph(units, tensors, d["meta"])


def encode_strategy(s, devices: list[str]) -> dict:
    """A strategy in a few lists: policy codes, error bounds, placements, stages."""
    lay = [[k[0], k[1], k[2], [devices.index(x) for x in k[3]]] for k in s.layouts]
    eb = {str(i): float(s.error_bound[i]) for i in np.flatnonzero(~np.isnan(s.error_bound))}
    return {"pol": "".join(map(str, s.policy.tolist())), "eb": eb, "lay": lay,
            "li": s.layout_ids.tolist(), "st": s.stage.tolist(), "mb": s.microbatches,
            "sch": s.schedule}


def decode_strategy(d: dict, graph, devices: list[str]):
    from memflow.strategy import Strategy
    n = len(d["li"])
    lay = [d["lay"][i] for i in d["li"]]
    eb = np.full(n, np.nan)
    for i, v in d["eb"].items():
        eb[int(i)] = v
    return Strategy(graph.names, devices=[[devices[x] for x in k[3]] for k in lay],
                    policy=[int(c) for c in d["pol"]], error_bound=eb,
                    sample=[k[0] for k in lay], parameter=[k[1] for k in lay],
                    attribute=[k[2] for k in lay], stage=d["st"], microbatches=d["mb"],
                    schedule=d["sch"])


def record(graph, strategy, cluster, optimizer: str, precision: str | None) -> dict:
    """What the simulator (and, for one device, ``memflow.estimate``) says of a case."""
    from memflow.memory import CATEGORIES
    from memflow.sim import estimate
    from memflow.sim import Simulator

    sim = Simulator(graph, cluster, optimizer=optimizer, precision=precision)
    r = sim.result(strategy)
    run = r.run
    tl = r.timeline
    tl = tl.assign(busy=tl["end"] - tl["start"])
    kinds = tl.groupby("kind").agg(n=("task", "size"), busy=("busy", "sum"),
                                   bytes=("bytes", "sum"))
    L = run.device
    alloc = np.zeros(len(CATEGORIES))
    for pos in run.devices_used:
        mine = (L.cls == run.device_class[pos]) & (L.delta > 0)
        np.add.at(alloc, L.category[mine], L.delta[mine])
    def short(values) -> list:
        return [_short(x, 13) for x in values]

    out = {"it": _short(r.iteration_time, 13), "peak": short(r.peak_memory),
           "host": short(r.host_peak), "feas": bool(r.feasible),
           "tl": {k: [int(v.n), *short([v.busy, v.bytes])] for k, v in kinds.iterrows()},
           "alloc": short(alloc), "at_peak": short(r.breakdown().sum(axis=0))}
    ev = sim.evaluate(strategy)      # the search's path must agree with the full result
    assert ev.iteration_time == r.iteration_time and ev.peak.max() == r.peak_memory.max()
    if len(strategy.device_names) == 1:
        dev = "cuda" if graph.meta.get("backend") == "cuda" else "cpu"
        est = estimate(graph, dev, optimizer=optimizer, strategy=strategy)
        out["est"] = [_short(est.attrs["peak"], 13), est.attrs["peak_task"]]
    return out


def differences(want, got, path: str = "", rel: float = 1e-9) -> list[str]:
    """Where ``got`` differs from ``want`` (numbers to ``rel``), as readable paths."""
    if isinstance(want, dict):
        keys = sorted(set(want) | set(got))
        return [d for k in keys for d in differences(want.get(k), got.get(k), f"{path}.{k}", rel)]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} entries, got {len(got)}"]
        return [d for i, (a, b) in enumerate(zip(want, got))
                for d in differences(a, b, f"{path}[{i}]", rel)]
    if isinstance(want, (int, float)) and isinstance(got, (int, float)) \
            and not isinstance(want, bool):
        if math.isclose(want, got, rel_tol=rel, abs_tol=1e-15) or (want != want and got != got):
            return []
        return [f"{path}: {want!r} became {got!r}"]
    return [] if want == got else [f"{path}: {want!r} became {got!r}"]


def recompute(doc: dict, case: dict) -> dict:
    import memflow
    graph = decode_graph(doc["graphs"][case["g"]])
    cluster = memflow.Cluster.preset(case["c"])
    devices = [str(d) for d in cluster.devices.index]
    s = decode_strategy(case["s"], graph, devices)
    return record(graph, s, cluster, case["o"], case["p"])


# ---------------------------------------------------------------------- drawing cases
def _random_cases(count: int) -> tuple[dict, list[dict]]:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    import memflow
    from sim.graphs import graphs, strategies_for

    clusters = ["2x4xV100-16GB", "2x4xV100-16GB", "2x4xV100-16GB", "jetson-nano-4GB"]
    found: list[tuple] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draw(data):
        name = clusters[len(found) % len(clusters)]
        devices = [str(d) for d in memflow.Cluster.preset(name).devices.index]
        g = data.draw(graphs())
        s = data.draw(strategies_for(g, devices if len(devices) >= 8
                                     else [f"gpu{i}" for i in range(8)]))
        if set(s.device_names) - set(devices):   # a small cluster: everything on one device
            s = s.with_config(g.names, sample=1, parameter=1, attribute=1, stage=-1,
                              devices=[devices[0]])
        found.append((g, s, name, data.draw(st.sampled_from(["sgd", "momentum", "adam"])),
                      data.draw(st.sampled_from([None, None, "amp"]))))

    draw()
    graphs_doc, cases = {}, []
    for i, (g, s, cname, opt, prec) in enumerate(found):
        key = f"r{i}"
        devices = [str(d) for d in memflow.Cluster.preset(cname).devices.index]
        try:
            s.validate(g, memflow.Cluster.preset(cname))
        except memflow.errors.StrategyError:
            continue
        graphs_doc[key] = encode_graph(g)
        cases.append({"g": key, "c": cname, "o": opt, "p": prec, "s": encode_strategy(s, devices)})
    return graphs_doc, cases


ZOO = {"resnet50": dict(batch_size=16, image_size=32),
       "resnet50-blocks": dict(batch_size=16, image_size=32, units="blocks"),
       "gpt2": dict(batch_size=8, seq_len=32, n_layer=2),
       "gpt2-blocks-bf16": dict(batch_size=8, seq_len=32, n_layer=4, units="blocks",
                                autocast="bfloat16", backend="cuda"),
       "vgg16": dict(batch_size=8, image_size=32)}


def _zoo_cases(per_graph: int) -> tuple[dict, list[dict]]:
    import memflow
    from memflow.strategy import Strategy

    rng = np.random.default_rng(2026)
    graphs_doc, cases = {}, []
    for key, kw in ZOO.items():
        g = memflow.zoo.graph(key.split("-")[0], **kw)
        g = decode_graph(encode_graph(g))
        graphs_doc[key] = encode_graph(g)
        c = memflow.Cluster.preset("2x4xV100-16GB")
        builders = [lambda: Strategy.single_device(g), lambda: Strategy.data_parallel(g, 4),
                    lambda: Strategy.data_parallel(g, c),
                    lambda: Strategy.hybrid(g, c, dp=2, mp=4),
                    lambda: memflow.strategy.pipeline(g, 4, stages=4, microbatches=4),
                    lambda: memflow.strategy.pipeline(g, 8, stages=4, microbatches=2, dp=2,
                                                      schedule="gpipe"),
                    lambda: Strategy.tensor_parallel(g, 8, tp=2, pp=2, dp=2, microbatches=2)]
        devices = [str(d) for d in c.devices.index]
        for j in range(per_graph):
            s = builders[j % len(builders)]()
            pol = rng.choice(4, size=len(g), p=[0.4, 0.3, 0.15, 0.15])
            if j % len(builders) == 0 and j < len(builders):
                pol[:] = 0
            s = s.with_policy({u: ["keep", "recompute", "offload", "compress:1e-2"][p]
                               for u, p in zip(g.names, pol)})
            cases.append({"g": key, "c": "2x4xV100-16GB",
                          "o": ["sgd", "adam", "momentum"][j % 3],
                          "p": None if j % 4 else "amp", "s": encode_strategy(s, devices)})
    return graphs_doc, cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--new", action="store_true", help="draw the cases anew")
    ap.add_argument("--write", action="store_true", help="recompute the stored cases' records")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE.parent))
    if args.new:
        g1, c1 = _random_cases(230)
        g2, c2 = _zoo_cases(10)
        doc = {"graphs": {**g1, **g2}, "cases": c1 + c2}
    else:
        doc = json.loads(PATH.read_text())
    if not (args.new or args.write):
        ap.error("give --new or --write")
    for i, case in enumerate(doc["cases"]):
        case["r"] = recompute(doc, case)
        if i % 50 == 0:
            print(i, "/", len(doc["cases"]), flush=True)
    PATH.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"{len(doc['cases'])} cases, {PATH.stat().st_size:,} bytes in {PATH}")


if __name__ == "__main__":
    main()
