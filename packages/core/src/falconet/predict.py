"""Inference on image files: letterbox, network, postprocess, boxes back in original pixels;
and the two outputs of ``falconet predict``: annotated images and a JSON of detections.

Drawing uses OpenCV's built-in Hershey fonts, so nothing (no font file) is fetched.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from falconet.contract import ModelFamily
from falconet.data.images import IMAGE_SUFFIXES
from falconet.data.transforms import letterbox, read_image


def image_sources(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """An image file, a folder of images (recursive), or a list of either, sorted per folder."""
    items = [source] if isinstance(source, str | Path) else list(source)
    paths: list[Path] = []
    for item in items:
        path = Path(item).expanduser()
        if path.is_dir():
            paths += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        elif path.is_file():
            paths.append(path)
        else:
            raise FileNotFoundError(f"source={item}: no such image file or folder")
    if not paths:
        raise FileNotFoundError(f"source={source}: no images found (looked for {IMAGE_SUFFIXES})")
    return paths


@torch.no_grad()
def predict_images(
    module: torch.nn.Module,
    family: ModelFamily,
    paths: Iterable[Path],
    *,
    imgsz: int,
    device: torch.device,
    names: Sequence[str],
    conf: float = 0.25,
    iou: float = 0.7,
    max_det: int = 300,
    batch: int = 16,
) -> list[dict[str, Any]]:
    """One ``{path, boxes [N, 4] xyxy original pixels, scores, labels, names}`` per image
    (numpy arrays). Unreadable images give an ``error`` entry instead of stopping."""
    module.eval()
    results: list[dict[str, Any]] = []
    chunk: list[tuple[Path, np.ndarray, float, tuple[float, float], tuple[int, int]]] = []

    def flush() -> None:
        if not chunk:
            return
        images = torch.from_numpy(np.stack([c[1] for c in chunk])).permute(0, 3, 1, 2)
        images = images.to(device).float().div_(255).contiguous(memory_format=torch.channels_last)
        outputs = module(images)
        detections = family.postprocess(
            outputs, [(imgsz, imgsz)] * len(chunk), conf=conf, iou=iou, max_det=max_det
        )
        for (path, _, ratio, pad, (h, w)), det in zip(chunk, detections, strict=True):
            boxes = det["boxes"].float().cpu().numpy()
            boxes = (boxes - np.array([*pad, *pad], np.float32)) / ratio
            boxes[:, 0::2] = boxes[:, 0::2].clip(0, w)
            boxes[:, 1::2] = boxes[:, 1::2].clip(0, h)
            labels = det["labels"].cpu().numpy()
            results.append(
                {
                    "path": str(path),
                    "boxes": boxes,
                    "scores": det["scores"].float().cpu().numpy(),
                    "labels": labels,
                    "names": [names[i] for i in labels.tolist()],
                }
            )
        chunk.clear()

    for path in paths:
        try:
            image = read_image(str(path))
        except OSError as exc:
            results.append({"path": str(path), "error": str(exc)})
            continue
        boxed, ratio, pad = letterbox(image, imgsz)
        chunk.append((path, boxed, ratio, pad, image.shape[:2]))
        if len(chunk) == batch:
            flush()
    flush()
    return results


def draw(image: np.ndarray, result: dict[str, Any]) -> np.ndarray:
    """``image`` (RGB) with each detection's box and ``name score`` drawn on it."""
    out = np.ascontiguousarray(image.copy())
    for box, score, label, name in zip(
        result["boxes"], result["scores"], result["labels"], result["names"], strict=True
    ):
        colour = _colour(int(label))
        x1, y1, x2, y2 = (round(float(v)) for v in box)
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, 2)
        text = f"{name} {score:.2f}"
        (tw, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)
        top = max(y1 - th - 4, 0)
        cv2.rectangle(out, (x1, top), (x1 + tw + 2, top + th + 4), colour, -1)
        cv2.putText(
            out,
            text,
            (x1 + 1, top + th + 1),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.5,
            (255, 255, 255),
            1,
            cv2.LINE_AA,
        )
    return out


def _colour(label: int) -> tuple[int, int, int]:
    hue = (label * 47) % 180
    bgr = cv2.cvtColor(np.uint8([[[hue, 200, 220]]]), cv2.COLOR_HSV2RGB)[0, 0]
    return tuple(int(c) for c in bgr)


def write_outputs(results: list[dict[str, Any]], folder: Path) -> Path:
    """Annotated copies of the images and ``predictions.json`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    records = []
    for result in results:
        if "error" in result:
            records.append({"path": result["path"], "error": result["error"]})
            continue
        image = read_image(result["path"])
        annotated = draw(image, result)
        cv2.imwrite(
            str(folder / Path(result["path"]).name), cv2.cvtColor(annotated, cv2.COLOR_RGB2BGR)
        )
        records.append(
            {
                "path": result["path"],
                "detections": [
                    {
                        "box_xyxy": [round(float(v), 2) for v in box],
                        "score": round(float(s), 4),
                        "label": int(lab),
                        "name": name,
                    }
                    for box, s, lab, name in zip(
                        result["boxes"],
                        result["scores"],
                        result["labels"],
                        result["names"],
                        strict=True,
                    )
                ],
            }
        )
    target = folder / "predictions.json"
    target.write_text(json.dumps(records, indent=1))
    return target
