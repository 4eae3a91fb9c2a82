"""The durations of a strategy's tasks: what the placements fix (compute, tensor-parallel and
DDP all-reduces, gathers and scatters, the optimizer step, copies), then what the memory
policies change (host time factors, compression speed, selective recomputation)."""
from __future__ import annotations

import numpy as np

from ..memory.arrays import graph_arrays
from ..memory.blocks import StepBlocks
from ..memory.states import stage_copies
from ..strategy.policies import POLICIES
from ..strategy.strategy import Strategy
from .costs import CPU_ADAM_RATE, OPTIMIZER_LAUNCHES, ring_time, tied_allreduce
from .expand import Timing
from .run import ByLayouts, Placement
from .structure import Structure

__all__ = ["placement_timing", "policy_timing"]

# columns of a layout's row of rates (Simulator._lc_row)
_DEGREE, _FLOPS32, _FLOPS16, _MEM, _LAUNCH, _PARAM_RING, _REPLICA_RING, _D2H, _H2D = \
    0, 1, 2, 3, 4, 5, 8, 11, 13


def placement_timing(sim, strategy: Strategy, S: Structure, states,
                     routes: ByLayouts) -> Timing:
    """Durations that the placements (and the model states) fix; ``sim`` is the
    :class:`~memflow.sim.simulator.Simulator` whose per-layout costs they read."""
    ga, M = sim.arrays(strategy), strategy.microbatches
    keys = strategy.layouts
    lcs = [sim._lc(k) for k in keys]
    L = strategy.layout_ids
    # one row of rates per layout (cached by placement key), spread over the units
    rates = np.stack([sim._lc_row(k, lc) for k, lc in zip(keys, lcs)])
    deg = rates[L, _DEGREE] * M
    half = ga.half | (sim.precision_of(strategy) != "fp32")
    f32, f16 = rates[L, _FLOPS32], rates[L, _FLOPS16]
    mem = rates[:, _MEM]
    launch = rates[L, _LAUNCH]
    ring = rates[L, _PARAM_RING:_PARAM_RING + 3]
    rate = np.where(half, f16, f32)

    def compute(flops, moved, ops, work):
        return (np.maximum(flops / deg / rate, moved / deg / mem[L]) + ops * launch
                + ring_time(work, ring[:, 0], ring[:, 1], ring[:, 2]))

    fwd = compute(ga.fwd_flops, ga.fwd_bytes_moved, ga.fwd_ops, S.tp_out)
    cheap = compute(ga.fwd_flops - ga.expensive_fwd_flops,
                    ga.fwd_bytes_moved - ga.expensive_fwd_bytes_moved,
                    ga.fwd_ops - ga.expensive_fwd_ops, S.tp_out)
    bwd = compute(ga.bwd_flops, ga.bwd_bytes_moved, ga.bwd_ops, S.tp_in)
    rr = rates[:, _REPLICA_RING:_REPLICA_RING + 3][S.bucket_layout]
    allreduce = ring_time(S.bucket_bytes, rr[:, 0], rr[:, 1], rr[:, 2])
    # ring all-gather and reduce-scatter each move half an all-reduce's bytes
    ru = rates[L, _REPLICA_RING:_REPLICA_RING + 3]
    gather = ring_time(S.gather, ru[:, 0], ru[:, 1], ru[:, 2]) / 2
    scatter = ring_time(S.scatter, ru[:, 0], ru[:, 1], ru[:, 2]) / 2
    optimizer = (np.bincount(L, weights=states.update, minlength=len(keys)) / mem
                 + OPTIMIZER_LAUNCHES * rates[:, _LAUNCH])
    if strategy.stage.max() > 0:
        whole = graph_arrays(sim.graph)      # the weights as the graph has them, once
        optimizer += tied_allreduce(whole, stage_copies(whole, strategy.stage), L, keys,
                                    sim._cc)
    off = strategy.offload_optimizer
    for i in np.unique(L[(states.regather > 0) | off]).tolist():
        lc, mine = lcs[i], L == i
        # ZeRO-1/2: each replica updated its shard; the new parameters are all-gathered
        regather = states.regather[mine]
        if regather.any():
            optimizer[i] += float(ring_time(regather.sum(), *lc.replica_ring)) / 2
        if off[mine].any():    # ZeRO-Offload: gradients down, CPU Adam, parameters up
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
    (at the code width of the unit's ratio), as one rate over the bytes it compresses; a
    selective unit's recomputation re-runs its cheap ops only."""
    scale = POLICIES.host_scales[strategy.policy]
    units = np.flatnonzero(plan.compressed > 0)
    sel = POLICIES.selective(strategy.policy)
    fixed = {"host_scale": scale}
    if sel.any():
        fixed["recompute"] = np.where(sel, P.timing.cheap_forward, P.timing.forward)
    if not len(units):
        if (scale == 1.0).all() and not sel.any():
            return P.timing
        return Timing(**{**P.timing.__dict__, **fixed})
    comp, decomp = np.ones(sim.ga.n), np.ones(sim.ga.n)
    ratio, half = sim._ratios(strategy), sim._half_maps(strategy)
    _, throughput, launches = sim.compression
    for u in units.tolist():
        lay, eb = int(strategy.layout_ids[u]), float(strategy.error_bound[u])
        bits = (16 if half[u] else 32) / ratio[u]
        nbytes = float(plan.compressed[u])
        for out, back in ((comp, False), (decomp, True)):
            k = (float(P.mem_rate[lay]), back, eb)
            r = sim._rates.get(k)
            if r is None:
                r = sim._rates[k] = throughput(k[0], decompress=back, error_bound=eb)
            out[u] = nbytes / (nbytes / r + launches(bits, decompress=back) * P.launch[lay])
    return Timing(**{**P.timing.__dict__, "compress": comp, "decompress": decomp, **fixed})

