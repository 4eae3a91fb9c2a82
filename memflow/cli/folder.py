"""A plan folder: the search run with a progress bar, and the files it leaves, as one set.

``plan/`` holds

* ``strategy.json`` — the best strategy (:meth:`memflow.Strategy.to_json`);
* ``search.json`` — the search, graph and cluster embedded (:meth:`memflow.MCMCSearch.save`),
  so that ``memflow report plan/`` needs neither the model nor a new capture;
* ``history.csv`` — one row per proposal (:attr:`memflow.MCMCSearch.history`);
* ``summary.json`` — what was asked (model, batch, cluster …) and what was found.

The four files are one set: ``search.json`` must be the chain that found ``strategy.json``, or
:meth:`~memflow.MCMCSearch.load` continues another chain. So the folder is never written file
by file in place (nor checked against a manifest, which would only find a mixed folder where
this never makes one). :class:`PlanFolder` is opened *before* the search, so that a bad ``--out``
costs nothing: the path must not be a file or a mount point, a folder already there must be
empty or hold only memflow's files (a new plan replaces it whole), and a staging folder
``.NAME.new-XXXX`` is made beside it, which proves the place writable. The files go into the
staging folder, flushed to disk; then the staging folder takes the plan's place in one step:
Linux's ``renameat2(RENAME_EXCHANGE)`` swaps the two folders atomically; where the system or
file system cannot (macOS, NFS), the old folder is renamed to ``.NAME.old-XXXX`` and the staging
folder to ``NAME``. Last, the old folder is deleted. A ``kill -9`` at any moment thus leaves at
``NAME`` the old complete set or the new one (or nothing, where there was no plan before), so
readers need no check; only with the two renames is there an instant with no ``NAME``, and the
next run puts the old folder back. Whatever a killed run leaves is a hidden sibling, which the
next run for the same folder deletes; a run holds a lock (``flock``) on its staging folder, so
that a second run at the same time leaves it alone. POSIX only (Linux, macOS).

>>> import tempfile, memflow
>>> g = memflow.zoo.graph("chain", batch_size=8, n=3, width=16, units="blocks")
>>> search = run_search(g, memflow.Cluster.preset("2xV100-16GB"), iterations=20, progress=False)
>>> where = Path(tempfile.mkdtemp())
>>> out = write_plan(where / "plan", search, {"model": "chain", "batch": 8})
>>> sorted(p.name for p in out.iterdir())
['history.csv', 'search.json', 'strategy.json', 'summary.json']
>>> out = write_plan(where / "plan", search, {"model": "chain", "batch": 8})   # replaced
>>> sorted(p.name for p in where.iterdir())                                     # no leftovers
['plan']
"""
from __future__ import annotations

import math
import os
import re
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from .._jsonio import write_json, write_text
from ..errors import MemflowError

__all__ = ["run_search", "write_plan", "summarize", "PlanFolder", "FILES", "DERIVED"]

FILES = {"strategy": "strategy.json", "search": "search.json", "history": "history.csv",
         "summary": "summary.json"}
DERIVED = {"report": "report.html", "train": "train.py", "train_strategy": "train.json"}
"""Files that ``memflow report`` and ``memflow demo`` add to a plan folder; they go with it."""
STAGING, OLD = "new", "old"     # the hidden siblings: .NAME.new-XXXX and .NAME.old-XXXX
CHUNK_SECONDS = 0.25   # progress bar refreshes about this often


def _postfix(search) -> dict[str, str]:
    best = search.best_score
    return {"best": f"{best.time * 1e3:,.1f} ms" if math.isfinite(search.best_cost) else "-",
            "feasible": "yes" if best.feasible else "no",
            "accept": f"{search.acceptance_rate():.0%}"}


def run_search(graph, cluster, *, iterations: int | None = None, seconds: float | None = None,
               seed: int = 0, progress: bool = True, **settings: Any):
    """Run an :class:`~memflow.MCMCSearch` for ``iterations`` proposals or ``seconds``
    (60 s when neither is given), showing a tqdm bar with the best time, whether it fits and
    the acceptance rate. ``settings`` go to the search (``optimizer``, ``beta`` …)."""
    from tqdm import tqdm

    from ..search import MCMCSearch

    if iterations is None and seconds is None:
        seconds = 60.0
    search = MCMCSearch(graph, cluster, seed=seed, **settings)
    by_count = iterations is not None
    total = int(iterations) if by_count else float(seconds)
    bar = tqdm(total=total, disable=not progress, unit=" proposals" if by_count else " s",
               bar_format=None if by_count else "{l_bar}{bar}| {n:.0f}/{total:.0f} s{postfix}",
               desc="search", dynamic_ncols=True)
    start = time.perf_counter()
    done = 0
    with bar:
        # Chunks of steps sized to ~CHUNK_SECONDS keep the bar live without a thread.
        chunk = 1
        while True:
            elapsed = time.perf_counter() - start
            left = (total - done) if by_count else (total - elapsed)
            if left <= 0:
                break
            t0 = time.perf_counter()
            n = min(chunk, int(left)) if by_count else chunk
            search.step(max(n, 1))
            done += max(n, 1)
            took = time.perf_counter() - t0
            chunk = max(1, int(chunk * CHUNK_SECONDS / took)) if took > 0 else chunk * 2
            bar.set_postfix(_postfix(search), refresh=False)
            bar.update(max(n, 1) if by_count else min(time.perf_counter() - start, total) - bar.n)
    return search


def summarize(search, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``summary.json``'s content: the inputs, then the best strategy's time, peaks, fit."""
    best = search.best_score
    devices = [str(d) for d in search.cluster.devices.index]
    return {"format": "memflow.planners/1", **dict(inputs),
            "cluster_name": search.cluster.name,
            "iterations": int(search.iteration), "search_seconds": float(search.elapsed),
            "simulations": int(search.simulations),
            "acceptance_rate": float(search.acceptance_rate(None)),
            "best_time": float(best.time), "feasible": bool(best.feasible),
            "start_time": float(search.history["time"].iloc[0]) if search.iteration else None,
            "start_feasible": bool(search.history["feasible"].iloc[0]) if search.iteration
            else None,
            "peak": dict(zip(devices, (float(p) for p in best.peak))),
            "capacity": {d: float(m) for d, m in search.cluster.devices["memory_bytes"].items()},
            "files": dict(FILES)}


def _ours(name: str) -> bool:
    """Whether memflow wrote ``name`` in a plan folder (a temporary file of a write included)."""
    known = {*FILES.values(), *DERIVED.values()}
    tmp = re.fullmatch(r"\.(.+)\.[0-9a-f]+\.tmp", name)     # _jsonio.write_text's
    return name in known or (tmp is not None and tmp.group(1) in known)


def _lock(path: Path) -> int | None:
    """An open descriptor of folder ``path`` holding an exclusive ``flock``; None if another
    process holds it. The lock goes when the descriptor is closed or the process dies."""
    import fcntl                 # POSIX: memflow writes plan folders on Linux and macOS

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _exchange(a: Path, b: Path) -> None:
    """Swap folders ``a`` and ``b`` in one step (Linux renameat2 with RENAME_EXCHANGE);
    OSError where the system or file system cannot."""
    if not sys.platform.startswith("linux"):
        raise OSError(f"no atomic exchange of folders on {sys.platform}")
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    if not hasattr(libc, "renameat2") or libc.renameat2(
            at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err) if err else "no renameat2", str(a))


def _sync(folder: Path) -> None:
    """Flush a folder's entries to disk (renames included), where the system allows it."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:              # pragma: no cover - some file systems refuse it on folders
        pass
    finally:
        os.close(fd)


class PlanFolder:
    """The plan folder ``out``, checked and staged before the search; :meth:`write` puts the
    files in place as one set (see the module docstring). Use it as a context manager: leaving
    without :meth:`write` deletes the staging folder.

    >>> import tempfile
    >>> with PlanFolder(Path(tempfile.mkdtemp()) / "plan") as folder:
    ...     print(folder.path.name, folder.staging.name.startswith(".plan.new-"))
    plan True
    >>> folder.staging.exists()
    False
    """

    def __init__(self, out: str | os.PathLike):
        path = Path(out).expanduser()
        # the folder is renamed, so it needs a name; a symlink's target is what is replaced
        self.path = path.resolve() if path.is_symlink() or path.name in ("", "..") else path
        self._fd: int | None = None
        self._clean_leftovers()
        self._check()
        try:
            self.staging = self._sibling(STAGING)
            self.staging.mkdir()
        except OSError as exc:
            raise MemflowError(f"cannot write the plan folder {self.path}: "
                               f"{exc.strerror or exc} in {self.path.parent}") from None
        self._fd = _lock(self.staging)

    def _sibling(self, kind: str) -> Path:
        return self.path.with_name(f".{self.path.name}.{kind}-{secrets.token_hex(6)}")

    def _clean_leftovers(self) -> None:
        # What killed runs left: an old folder between the two renames goes back (when no plan
        # took its place); the rest is deleted, unless a live run holds its lock.
        parent = self.path.parent
        if not parent.is_dir():
            return
        for kind in (OLD, STAGING):
            prefix = f".{self.path.name}.{kind}-"
            for entry in sorted(p for p in parent.iterdir()
                                if p.name.startswith(prefix) and p.is_dir()):
                fd = _lock(entry)
                if fd is None:
                    continue
                try:
                    if kind == OLD and not self.path.exists():
                        os.rename(entry, self.path)
                    else:
                        shutil.rmtree(entry, ignore_errors=True)
                finally:
                    os.close(fd)

    def _check(self) -> None:
        out = self.path
        if out.exists() and not out.is_dir():
            raise MemflowError(f"cannot write the plan folder {out}: it is a file; "
                               "give a folder (new or written by memflow search)")
        if out.is_dir():
            if os.path.ismount(out):
                raise MemflowError(f"cannot write the plan folder {out}: it is a mount point; "
                                   "give a folder inside it")
            foreign = sorted(p.name for p in out.iterdir() if not _ours(p.name))
            if foreign:
                shown = ", ".join(foreign[:3]) + (" …" if len(foreign) > 3 else "")
                raise MemflowError(f"cannot write the plan folder {out}: it holds {shown}, "
                                   "which memflow did not write, and a new plan replaces the "
                                   "folder whole; give another folder or move them")
            if not os.access(out, os.W_OK | os.X_OK):
                raise MemflowError(f"cannot write the plan folder {out}: its old files "
                                   "cannot be removed (no write permission)")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise MemflowError(f"cannot write the plan folder {out}: cannot create "
                               f"{exc.filename or out.parent} ({exc.strerror or exc})") from None

    def write(self, search, inputs: Mapping[str, Any]) -> Path:
        """Write the plan of ``search`` (``inputs``: what was asked, for ``summary.json``) and
        swap it in; the plan folder's path."""
        stage = self.staging
        # The chain's strategies keep the starting strategy's name; say what this one is.
        best = search.best
        best.with_schedule(name=f"memflow search: best of {search.iteration:,} proposals "
                                f"from {best.name}").to_json(stage / FILES["strategy"])
        search.save(stage / FILES["search"], embed=True)
        # CSV is for people and spreadsheets; flushed to disk like the JSON files.
        write_text(stage / FILES["history"], search.history.to_csv(index=False))
        write_json(stage / FILES["summary"], summarize(search, inputs))
        _sync(stage)
        self._swap()
        return self.path

    def _swap(self) -> None:
        stage, out = self.staging, self.path
        if not out.exists():
            os.rename(stage, out)
            _sync(out.parent)
            return
        try:
            _exchange(stage, out)
            old = stage                  # the staging name now holds the old plan
        except OSError:
            old = self._sibling(OLD)
            fd = _lock(out)              # a second run's clean-up must not put it back
            try:
                os.rename(out, old)
                os.rename(stage, out)
            finally:
                if fd is not None:
                    os.close(fd)
        _sync(out.parent)
        shutil.rmtree(old, ignore_errors=True)

    def close(self) -> None:
        """Release the lock and delete the staging folder if the plan was not swapped in."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> "PlanFolder":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def write_plan(out: str | os.PathLike, search, inputs: Mapping[str, Any]) -> Path:
    """Write the plan folder ``out`` as one set (see the module docstring) and return it."""
    with PlanFolder(out) as folder:
        return folder.write(search, inputs)
