"""``falconet export`` and ``Detector.export``: a trained detector as an ONNX file, checked.

The family that owns the network makes it exportable
(:meth:`falconet.contract.ExportableFamily.export_graph`: the network and its decoding, to
``boxes`` and ``scores``); the core chooses the weights (:mod:`~falconet.export.weights`),
writes the file (:mod:`~falconet.export.onnx_file`) and compares it with PyTorch
(:mod:`~falconet.export.parity`). ``onnx`` and ``onnxruntime`` come with the ``export`` extra:
``pip install 'falconet-core[export]'``. docs/cli.md lists the keys; docs/export.md says what
each family's graph outputs.
"""

from __future__ import annotations

from falconet.export.model_export import ExportResult, export_checkpoint
from falconet.export.options import ExportError, ExportOptions, ParityError, parse_options

__all__ = [
    "ExportError",
    "ExportOptions",
    "ExportResult",
    "ParityError",
    "export_checkpoint",
    "parse_options",
]
