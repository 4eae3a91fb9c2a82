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
from typing import Any, Mapping

from .._jsonio import dumps, read_json
from ..errors import FileFormatError, SearchError

__all__ = ["FORMAT", "describe_graph", "describe_cluster", "check_match", "read_search",
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


def read_search(path: str | Path) -> dict[str, Any]:
    """Read a saved search, checking its format and fields; errors name the file."""
    doc = read_json(path, kind="memflow.search")
    if doc.get("format") != FORMAT:
        raise FileFormatError(f"{path}: search format {doc.get('format')!r} is not supported; "
                              f"this memflow reads {FORMAT!r}")
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise FileFormatError(f"{path}: saved search lacks the field {missing[0]!r}; the file "
                              "is truncated or was not written by MCMCSearch.save")
    return doc
