#!/usr/bin/env python
"""Train a model with a memflow strategy: written by ``memflow.export.script``.

Run it with ``torchrun --nproc_per_node <processes> <this file> --steps 100``: one process per
data-parallel replica of the strategy (another process count stops it with one line saying the
right one; ``--batch-size`` shrinks the global batch for a try-out on a laptop, to a multiple of
replicas x micro-batches), DistributedDataParallel between them (NCCL on GPUs,
gloo on CPU; FSDP2 ``fully_shard`` and ZeRO-1 where the strategy shards model states,
``memflow.export.fsdp``; with ``ACROSS`` set, one process per pipeline stage or tensor-parallel shard
instead, ``memflow.export.multiprocess``), each replica running the strategy's memory policies
and placement through
``memflow.export.apply``. Without torchrun it runs one replica in this process.

The configuration below was written for one model and one strategy (the JSON file beside this
script); flags override it. The batch is synthetic — one fixed batch per replica from the model
factory, with fixed random targets, so the loss must fall — unless ``--data file.py:fn`` gives
``fn(rank, world_size, batch_size)``, an iterable of ``(inputs, target)`` batches.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils import _pytree as pytree
from tqdm import tqdm

from memflow.export import apply
from memflow.export.accumulation import accumulate, accumulates, micro_batches
from memflow.export.amp import autocast, grad_scaler
from memflow.export.fsdp import shard_model
from memflow.export.losses import LOSSES, first_float, loss_of
from memflow.export.multiprocess import train_across_processes
from memflow.export.rank_measure import measure_rank
from memflow.export.scripts import launch_problem
from memflow.export.factory import build_model, load_callable
from memflow.strategy import Strategy

# ---- configuration (written by memflow.export.script) ----
MODEL = "chain"                 # a memflow.zoo name, or "path/to/file.py:factory"
MODEL_OPTIONS: dict = {}        # zoo options (n_layer, hidden, ...) or factory keywords
BATCH_SIZE = 8                  # global batch, split over the replicas
STRATEGY = "strategy.json"      # beside this script
OPTIMIZER = "sgd"               # sgd, momentum or adam
LR = 0.01
LOSS = "auto"                   # auto, cross_entropy or mse
DEVICES: dict = {}              # strategy device name -> torch device (default: gpuK -> cuda:K)
ACROSS = None                   # "pipeline"/"tensor": a process per stage/shard; None: per replica
# ---- end of configuration ----

HERE = Path(__file__).resolve().parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="training steps")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="global batch size")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"), default=OPTIMIZER)
    p.add_argument("--loss", choices=LOSSES, default=LOSS)
    p.add_argument("--strategy", default=str(HERE / STRATEGY), help="strategy JSON")
    p.add_argument("--data", default=None, help="file.py:fn giving (inputs, target) batches")
    p.add_argument("--devices", default=json.dumps(DEVICES), help="JSON: device name -> torch")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--measure", default=None, help="folder: each rank writes the memory it "
                   "holds after the first step (memflow.export.rank_validation)")
    p.add_argument("--step-times", default=None,
                   help="JSON file: wall and CPU seconds of every step, written by rank 0")
    return p.parse_args(argv)


def as_args(inputs) -> tuple[tuple, dict]:
    if isinstance(inputs, dict):
        return (), inputs
    return (tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)), {}


def main(argv: list[str] | None = None) -> list[float]:
    """Train; returns the loss of every step (averaged over the replicas)."""
    args = parse_args(argv)
    distributed = "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    strategy = Strategy.from_json(Path(args.strategy))
    # checked before the process group starts: one line from rank 0, not one error per rank;
    # the other ranks leave quietly (status 0), so torchrun names rank 0 as the failure rather
    # than stopping it before it has printed
    problem = launch_problem(strategy, world, args.batch_size, ACROSS)
    if problem is not None:
        if rank == 0:
            print(f"{Path(__file__).name}: error: {problem}", file=sys.stderr)
        raise SystemExit(2 if rank == 0 else 0)
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    # ---- pipeline stages and tensor-parallel groups across processes (memflow.export.multiprocess)
    if distributed and ACROSS:
        losses = train_across_processes(
            strategy, ACROSS, args, lambda batch, seed: build_model(MODEL, batch, MODEL_OPTIONS,
                                                                    device="cpu", seed=seed),
            loss_of, as_args)
        dist.destroy_process_group()
        return losses
    # ---- end of the multi-process path ----
    torch.manual_seed(args.seed)
    # this replica's share of the global batch
    model, example = build_model(MODEL, args.batch_size // world, MODEL_OPTIONS, device="cpu",
                                 seed=args.seed + rank)
    model = apply(model, strategy, inplace=True, replica=rank,
                  devices=json.loads(args.devices))
    device = model.devices[0][0]
    if device.type == "cuda":
        torch.cuda.set_device(device)       # this process's GPU for NCCL
    # ---- model states (memflow.export.fsdp): FSDP2 fully_shard per sharded unit, ZeRO-1,
    # DistributedDataParallel for the rest; bf16 with fp32 masters, optimizer on the host
    sharding = shard_model(model, device)
    model = sharding.module
    # ---- end of model states ----
    if args.data:
        batches = itertools.cycle(load_callable(args.data)(rank, world, args.batch_size // world))
    else:
        batches = itertools.repeat((example, None))
    kind, options = ((torch.optim.Adam, {"lr": args.lr}) if args.optimizer == "adam" else
                     (torch.optim.SGD, {"lr": args.lr, "momentum": 0.9 if args.optimizer ==
                                        "momentum" else 0.0}))
    optimizer = sharding.optimizer(kind, **options)
    # ---- precision amp (memflow.export.amp): forward and loss under float16 autocast, fp32
    # weights, gradients and states, backward on the scaled loss (a pass-through otherwise)
    scaler = grad_scaler(strategy.precision, device)
    losses, target, seconds, cpu_seconds = [], None, [], []
    for step in tqdm(range(args.steps), disable=rank != 0, desc="training"):
        start, cpu_start = time.perf_counter(), time.process_time()
        inputs, given = next(batches)
        call_args, call_kwargs = pytree.tree_map_only(
            torch.Tensor, lambda t: t.to(device), sharding.inputs(as_args(inputs)))
        optimizer.zero_grad(set_to_none=True)
        target = given.to(device) if given is not None else target
        if accumulates(strategy):
            # ---- gradient accumulation (1F1B, one stage): each micro-batch's forward, then
            # its backward (memflow.export.accumulation); replicas synchronise on the last
            m = strategy.microbatches

            def micro_loss(output, k: int) -> torch.Tensor:
                nonlocal target
                if target is None:      # drawn for the whole batch, as without micro-batches
                    out = first_float(output)
                    _, target = loss_of(args.loss, out.new_zeros((out.shape[0] * m,
                                                                   *out.shape[1:])),
                                        None, args.seed + 1000 + rank)
                return loss_of(args.loss, output, target.tensor_split(m)[k],
                               args.seed + 1000 + rank)[0]
            loss = accumulate(model, (call_args, call_kwargs), m, micro_loss, sharding.no_sync,
                              autocast=lambda: autocast(strategy.precision, device),
                              scale=scaler.scale)
            # ---- end of gradient accumulation ----
        else:
            with autocast(strategy.precision, device):
                loss, target = loss_of(args.loss, model(*call_args, **call_kwargs), target,
                                       args.seed + 1000 + rank)
            scaler.scale(loss).backward()
        sharding.after_backward()
        scaler.step(optimizer)      # skipped, and the scale shrunk, if a gradient is not finite
        scaler.update()
        if args.measure and step == args.steps - 1:     # one micro-batch's under accumulation
            measure_rank(args.measure, rank, None, model, optimizer,
                         micro_batches(call_args, call_kwargs, strategy.microbatches)[0]
                         if accumulates(strategy) else (call_args, call_kwargs),
                         autocast=lambda: autocast(strategy.precision, device))
        value = loss.detach().float()
        if distributed:
            dist.all_reduce(value)
            value /= world
        losses.append(float(value))      # waits for the step (a CUDA sync, on GPUs)
        seconds.append(time.perf_counter() - start)
        cpu_seconds.append(time.process_time() - cpu_start)    # this process's CPU time
        if rank == 0:
            tqdm.write(f"step {step + 1}/{args.steps} loss {losses[-1]:.6f}")
    if args.step_times and rank == 0:
        record = {"wall": seconds, "cpu": cpu_seconds}
        if device.type == "cuda":       # the whole run's peaks, as the caching allocator saw them
            record.update(peak_allocated=torch.cuda.max_memory_allocated(device),
                          peak_reserved=torch.cuda.max_memory_reserved(device))
        Path(args.step_times).write_text(json.dumps(record))
    if distributed:
        # Every rank leaves together, the DDP reducer first: a rank that tears gloo down while
        # another still finishes its last collective aborts ("terminate called without an
        # active exception"), seen once in three 4-process runs on 2 CPU cores.
        del model, optimizer, sharding
        dist.barrier()
        dist.destroy_process_group()
    return losses


if __name__ == "__main__":
    main()
