"""SimResult: one simulated training step, with DataFrames made on first use."""
from __future__ import annotations

import html
from functools import cached_property

import numpy as np
import pandas as pd

from .._tables import ReadableFrame
from .._units import format_bytes
from ..memory.blocks import CATEGORIES
from .kinds import R_COMPUTE, R_COPY, R_COPYBACK, ROLES, TASK_KINDS

__all__ = ["SimResult"]


class SimResult:
    """Time and memory of one training step of a strategy on a cluster.

    Attributes follow ``docs/data-model.md`` ("SimResult"): ``iteration_time`` (s),
    ``throughput`` (samples/s), ``peak_memory`` and ``capacity`` (Series by device, devices the
    strategy uses), ``feasible``, ``over_capacity`` (the devices, then the hosts, whose peak
    exceeds their memory), ``timeline`` and ``memory`` (DataFrames), ``host_peak`` and
    ``host_capacity`` (Series by host) and :meth:`summary`.
    """

    def __init__(self, simulator, run):
        self._sim, self._run = simulator, run
        self.strategy = run.strategy
        self.iteration_time = run.iteration_time
        batch = simulator.ga.batch_size or 1
        self.throughput = batch / self.iteration_time if self.iteration_time > 0 else float("inf")
        ca = simulator.ca
        used = run.devices_used
        names = ca.devices[used]
        self.peak_memory = pd.Series(run.device.peak[run.device_class[used]], index=names,
                                     name="peak_memory")
        self.capacity = pd.Series(ca.memory[used], index=names, name="capacity")
        hosts = np.unique(ca.host[used])
        host_names = simulator.cluster.hosts.index[hosts]
        self.host_peak = pd.Series(run.host.peak[hosts], index=host_names, name="host_peak")
        # offloaded bytes need room on the host: none where an edge board's memory is unified
        self.host_capacity = pd.Series(ca.host_memory[hosts], index=host_names,
                                       name="host_capacity")
        self.over_capacity = [str(d) for d in names[self.peak_memory.to_numpy()
                                                    > self.capacity.to_numpy()]] + \
            [str(h) for h in host_names[self.host_peak.to_numpy()
                                        > self.host_capacity.to_numpy()]]
        self.feasible = not self.over_capacity

    @property
    def run(self):
        """The raw arrays of the simulation (:class:`~memflow.sim.simulator.Run`)."""
        return self._run

    @cached_property
    def timeline(self) -> pd.DataFrame:
        """One row per task: ``task``, ``kind``, ``unit``, ``microbatch``, ``resource``
        (devices or links, as a comma-separated string), ``start``, ``end``, ``bytes``."""
        r, sim = self._run, self._sim
        T = r.tasks
        names = np.array(list(sim.ga.names) + [""], dtype=object)
        keys = r.strategy.layouts
        links = sim.cluster.links
        n = len(sim.ca.devices)
        raw_ptr, raw = r.placement.raw_sets

        def resource(role: int, key: int, chan_set: int) -> str:
            if role in (R_COPY, R_COPYBACK) or ROLES[role] in ("to-host", "from-host"):
                return ",".join(f"{links['src'].iat[c - 2 * n]}->{links['dst'].iat[c - 2 * n]}"
                                for c in raw[raw_ptr[chan_set]:raw_ptr[chan_set + 1]])
            devs = ",".join(keys[key][3])
            return devs if ROLES[role] == "compute" else f"comm:{devs}"

        sets, first = np.unique(T.channel_set, return_index=True)
        label = {int(c): resource(int(T.role[i]), int(T.key[i]), int(c))
                 for c, i in zip(sets, first)}
        return pd.DataFrame({
            "task": np.arange(len(T.kind)),
            "kind": np.array(TASK_KINDS, dtype=object)[T.kind],
            "unit": names[T.unit],
            "microbatch": T.mb,
            "resource": [label[c] for c in T.channel_set.tolist()],
            "start": r.start, "end": r.end, "bytes": T.work})

    @cached_property
    def memory(self) -> pd.DataFrame:
        """Bytes on each device after each change: ``device``, ``time``, ``bytes`` and one
        column per category."""
        r, sim = self._run, self._sim
        L = r.device
        frames = []
        cat = np.zeros((len(L.delta), len(CATEGORIES)))
        cat[np.arange(len(L.delta)), L.category] = L.delta
        for c in np.unique(r.device_class[r.devices_used]):
            sel = L.cls == c
            run = np.cumsum(cat[sel], 0) + L.persistent[c]
            devs = sim.ca.devices[r.devices_used[r.device_class[r.devices_used] == c]]
            part = pd.DataFrame(run, columns=list(CATEGORIES))
            part.insert(0, "bytes", L.total[sel])
            part.insert(0, "time", L.time[sel])
            for d in devs:
                frames.append(part.assign(device=str(d)))
        if not frames:
            return pd.DataFrame(columns=["device", "time", "bytes", *CATEGORIES])
        out = pd.concat(frames, ignore_index=True)
        return out[["device", "time", "bytes", *CATEGORIES]]

    @property
    def precision(self) -> str:
        """The precision the step trained in: the strategy's, else the simulator's default."""
        return self._sim.precision_of(self.strategy)

    @property
    def optimizer(self) -> str:
        """The optimizer the step was simulated with (:data:`memflow.strategy.OPTIMIZERS`)."""
        return self._sim.optimizer

    @cached_property
    def model_states(self) -> pd.DataFrame:
        """Per device (rows, the devices the strategy uses): bytes of ``weights``,
        ``gradients`` and ``optimizer`` state it holds, each category's maximum over the step.

        Sharded states count as the shard each device owns; FSDP's gathered parameters and
        a gradient's full size before its reduce-scatter are communication buffers, not model
        states, and optimizer states offloaded to the host are not on the device
        (``docs/data-model.md``, "Model states").

        >>> import memflow
        >>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
        >>> four = memflow.Cluster.preset("4xV100-16GB")
        >>> s = memflow.Strategy.data_parallel(g, four, shard="parameters", precision="bf16")
        >>> ms = memflow.simulate(g, s, four, optimizer="adam").model_states
        >>> list(ms.columns), len(ms)
        (['weights', 'gradients', 'optimizer'], 4)
        """
        r = self._run
        L = r.device
        keep = [CATEGORIES.index(c) for c in ("weights", "gradients", "optimizer")]
        cat = np.zeros((len(L.delta), len(CATEGORIES)))
        cat[np.arange(len(L.delta)), L.category] = L.delta
        per_class: dict[int, np.ndarray] = {}
        rows = []
        for pos in r.devices_used:
            c = int(r.device_class[pos])
            if c not in per_class:
                run = np.cumsum(cat[L.cls == c], 0) + L.persistent[c]
                per_class[c] = np.vstack([L.persistent[c][None], run]).max(0)[keep]
            rows.append(per_class[c])
        return pd.DataFrame(np.array(rows).reshape(-1, 3), index=self.peak_memory.index,
                            columns=["weights", "gradients", "optimizer"])

    def breakdown(self) -> pd.DataFrame:
        """Per device: bytes of each category at that device's peak."""
        r = self._run
        L = r.device
        rows = {}
        for d, pos in zip(self.peak_memory.index, r.devices_used):
            c = r.device_class[pos]
            ev = L.peak_event[c]
            sel = np.flatnonzero(L.cls == c)
            upto = sel[sel <= ev] if ev >= 0 else sel[:0]
            vals = L.persistent[c].copy()
            np.add.at(vals, L.category[upto], L.delta[upto])
            rows[d] = vals
        return pd.DataFrame.from_dict(rows, orient="index", columns=list(CATEGORIES))

    def summary(self) -> pd.DataFrame:
        """Per device: ``peak``, ``capacity``, ``headroom`` (bytes), ``compute_busy`` (seconds
        its compute stream works) and ``utilization`` (busy / step time).

        The numbers stay plain for code; printed, they read in GiB, ms and %, under this
        result's one-line summary (a :class:`~memflow._tables.ReadableFrame`).

        >>> import memflow
        >>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16)
        >>> one = memflow.Cluster.preset("1xV100-16GB")
        >>> s = memflow.simulate(g, memflow.Strategy.single_device(g), one).summary()
        >>> print(s)
        <SimResult 'single device': 0.14 ms/step, 59,239.4 samples/s, peak 7.31 KiB on 1 devices, feasible>
                    peak  capacity  headroom compute_busy utilization
        device
        gpu0    7.31 KiB  16.0 GiB  16.0 GiB       135 µs        100%
        >>> bool(s.loc["gpu0", "capacity"] == 16 * 2**30)
        True
        """
        r, sim = self._run, self._sim
        role, key = r.tasks.role, r.tasks.key
        compute = role == R_COMPUTE
        per_layout = np.bincount(key[compute], weights=r.duration[compute],
                                 minlength=len(r.strategy.layouts))
        busy = np.zeros(len(sim.ca.devices))
        for L, k in enumerate(r.strategy.layouts):
            busy[sim.ca.devices.get_indexer(list(k[3]))] += per_layout[L]
        busy = pd.Series(busy[r.devices_used], index=self.peak_memory.index)
        return ReadableFrame({"peak": self.peak_memory, "capacity": self.capacity,
                              "headroom": self.capacity - self.peak_memory,
                              "compute_busy": busy,
                              "utilization": busy / self.iteration_time},
                             units={"peak": "bytes", "capacity": "bytes", "headroom": "bytes",
                                    "compute_busy": "seconds", "utilization": "share"},
                             caption=repr(self))

    def __repr__(self) -> str:
        worst = self.peak_memory.max() if len(self.peak_memory) else 0.0
        state = "feasible" if self.feasible else f"OUT OF MEMORY on {', '.join(self.over_capacity[:4])}"
        return (f"<SimResult {self.strategy.name!r}: {self.iteration_time * 1e3:,.2f} ms/step, "
                f"{self.throughput:,.1f} samples/s, peak {format_bytes(worst)} on "
                f"{len(self.peak_memory)} devices, {state}>")

    def _repr_html_(self) -> str:
        s = self.summary().readable()
        color = "#2a7" if self.feasible else "#c33"
        return (f"<div><b style='color:{color}'>{html.escape(repr(self))}</b>"
                f"{s.head(16).to_html()}"
                + (f"<p>… {len(s) - 16} more devices</p>" if len(s) > 16 else "") + "</div>")
