"""What a recording keeps: units (:class:`Span`), activation storages (:class:`Storage`) and
weights (:class:`Weight`).

A :class:`~memflow.graph.recorder.Recorder` fills these while the step runs on fake tensors;
:mod:`memflow.graph.tables` turns them into the graph's DataFrames. They hold plain values only
(and a weak reference to a storage), so nothing of the fake program outlives the recording.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from torch.multiprocessing.reductions import StorageWeakRef

from .mapkind import SIGNED

__all__ = ["Span", "Storage", "Weight"]


@dataclass(eq=False)
class Span:
    """One unit: a run of ops owned by one module call."""

    index: int
    name: str
    module: str
    kind: str
    role: str
    call: int
    owner: int
    seq_hi: int = 0
    fwd_flops: float = 0.0
    fwd_bytes: int = 0
    fwd_ops: int = 0
    bwd_flops: float = 0.0
    bwd_bytes: int = 0
    bwd_ops: int = 0
    fwd_tmp: int = 0
    bwd_tmp: int = 0
    unpack_tmp: int = 0            # … the same were what it saved decompressed node by node,
    unpack_done: int = 0           # and the bytes the nodes run before that peak had unpacked
    # the forward cost of its expensive ops (selective recomputation does not re-run them)
    expensive_flops: float = 0.0
    expensive_bytes: int = 0
    expensive_ops: int = 0
    # its forward's matrix products and convolutions: (class, m, n, k) -> count (opcost)
    kernels: dict[tuple[str, int, int, int], int] = field(default_factory=dict)
    # selective checkpointing replays its forward: no op writes an expensive output it keeps
    # so that recompute would read another value (:func:`~.selective.unreplayable_write`)
    selective_replays: bool = True
    last_out: tuple[str, tuple[int, ...]] | None = None    # dtype, shape of its last op's result
    main_out: tuple[str, tuple[int, ...]] | None = None    # … of what its module returned
    reads_params: bool = False


@dataclass(eq=False)
class Storage:
    """An activation storage made (or first seen) during the forward."""

    nbytes: int
    producer: int                  # span index; -1 for the model's inputs
    dtype: str
    shape: tuple[int, ...]
    ref: StorageWeakRef
    tainted: bool
    requires_grad: bool = False
    is_output: bool = False
    expensive: bool = False        # made by an expensive op (:mod:`memflow.graph.selective`)
    kind: str = SIGNED             # what its values are (:mod:`memflow.graph.mapkind`), as the
                                   # op that last wrote it leaves them
    consumers: list[int] = field(default_factory=list)
    savers: list[int] = field(default_factory=list)


@dataclass(eq=False)
class Weight:
    """A parameter or buffer storage under all its names, and the spans that read it."""

    names: list[str]
    numel: int
    nbytes: int
    dtype: str
    trainable: bool
    is_buffer: bool
    module: str                    # module of its first name
    readers: list[int] = field(default_factory=list)
