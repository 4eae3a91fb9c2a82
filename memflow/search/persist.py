"""Saving and resuming searches: fingerprints of the graph and cluster, and checked reads.

A saved search is JSON (written atomically by :mod:`memflow._jsonio`) with the chain's state,
its settings, its history and its pins, plus fingerprints of the graph and the cluster it ran
on: resuming on another graph or cluster would continue a different chain, so a mismatch is an
error that names the file and what differs. The graph and cluster themselves can be embedded
(``embed=True``) so that the file alone resumes the search.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from .._jsonio import Fields, dumps, read_json
from ..errors import FileFormatError, MemflowError, SearchError

__all__ = ["FORMAT", "describe_graph", "describe_cluster", "check_match", "read_search",
           "check_search", "in_field",
           "graph_fingerprint", "cluster_fingerprint"]

FORMAT = "memflow.search/1"
REQUIRED = ("graph", "cluster", "settings", "chain", "history", "pins")


def _digest(doc: Any) -> str:
    text = json.dumps(json.loads(dumps(doc, indent=None)), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def graph_fingerprint(graph) -> str:
    """A short hash of the graph's units and tensors (its meta data is left out).

    >>> from memflow.search.synthetic import chain_graph
    >>> graph_fingerprint(chain_graph(3)) == graph_fingerprint(chain_graph(3))
    True
    >>> graph_fingerprint(chain_graph(3)) == graph_fingerprint(chain_graph(3, batch=8))
    False
    """
    doc = graph.to_dict()
    return _digest({"units": doc["units"], "tensors": doc["tensors"]})


def cluster_fingerprint(cluster) -> str:
    """A short hash of the cluster's devices, hosts, switches and links (not its name)."""
    doc = dict(cluster.to_dict())
    doc.pop("name", None)
    return _digest(doc)


def describe_graph(graph) -> dict[str, Any]:
    """Fingerprint plus what a person needs to recognise the graph in an error message."""
    return {"fingerprint": graph_fingerprint(graph), "model": graph.meta.get("model"),
            "units": len(graph), "batch_size": graph.meta.get("batch_size")}


def describe_cluster(cluster) -> dict[str, Any]:
    """Fingerprint plus the cluster's name and device count."""
    return {"fingerprint": cluster_fingerprint(cluster), "name": cluster.name,
            "devices": len(cluster.devices)}


def check_match(doc: Mapping[str, Any], graph, cluster, source: str) -> None:
    """Raise :class:`~memflow.errors.SearchError` if ``doc`` was saved for another graph or
    cluster, naming ``source`` and both sides."""
    for what, saved, now in (("graph", doc["graph"], describe_graph(graph)),
                             ("cluster", doc["cluster"], describe_cluster(cluster))):
        if saved.get("fingerprint") != now["fingerprint"]:
            show = {k: v for k, v in saved.items() if k != "fingerprint"}
            given = {k: v for k, v in now.items() if k != "fingerprint"}
            raise SearchError(f"{source}: the search was saved for another {what} "
                              f"({show}, fingerprint {saved.get('fingerprint')}); the {what} "
                              f"given is {given}, fingerprint {now['fingerprint']}. Load it with "
                              f"the {what} it ran on")


@contextmanager
def in_field(source: str, field: str) -> Iterator[None]:
    """Re-raise a :class:`~memflow.errors.MemflowError` (or a type error from reading a
    malformed part) raised inside as the same kind of error, prefixed with ``source`` and
    ``field``, so that a check made deep inside names the file it read.

    >>> with in_field("plan/search.json", "chain.current"):
    ...     raise SearchError("unit 'fc9' is not a unit of the graph")
    Traceback (most recent call last):
    ...
    memflow.errors.SearchError: plan/search.json: field 'chain.current': unit 'fc9' is not a unit of the graph
    """
    try:
        yield
    except MemflowError as exc:
        if str(exc).startswith(f"{source}:"):
            raise
        raise type(exc)(f"{source}: field {field!r}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise FileFormatError(f"{source}: field {field!r} is malformed "
                              f"({type(exc).__name__}: {exc})") from None


def read_search(path: str | Path) -> dict[str, Any]:
    """Read a saved search, checking its format and the type of every field; errors name the
    file and the field (see :func:`check_search`)."""
    doc = read_json(path, kind="memflow.search")
    if doc.get("format") != FORMAT:
        raise FileFormatError(f"{path}: search format {doc.get('format')!r} is not supported; "
                              f"this memflow reads {FORMAT!r}")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise FileFormatError(f"{path}: saved search lacks the field {missing[0]!r}; the file "
                              "is truncated or was not written by MCMCSearch.save")
    check_search(doc, str(path))
    return doc


def check_search(doc: Mapping[str, Any], source: str) -> None:
    """Raise :class:`~memflow.errors.FileFormatError` naming ``source`` and the field if a
    saved search's descriptions, settings, history columns or pins have the wrong type (the
    chain's state is checked as it is read, by :meth:`ChainState.from_dict`).

    >>> check_search({"graph": {"fingerprint": "ab"}, "cluster": {"fingerprint": "cd", "devices": 1},
    ...               "settings": {"seed": 0, "beta": "hot"}}, "s.json")
    Traceback (most recent call last):
    ...
    memflow.errors.FileFormatError: s.json: field 'settings.beta' must be a number > 0, got 'hot'
    """
    f = Fields(doc, source)
    for what in ("graph", "cluster"):
        f.sub(what).str("fingerprint")
    devices = f.sub("cluster").int("devices", least=1)
    settings = f.sub("settings")
    limit = settings.get("memory_limit", "a memory limit", None)
    if not (limit is None or isinstance(limit, (int, float, str, dict))
            and not isinstance(limit, bool)):
        raise settings.fail("memory_limit", "null, a number of bytes, a size such as '16GB', "
                            "a fraction such as 0.8 or '80%' or a mapping of devices to these",
                            limit)
    settings.int("seed", least=0)
    settings.number("beta", positive=True)
    settings.bool("memory_aware")
    settings.str("optimizer")
    settings.str("precision", nullable=True)
    moves = settings.get("moves", "null or a mapping of move names to weights", None)
    if moves is not None:
        weights = settings.sub("moves")
        for move in moves:
            weights.number(move, least=0)
    settings.int("restart_every", least=0)
    settings.strs("policies")
    settings.numbers("error_bounds", positive=True)
    settings.str("init")
    settings.bool("runnable", default=False)
    history = f.sub("history")
    history.strs("devices", length=devices)
    for column in ("iteration", "cost", "time", "elapsed"):
        history.numbers(column)
    history.numbers("best_cost", nullable=True)
    for column in ("feasible", "accepted"):
        history.bools(column)
    history.strs("move")
    history.list("unit", "unit names")
    valid = f"lists of {devices} numbers (peak bytes per device)"
    for i, peaks in enumerate(history.list("peaks", valid)):
        if not (isinstance(peaks, list) and len(peaks) == devices and all(
                isinstance(p, (int, float)) and not isinstance(p, bool) for p in peaks)):
            raise history.fail("peaks", f"a list of {valid}", peaks, f" at [{i}]")
    chain = f.sub("chain")
    for score in ("current_score", "best_score"):
        chain.sub(score).numbers("peak", length=devices)
    pins = f.sub("pins")
    policies = pins.sub("policies")
    for unit in policies.doc:
        policies.str(unit)
    configs = pins.sub("configs")
    for unit in configs.doc:
        configs.sub(unit)
