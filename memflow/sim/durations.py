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
from .costs import CPU_ADAM_RATE, OPTIMIZER_LAUNCHES, pairwise_sum, ring_time, tied_allreduce
from .cpu_time import cpu_compute, cpu_hooks, cpu_optimizer
from .expand import Timing
from .layouts import (D2H, DEGREE, FLOPS16, FLOPS32, FLOPS_BF16, H2D, LAUNCH, MEM, PARAM_RING,
                      REPLICA_RING)
from .precision import bf16_units
from .run import ByLayouts, Placement
from .shapes import shaped_rates
from .structure import Structure, _by_key

__all__ = ["placement_timing", "policy_timing"]


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
def _unit_durations(L, M, rates, half, bf16, tp_out, tp_in, gather, scatter, fwd_flops,
                    fwd_moved, fwd_ops, exp_flops, exp_moved, exp_ops, bwd_flops, bwd_moved,
                    bwd_ops, out):
    """Per unit, into the rows of ``out``: its forward (roofline of its flops and bytes moved
    at its layout's rates, row ``L[u]`` of ``rates``, kernel launches, the tensor-parallel
    all-reduce of its outputs), the forward of its cheap ops only (what a selective
    recomputation re-runs), its backward (the all-reduce of its input gradients), its
    parameters' all-gather and gradients' reduce-scatter (each half a ring all-reduce), its
    degree (its layout's devices times ``M`` micro-batches) and its flop rate (16-bit where
    ``half``: bfloat16's where ``bf16`` too). One compiled pass: as numpy expressions these
    were ~50 calls on arrays of a few hundred units, a fifth of a new placement."""
    for u in range(len(L)):
        r = rates[L[u]]
        deg = r[DEGREE] * M
        rate = (r[FLOPS_BF16] if bf16[u] else r[FLOPS16]) if half[u] else r[FLOPS32]
        mem, launch = r[MEM], r[LAUNCH]
        ring, replica = r[PARAM_RING:PARAM_RING + 3], r[REPLICA_RING:REPLICA_RING + 3]
        t_out = _ring(tp_out[u], ring[0], ring[1], ring[2])
        out[0, u] = _compute(fwd_flops[u], fwd_moved[u], fwd_ops[u], deg, rate, mem, launch,
                             t_out)
        out[1, u] = _compute(fwd_flops[u] - exp_flops[u], fwd_moved[u] - exp_moved[u],
                             fwd_ops[u] - exp_ops[u], deg, rate, mem, launch, t_out)
        out[2, u] = _compute(bwd_flops[u], bwd_moved[u], bwd_ops[u], deg, rate, mem, launch,
                             _ring(tp_in[u], ring[0], ring[1], ring[2]))
        out[3, u] = _ring(gather[u], replica[0], replica[1], replica[2]) / 2
        out[4, u] = _ring(scatter[u], replica[0], replica[1], replica[2]) / 2
        out[5, u], out[6, u] = deg, rate


@njit
def _sum_of(values, units, off, offloaded_only, buf):
    """``np.sum`` of ``values`` over ``units`` (ascending), the offloaded ones only if
    ``offloaded_only``."""
    k = 0
    for u in units:
        if off[u] or not offloaded_only:
            buf[k] = values[u]
            k += 1
    return pairwise_sum(buf[:k], 0.0)


@njit
def _layout_durations(L, rates, update, bucket_layout, bucket_bytes, regather, off,
                      gradients, host_elements, weights):
    """Per DDP bucket its ring all-reduce; per layout its optimizer step (the bytes its
    units' updates move, summed in ``np.bincount``'s order, plus the step's kernel
    launches), the all-gather after it of the parameters its ZeRO-1/2 shards updated and
    whether it has one, and the sums a ZeRO-Offload step moves and computes (its offloaded
    units' gradients and weights, all its units' host elements, each as ``np.sum`` of the
    units ascending gives it) and the layouts that offload. One compiled pass instead of ~10
    numpy calls per layout."""
    n_lay = len(rates)
    allreduce = np.empty(len(bucket_bytes))
    for b in range(len(bucket_bytes)):
        r = rates[bucket_layout[b]]
        allreduce[b] = _ring(bucket_bytes[b], r[REPLICA_RING], r[REPLICA_RING + 1],
                             r[REPLICA_RING + 2])
    moved = np.zeros(n_lay)
    for u in range(len(L)):
        moved[L[u]] += update[u]
    optimizer = np.empty(n_lay)
    for i in range(n_lay):
        optimizer[i] = moved[i] / rates[i, MEM] + OPTIMIZER_LAUNCHES * rates[i, LAUNCH]
    # the units by layout, ascending within each (the order a mask picks them in)
    ptr, units = _by_key(L, n_lay, np.arange(len(L)))
    regathers = np.zeros(n_lay)
    gathers = np.zeros(n_lay, np.bool_)
    sums = np.zeros((3, n_lay))
    offloads = np.zeros(n_lay, np.bool_)
    buf = np.empty(len(L))
    for i in range(n_lay):
        mine = units[ptr[i]:ptr[i + 1]]
        busy = False
        for u in mine:
            busy |= regather[u] > 0 or off[u]
            gathers[i] |= regather[u] != 0
            offloads[i] |= off[u]
        gathers[i] &= busy
        if gathers[i]:     # ZeRO-1/2: each replica updated its shard, all-gathered after
            r = rates[i]
            regathers[i] = _ring(_sum_of(regather, mine, off, False, buf), r[REPLICA_RING],
                                 r[REPLICA_RING + 1], r[REPLICA_RING + 2]) / 2
        if offloads[i]:
            sums[0, i] = _sum_of(gradients, mine, off, True, buf)
            sums[1, i] = _sum_of(host_elements, mine, off, False, buf)
            sums[2, i] = _sum_of(weights, mine, off, True, buf)
    return allreduce, optimizer, regathers, gathers, sums, np.flatnonzero(offloads)


def placement_timing(sim, strategy: Strategy, S: Structure, states,
                     routes: ByLayouts) -> Timing:
    """Durations that the placements (and the model states) fix; ``sim`` is the
    :class:`~memflow.sim.simulator.Simulator` whose per-layout costs they read."""
    ga = sim.arrays(strategy)
    keys = strategy.layouts
    lcs = routes.of.lcs
    L = strategy.layout_ids
    # one row of rates per layout (kept per list of layouts), read per unit by the kernels
    rates = routes.of.rates
    precision = sim.precision_of(strategy)
    per_unit = np.empty((7, ga.n))  # forward, its cheap ops, backward, gather, scatter, degree,
    _unit_durations(                # flop rate
        L, strategy.microbatches, rates, ga.half | (precision != "fp32"),
        # bfloat16 runs at the 16-bit rate only on devices with bf16 units (LayoutCost)
        bf16_units(sim.graph, precision), S.tp_out, S.tp_in, S.gather, S.scatter,
        ga.fwd_flops, ga.fwd_bytes_moved, ga.fwd_ops, ga.expensive_fwd_flops,
        ga.expensive_fwd_bytes_moved, ga.expensive_fwd_ops, ga.bwd_flops, ga.bwd_bytes_moved,
        ga.bwd_ops, per_unit)
    fwd, cheap, bwd, gather, scatter, deg, rate = per_unit
    off = strategy.offload_optimizer
    allreduce, optimizer, regathers, gathers, sums, offloads = _layout_durations(
        L, rates, states.update, S.bucket_layout, S.bucket_bytes, states.regather, off,
        states.gradients, states.host_elements, states.weights)
    if sim._cpu is not None:              # a CPU measured here: its own time model
        tensors, table = sim._cpu_tensors[0], sim._cpu["kernel_rates"]
        ring = rates[L, PARAM_RING:PARAM_RING + 3]
        # the units' matmuls and convolutions at their shape classes' rates, where measured
        shaped = None if table is None else shaped_rates(sim._cpu_tensors[2], table, deg)
        fwd, cheap, bwd = (t + ring_time(w, ring[:, 0], ring[:, 1], ring[:, 2]) for t, w in
                           zip(cpu_compute(ga, sim._cpu, rate, deg, tensors, shaped),
                               (S.tp_out, S.tp_out, S.tp_in)))
        mem = rates[:, MEM]
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
        optimizer[last] += float(ring_time(4.0, *rates[last, REPLICA_RING:REPLICA_RING + 3]))
    if len(S.final_mb) > 1:               # a pipeline
        whole = graph_arrays(sim.graph)      # the weights as the graph has them, once
        optimizer += tied_allreduce(whole, stage_copies(whole, strategy.stage), L, keys,
                                    sim._cc)
    # ZeRO-1/2's all-gathers, then ZeRO-Offload's: gradients down, CPU Adam, parameters up
    np.add(optimizer, regathers, out=optimizer, where=gathers)
    if len(offloads):
        gradients, host_elements, weights = sums.tolist()
        for i in offloads.tolist():
            lc, hosts = lcs[i], routes.of.layout_hosts[i].tolist()
            on_host = max(hosts.count(h) for h in set(hosts))    # its devices on one host
            optimizer[i] += (gradients[i] * lc.d2h[1]
                             + on_host * host_elements[i] / CPU_ADAM_RATE
                             + weights[i] * lc.h2d[1] + lc.d2h[2] + lc.h2d[2])
    return Timing(forward=fwd, backward=bwd, allreduce=allreduce, copy=routes.copy,
                    copy_back=routes.back,
                    d2h=rates[:, D2H:D2H + 2], h2d=rates[:, H2D:H2D + 2],
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

