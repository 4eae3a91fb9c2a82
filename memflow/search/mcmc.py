"""MCMCSearch: a Metropolis search over strategies that counts memory, in steps you can pause.

Each step draws a move (:mod:`memflow.search.moves`) by its weight, simulates the proposal
(scores are memoized, :mod:`memflow.search.cost`) and accepts it with probability
``min(1, exp(-beta · Δcost / t0))``, ``t0`` being the initial strategy's time, so ``beta`` is
in units of relative cost: at the default 20 a proposal 5% worse is accepted about one time in
three (tuned on the chains of ``benchmarks/bench_search.py``: colder chains stall in local
optima, hotter ones wander). Every ``restart_every`` steps the chain goes back to the best strategy (FlexFlow resets
to the best every ``min(budget/100, 1000)`` steps).

The search holds no thread and no loop of its own: ``step(n)`` returns after ``n`` proposals,
``run(...)`` after a budget or when a callback says stop, and the next call continues the same
chain, so a dashboard can drive it from an asyncio loop in short chunks, pause it, pin units
and resume.
"""
from __future__ import annotations

import bisect
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from .._jsonio import write_json
from ..errors import SearchError
from ..sim import Simulator
from ..strategy import Strategy, parse_policy
from ..strategy.runnable import model_state_problem
from .chain import ChainState
from .cost import JUMP, WEIGHT, CostModel, Score
from .history import History
from .initial import INITS, best_baseline, data_parallel
from .moves import DEFAULT_WEIGHTS, FLEXFLOW_WEIGHTS, MOVES, PARALLEL_MOVES, Proposal
from .persist import (FORMAT, check_match, describe_cluster, describe_graph, in_field,
                      read_search)
from .space import DEFAULT_POLICIES, OPTIMIZER_PLACES, SearchSpace, policy_label

__all__ = ["MCMCSearch"]

CONFIG_KEYS = ("sample", "parameter", "attribute", "devices", "stage")
STATE_KEYS = ("shard", "optimizer_place")
"""Pin keys of a unit's model states: its shard level and optimizer place (device or host)."""
MAX_DRAWS = 16      # moves drawn per step before the step records "none"


class MCMCSearch:
    """Metropolis–Hastings search over the strategies of ``graph`` on ``cluster``.

    Parameters: ``memory_limit`` (bytes, ``"8GB"`` or per-device mapping; default each
    device's capacity); ``init`` (``"data_parallel"``, ``"baseline"`` — the best of
    :func:`memflow.search.initial.baselines` — or a :class:`~memflow.Strategy`); ``seed``;
    ``beta`` (inverse temperature on relative cost); ``memory_aware`` (False: FlexFlow's
    memory-oblivious cost and moves); ``optimizer`` / ``precision`` (as for
    :func:`memflow.simulate`); ``moves`` (move → weight); ``restart_every`` (steps between
    returns to the best; 0 never); ``policies`` / ``error_bounds`` (memory policies the search
    may choose); ``runnable`` (True: propose only strategies export runs,
    :mod:`memflow.strategy.runnable`, with starts and offers projected there; False:
    FlexFlow's full per-unit space, for research).

    >>> import memflow
    >>> from memflow.search.synthetic import chain_graph
    >>> g = chain_graph(6, batch=4096, width=256)
    >>> search = MCMCSearch(g, memflow.Cluster.preset("1xV100-16GB"), memory_limit=85e6)
    >>> bool(search.step(300).best_cost < search.history["cost"].iloc[0])
    True
    >>> search.pin(["l0"], policy="recompute").run(iterations=50).current.policies[0]
    'recompute'
    >>> list(search.history.columns[:6])
    ['iteration', 'move', 'unit', 'cost', 'time', 'peak']
    """

    def __init__(self, graph, cluster, *, memory_limit: Any = None,
                 init: str | Strategy = "data_parallel", seed: int = 0, beta: float = 20.0,
                 memory_aware: bool = True, optimizer: str = "sgd", precision: str | None = None,
                 moves: Mapping[str, float] | None = None, restart_every: int = 1000,
                 policies: Iterable[str] = DEFAULT_POLICIES,
                 error_bounds: Iterable[float] = (1e-3,), runnable: bool = True):
        settings = {"memory_limit": memory_limit, "seed": int(seed), "beta": float(beta),
                    "memory_aware": bool(memory_aware), "optimizer": optimizer,
                    "precision": precision, "moves": moves, "restart_every": int(restart_every),
                    "policies": list(policies), "error_bounds": list(error_bounds),
                    "init": init if isinstance(init, str) else "strategy",
                    "runnable": bool(runnable)}
        self._setup(graph, cluster, settings)
        start = self._initial(init)
        self._chain = ChainState.start(start, self._cost(start), seed=seed,
                                       memory_aware=self.memory_aware)

    # ------------------------------------------------------------------ set-up
    def _setup(self, graph, cluster, settings: dict[str, Any]) -> None:
        self.graph, self.cluster = graph, cluster
        self.simulator = Simulator(graph, cluster, optimizer=settings["optimizer"],
                                   precision=settings["precision"])
        settings["precision"] = self.simulator.precision
        self.memory_aware = settings["memory_aware"]
        self._cost = CostModel(self.simulator, memory_limit=settings["memory_limit"],
                               memory_aware=self.memory_aware, jump=JUMP, weight=WEIGHT)
        # a search saved before the runnable space existed resumes in the full space it ran in
        settings["runnable"] = bool(settings.get("runnable", False))
        self.space = SearchSpace(graph, cluster, policies=settings["policies"],
                                 error_bounds=settings["error_bounds"],
                                 runnable=settings["runnable"])
        weights = settings["moves"]
        if weights is None:
            weights = DEFAULT_WEIGHTS if self.memory_aware else FLEXFLOW_WEIGHTS
        unknown = [m for m in weights if m not in MOVES]
        if unknown:
            raise SearchError(f"unknown move {unknown[0]!r}; valid moves: {', '.join(MOVES)}")
        if any(not w >= 0 for w in weights.values()) or not sum(weights.values()) > 0:
            raise SearchError(f"move weights must be >= 0 and not all 0, got {dict(weights)}")
        settings["moves"] = {m: float(w) for m, w in weights.items()}
        single = len(self.space.devices) < 2
        # the sequence move is drawn only where some unit may be sequence parallel, so a
        # search of a graph without splittable blocks draws as it did before the move existed
        live = {m: w for m, w in settings["moves"].items()
                if w > 0 and not (single and m in PARALLEL_MOVES)
                and not (m == "sequence" and not self.space.sequence.any())}
        self._move_names = list(live) or list(settings["moves"])
        cum = np.cumsum([live.get(m, 1.0) for m in self._move_names])
        # as floats, for bisect: np.searchsorted's wrappers were a tenth of proposing
        self._move_cdf = (cum / cum[-1]).tolist()
        if not settings["beta"] > 0:
            raise SearchError(f"beta must be > 0, got {settings['beta']}")
        if settings["restart_every"] < 0:
            raise SearchError(f"restart_every must be >= 0 (0: never), got "
                              f"{settings['restart_every']}")
        self.settings = settings
        self._history = History(self.space.devices)
        self._pins: dict[str, str] = {}
        self._pin_configs: dict[str, dict[str, Any]] = {}
        self._pin_precision: str | None = None
        self._best_result: tuple[Strategy, Any] | None = None

    def _initial(self, init: str | Strategy) -> Strategy:
        if isinstance(init, Strategy):
            return self.space.project(init.validate(self.graph, self.cluster))
        if init == "data_parallel":
            return data_parallel(self.graph, self.cluster)
        if init == "baseline":
            return best_baseline(self.graph, self.cluster, self._cost,
                                 memory_limit=self.settings["memory_limit"],
                                 pin=self.space.project, admits=self.space.admits)
        raise SearchError(f"init={init!r} is unknown; valid: {', '.join(INITS)} or a Strategy")

    # ------------------------------------------------------------------ state
    @property
    def current(self) -> Strategy:
        """The strategy the chain stands on."""
        return self._chain.current

    @property
    def current_cost(self) -> float:
        """Cost of :attr:`current`."""
        return self._chain.current_score.cost

    @property
    def best(self) -> Strategy:
        """The best feasible strategy seen (until one is seen: the least-cost one)."""
        return self._chain.best

    @property
    def best_cost(self) -> float:
        """Cost of :attr:`best`; infinite while no feasible strategy has been seen."""
        return self._chain.best_cost

    @property
    def best_score(self) -> Score:
        """Time, peak per device and feasibility of :attr:`best`."""
        return self._chain.best_score

    @property
    def best_result(self):
        """The full :class:`~memflow.sim.SimResult` of :attr:`best` (simulated once per best)."""
        if self._best_result is None or self._best_result[0] is not self.best:
            self._best_result = (self.best, self.simulator.result(self.best))
        return self._best_result[1]

    @property
    def iteration(self) -> int:
        """Proposals made so far."""
        return self._chain.iteration

    @property
    def elapsed(self) -> float:
        """Seconds spent in :meth:`step` so far (over every run, and before a save)."""
        return self._chain.elapsed

    @property
    def history(self) -> pd.DataFrame:
        """One row per proposal (see :mod:`memflow.search.history`)."""
        return self._history.frame

    def score(self, strategy: Strategy) -> Score:
        """The search's cost of ``strategy`` as it stands (memoized; no pins applied, no
        projection, no history row): what a proposal of it would be judged by."""
        return self._cost(strategy)

    def acceptance_rate(self, window: int | None = 100) -> float:
        """Share of the last ``window`` proposals accepted (NaN before the first)."""
        return self._history.acceptance_rate(window)

    @property
    def pins(self) -> dict[str, str]:
        """Pinned units and their memory policy (``"recompute"``, ``"compress:0.001"`` …)."""
        return dict(self._pins)

    @property
    def pin_configs(self) -> dict[str, dict[str, Any]]:
        """Pinned units' configuration and model-state pins (``shard``, ``optimizer_place``)."""
        return {u: dict(c) for u, c in self._pin_configs.items()}

    @property
    def pinned_precision(self) -> str | None:
        """The global precision the search keeps (None: it may change it)."""
        return self._pin_precision

    @property
    def simulations(self) -> int:
        """Simulations run (proposals answered from memory are not counted)."""
        return self._cost.simulations

    # ------------------------------------------------------------------ steps
    def _propose(self) -> Proposal | None:
        rng, s = self._chain.rng, self._chain.current
        for _ in range(MAX_DRAWS):
            move = self._move_names[bisect.bisect_right(self._move_cdf, rng.random())]
            prop = MOVES[move](rng, s, self.space)
            if prop is not None:
                return prop
        return None

    def step(self, n: int = 1) -> "MCMCSearch":
        """Make ``n`` proposals (each one history row); returns the search."""
        chain, beta = self._chain, self.settings["beta"]
        every = self.settings["restart_every"]
        for _ in range(int(n)):
            t0 = time.perf_counter()
            prop = self._propose()
            if prop is None:
                move, unit, score, accepted = "none", "", chain.current_score, False
            else:
                move, unit = prop.move, prop.unit
                score = self._cost(prop.strategy)
                delta = score.cost - chain.current_score.cost
                accepted = delta <= 0 or chain.rng.random() < math.exp(
                    -beta * delta / chain.reference)
                chain.offer(prop.strategy, score)
                if accepted:
                    chain.move_to(prop.strategy, score)
            chain.iteration += 1
            chain.since_restart += 1
            if every and chain.since_restart >= every:
                chain.move_to(chain.best, chain.best_score)
                chain.since_restart = 0
            chain.elapsed += time.perf_counter() - t0
            self._history.append(chain.iteration - 1, move, unit, score, accepted,
                                 chain.best_cost, chain.elapsed)
        return self

    def run(self, iterations: int | None = None, seconds: float | None = None,
            callback: Callable[["MCMCSearch"], Any] | None = None) -> "MCMCSearch":
        """Step until ``iterations`` proposals, ``seconds`` of wall time, or ``callback``
        (called after each step with the search) returns False; resumable."""
        if iterations is None and seconds is None and callback is None:
            raise SearchError("run needs a budget: iterations=, seconds= or a callback that "
                              "returns False to stop")
        end = None if seconds is None else time.perf_counter() + float(seconds)
        done = 0
        while (iterations is None or done < iterations) and (
                end is None or time.perf_counter() < end):
            self.step(1)
            done += 1
            if callback is not None and callback(self) is False:
                break
        return self

    # ------------------------------------------------------------------ steering
    def _apply_pins(self, s: Strategy) -> Strategy:
        if self._pins:
            s = s.with_policy(self._pins)
        configs = {u: {k: v for k, v in c.items() if k in CONFIG_KEYS}
                   for u, c in self._pin_configs.items()}
        if any(configs.values()):
            s = s.with_config({u: c for u, c in configs.items() if c})
        shard = {u: c["shard"] for u, c in self._pin_configs.items() if "shard" in c}
        if shard:
            s = s.with_shard(shard)
        place = {u: c["optimizer_place"] for u, c in self._pin_configs.items()
                 if "optimizer_place" in c}
        if place:
            host = {u for u, off in zip(s.units, s.offload_optimizer) if off}
            host = (host - set(place)) | {u for u, p in place.items() if p == "host"}
            s = s.with_model_states(offload_optimizer=sorted(host) if host else False)
        if self._pin_precision is not None:
            s = s.with_model_states(precision=self._pin_precision)
        return s

    def _check_pins(self, s: Strategy) -> Strategy:
        """``s`` with the pins, validated; in the runnable space export must hold its model
        states (a pinned parallel configuration is the person's to choose, as before)."""
        s = self._apply_pins(s).validate(self.graph, self.cluster)
        reason = model_state_problem(s, self.graph) if self.space.runnable else None
        if reason is not None:
            raise SearchError(f"the pins make a strategy export cannot run: {reason}")
        return s

    def pin_precision(self, precision: str | None) -> "MCMCSearch":
        """Keep the global ``precision`` (one of :data:`~memflow.strategy.PRECISIONS`) from now
        on; None lets the search change it again. Checked as :meth:`pin` checks its pins."""
        before = self._pin_precision
        self._pin_precision = precision
        try:
            current = self._check_pins(self.current) if precision is not None else self.current
        except Exception:
            self._pin_precision = before
            raise
        self.space.precision_pinned = precision is not None
        if precision is not None:
            self._rebase(current, self._apply_pins(self.best))
        return self

    def pin(self, units: str | Iterable[str], policy: Any = None,
            config: Mapping[str, Any] | None = None) -> "MCMCSearch":
        """Fix ``units``: give them ``policy`` and/or ``config`` (keys ``sample``,
        ``parameter``, ``attribute``, ``devices``, ``stage``, and the model states ``shard``
        — a shard level — and ``optimizer_place`` — ``"device"`` or ``"host"``) and never
        change them again; :meth:`pin_precision` fixes the global precision.

        The current strategy takes the pins at once and is re-simulated; the best is re-checked
        with the pins applied (it may get worse: a pin is a constraint)."""
        idx = self.space.index(units)
        names = [self.space.names[i] for i in idx]
        if config is not None:
            bad = [k for k in config if k not in CONFIG_KEYS + STATE_KEYS]
            if bad:
                raise SearchError(f"pin config key {bad[0]!r} is unknown; valid: "
                                  f"{', '.join(CONFIG_KEYS + STATE_KEYS)}")
            if config.get("optimizer_place", "device") not in OPTIMIZER_PLACES:
                raise SearchError(f"pin optimizer_place {config['optimizer_place']!r} is "
                                  f"unknown; valid: {', '.join(OPTIMIZER_PLACES)}")
        if policy is not None:
            code, bound = parse_policy(names[0], policy)
            label = policy_label(code, bound)
        before = (dict(self._pins), {u: dict(c) for u, c in self._pin_configs.items()})
        for i, name in zip(idx, names):
            self._pins[name] = label if policy is not None else policy_label(
                int(self.current.policy[i]), float(self.current.error_bound[i]))
            if config is not None:
                self._pin_configs[name] = {**self._pin_configs.get(name, {}), **config}
        try:
            current = self._check_pins(self.current)
        except Exception:       # a refused pin leaves the pins as they were
            self._pins, self._pin_configs = before
            raise
        self.space.pinned[idx] = True
        self._rebase(current, self._apply_pins(self.best))
        return self

    def unpin(self, units: str | Iterable[str] | None = None) -> "MCMCSearch":
        """Let the search change ``units`` again (all pinned units when ``None``)."""
        names = list(self._pins) if units is None else \
            [self.space.names[i] for i in self.space.index(units)]
        for name in names:
            self._pins.pop(name, None)
            self._pin_configs.pop(name, None)
            self.space.pinned[self.space.position[name]] = False
        return self

    def _rebase(self, current: Strategy, best: Strategy) -> None:
        """Stand on ``current`` and make the better of it and ``best`` the best."""
        chain = self._chain
        cur_score, best_score = self._cost(current), self._cost(best)
        chain.move_to(current, cur_score)
        chain.reset_best(best, best_score)
        chain.offer(current, cur_score)

    def offer(self, strategy: Strategy) -> bool:
        """Consider ``strategy`` (from another chain, a planner or a person), pins applied:
        if it beats the best, it becomes the best and the chain moves to it. Whether it did."""
        s = self._apply_pins(self.space.project(strategy.validate(self.graph, self.cluster)))
        score = self._cost(s)
        taken = self._chain.offer(s, score)
        if taken:
            self._chain.move_to(s, score)
        return taken

    # ------------------------------------------------------------------ persistence
    def to_dict(self, *, embed: bool = False) -> dict[str, Any]:
        """Everything needed to resume this chain (JSON-ready); see :meth:`save`."""
        doc = {"format": FORMAT, "graph": describe_graph(self.graph),
               "cluster": describe_cluster(self.cluster), "settings": self.settings,
               "chain": self._chain.to_dict(), "history": self._history.to_dict(),
               "pins": {"policies": dict(self._pins), "configs": dict(self._pin_configs),
                        "precision": self._pin_precision}}
        if embed:
            doc["graph_doc"], doc["cluster_doc"] = self.graph.to_dict(), self.cluster.to_dict()
        return doc

    def save(self, path: str | Path, *, embed: bool = False) -> Path:
        """Write the search to ``path`` as JSON, atomically; :meth:`load` resumes the same
        chain (the same proposals follow). ``embed=True`` stores the graph and cluster too."""
        return write_json(path, self.to_dict(embed=embed))

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], graph=None, cluster=None, *,
                  source: str = "search document") -> "MCMCSearch":
        """Rebuild a search from :meth:`to_dict`'s output (graph and cluster given or embedded)."""
        if graph is None or cluster is None:
            if "graph_doc" not in doc or "cluster_doc" not in doc:
                raise SearchError(f"{source}: give the graph and cluster the search ran on "
                                  "(the file does not embed them; save with embed=True)")
            from ..graph import OpGraph
            from ..hardware import Cluster
            with in_field(source, "graph_doc"):
                graph = graph if graph is not None else OpGraph.from_dict(doc["graph_doc"])
            with in_field(source, "cluster_doc"):
                cluster = cluster if cluster is not None else Cluster.from_dict(doc["cluster_doc"])
        check_match(doc, graph, cluster, source)
        self = cls.__new__(cls)
        with in_field(source, "settings"):
            self._setup(graph, cluster, dict(doc["settings"]))
        self._chain = ChainState.from_dict(doc["chain"], source=source)
        for field in ("current", "best"):
            with in_field(source, f"chain.{field}"):
                getattr(self._chain, field).validate(graph, cluster)
        with in_field(source, "history"):
            self._history = History.from_dict(doc["history"])
        self._pins = dict(doc["pins"]["policies"])
        self._pin_configs = {k: dict(v) for k, v in doc["pins"]["configs"].items()}
        self._pin_precision = doc["pins"].get("precision")
        self.space.precision_pinned = self._pin_precision is not None
        with in_field(source, "pins"):
            self.space.pinned[self.space.index(list(self._pins))] = True
        return self

    @classmethod
    def load(cls, path: str | Path, graph=None, cluster=None) -> "MCMCSearch":
        """Resume a search written by :meth:`save`; errors name the file and the mismatch."""
        return cls.from_dict(read_search(path), graph, cluster, source=str(path))

    def __repr__(self) -> str:
        best = "none feasible yet" if not math.isfinite(self.best_cost) else \
            f"best {self.best_score.time * 1e3:.3f} ms"
        return (f"<MCMCSearch {self.graph.meta.get('model', '')!s} on {self.cluster.name}: "
                f"{self.iteration} proposals, {best}, acceptance "
                f"{self.acceptance_rate():.0%}>")
