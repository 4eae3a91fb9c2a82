"""Measure a real training step with PyTorch's own MemTracker, to check ``memflow.estimate``.

``torch.distributed._tools.mem_tracker.MemTracker`` counts every storage (parameters,
buffers, gradients, optimizer states, activations, temporaries) as PyTorch allocates and frees
it, without a GPU. The step measured is the steady state: a first step creates the optimizer
state, the second is measured.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

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
    if name == "adamw":          # memflow's "adam" states (two moments), decoupled decay
        return torch.optim.AdamW(params, lr=1e-3)
    raise ValueError(f"unknown optimizer {name!r}; valid: sgd, momentum, adam, adamw")


@contextlib.contextmanager
def _frozen_as_buffers(model) -> Iterator[None]:
    # MemTracker hooks the gradient of every parameter and fails on a frozen one; a frozen
    # parameter is memory as a buffer is, so it is measured as one.
    frozen = [(m, name, p) for m in model.modules() for name, p in list(m._parameters.items())
              if p is not None and not p.requires_grad]
    for m, name, p in frozen:
        del m._parameters[name]
        m._buffers[name] = p
    try:
        yield
    finally:
        for m, name, p in frozen:
            del m._buffers[name]
            m._parameters[name] = p


def memtracker_peak(model, inputs: Any, *, optimizer: str = "sgd",
                    loss_fn: Callable | None = None, keep_output: bool = False
                    ) -> dict[str, int]:
    """Peak bytes of one steady-state training step on CPU, by MemTracker category.

    ``inputs`` as for :func:`memflow.from_torch` (a tensor, a tuple or a dict). The loss is
    the sum of the outputs unless ``loss_fn(output)`` is given (as in capture); the step is
    ``loss_fn(model(inputs)).backward()`` — the output is dropped once the loss is computed —,
    ``optimizer.step()``, ``zero_grad(set_to_none=True)``. ``keep_output=True`` holds the
    output until backward ends, as capture's ``keep_output`` describes.
    Returns MemTracker's peak snapshot: ``Total`` and one entry per category.
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.utils import _pytree as pytree

    from ..graph.capture import split_inputs

    opt = make_optimizer(optimizer, model.parameters())
    args, kwargs = split_inputs(inputs)
    loss_fn = loss_fn or (lambda out: sum(t.sum() for t in pytree.tree_leaves(out)
                                          if isinstance(t, torch.Tensor) and t.requires_grad))

    def step() -> None:
        out = model(*args, **kwargs)
        loss = loss_fn(out)
        if not keep_output:
            del out
        loss.backward()
        out = None
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()                       # creates the optimizer state: the steady state starts here
    with _frozen_as_buffers(model):
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            step()
    snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return {str(k): int(v) for k, v in snap[dev].items()}
