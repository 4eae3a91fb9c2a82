"""Measure a real training step with PyTorch's own MemTracker, to check ``memflow.estimate``.

``torch.distributed._tools.mem_tracker.MemTracker`` counts every storage (parameters,
buffers, gradients, optimizer states, activations, temporaries) as PyTorch allocates and frees
it, without a GPU. The step measured is the steady state: a first step creates the optimizer
state, the second is measured.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["memtracker_peak", "make_optimizer"]


def make_optimizer(name: str, params) -> Any:
    """The PyTorch optimizer memflow's ``optimizer=`` names stand for."""
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if name == "momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}; valid: sgd, momentum, adam")


def memtracker_peak(model, inputs: tuple, *, optimizer: str = "sgd",
                    loss_fn: Callable | None = None) -> dict[str, int]:
    """Peak bytes of one steady-state training step on CPU, by MemTracker category.

    The loss is ``output.sum()`` unless ``loss_fn(output)`` is given (as in capture); the
    step is forward, backward, ``optimizer.step()``, ``zero_grad(set_to_none=True)``.
    Returns MemTracker's peak snapshot: ``Total`` and one entry per category.
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker

    opt = make_optimizer(optimizer, model.parameters())
    loss_fn = loss_fn or (lambda out: out.sum() if isinstance(out, torch.Tensor)
                          else sum(o.sum() for o in out))

    def step() -> None:
        loss = loss_fn(model(*inputs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()                       # creates the optimizer state: the steady state starts here
    tracker = MemTracker()
    tracker.track_external(model, opt)
    with tracker:
        step()
    snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return {str(k): int(v) for k, v in snap[dev].items()}
