"""Collect a validation run's detections batch by batch, then merge across processes.

``add`` only keeps references (device tensors stay where they are, so validation never waits
on the host per batch); the one device-to-host copy happens in :meth:`state`. A state is a dict
of numpy arrays, small and picklable, made for ``torch.distributed.all_gather_object``:

    states = [None] * world_size
    dist.all_gather_object(states, accumulator.state())
    detections = DetectionAccumulator.merge(states, category_ids).detections()

``merge`` drops a second copy of an image (DistributedSampler pads the last round by repeating
images on some ranks), so each image counts once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from falconet.evaluation.contract import Detections, EvalInputError

_FIELDS = ("boxes_xyxy", "scores", "labels")


def _to_numpy(parts: list[Any], dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    """Concatenate tensors or arrays; torch tensors are joined on their device and copied once.

    One ``torch.cat`` over every part, then one ``detach`` and one copy: per-part Python work
    (a ``detach`` or ``reshape`` per image) cost more than the evaluation itself at 5,000 images.
    """
    if not parts:
        return np.zeros((0, *shape), dtype=dtype)
    if hasattr(parts[0], "detach"):  # torch.Tensor, without importing torch here
        import torch

        return torch.cat(parts).detach().cpu().numpy().astype(dtype, copy=False).reshape(-1, *shape)
    return np.concatenate([np.asarray(p).reshape(-1, *shape) for p in parts]).astype(dtype)


class DetectionAccumulator:
    """Detections of one process, in the torchvision output contract, keyed by image id.

    :param category_ids: maps a contiguous label ``i`` to the ground truth's category id
        ``category_ids[i]`` (``GroundTruth.category_ids`` when the dataset came from COCO).
    """

    def __init__(self, category_ids: Sequence[int]) -> None:
        self.category_ids = np.asarray(category_ids, dtype=np.int64)
        self._images: list[int] = []
        self._parts: dict[str, list[Any]] = {f: [] for f in _FIELDS}
        self._counts: list[int] = []

    def add(self, image_ids: Sequence[int], outputs: Sequence[Mapping[str, Any]]) -> None:
        """One batch: ``outputs[j]`` holds ``boxes [N, 4]`` xyxy original pixels, ``scores [N]``
        and ``labels [N]`` (contiguous) for image ``image_ids[j]``."""
        if len(image_ids) != len(outputs):
            raise ValueError(f"{len(image_ids)} image ids for {len(outputs)} outputs")
        for image_id, out in zip(image_ids, outputs, strict=True):
            self._images.append(int(image_id))
            self._counts.append(out["scores"].shape[0])
            self._parts["boxes_xyxy"].append(out["boxes"])
            self._parts["scores"].append(out["scores"])
            self._parts["labels"].append(out["labels"])

    def state(self) -> dict[str, np.ndarray]:
        """Everything collected, as numpy arrays (one device-to-host copy per field).

        ``images [I]`` and ``counts [I]`` (detections per image) describe the rows of
        ``boxes_xyxy [D, 4]``, ``scores [D]`` and ``labels [D]``, grouped per image in order.
        """
        return {
            "images": np.asarray(self._images, dtype=np.int64),
            "counts": np.asarray(self._counts, dtype=np.int64),
            "boxes_xyxy": _to_numpy(self._parts["boxes_xyxy"], np.float64, (4,)),
            "scores": _to_numpy(self._parts["scores"], np.float64, ()),
            "labels": _to_numpy(self._parts["labels"], np.int64, ()),
        }

    @classmethod
    def merge(
        cls, states: Sequence[Mapping[str, np.ndarray]], category_ids: Sequence[int]
    ) -> DetectionAccumulator:
        """One accumulator holding every state's images, each image once (first state wins)."""
        merged = cls(category_ids)
        seen: set[int] = set()
        for state in states:
            fresh = np.array([i not in seen for i in state["images"].tolist()], dtype=bool)
            seen.update(state["images"].tolist())
            rows = np.repeat(fresh, state["counts"])
            merged._images.extend(state["images"][fresh].tolist())
            merged._counts.extend(state["counts"][fresh].tolist())
            for name in _FIELDS:
                merged._parts[name].append(state[name][rows])
        return merged

    @property
    def images(self) -> list[int]:
        """Image ids seen so far (with or without detections)."""
        return list(self._images)

    def detections(self) -> Detections:
        """The collected detections in the evaluation contract (xywh, category ids)."""
        state = self.state()
        labels = state["labels"]
        if labels.size and (labels.min() < 0 or labels.max() >= len(self.category_ids)):
            raise EvalInputError(
                f"labels must be in 0..{len(self.category_ids) - 1} (one per "
                f"category), got {labels.min()}..{labels.max()}"
            )
        xywh = state["boxes_xyxy"]  # a fresh array: converted in place
        xywh[:, 2:] -= xywh[:, :2]
        image_ids = np.repeat(state["images"], state["counts"])
        return Detections(
            image_ids=image_ids,
            category_ids=self.category_ids[labels],
            boxes=xywh,
            scores=state["scores"],
        )
