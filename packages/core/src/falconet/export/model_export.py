"""An export from end to end: weights chosen, the family's graph built, the file written and
checked. The family owns its graph (:class:`~falconet.contract.ExportableFamily`); this module
names no family."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from falconet.contract import ExportableFamily, ExportGraph, ModelFamily
from falconet.export.onnx_file import (
    check_opset,
    metadata,
    output_shapes,
    require,
    write_onnx,
)
from falconet.export.options import DEFAULT_OPSET, ExportError, ExportOptions, ParityError
from falconet.export.parity import Parity, check_parity
from falconet.export.weights import choose_weights

log = logging.getLogger("falconet.export")

CHECK_BATCHES = (1, 3)
"""The batch sizes a dynamic-batch file is checked at."""


@dataclass(frozen=True)
class ExportResult:
    """What was written and what the parity check measured (``parity`` is empty with
    ``check=false``); ``batch`` is ``None`` for a dynamic batch dimension."""

    path: Path
    format: str
    opset: int
    batch: int | None
    imgsz: int
    weights: str
    shapes: dict[str, list[int | str]]
    candidates: str
    selection: str
    parity: list[Parity] = field(default_factory=list)

    def summary(self) -> str:
        """The lines ``falconet export`` prints."""
        batch = "dynamic batch" if self.batch is None else f"batch {self.batch}"
        lines = [
            f"exported {self.path} ({self.format}, opset {self.opset}, {batch}, "
            f"{self.imgsz}x{self.imgsz}, {self.weights} weights)",
            f"  input   images  float32 {_shape(self.shapes['images'])}  RGB in [0, 1], "
            "letterboxed",
            f"  output  boxes   float32 {_shape(self.shapes['boxes'])}  xyxy, input pixels",
            f"  output  scores  float32 {_shape(self.shapes['scores'])}  class probabilities",
            f"  one candidate: {self.candidates}",
            f"  detections (outside the graph): {self.selection}",
        ]
        for check in self.parity:
            lines.append(
                f"  parity with PyTorch, onnxruntime CPU, batch {check.batch}: "
                f"max |score diff| {check.score_error:.1e} (<= {check.score_tolerance:.0e}), "
                f"max |box diff| {check.box_error:.1e} px (<= {check.box_tolerance:.1e}) over "
                f"{check.pairs} best (candidate, class) pairs"
            )
        return "\n".join(lines)


def _shape(dims: list[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def exportable_graph(family: ModelFamily, module: torch.nn.Module) -> ExportGraph:
    """The family's :class:`ExportGraph` of ``module``, or why there is none."""
    if not isinstance(family, ExportableFamily):
        raise ExportError(
            f"the {family.name} family does not say how to export its models (it has no "
            "export_graph method); ask its authors for one (docs/plugins.md)"
        )
    graph = family.export_graph(module)
    if not isinstance(graph, ExportGraph):
        raise ExportError(
            f"the {family.name} family's export_graph returned {type(graph).__name__}, "
            "not a falconet.contract.ExportGraph"
        )
    return graph


def check_images(source: str | None, imgsz: int, count: int) -> torch.Tensor:
    """``[count, 3, imgsz, imgsz]`` float32 in ``[0, 1]``: ``source``'s images letterboxed as
    ``falconet predict`` does them (repeated where it has fewer), else images of the built-in
    ``shapes`` set's generator (textured backgrounds, coloured shapes), made here."""
    if source:
        from falconet.data.transforms import letterbox, read_image
        from falconet.predict import image_sources

        paths = image_sources(source)
        pixels = [letterbox(read_image(str(paths[i % len(paths)])), imgsz)[0] for i in range(count)]
    else:
        from falconet.data.shapes import make_image

        pixels = [make_image(seed, imgsz)[0] for seed in range(count)]
    batch = torch.from_numpy(np.stack(pixels)).permute(0, 3, 1, 2)
    return batch.float().div_(255).contiguous()


def export_checkpoint(
    checkpoint: dict[str, Any],
    where: Path,
    family: ModelFamily,
    options: ExportOptions,
) -> ExportResult:
    """Write ``checkpoint`` (loaded from ``where``) of ``family`` as ``options`` say."""
    require("onnx")
    if options.check:
        require("onnxruntime")
    spec = checkpoint["spec"]
    which, state = choose_weights(checkpoint, options.weights, str(where))
    log.info("export: the %s weights of %s", which, where)
    module = family.build_model(spec["model"], len(spec["names"]))
    module.load_state_dict(state)
    module = module.float().eval()
    graph = exportable_graph(family, module)
    opset = options.opset
    check_opset(opset, graph, family.name, DEFAULT_OPSET)
    imgsz = options.imgsz or int(checkpoint.get("config", {}).get("imgsz") or 640)
    batches = sorted({*CHECK_BATCHES, options.batch}) if options.dynamic else [options.batch]
    images = check_images(options.source, imgsz, max(batches))
    path = Path(options.out) if options.out else where.with_suffix(".onnx")
    write_onnx(
        graph,
        path,
        images[: options.batch].contiguous(),
        opset=opset,
        dynamic=options.dynamic,
        metadata=metadata(
            graph,
            family=family.name,
            model=spec["model"],
            names=list(spec["names"]),
            imgsz=imgsz,
            batch=None if options.dynamic else options.batch,
            weights=which,
        ),
    )
    result = ExportResult(
        path=path,
        format=options.format,
        opset=opset,
        batch=None if options.dynamic else options.batch,
        imgsz=imgsz,
        weights=which,
        shapes=output_shapes(path),
        candidates=graph.candidates,
        selection=graph.selection,
        parity=check_parity(graph, path, images, batches) if options.check else [],
    )
    failed = [p for p in result.parity if not p.ok]
    if failed:
        raise ParityError(
            f"{path} was written, but its outputs differ from PyTorch's beyond the tolerance: "
            + "; ".join(
                f"batch {p.batch}: score {p.score_error:.1e} (<= {p.score_tolerance:.0e}), "
                f"box {p.box_error:.1e} px (<= {p.box_tolerance:.1e})"
                for p in failed
            )
            + f". Try another opset (opset={DEFAULT_OPSET} is the default), or report it with "
            "the file and these numbers"
        )
    return result
