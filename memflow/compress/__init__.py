"""Error-bounded lossy compression of feature maps (COMET-style), and its model for the simulator.

``compress``/``decompress`` keep every element within an absolute (or range-relative) error
bound — with SZ3 (the optional ``pysz``, as COMET) on the CPU when it is installed, with
memflow's own quantizer otherwise (:mod:`~memflow.compress.codec`);
:class:`compressed_saved_tensors` applies them to what autograd saves for backward;
``expected_ratio`` and ``throughput`` are what the simulator charges for the ``compress`` policy.

>>> import torch
>>> x = torch.relu(torch.randn(64, 64))
>>> packed = compress(x, 1e-2)
>>> bool((decompress(packed) - x).abs().max() <= 1e-2), packed.ratio > 3
(True, True)
"""
from .hooks import compressed_saved_tensors
from .measure import measure
from .model import DEFAULT_ERROR_BOUND, THROUGHPUT, expected_ratio, launches, throughput
from .codec import COMPRESSORS, choose, compress, decompress
from .quantizer import FLOAT_DTYPES, Packed, compressed_bytes
from .sz3 import available as sz3_available

__all__ = ["Packed", "compress", "decompress", "compressed_bytes", "compressed_saved_tensors",
           "choose", "COMPRESSORS", "sz3_available",
           "measure", "expected_ratio", "throughput", "launches", "THROUGHPUT",
           "DEFAULT_ERROR_BOUND", "FLOAT_DTYPES"]
