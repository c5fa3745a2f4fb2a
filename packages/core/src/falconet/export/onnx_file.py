"""Writing an :class:`~falconet.contract.ExportGraph` as an ONNX file, with its metadata.

The graph is traced by torch's TorchScript-based exporter (``torch.onnx.export(...,
dynamo=False)``): it needs only the ``onnx`` package and exports a model in seconds on a
laptop CPU. torch marks that exporter deprecated in favour of the ``torch.export``-based one,
which needs ``onnxscript`` as well and took several times as long on the same CPU; its
deprecation notice and the tracer's warnings about constant shapes (the input size is fixed)
are silenced here, since the parity check (:mod:`falconet.export.parity`) is what says whether
the trace is right.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from falconet.contract import ExportGraph
from falconet.export.options import ExportError

INPUT = "images"
OUTPUTS = ("boxes", "scores")
INSTALL = "pip install 'falconet-core[export]'"


def require(module: str) -> Any:
    """Import ``module`` (``onnx``, ``onnxruntime``), or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ExportError(
            f"format=onnx needs the onnx and onnxruntime packages, and {module} does not "
            f"import here ({exc}): {INSTALL} (or pip install onnx onnxruntime)"
        ) from None


def opset_range(graph: ExportGraph) -> tuple[int, int]:
    """The opsets this graph can be written in: the family's minimum to the exporter's newest."""
    from torch.onnx import _constants

    newest = getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", _constants.ONNX_MAX_OPSET)
    return max(graph.min_opset, _constants.ONNX_MIN_OPSET), newest


def check_opset(opset: int, graph: ExportGraph, family: str, default: int) -> None:
    low, high = opset_range(graph)
    if not low <= opset <= high:
        raise ExportError(
            f"opset={opset}: the {family} family's graph needs opset {low} or newer, and "
            f"torch {torch.__version__.split('+')[0]} writes opsets up to {high}; use "
            f"opset={default} (the default) or another of {low}..{high}"
        )


def write_onnx(
    graph: ExportGraph,
    path: Path,
    example: torch.Tensor,
    *,
    opset: int,
    dynamic: bool,
    metadata: Mapping[str, str],
) -> Path:
    """Trace ``graph.module`` on ``example`` (``[batch, 3, H, W]``) and write ``path``
    atomically, with ``metadata`` as the model's metadata properties."""
    onnx = require("onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    axes = {name: {0: "batch"} for name in (INPUT, *OUTPUTS)} if dynamic else None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            warnings.filterwarnings("ignore", message=".*TorchScript-based ONNX export")
            warnings.filterwarnings("ignore", message=".*feature will be removed")
            torch.onnx.export(
                graph.module,
                (example,),
                tmp,
                dynamo=False,
                opset_version=opset,
                input_names=[INPUT],
                output_names=list(OUTPUTS),
                dynamic_axes=axes,
                do_constant_folding=True,
            )
        model = onnx.load(tmp)
        _fix_candidate_dims(model, graph, example)
        for key, value in metadata.items():
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.checker.check_model(model)
        onnx.save(model, tmp)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def _fix_candidate_dims(model: Any, graph: ExportGraph, example: torch.Tensor) -> None:
    """Write the outputs' candidate and class dimensions as the numbers they are: the tracer
    marks every dimension that a dynamic batch flows through as symbolic, though ``N`` and
    ``C`` depend only on the (fixed) input size and the model."""
    with torch.no_grad():
        outputs = graph.module(example)
    for value, tensor in zip(model.graph.output, outputs, strict=True):
        dims = value.type.tensor_type.shape.dim
        for dim, size in zip(list(dims)[1:], tensor.shape[1:], strict=True):
            dim.dim_value = size


def metadata(
    graph: ExportGraph,
    *,
    family: str,
    model: str,
    names: list[str],
    imgsz: int,
    batch: int | None,
    weights: str,
) -> dict[str, str]:
    """What a reader of the file needs besides the graph, as ``metadata_props`` strings."""
    from falconet import __version__

    return {
        "falconet": __version__,
        "family": family,
        "model": model,
        "names": json.dumps(names),
        "imgsz": json.dumps([imgsz, imgsz]),
        "batch": "dynamic" if batch is None else str(batch),
        "weights": weights,
        "input": "images float32 [B, 3, H, W] RGB in [0, 1]; the image's long side resized to "
        "imgsz, centred, padded with 114/255",
        "boxes": "float32 [B, N, 4] xyxy in pixels of the input",
        "scores": "float32 [B, N, C] class probabilities",
        "candidates": graph.candidates,
        "selection": graph.selection,
    }


def output_shapes(path: Path) -> dict[str, list[int | str]]:
    """Each input's and output's shape as the file declares it (``batch`` where dynamic)."""
    onnx = require("onnx")
    model = onnx.load(str(path), load_external_data=False)
    shapes = {}
    for value in (*model.graph.input, *model.graph.output):
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [d.dim_param or d.dim_value for d in dims]
    return shapes
