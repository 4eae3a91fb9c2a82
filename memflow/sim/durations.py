"""The durations of a strategy's tasks: what the placements fix (compute, tensor-parallel and
DDP all-reduces, gathers and scatters, the optimizer step, copies), then what the memory
policies change (host time factors, compression speed, selective recomputation)."""
from __future__ import annotations

import numpy as np

from ..graph.mapkind import MAP_KINDS
from ..memory.arrays import graph_arrays
from ..memory.jit import njit
from ..memory.blocks import StepBlocks
from ..memory.states import stage_copies
from ..strategy.policies import M_COMPRESSED, M_HOST, M_RECOMPUTE, M_SELECTIVE, POLICIES
from ..strategy.strategy import Strategy
from .costs import CPU_ADAM_RATE, OPTIMIZER_LAUNCHES, ring_time, tied_allreduce
from .cpu_time import cpu_compute, cpu_hooks, cpu_optimizer
from .expand import Timing
from .precision import bf16_units
from .run import ByLayouts, Placement
from .shapes import shaped_rates
from .structure import Structure

__all__ = ["placement_timing", "policy_timing"]

# columns of a layout's row of rates (Simulator._lc_row)
_DEGREE, _FLOPS32, _FLOPS16, _MEM, _LAUNCH, _PARAM_RING, _REPLICA_RING, _D2H, _H2D, \
    _FLOPS_BF16 = 0, 1, 2, 3, 4, 5, 8, 11, 13, 15


@njit
def _ring(nbytes, bandwidth, latency, members):
    """:func:`~memflow.sim.costs.ring_time` of one all-reduce, the same operations in the
    same order (so the same bits)."""
    if members > 1:
        n = max(members, 1.0)
        return 2 * (n - 1) / n * nbytes / bandwidth + 2 * (n - 1) * latency
    return 0.0


@njit
def _compute(flops, moved, ops, deg, rate, mem, launch, tp):
    a, b = flops / deg / rate, moved / deg / mem
    return (a if a >= b or a != a else b) + ops * launch + tp      # np.maximum, NaN first


@njit
def _unit_durations(deg, rate, mem, launch, ring, replica, tp_out, tp_in, gather, scatter,
                    fwd_flops, fwd_moved, fwd_ops, exp_flops, exp_moved, exp_ops, bwd_flops,
                    bwd_moved, bwd_ops, out):
    """Per unit, into the rows of ``out``: its forward (roofline of its flops and bytes moved,
    kernel launches, the tensor-parallel all-reduce of its outputs), the forward of its cheap
    ops only (what a selective recomputation re-runs), its backward (the all-reduce of its
    input gradients), and its parameters' all-gather and gradients' reduce-scatter (each half
    a ring all-reduce). One compiled pass: as numpy expressions these were ~40 calls on
    arrays of a few hundred units, a fifth of a new placement."""
    for u in range(len(deg)):
        t_out = _ring(tp_out[u], ring[u, 0], ring[u, 1], ring[u, 2])
        out[0, u] = _compute(fwd_flops[u], fwd_moved[u], fwd_ops[u], deg[u], rate[u], mem[u],
                             launch[u], t_out)
        out[1, u] = _compute(fwd_flops[u] - exp_flops[u], fwd_moved[u] - exp_moved[u],
                             fwd_ops[u] - exp_ops[u], deg[u], rate[u], mem[u], launch[u], t_out)
        out[2, u] = _compute(bwd_flops[u], bwd_moved[u], bwd_ops[u], deg[u], rate[u], mem[u],
                             launch[u], _ring(tp_in[u], ring[u, 0], ring[u, 1], ring[u, 2]))
        out[3, u] = _ring(gather[u], replica[u, 0], replica[u, 1], replica[u, 2]) / 2
        out[4, u] = _ring(scatter[u], replica[u, 0], replica[u, 1], replica[u, 2]) / 2


def placement_timing(sim, strategy: Strategy, S: Structure, states,
                     routes: ByLayouts) -> Timing:
    """Durations that the placements (and the model states) fix; ``sim`` is the
    :class:`~memflow.sim.simulator.Simulator` whose per-layout costs they read."""
    ga, M = sim.arrays(strategy), strategy.microbatches
    keys = strategy.layouts
    lcs = routes.of.lcs
    L = strategy.layout_ids
    # one row of rates per layout (kept per list of layouts), spread over the units
    rates = routes.of.rates
    deg = rates[L, _DEGREE] * M
    precision = sim.precision_of(strategy)
    half = ga.half | (precision != "fp32")
    # bfloat16 runs at the 16-bit rate only on devices with bf16 units (LayoutCost.flops_bf16)
    rate = np.where(half, np.where(bf16_units(sim.graph, precision), rates[L, _FLOPS_BF16],
                                   rates[L, _FLOPS16]), rates[L, _FLOPS32])
    per_unit = np.empty((5, ga.n))       # forward, its cheap ops, backward, gather, scatter
    _unit_durations(deg, rate, rates[L, _MEM], rates[L, _LAUNCH],
                    rates[L, _PARAM_RING:_PARAM_RING + 3],
                    rates[L, _REPLICA_RING:_REPLICA_RING + 3], S.tp_out, S.tp_in, S.gather,
                    S.scatter, ga.fwd_flops, ga.fwd_bytes_moved, ga.fwd_ops,
                    ga.expensive_fwd_flops, ga.expensive_fwd_bytes_moved, ga.expensive_fwd_ops,
                    ga.bwd_flops, ga.bwd_bytes_moved, ga.bwd_ops, per_unit)
    fwd, cheap, bwd, gather, scatter = per_unit
    if sim._cpu is not None:              # a CPU measured here: its own time model
        tensors, table = sim._cpu_tensors[0], sim._cpu["kernel_rates"]
        ring = rates[L, _PARAM_RING:_PARAM_RING + 3]
        # the units' matmuls and convolutions at their shape classes' rates, where measured
        shaped = None if table is None else shaped_rates(sim._cpu_tensors[2], table, deg)
        fwd, cheap, bwd = (t + ring_time(w, ring[:, 0], ring[:, 1], ring[:, 2]) for t, w in
                           zip(cpu_compute(ga, sim._cpu, rate, deg, tensors, shaped),
                               (S.tp_out, S.tp_out, S.tp_in)))
    mem = rates[:, _MEM]
    rr = rates[:, _REPLICA_RING:_REPLICA_RING + 3][S.bucket_layout]
    allreduce = ring_time(S.bucket_bytes, rr[:, 0], rr[:, 1], rr[:, 2])
    optimizer = (np.bincount(L, weights=states.update, minlength=len(keys)) / mem
                 + OPTIMIZER_LAUNCHES * rates[:, _LAUNCH])
    if sim._cpu is not None:
        optimizer = cpu_optimizer(L, states.update, tensors, mem, sim._cpu)
        # gloo's all-reduce copies and sums on the processes' cores: where they leave no
        # core for its thread, that part of each bucket takes the compute's turn (measured,
        # 2 processes of mlp on 2 busy cores: 3.3 ms of CPU per step in gloo's threads
        # beside 4.2 in the training thread) instead of running beside the backward
        serial = allreduce * (1.0 - sim._cpu["collective_overlap"])
        optimizer = optimizer + np.bincount(S.bucket_layout, weights=serial,
                                            minlength=len(keys))
        allreduce = allreduce - serial
        # the exported step's loss, averaged over the replicas: one tiny all-reduce
        last = int(L[-1])
        optimizer[last] += float(ring_time(4.0, *rates[last, _REPLICA_RING:_REPLICA_RING + 3]))
    if strategy.stage.max() > 0:
        whole = graph_arrays(sim.graph)      # the weights as the graph has them, once
        optimizer += tied_allreduce(whole, stage_copies(whole, strategy.stage), L, keys,
                                    sim._cc)
    off = strategy.offload_optimizer
    busy = (states.regather > 0) | off
    if busy.any():
        # the units by layout, ascending within each: a layout's units are one slice (the
        # same numbers in the same order as a mask picks them, so the same sums), not a
        # mask and two copies per layout
        order = np.argsort(L, kind="stable")
        bounds = np.searchsorted(L[order], np.arange(len(keys) + 1)).tolist()
        by_layout = states.regather[order]
        offloaded = off[order]
    for i in np.unique(L[busy]).tolist():
        lc, a, b = lcs[i], bounds[i], bounds[i + 1]
        # ZeRO-1/2: each replica updated its shard; the new parameters are all-gathered
        regather = by_layout[a:b]
        if regather.any():      # compiled: ring_time's numpy calls on one number
            optimizer[i] += _ring(float(regather.sum()), *lc.replica_ring) / 2
        if offloaded[a:b].any():    # ZeRO-Offload: gradients down, CPU Adam, parameters up
            mine = L == i
            on_host = np.bincount(sim.ca.host[lc.devices]).max()
            optimizer[i] += (float(np.sum(states.gradients[mine & off])) * lc.d2h[1]
                             + on_host * float(np.sum(states.host_elements[mine]))
                             / CPU_ADAM_RATE
                             + float(np.sum(states.weights[mine & off])) * lc.h2d[1]
                             + lc.d2h[2] + lc.h2d[2])
    return Timing(forward=fwd, backward=bwd, allreduce=allreduce, copy=routes.copy,
                    copy_back=routes.back,
                    d2h=rates[:, _D2H:_D2H + 2], h2d=rates[:, _H2D:_H2D + 2],
                    host_scale=np.ones(ga.n), optimizer=optimizer,
                    compress=np.ones(ga.n), decompress=np.ones(ga.n), gather=gather,
                    scatter=scatter, cheap_forward=cheap)


def policy_timing(sim, strategy: Strategy, P: Placement,
                  plan: StepBlocks) -> Timing:
    """``P.timing`` with what the units' policies set: the policy table's host time factor
    (``Policy.host_scale``) and the compression speed of the units that compress — the
    quantizer's memory-bound throughput on the unit's devices plus its kernel launches
    (at the code width of the unit's ratio) — on a CPU the compressor's measured rate plus
    its fixed cost per call, one per saved map — as one rate over the bytes it compresses; a
    selective unit's recomputation re-runs its cheap ops only."""
    scale = POLICIES.host_scales[strategy.policy]
    units = np.flatnonzero(plan.compressed > 0)
    sel = POLICIES.selective(strategy.policy)
    fixed = {"host_scale": scale}
    if sel.any():
        fixed["recompute"] = np.where(sel, P.timing.cheap_forward, P.timing.forward)
    # offload and compress hooks, and recompute's checkpoint: a Python pack and unpack
    hooked = np.isin(POLICIES.mechanism_codes[strategy.policy],
                     (M_HOST, M_COMPRESSED, M_RECOMPUTE, M_SELECTIVE))
    if sim._cpu is not None and hooked.any():     # export's hooks, on the CPU's thread
        fixed["forward"] = P.timing.forward + cpu_hooks(
            plan.offloaded, hooked, sim._cpu_tensors[1], sim._cpu)
    if not len(units):
        if len(fixed) == 1 and (scale == 1.0).all():
            return P.timing
        return Timing(**{**P.timing.__dict__, **fixed})
    comp, decomp = np.ones(sim.ga.n), np.ones(sim.ga.n)
    ratio, half = sim._ratios(strategy), sim._half_maps(strategy)
    _, throughput, launches, per_call = sim.compression
    # a CPU's compressor: its measured rate on each kind of map the unit packs (shares of its
    # bytes) and a fixed cost per call, one per saved map (the GPU quantizer's: one rate)
    calls, by_kind = sim._cpu_tensors[3] if sim._cpu is not None else (None, None)

    def rate(mem: float, back: bool, eb: float, kind: str | None) -> float:
        k = (mem, back, eb, kind)
        if k not in sim._rates:
            sim._rates[k] = throughput(mem, decompress=back, error_bound=eb,
                                       **({} if kind is None else {"kind": kind}))
        return sim._rates[k]
    for u in units.tolist():
        lay, eb = int(strategy.layout_ids[u]), float(strategy.error_bound[u])
        bits = (16 if half[u] else 32) / ratio[u, 0]    # signed maps: the widest codes
        nbytes, mem = float(plan.compressed[u]), float(P.mem_rate[lay])
        kinds = [] if by_kind is None else np.flatnonzero(by_kind[u])
        for out, back in ((comp, False), (decomp, True)):
            per_unit = launches(bits, decompress=back) * P.launch[lay]
            if len(kinds):
                share = by_kind[u, kinds] / by_kind[u, kinds].sum()
                per_byte = sum(f / rate(mem, back, eb, MAP_KINDS[j])
                               for f, j in zip(share, kinds))
                per_unit += sum(calls[u] * f * per_call(decompress=back, error_bound=eb,
                                                        kind=MAP_KINDS[j])
                                for f, j in zip(share, kinds))
            else:
                per_byte = 1.0 / rate(mem, back, eb, None)
            out[u] = nbytes / (nbytes * per_byte + per_unit)
    return Timing(**{**P.timing.__dict__, "compress": comp, "decompress": decomp, **fixed})

