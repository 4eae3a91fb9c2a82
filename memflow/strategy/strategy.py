"""The Strategy value object: per unit a parallel configuration and a memory policy.

A strategy is plain data held in numpy arrays (one entry per unit, in the graph's order), so the
search can copy and modify one cheaply: :meth:`Strategy.with_policy` and
:meth:`Strategy.with_config` return a new strategy sharing every array they do not touch.

Parts of a unit are numbered sample-major, then attribute, then parameter (innermost), so the
parameter (tensor-parallel) group of a unit is a run of adjacent devices — as Megatron-LM places
tensor parallelism inside a node.
"""
from __future__ import annotations

import html
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..errors import StrategyError
from .layouts import interned, moved
from .policies import KEEP, POLICIES, parse_policy
from .shard_levels import S_GRADIENTS, SHARD_LEVELS, check_precision, shard_codes

__all__ = ["Strategy", "SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b")
_PLACEMENT_KEYS = frozenset({"pos", "layouts", "layout_ids", "layout_index", "moved"})
"""What a strategy derives from its units and placements alone (kept by a copy that keeps them;
``layout_index``: layout -> id, ``moved``: the strategy it was made from by moving a few
units, and their positions, until its layouts are derived from that one's)."""
_PLACEMENT_FIELDS = frozenset({"units", "sample", "parameter", "attribute", "devices"})
_UNIT_KEYS = frozenset({"pos"})
_KINDS_FIELDS = frozenset({"stage", "parameter", "sample"})
"""What the cached :func:`~memflow.strategy.runnable.parallel_kinds` reads (a copy keeps it)."""


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _check_breaks(units: Sequence[str], policy: np.ndarray, brk: np.ndarray) -> np.ndarray:
    """``brk`` if segment breaks sit on recomputed units only; else a StrategyError naming one."""
    stray = np.flatnonzero(brk & ~POLICIES.recomputes(policy))
    if len(stray):
        i = int(stray[0])
        raise StrategyError(f"unit {units[i]!r}: a segment break on a unit whose policy is "
                            f"{POLICIES[policy[i]]!r}; breaks start a recompute segment, so "
                            "they are valid only on recomputed units")
    return brk


def _check_sequence(units: Sequence[str], parameter: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """``seq`` if sequence parallelism sits on tensor-parallel units only; else a
    StrategyError naming one."""
    if not seq.any():       # the common case, found without the units' degrees
        return seq
    stray = np.flatnonzero(seq & (parameter <= 1))
    if len(stray):
        raise StrategyError(f"unit {units[int(stray[0])]!r}: sequence_parallel on a unit with "
                            "parameter degree 1; it splits the sequence over a tensor-parallel "
                            "group, so it is valid only where parameter > 1")
    return seq


class Strategy:
    """Per-unit parallel configuration and memory policy for one training step.

    Build one with a constructor (:meth:`single_device`, :meth:`data_parallel`,
    :meth:`model_parallel`, :meth:`hybrid`, :meth:`tensor_parallel`, :meth:`pipeline`) and
    modify it with :meth:`with_policy` / :meth:`with_config`; each returns a new strategy.

    >>> s = Strategy(["a", "b", "c"], devices=[("gpu0",)] * 3)
    >>> s = s.with_policy({"a": "recompute", "b": "recompute", "c": "compress:0.01"})
    >>> s.table[["unit", "policy", "error_bound", "devices", "segment"]]
      unit     policy  error_bound devices  segment
    0    a  recompute          NaN (gpu0,)        0
    1    b  recompute          NaN (gpu0,)        0
    2    c   compress         0.01 (gpu0,)       -1
    >>> Strategy.from_json(s.to_json()) == s
    True

    ``segment_break`` (per unit) starts a new checkpoint segment at a recomputed unit even
    though the unit before it is recomputed too, so that adjacent recomputed units can run as
    separate checkpoints (:meth:`with_segments`). It may be True only on recomputed units.

    >>> s.with_segments("each").table[["unit", "segment_break", "segment"]]
      unit  segment_break  segment
    0    a          False        0
    1    b           True        1
    2    c          False       -1

    ``sequence_parallel`` (per unit, only where ``parameter > 1``) is Megatron's sequence
    parallelism (Korthikanti et al. 2022, section 4.2.2): what the unit keeps between its
    tensor-parallel regions (LayerNorm, dropout and residual tensors) is split over the
    sequence across its parameter group instead of replicated.
    """

    __slots__ = ("units", "policy", "error_bound", "segment_break", "sample", "parameter",
                 "attribute", "devices", "stage", "shard", "offload_optimizer", "precision",
                 "sequence_parallel", "microbatches", "schedule", "name", "_cache")

    def __init__(self, units: Sequence[str], *, devices: Sequence[Sequence[str]],
                 policy: Sequence[int] | np.ndarray | None = None,
                 error_bound: Sequence[float] | np.ndarray | None = None,
                 segment_break: Sequence[bool] | np.ndarray | None = None,
                 sample: Sequence[int] | np.ndarray | None = None,
                 parameter: Sequence[int] | np.ndarray | None = None,
                 attribute: Sequence[int] | np.ndarray | None = None,
                 stage: Sequence[int] | np.ndarray | None = None,
                 shard: Any = None, offload_optimizer: Sequence[bool] | np.ndarray | None = None,
                 precision: str | None = None,
                 sequence_parallel: Sequence[bool] | np.ndarray | None = None,
                 microbatches: int = 1, schedule: str = "1f1b", name: str = "strategy"):
        n = len(units)
        self.units: tuple[str, ...] = tuple(str(u) for u in units)

        def arr(field, v, default, dtype):
            if v is None:
                return _frozen(np.full(n, default, dtype))
            given = np.asarray(v)
            if given.shape != (n,):
                raise StrategyError(f"{field}: expected one value per unit ({n}), "
                                    f"got shape {given.shape}")
            try:
                a = np.array(v, dtype=dtype)
            except (TypeError, ValueError):
                raise StrategyError(f"{field}: expected {np.dtype(dtype).name} values, one per "
                                    f"unit, got {list(v)[:4]}") from None
            # numpy truncates 2.5 to 2: a degree or stage that is not whole is an error
            if a.dtype.kind == "i" and given.dtype.kind not in "iub" and (a != given).any():
                i = int(np.flatnonzero(a != given)[0])
                raise StrategyError(f"unit {self.units[i]!r}: {field} {given[i].item()!r} is not "
                                    "an integer")
            return _frozen(a)

        self.policy = arr("policy", policy, KEEP, np.int8)
        # every NaN (no bound) as the one NaN, so equal strategies give equal bytes (_key)
        bound = arr("error_bound", error_bound, np.nan, np.float64)
        self.error_bound = _frozen(np.where(np.isnan(bound), np.nan, bound))
        self.segment_break = _check_breaks(self.units, self.policy,
                                           arr("segment_break", segment_break, False, np.bool_))
        self.sample = arr("sample", sample, 1, np.int64)
        self.parameter = arr("parameter", parameter, 1, np.int64)
        self.attribute = arr("attribute", attribute, 1, np.int64)
        self.stage = arr("stage", stage, -1, np.int64)
        self.shard = _frozen(shard_codes(self.units, 0 if shard is None else shard))
        self.offload_optimizer = arr("offload_optimizer", offload_optimizer, False, np.bool_)
        self.precision = check_precision(precision)
        self.sequence_parallel = _check_sequence(
            self.units, self.parameter,
            arr("sequence_parallel", sequence_parallel, False, np.bool_))
        if len(devices) != n:
            raise StrategyError(f"expected one device tuple per unit ({n}), got {len(devices)}")
        # equal device tuples made one object: interning the layouts compares them by identity
        same: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.devices: tuple[tuple[str, ...], ...] = tuple(
            same.setdefault(t, t) for t in (tuple(map(str, d)) for d in devices))
        if schedule not in SCHEDULES:
            raise StrategyError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        if int(microbatches) < 1:
            raise StrategyError(f"microbatches must be >= 1, got {microbatches}")
        self.microbatches = int(microbatches)
        self.schedule = schedule
        self.name = str(name)
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------ copies
    def _replace(self, **fields: Any) -> "Strategy":
        new = object.__new__(Strategy)
        for slot, value in zip(_FIELDS, _field_values(self)):
            setattr(new, slot, value)
        for slot, value in fields.items():
            setattr(new, slot, value)
        # a copy that keeps the placements keeps what was derived from them (the unit
        # positions, the interned layouts): a shard, precision or policy move re-made them
        keep = _PLACEMENT_KEYS if _PLACEMENT_FIELDS.isdisjoint(fields) else \
            frozenset() if "units" in fields else _UNIT_KEYS
        new._cache = {k: v for k, v in self._cache.items() if k in keep}
        kinds = self._cache.get("parallel_kinds")
        if kinds is not None and _KINDS_FIELDS.isdisjoint(fields):
            new._cache["parallel_kinds"] = kinds
        return new

    def _positions(self, units: Iterable[str]) -> list[int]:
        pos = self._cache.get("pos")
        if pos is None:
            pos = self._cache["pos"] = {u: i for i, u in enumerate(self.units)}
        out = []
        for u in units:
            if u not in pos:
                close = [v for v in self.units if u in v][:3]
                raise StrategyError(f"{u!r} is not a unit of this strategy"
                                    + (f"; did you mean {close}?" if close else ""))
            out.append(pos[u])
        return out

    def with_policy(self, policies: Mapping[str, Any] | None = None, /, **by_policy: Any) -> "Strategy":
        """A copy with the memory policy of some units changed.

        ``policies`` maps unit -> policy (see :func:`parse_policy`); or give lists of units by
        policy name: ``s.with_policy(recompute=["b", "c"])``. A unit given a policy other than
        ``recompute`` loses its segment break (breaks exist on recomputed units only).

        >>> s = Strategy(["a", "b"], devices=[("gpu0",)] * 2).with_policy(offload=["b"])
        >>> s.policies
        ['keep', 'offload']
        """
        items = list((policies or {}).items())
        for pol, units in by_policy.items():
            items += [(u, pol) for u in ([units] if isinstance(units, str) else units)]
        pos = self._positions(u for u, _ in items)
        policy, bound = self.policy.copy(), self.error_bound.copy()
        for i, (u, spec) in zip(pos, items):
            policy[i], bound[i] = parse_policy(u, spec)
        fields = dict(policy=_frozen(policy), error_bound=_frozen(bound))
        brk = self.segment_break
        if brk.any():       # breaks are rare: most copies need not map the policies
            rec = POLICIES.recomputes(policy)
            if (brk & ~rec).any():
                fields["segment_break"] = _frozen(brk & rec)
        return self._replace(**fields)

    def with_segments(self, breaks: str | Iterable[str]) -> "Strategy":
        """A copy whose recompute segments start at ``breaks`` as well as at every run's start.

        ``breaks`` is ``"each"`` (every recomputed unit its own segment, as checkpointing each
        unit separately does), ``"runs"`` (no breaks: one segment per maximal run) or a list of
        recomputed units at which a new segment starts. The breaks replace any earlier ones.

        >>> s = Strategy(["a", "b", "c"], devices=[("gpu0",)] * 3).with_policy(recompute=["a", "b", "c"])
        >>> s.segment.tolist(), s.with_segments(["c"]).segment.tolist()
        ([0, 0, 0], [0, 0, 1])
        >>> s.with_segments("each").segment.tolist()
        [0, 1, 2]
        >>> s.with_segments(["x"])
        Traceback (most recent call last):
        ...
        memflow.errors.StrategyError: 'x' is not a unit of this strategy
        >>> s.with_policy(keep=["c"]).with_segments(["c"])
        Traceback (most recent call last):
        ...
        memflow.errors.StrategyError: unit 'c': a segment break on a unit whose policy is 'keep'; breaks start a recompute segment, so they are valid only on recomputed units
        """
        rec = POLICIES.recomputes(self.policy)
        if isinstance(breaks, str) and breaks in ("each", "runs"):
            brk = rec.copy() if breaks == "each" else np.zeros(len(self), bool)
            brk[1:] &= rec[:-1]        # a run's first unit starts a segment anyway
            brk[:1] = False
        else:
            brk = np.zeros(len(self), bool)
            brk[self._positions([breaks] if isinstance(breaks, str) else breaks)] = True
            _check_breaks(self.units, self.policy, brk)
        return self._replace(segment_break=_frozen(brk))

    def with_config(self, units: str | Iterable[str] | Mapping[str, Mapping[str, Any]], *,
                    sample: int | None = None, parameter: int | None = None,
                    attribute: int | None = None, devices: Sequence[str] | None = None,
                    stage: int | None = None,
                    sequence_parallel: bool | None = None) -> "Strategy":
        """A copy with the parallel configuration of ``units`` changed.

        ``units`` is a unit, a list of units (all get the same keywords) or a mapping unit ->
        keywords. Degrees left out keep their value; ``devices`` must list one device per part.
        A unit whose parameter degree becomes 1 drops ``sequence_parallel``.

        >>> s = Strategy(["a", "b"], devices=[("gpu0",)] * 2)
        >>> s.with_config("b", sample=2, devices=["gpu0", "gpu1"]).devices
        (('gpu0',), ('gpu0', 'gpu1'))
        """
        if isinstance(units, Mapping):
            items = list(units.items())
        else:
            kw = dict(sample=sample, parameter=parameter, attribute=attribute,
                      devices=devices, stage=stage, sequence_parallel=sequence_parallel)
            items = [(u, kw) for u in ([units] if isinstance(units, str) else units)]
        pos = self._positions(u for u, _ in items)
        # only the degrees given are replaced: a copy keeps what the others derive
        arrays = {k: getattr(self, k).copy() for k in ("sample", "parameter", "attribute",
                                                       "stage")
                  if any(kw.get(k) is not None for _, kw in items)}
        devs = list(self.devices)
        seq = self.sequence_parallel.copy()
        for i, (_, kw) in zip(pos, items):
            if kw.get("parameter") == 1 or kw.get("sequence_parallel") is not None:
                seq[i] = bool(kw.get("sequence_parallel"))
            for k in arrays:
                if kw.get(k) is not None:
                    if int(kw[k]) != kw[k]:
                        raise StrategyError(f"unit {self.units[i]!r}: {k} {kw[k]!r} is not an "
                                            "integer")
                    arrays[k][i] = int(kw[k])
            if kw.get("devices") is not None:
                devs[i] = tuple(map(str, kw["devices"]))
        new = self._replace(devices=tuple(devs), sequence_parallel=_frozen(_check_sequence(
            self.units, arrays.get("parameter", self.parameter), seq)),
            **{k: _frozen(v) for k, v in arrays.items()})
        if 2 * len(pos) <= len(self):   # a few units moved: their layouts, the others' kept
            self.layouts        # made here, not along a lineage of strategies never simulated
            new._cache["moved"] = (self, pos)
        return new

    def with_schedule(self, *, microbatches: int | None = None, schedule: str | None = None,
                      name: str | None = None) -> "Strategy":
        """A copy with the global pipeline settings (or the name) changed."""
        if schedule is not None and schedule not in SCHEDULES:
            raise StrategyError(f"unknown schedule {schedule!r}; valid: {', '.join(SCHEDULES)}")
        if microbatches is not None and int(microbatches) < 1:
            raise StrategyError(f"microbatches must be >= 1, got {microbatches}")
        return self._replace(
            microbatches=self.microbatches if microbatches is None else int(microbatches),
            schedule=schedule or self.schedule, name=self.name if name is None else str(name))

    # Strategy.with_shard and Strategy.with_model_states are memflow.strategy.model_states.
    # Strategy.validate(graph, cluster=None) is memflow.strategy.validate, attached there.

    # ------------------------------------------------------------------ derived
    @property
    def policies(self) -> list[str]:
        """Policy names per unit."""
        return [POLICIES[c] for c in self.policy]

    @property
    def shard_levels(self) -> list[str]:
        """Shard level names per unit."""
        return [SHARD_LEVELS[c] for c in self.shard]

    @property
    def degree(self) -> np.ndarray:
        """Number of parts per unit (sample × parameter × attribute)."""
        return self.sample * self.parameter * self.attribute

    @property
    def segment(self) -> np.ndarray:
        """Recompute segment id per unit (-1 when not recomputed).

        A segment is a maximal run of consecutive recomputed units with the same placement and
        pipeline stage and no :attr:`segment_break` after its first unit, as one
        ``torch.utils.checkpoint`` call would run them; ``selective`` and ``recompute`` units
        never share one (a selective segment's checkpoint has a selective policy). A unit
        whose gradients or parameters are sharded over its replicas (FSDP2's ``fully_shard``)
        starts a segment: FSDP2 runs a group's inputs through an autograd
        function that a checkpoint entered before the group cannot replay.

        >>> s = Strategy(["a", "b"], devices=[("gpu0", "gpu1")] * 2, sample=[2, 2])
        >>> s = s.with_policy(recompute=["a", "b"])
        >>> s.segment.tolist(), s.with_shard({"b": "parameters"}).segment.tolist()
        ([0, 0], [0, 1])
        """
        seg = self._cache.get("segment")
        if seg is None:
            layout = self.layout_ids
            rec = POLICIES.recomputes(self.policy)
            sel = POLICIES.selective(self.policy)
            start = rec.copy()
            group = (self.shard >= S_GRADIENTS) & (self.sample > 1)    # its own fully_shard
            start[1:] &= ~(rec[:-1] & (layout[1:] == layout[:-1]) & (sel[1:] == sel[:-1])
                           & (self.stage[1:] == self.stage[:-1]) & ~self.segment_break[1:]
                           & ~group[1:])
            seg = np.where(rec, np.cumsum(start) - 1, -1)
            seg = self._cache["segment"] = _frozen(seg.astype(np.int64))
        return seg

    @property
    def layouts(self) -> list[tuple]:
        """Distinct placements ``(sample, parameter, attribute, devices)``, by first use."""
        if "layouts" not in self._cache:
            self._intern_layouts()
        return self._cache["layouts"]

    @property
    def layout_ids(self) -> np.ndarray:
        """Index into :attr:`layouts` per unit."""
        if "layout_ids" not in self._cache:
            self._intern_layouts()
        return self._cache["layout_ids"]

    def _intern_layouts(self) -> None:
        # a few units moved from a parent: its layouts kept, the moved units' looked up
        # (a tenth of a proposal on 175 units, interned from scratch)
        parent = self._cache.pop("moved", None)
        if parent is not None:
            parent, units = parent
            index = parent._cache.get("layout_index")    # made once per parent
            if index is None:
                index = parent._cache["layout_index"] = {
                    key: j for j, key in enumerate(parent.layouts)}
            layouts, ids = moved(parent.layouts, parent.layout_ids, index, self, units)
        else:
            layouts, ids = interned(self.sample, self.parameter, self.attribute, self.devices)
        self._cache["layouts"] = layouts
        self._cache["layout_ids"] = _frozen(np.asarray(ids, np.int64))

    @property
    def device_names(self) -> list[str]:
        """Every device the strategy uses, in order of first use."""
        return list(dict.fromkeys(d for devs in self.devices for d in devs))

    @property
    def table(self) -> pd.DataFrame:
        """One row per unit: policy, error_bound, segment_break, degrees, devices, stage,
        segment, shard level, offload_optimizer, sequence_parallel (the global precision is
        :attr:`precision`)."""
        return pd.DataFrame({
            "unit": list(self.units), "policy": self.policies,
            "error_bound": np.array(self.error_bound),
            "segment_break": np.array(self.segment_break), "sample": np.array(self.sample),
            "parameter": np.array(self.parameter), "attribute": np.array(self.attribute),
            "devices": list(self.devices), "stage": np.array(self.stage),
            "segment": np.array(self.segment), "shard": self.shard_levels,
            "offload_optimizer": np.array(self.offload_optimizer),
            "sequence_parallel": np.array(self.sequence_parallel)})

    # ------------------------------------------------------------------ equality, display
    def _key(self) -> tuple:
        # built once; placements as the interned layouts and layout ids (interned by first
        # use: the same per-unit degrees and devices): hashing the per-unit devices (175
        # tuples on resnet50's leaves) was most of a search's memo lookup
        key = self._cache.get("key")
        if key is None:
            key = self._cache["key"] = (
                self.units, self.policy.tobytes(),
                # one NaN (no bound) bit pattern: __init__'s and parse_policy's
                self.error_bound.tobytes(),
                self.segment_break.tobytes(), tuple(self.layouts), self.layout_ids.tobytes(),
                self.stage.tobytes(), self.shard.tobytes(), self.offload_optimizer.tobytes(),
                self.sequence_parallel.tobytes(), self.precision, self.microbatches,
                self.schedule, self.name)
        return key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Strategy) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __len__(self) -> int:
        return len(self.units)

    def __repr__(self) -> str:
        counts = pd.Series(self.policies).value_counts()
        pol = ", ".join(f"{k} {v}" for k, v in counts.items())
        states = "".join(  # model-state choices, only where set (the default reads as before)
            [f", shard {k} {v}" for k, v in pd.Series(self.shard_levels).value_counts().items()
             if k != "none"]
            + ([f", optimizer on host {int(self.offload_optimizer.sum())}"]
               if self.offload_optimizer.any() else [])
            + ([f", sequence parallel {int(self.sequence_parallel.sum())}"]
               if self.sequence_parallel.any() else [])
            + ([f", {self.precision}"] if self.precision else []))
        return (f"<Strategy {self.name!r}: {len(self)} units on {len(self.device_names)} "
                f"devices, {pol}{states}, microbatches={self.microbatches} ({self.schedule})>")

    def _repr_html_(self) -> str:
        return f"<div><b>{html.escape(repr(self))}</b>{self.table.head(30).to_html()}</div>"

    # Strategy.to_dict / from_dict / to_json / from_json are memflow.strategy.document.


_FIELDS = Strategy.__slots__[:-1]
"""The slots a copy (:meth:`Strategy._replace`) takes over: all but the cache."""
_field_values = operator.attrgetter(*_FIELDS)
