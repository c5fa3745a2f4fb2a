"""What every eval backend receives and returns: flat numpy arrays in, the 12 COCO stats out.

Conventions are COCO's, so results match pycocotools bit for bit:

* boxes are ``xywh`` (top-left corner, width, height) in original-image pixels, ``float64``;
* category ids are the ground truth's own ids (COCO's are 1..90 with gaps), ``int64``; a
  trainer maps its contiguous label ``i`` to ``ground_truth.category_ids[i]``;
* image ids are the ground truth's ids, ``int64``.

Arrays are flat, one row per box, with an ``image_ids`` column rather than one list per image:
every backend library takes that layout directly, with no JSON round trip. A backend imports
its library through :func:`require_library`, which raises :class:`EvalBackendUnavailable`
with the install command where the library is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import import_module
from typing import Any

import numpy as np

STAT_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
"""The 12 COCO bbox stats, in pycocotools' ``COCOeval.stats`` order."""


class EvalInputError(ValueError):
    """Ground truth or detections that cannot be evaluated; the message says what to fix."""


class EvalBackendUnavailable(RuntimeError):
    """A registered backend whose library is not installed."""


def require_library(module: str, backend: str, install: str):  # -> module
    """Import ``module`` for ``backend``, or fail with the command that installs it."""
    try:
        return import_module(module)
    except ImportError as exc:
        raise EvalBackendUnavailable(
            f"eval_backend={backend} needs the {module} library, which is not importable "
            f"({exc}); install it with: pip install {install}"
        ) from exc


def _column(values: Any, dtype: type, shape: tuple[int, ...], what: str) -> np.ndarray:
    array = np.ascontiguousarray(values, dtype=dtype)
    if array.ndim != len(shape) or any(
        s not in (-1, a) for s, a in zip(shape, array.shape, strict=False)
    ):
        want = "x".join("N" if s == -1 else str(s) for s in shape)
        raise EvalInputError(f"{what} must have shape [{want}], got {list(array.shape)}")
    return array


@dataclass(frozen=True)
class GroundTruth:
    """A COCO-style ground truth, as flat arrays.

    :param image_ids: ``[I]`` image ids.
    :param image_sizes: ``[I, 2]`` ``(height, width)`` per image, pixels.
    :param category_ids: ``[K]`` category ids, in the order contiguous labels index them.
    :param category_names: ``K`` names, same order.
    :param ann_image_ids: ``[N]`` image id of each annotation.
    :param ann_category_ids: ``[N]`` category id of each annotation.
    :param ann_boxes: ``[N, 4]`` xywh pixels.
    :param ann_areas: ``[N]`` area used for the small/medium/large ranges (COCO files give the
        segmentation area; when a file has none, the box area ``w * h``).
    :param ann_iscrowd: ``[N]`` ``bool``; crowd regions are ignore regions: a detection matched
        to one is neither a true nor a false positive.
    """

    image_ids: np.ndarray
    image_sizes: np.ndarray
    category_ids: np.ndarray
    category_names: tuple[str, ...]
    ann_image_ids: np.ndarray
    ann_category_ids: np.ndarray
    ann_boxes: np.ndarray
    ann_areas: np.ndarray
    ann_iscrowd: np.ndarray

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "image_ids", _column(self.image_ids, np.int64, (-1,), "image_ids"))
        n_images = len(self.image_ids)
        set_(self, "image_sizes", _column(self.image_sizes, np.int64, (n_images, 2), "image_sizes"))
        set_(self, "category_ids", _column(self.category_ids, np.int64, (-1,), "category_ids"))
        set_(self, "category_names", tuple(str(n) for n in self.category_names))
        set_(self, "ann_image_ids", _column(self.ann_image_ids, np.int64, (-1,), "ann_image_ids"))
        n = len(self.ann_image_ids)
        set_(
            self,
            "ann_category_ids",
            _column(self.ann_category_ids, np.int64, (n,), "ann_category_ids"),
        )
        set_(self, "ann_boxes", _column(self.ann_boxes, np.float64, (n, 4), "ann_boxes"))
        set_(self, "ann_areas", _column(self.ann_areas, np.float64, (n,), "ann_areas"))
        set_(self, "ann_iscrowd", _column(self.ann_iscrowd, np.bool_, (n,), "ann_iscrowd"))
        if len(self.category_names) != len(self.category_ids):
            raise EvalInputError(
                f"{len(self.category_ids)} category ids but {len(self.category_names)} names"
            )
        if len(set(self.category_names)) != len(self.category_names):
            raise EvalInputError(
                "category names must be unique: per-class results are keyed by name"
            )
        _refuse_duplicates(self.image_ids, "image id")
        _refuse_duplicates(self.category_ids, "category id")
        _refuse_unknown(self.ann_image_ids, self.image_ids, "annotations", "image ids")
        _refuse_unknown(self.ann_category_ids, self.category_ids, "annotations", "category ids")
        if not np.isfinite(self.ann_boxes).all() or (self.ann_boxes[:, 2:] < 0).any():
            raise EvalInputError("ground-truth boxes must be finite with non-negative w, h")

    def names_by_sorted_id(self) -> tuple[str, ...]:
        """Category names ordered by ascending id: the ``K`` axis of a COCO precision array."""
        return tuple(self.category_names[i] for i in np.argsort(self.category_ids, kind="stable"))


@dataclass(frozen=True)
class Detections:
    """Detections for some of a ground truth's images, as flat arrays.

    :param image_ids: ``[D]`` image id of each detection (must be in the ground truth).
    :param category_ids: ``[D]`` category id (must be in the ground truth).
    :param boxes: ``[D, 4]`` xywh pixels.
    :param scores: ``[D]`` confidence; ties are allowed (every backend breaks them as
        pycocotools does: by input order, with a stable sort).
    """

    image_ids: np.ndarray
    category_ids: np.ndarray
    boxes: np.ndarray
    scores: np.ndarray

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "image_ids", _column(self.image_ids, np.int64, (-1,), "detection image_ids"))
        n = len(self.image_ids)
        set_(
            self,
            "category_ids",
            _column(self.category_ids, np.int64, (n,), "detection category_ids"),
        )
        set_(self, "boxes", _column(self.boxes, np.float64, (n, 4), "detection boxes"))
        set_(self, "scores", _column(self.scores, np.float64, (n,), "detection scores"))
        if not (np.isfinite(self.boxes).all() and np.isfinite(self.scores).all()):
            raise EvalInputError("detection boxes and scores must be finite (no NaN or inf)")

    def __len__(self) -> int:
        return len(self.image_ids)

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros(0), np.zeros(0), np.zeros((0, 4)), np.zeros(0))

    def check_against(self, ground_truth: GroundTruth) -> None:
        """Refuse ids the ground truth does not know (pycocotools would assert, some backends
        would silently drop them): a clear error naming them, so no result is silently wrong."""
        _refuse_unknown(
            self.image_ids,
            ground_truth.image_ids,
            "detections",
            "image ids",
            hint="evaluate against the ground truth the detections were made for",
        )
        _refuse_unknown(
            self.category_ids,
            ground_truth.category_ids,
            "detections",
            "category ids",
            hint="map contiguous labels through ground_truth.category_ids",
        )


@dataclass(frozen=True)
class EvalResult:
    """The 12 COCO stats, per-class AP and AP50, and who computed them.

    A value of ``-1`` means "undefined", as in pycocotools: no ground truth in that area range
    (a stat) or for that category (per class). ``extra["pr_curve50"]``, when a backend gives
    it, is :func:`pr_curve_from_precision` (the trainer's PR-curve plot reads it).
    """

    stats: Mapping[str, float]
    per_class_ap: Mapping[str, float]
    per_class_ap50: Mapping[str, float]
    backend: str
    backend_version: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if tuple(self.stats) != STAT_KEYS:
            raise ValueError(f"stats must have the keys {STAT_KEYS}, got {tuple(self.stats)}")

    def to_json(self) -> dict[str, Any]:
        """The ``falconet eval --json`` document."""
        return {
            **{k: float(v) for k, v in self.stats.items()},
            "per_class": {
                name: {"AP": float(ap), "AP50": float(self.per_class_ap50[name])}
                for name, ap in self.per_class_ap.items()
            },
            "backend": self.backend,
            "backend_version": self.backend_version,
        }


def result_from_cocoeval(
    stats: Any, precision: Any, names: tuple[str, ...], backend: str, version: str
) -> EvalResult:
    """The :class:`EvalResult` of a COCOeval-style run, whatever library made it: its 12
    ``stats`` in pycocotools' order and its precision array ``[T, R, K, A, M]`` (categories in
    ascending id order, named by ``names``), giving per-class AP, AP50 and the PR curve."""
    precision = np.asarray(precision)
    ap, ap50 = per_class_from_precision(precision, names)
    return EvalResult(
        stats=dict(zip(STAT_KEYS, np.asarray(stats, dtype=float).tolist(), strict=True)),
        per_class_ap=ap,
        per_class_ap50=ap50,
        extra={"pr_curve50": pr_curve_from_precision(precision, names)},
        backend=backend,
        backend_version=version,
    )


def per_class_from_precision(
    precision: np.ndarray, names: tuple[str, ...]
) -> tuple[dict[str, float], dict[str, float]]:
    """Per-class AP (IoU .50:.95) and AP50 from a COCO precision array ``[T, R, K, A, M]``.

    Uses area range 0 (all) and the last max-detections setting (100), and averages the
    defined (``> -1``) entries as ``COCOeval.summarize`` does; ``-1`` where none is defined.
    """
    ap, ap50 = {}, {}
    for k, name in enumerate(names):
        ap[name] = _mean_defined(precision[:, :, k, 0, -1])
        ap50[name] = _mean_defined(precision[0, :, k, 0, -1])
    return ap, ap50


def pr_curve_from_precision(
    precision: np.ndarray, names: tuple[str, ...]
) -> dict[str, list[float]]:
    """Per-class precision at IoU 0.50 over COCO's 101 recall points (``-1``: undefined),
    area range all, 100 detections: what ``EvalResult.extra["pr_curve50"]`` holds."""
    return {name: precision[0, :, k, 0, -1].astype(float).tolist() for k, name in enumerate(names)}


def _mean_defined(values: np.ndarray) -> float:
    defined = values[values > -1]
    return float(np.mean(defined)) if defined.size else -1.0


def _refuse_duplicates(ids: np.ndarray, what: str) -> None:
    unique, counts = np.unique(ids, return_counts=True)
    if (counts > 1).any():
        raise EvalInputError(f"duplicate {what}s in the ground truth: {_few(unique[counts > 1])}")


def _refuse_unknown(
    ids: np.ndarray, known: np.ndarray, where: str, what: str, hint: str = ""
) -> None:
    unknown = np.setdiff1d(ids, known)
    if unknown.size:
        raise EvalInputError(
            f"{where} refer to {unknown.size} {what} not in the ground truth: "
            f"{_few(unknown)}" + (f"; {hint}" if hint else "")
        )


def _few(ids: np.ndarray, limit: int = 10) -> str:
    shown = ", ".join(str(int(i)) for i in ids[:limit])
    return shown + (f", ... ({len(ids) - limit} more)" if len(ids) > limit else "")
