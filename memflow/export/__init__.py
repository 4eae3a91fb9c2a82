"""Export: a strategy becomes PyTorch training code, and its memory predictions are measured.

* :func:`apply` — the model running a strategy: recompute segments as non-reentrant
  checkpoints, offloaded units' saved tensors in host memory, compressed ones packed by
  memflow's error-bounded quantizer, parts on their devices;
* :func:`script` — a ``torchrun`` training script (DistributedDataParallel over the
  data-parallel replicas) and the strategy JSON beside it;
* :func:`validate` — predicted against measured memory (``saved_bytes``, ``offloaded_bytes``,
  and ``peak_bytes`` on a GPU) and, with ``time=True``, step time (:mod:`~.timing`: the
  exported script run for real); :func:`validate_ranks` — memory per rank of the training
  script run across processes (:mod:`~.rank_validation`).

Anything PyTorch code cannot do as the strategy says raises
:class:`~memflow.errors.ExportError` naming the unit. Modules: :mod:`~.spans` (units as
stretches of the forward), :mod:`~.tracker` (following them at run time), :mod:`~.segment`
(recompute), :mod:`~.saved` (offload, compress), :mod:`~.placement`, :mod:`~.sharding`, :mod:`~.exported`,
:mod:`~.measure`, :mod:`~.validation`, :mod:`~.timing`, :mod:`~.scripts` and its :mod:`~.train_template`,
:mod:`~.factory` (a model from a zoo name or the user's ``file.py:factory``). Across processes:
:mod:`~.pipelining` (pipeline stages, ``torch.distributed.pipelining``),
:mod:`~.tensor_parallel` (parameter splits as DTensor shards) and :mod:`~.multiprocess` (the
training script's path for both); :mod:`~.fsdp` (shard levels: FSDP2 ``fully_shard`` and
ZeRO-1, on the replicas of either path), :mod:`~.model_states` (precision and optimizer
offload on whole-model replicas) and :mod:`~.amp` (the ``amp`` precision: autocast and a loss
scaler in the replicas' training loop); :mod:`~.losses` (the script's loss, and the same loss
for capture: :func:`capture_loss`).

>>> import memflow
>>> sorted(memflow.export.__all__)
['ExportError', 'Exported', 'apply', 'capture_loss', 'held_bytes', 'replicas', 'script', 'validate',
 'validate_ranks']
"""
from ..errors import ExportError
from .exported import Exported, apply
from .losses import capture_loss
from .measure import held_bytes
from .placement import replicas
from .scripts import script
from .rank_validation import validate_ranks
from .timing import validate

__all__ = ["apply", "Exported", "script", "validate", "validate_ranks", "held_bytes", "replicas",
           "ExportError", "capture_loss"]
