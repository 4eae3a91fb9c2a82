"""Run a function on a gloo process group of a few CPU processes, as the exported script's
ranks do under torchrun, and collect what each rank returns."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world: int, port: int, folder: str, args: tuple) -> None:
    os.environ.update(OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    try:
        result = fn(rank, *args)
        dist.barrier()      # every rank leaves together (gloo aborts on a peer torn down)
    finally:
        dist.destroy_process_group()
    torch.save(result, Path(folder) / f"rank{rank}.pt")


def run_ranks(fn: Callable, world: int, folder: Path, *args: Any) -> list[Any]:
    """``fn(rank, *args)`` on ``world`` spawned processes; their results, by rank.

    A rank killed by a signal is tried once more on a fresh port: in two full-suite runs
    (never alone, nor with its file or the tests before it) a rank of the ZeRO-1 case
    aborted with "terminate called without an active exception" and no Python error, a
    crash in gloo's C++ threads rather than in the step. A rank that fails twice, or raises,
    fails the test."""
    files = [folder / f"rank{r}.pt" for r in range(world)]
    for attempt in range(2):
        try:
            mp.spawn(_entry, (fn, world, _free_port(), str(folder), args), nprocs=world)
            break
        except mp.ProcessExitedException as err:
            if attempt or err.signal_name is None:
                raise
            for f in files:
                f.unlink(missing_ok=True)
    return [torch.load(f, weights_only=False) for f in files]


def gathered(results: list[dict], model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """One gradient per parameter of ``model`` from the ranks' ``{name: grad}``. A weight two
    ranks hold (a tied weight, under either of its names) must be complete, alike, on both."""
    canonical: dict[int, str] = {}
    alias = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        alias[name] = canonical.setdefault(id(p), name)
    out: dict[str, torch.Tensor] = {}
    for grads in results:
        for name, g in grads.items():
            name = alias[name.removeprefix("module.")]
            if name in out:
                torch.testing.assert_close(g, out[name], msg=f"{name} differs between ranks")
            out.setdefault(name, g)
    return out


def _scripts_entry(rank: int, scripts: list[str], world: int, ports: list[int], folder: str,
                   argv: list[str]) -> None:
    import importlib.util
    torch.set_num_threads(1)
    losses = []
    for k, (path, port) in enumerate(zip(scripts, ports)):
        # what torchrun gives each rank; the script starts and ends its own process group
        os.environ.update(OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank),
                          WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        spec = importlib.util.spec_from_file_location(f"exported_{k}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        losses.append(module.main(argv))
    torch.save(losses, Path(folder) / f"rank{rank}.pt")


def run_scripts(scripts: list[Path], world: int, folder: Path, argv: list[str]) -> list[list]:
    """Each exported training script's ``main(argv)`` in turn on ``world`` spawned processes,
    as ``torchrun --nproc_per_node world`` runs it (its environment, a port per script), in one
    launch: the processes import torch and memflow once. Rank 0's losses, by script."""
    ports = [_free_port() for _ in scripts]
    mp.spawn(_scripts_entry, ([str(p) for p in scripts], world, ports, str(folder), argv),
             nprocs=world)
    return torch.load(folder / "rank0.pt", weights_only=False)
