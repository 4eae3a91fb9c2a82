"""The policy table: every memory policy declared once, everything else derived from it.

A memory policy says what becomes of the tensors a unit saves for backward. Each is a
:class:`Policy` row: its name, its *mechanism*, its parameter (if any), its time factor, its
colour, and whether the search proposes it by default. The **mechanism** is the part the
memory model, the simulator and export know how to carry out — it fixes the memory rule (what
holds a saved storage, from when to when), the tasks the simulator runs for it and the hook
export installs:

=============  ===========================================================================
mechanism      memory rule / simulator tasks / export hook
=============  ===========================================================================
``keep``       held on the device until its first saver's backward / none / none
``recompute``  dropped after forward, rebuilt by its segment's replay / recompute tasks /
               a non-reentrant ``torch.utils.checkpoint`` segment
``host``       copied to host memory after forward, back before backward / offload and
               prefetch on the host link / ``saved_tensors_hooks`` moving to and from the CPU
``compressed`` held compressed on the device / compress and decompress on the compute
               stream / ``saved_tensors_hooks`` with the error-bounded quantizer
``selective``  the outputs of its expensive ops (:mod:`memflow.graph.selective`) held as by
               ``keep``, the rest as by ``recompute``, in segments of selective units /
               recompute tasks re-running only the cheap ops / a selective checkpoint
               (``create_selective_checkpoint_contexts``: the expensive ops must be saved)
=============  ===========================================================================

When several savers of one storage disagree, the mechanism earlier in :data:`MECHANISMS`
holds it (keep > compressed > host > selective > recompute), as a tensor saved by one kept unit is held
whatever its other savers do.

Everything else reads the table: :func:`parse_policy` and validation (names, parameters),
the memory model (:attr:`PolicyTable.mechanism_codes`), the simulator
(:attr:`PolicyTable.host_scales`), the search's choices, the widgets' pin choices and the
report's legend (:attr:`PolicyTable.colors`). A new policy on an existing mechanism is one
:meth:`PolicyTable.register` call — for example swapping to a slow disk, offload at a tenth
of the host link's bandwidth:

>>> swap = Policy("swap", "host", "offload to NVMe at a tenth of the host link", "#8c613c",
...               host_scale=10.0)
>>> POLICIES.register(swap).name in POLICIES
True
>>> parse_policy("fc1", "swap") == (POLICIES.index("swap"), math.nan)
True
>>> POLICIES.unregister("swap")

A new *mechanism* touches four places: :data:`MECHANISMS` here, its rule in
:mod:`memflow.memory.blocks`, its tasks in :mod:`memflow.sim.expand` (if it has any) and its
hook in :mod:`memflow.export.exported` (``docs/architecture.md``).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StrategyError

__all__ = ["Policy", "PolicyTable", "POLICIES", "MECHANISMS", "parse_policy",
           "KEEP", "RECOMPUTE", "OFFLOAD", "COMPRESS", "SELECTIVE",
           "M_KEEP", "M_RECOMPUTE", "M_HOST", "M_COMPRESSED", "M_SELECTIVE"]

MECHANISMS = ("keep", "compressed", "host", "selective", "recompute")
"""What the memory model can do with a saved storage, in the order that decides who holds a
storage several units save (the first wins)."""
M_KEEP, M_COMPRESSED, M_HOST, M_SELECTIVE, M_RECOMPUTE = (
    MECHANISMS.index(m) for m in ("keep", "compressed", "host", "selective", "recompute"))


@dataclass(frozen=True)
class Policy:
    """One row of the policy table.

    ``parameter``: the name of the policy's numeric parameter (``"error_bound"`` for
    compression), written ``"<name>:<value>"`` and stored in :attr:`Strategy.error_bound`;
    ``default`` its value when omitted. ``host_scale`` multiplies the seconds per byte of the
    host transfers of a ``host`` policy (1: the link's own rate). ``searched``: among the
    search's default choices.
    """

    name: str
    mechanism: str
    doc: str
    color: str
    parameter: str | None = None
    default: float = math.nan
    host_scale: float = 1.0
    searched: bool = False

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise StrategyError(f"policy {self.name!r}: unknown mechanism {self.mechanism!r}; "
                                f"valid: {', '.join(MECHANISMS)}")
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise StrategyError(f"policy name {self.name!r} must be a plain word "
                                "(letters, digits, underscores)")
        if not self.host_scale > 0:
            raise StrategyError(f"policy {self.name!r}: host_scale must be > 0, "
                                f"got {self.host_scale}")

    @property
    def wording(self) -> str:
        """The parameter in words, for messages: ``"an error bound"``."""
        return "an " + str(self.parameter).replace("_", " ")

    @property
    def syntax(self) -> str:
        """How a strategy writes it: ``"compress:<error_bound>"`` or the bare name."""
        return f"{self.name}:<{self.parameter}>" if self.parameter else self.name


class PolicyTable(Sequence[str]):
    """The memory policies in the order of their integer codes; a sequence of their names.

    Strategies store codes (int8), JSON stores names, so codes of policies registered at run
    time are valid in this process only. The arrays below are indexed by code and rebuilt on
    :meth:`register`, so compiled kernels read them as plain arrays.

    >>> list(POLICIES)
    ['keep', 'recompute', 'offload', 'compress', 'selective']
    >>> POLICIES["compress"].mechanism, POLICIES.index("offload")
    ('compressed', 2)
    """

    def __init__(self, policies: Sequence[Policy]):
        self._rows: list[Policy] = []
        self._derive()
        for p in policies:
            self.register(p)

    # --------------------------------------------------------------- the sequence of names
    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[str]:
        return (p.name for p in self._rows)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._code

    def __getitem__(self, key):  # type: ignore[override]
        """``table[code]`` is a name; ``table[name]`` the :class:`Policy`."""
        if isinstance(key, str):
            return self._rows[self.index(key)]
        return self._rows[int(key)].name

    def index(self, name: Any, start: int = 0, stop: int | None = None) -> int:
        code = self._code.get(name) if isinstance(name, str) else None
        if code is None:
            raise StrategyError(f"unknown memory policy {name!r}; valid: {self.valid()}")
        return code

    def __repr__(self) -> str:
        return f"PolicyTable({list(self)!r})"

    # ------------------------------------------------------------------ changing the table
    def register(self, policy: Policy) -> Policy:
        """Add ``policy`` at the next code (its name must be new)."""
        if policy.name in self:
            raise StrategyError(f"memory policy {policy.name!r} is already in the table")
        self._rows.append(policy)
        self._derive()
        return policy

    def unregister(self, name: str) -> None:
        """Remove the policy registered last, by name (codes of the others stay)."""
        if not self._rows or self._rows[-1].name != name:
            raise StrategyError(f"only the policy registered last can be removed; "
                                f"{name!r} is not it")
        self._rows.pop()
        self._derive()

    def _derive(self) -> None:
        # a search parses and classifies policies on every proposal: look-ups, not scans
        rows = self._rows
        self._code = {p.name: i for i, p in enumerate(rows)}
        self.mechanism_codes = np.array([MECHANISMS.index(p.mechanism) for p in rows], np.int64)
        self.host_scales = np.array([p.host_scale for p in rows], np.float64)
        self.with_parameter = np.array([p.parameter is not None for p in rows], bool)
        self._recomputing = np.isin(self.mechanism_codes, (M_RECOMPUTE, M_SELECTIVE))
        self._by_mechanism = {m: tuple(i for i, p in enumerate(rows) if p.mechanism == m)
                              for m in MECHANISMS}

    # ---------------------------------------------------------------------- derived views
    def rows(self) -> tuple[Policy, ...]:
        return tuple(self._rows)

    def codes(self, mechanism: str) -> tuple[int, ...]:
        """The codes of the policies carried out by ``mechanism``.

        >>> POLICIES.codes("host")
        (2,)
        """
        return self._by_mechanism[mechanism]

    def recomputes(self, policy: np.ndarray) -> np.ndarray:
        """Per unit (``policy``: codes), whether its mechanism re-runs its forward
        (``recompute`` or ``selective``) — the units that form checkpoint segments.

        >>> POLICIES.recomputes(np.array([KEEP, RECOMPUTE, SELECTIVE])).tolist()
        [False, True, True]
        """
        return self._recomputing[np.asarray(policy, np.int64)]

    def selective(self, policy: np.ndarray) -> np.ndarray:
        """Per unit, whether its mechanism is ``selective`` (segments re-running only their
        cheap ops).

        >>> POLICIES.selective(np.array([KEEP, RECOMPUTE, SELECTIVE])).tolist()
        [False, False, True]
        """
        return self.mechanism_codes[np.asarray(policy, np.int64)] == M_SELECTIVE

    @property
    def colors(self) -> dict[str, str]:
        """``{name: colour}`` for legends and tables."""
        return {p.name: p.color for p in self._rows}

    @property
    def searched(self) -> tuple[str, ...]:
        """The search's default choices."""
        return tuple(p.name for p in self._rows if p.searched)

    def valid(self) -> str:
        """The names as a strategy may write them, for error messages."""
        return ", ".join(p.syntax for p in self._rows)


POLICIES = PolicyTable([
    Policy("keep", "keep", "hold what the unit saves until its backward", "#4c72b0",
           searched=True),
    Policy("recompute", "recompute",
           "drop what it saves; rerun its checkpoint segment before backward", "#64b5cd",
           searched=True),
    Policy("offload", "host", "copy what it saves to host memory, prefetch it back (vDNN)",
           "#55a868", searched=True),
    Policy("compress", "compressed",
           "hold what it saves compressed within an error bound (COMET)", "#da8bc3",
           parameter="error_bound", default=1e-3),
    Policy("selective", "selective",
           "keep its expensive ops' outputs (matmul, convolution); recompute the rest",
           "#dd8452", searched=True),
])
"""The memory policies: a sequence of names in the order of their codes."""
KEEP, RECOMPUTE, OFFLOAD, COMPRESS, SELECTIVE = (
    POLICIES.index(n) for n in ("keep", "recompute", "offload", "compress", "selective"))


def parse_policy(unit: str, spec: Any) -> tuple[int, float]:
    """``(code, parameter)`` of a policy given as a name, ``"compress:1e-3"``, a
    ``("compress", 1e-3)`` pair or a ``{"policy": ..., "error_bound": ...}`` mapping; the
    parameter is NaN for policies without one.

    >>> parse_policy("fc", "compress:1e-2")
    (3, 0.01)
    >>> parse_policy("fc", "swap")
    Traceback (most recent call last):
    ...
    memflow.errors.StrategyError: unit 'fc': unknown memory policy 'swap'; valid: keep, recompute, offload, compress:<error_bound>, selective
    """
    value: Any = None
    given = spec
    if not isinstance(spec, str):   # a name skips the ABC check: one per proposal
        if isinstance(spec, Mapping):
            spec = spec.get("policy")
        elif isinstance(spec, (tuple, list)):
            spec, value = (spec[0], spec[1]) if len(spec) == 2 else (spec[0], None)
    if isinstance(spec, str) and ":" in spec:
        spec, value = spec.split(":", 1)
    if not isinstance(spec, str) or spec not in POLICIES:
        raise StrategyError(f"unit {unit!r}: unknown memory policy {spec!r}; valid: "
                            f"{POLICIES.valid()}")
    code = POLICIES.index(spec)
    policy = POLICIES[spec]
    if policy.parameter is None:
        if value is not None and not (isinstance(value, float) and math.isnan(value)):
            raise StrategyError(f"unit {unit!r}: policy {spec!r} takes no parameter, "
                                f"got {value!r}")
        return code, math.nan
    if isinstance(given, Mapping):
        value = given.get(policy.parameter)
    try:
        x = policy.default if value is None else float(value)
    except (TypeError, ValueError):
        raise StrategyError(f"unit {unit!r}: {policy.wording} {value!r} of policy {spec!r} "
                            "is not a number") from None
    if not x > 0:
        raise StrategyError(f"unit {unit!r}: {spec} needs {policy.wording} > 0, got {x}")
    return code, x
