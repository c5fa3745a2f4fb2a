"""The contract of each kind of thing a plugin can register.

Every kind is a runtime-checkable :class:`typing.Protocol`: a registry refuses an item that lacks
the attributes below, with the plugin named. Conventions shared by all kinds:

* images: ``float`` tensors ``[B, 3, H, W]`` in ``[0, 1]``, RGB, on the training device;
* boxes: ``xyxy`` in pixels of the tensor they refer to, ``float32``, unless a docstring says
  otherwise (COCO evaluation uses ``xywh`` in original-image pixels, as COCO does);
* labels: contiguous class indices ``0..C-1``, ``int64``;
* ground truth in a batch is *padded*: ``boxes [B, M, 4]``, ``labels [B, M]`` and a
  ``counts [B]`` (``int64``) of real boxes per image, so model, assigner and loss code is
  static-shaped (``M`` depends on the batch's bucket, never on Python-side data inspection);
  the loader adds the same boxes per box, ``box_images [N]`` and ``box_slots [N]``
  (:mod:`falconet.data.targets`), for code that works on the real boxes only.

Every item carries ``name`` (what users type) and ``summary`` (one line for
``falconet plugins list``). Torch is imported only for type checking here, so importing this
module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn

    from falconet.evaluation.contract import Detections, EvalResult, GroundTruth


@runtime_checkable
class ModelFamily(Protocol):
    """A family of detectors (YOLO, DETR-style, ...) and everything needed to train it.

    ``models`` lists the selectable model names (``yolo-n``, ``yolo-s``, ...); they share one
    namespace with family names across all plugins.
    """

    name: str
    summary: str
    models: Sequence[str]

    def build_model(self, model: str, num_classes: int) -> nn.Module:
        """Build ``model`` (one of ``models``) with ``num_classes`` classes, randomly initialised.

        In training mode the module maps images ``[B, 3, H, W]`` to raw head outputs (whatever
        the family's loss consumes); :meth:`postprocess` turns those into detections.
        """
        ...

    def build_loss(self, model: nn.Module, assigner: Assigner) -> Callable[..., Any]:
        """Return ``loss(outputs, targets) -> (total [], parts {name: []})`` using ``assigner``.

        ``targets`` is the padded ground truth of the module docstring. ``total`` is a scalar
        normalised so it does not depend on the world size (DDP averages gradients).
        """
        ...

    def default_recipe(self, model: str) -> Mapping[str, Any]:
        """Training keys this model trains best with (``optimizer``, ``lr0``, ``imgsz``, ...)."""
        ...

    # Optional: ``static_loss(assigner) -> bool``, whether the loss built with that assigner
    # is static-shaped and free of host synchronisation for a fixed input shape and target
    # bucket, so a graph backend may capture the whole step (absent: no).

    def capture_region(self, model: nn.Module) -> nn.Module | None:
        """The submodule a graph backend may capture or compile, or ``None`` for none.

        The region must have static shapes for a fixed input shape and no Python-side
        data-dependent control flow (YOLO: the whole network).
        """
        ...

    def postprocess(
        self,
        outputs: Any,
        image_sizes: Sequence[tuple[int, int]],
        *,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        multi_label: bool = False,
    ) -> list[dict]:
        """Decode raw outputs into one ``{boxes [N, 4] xyxy, scores [N], labels [N]}`` per image.

        ``image_sizes`` holds each input's ``(height, width)`` in pixels; boxes are returned in
        those pixels (the caller undoes its letterbox). ``conf`` is the score threshold, ``iou``
        the NMS threshold, ``max_det`` the cap per image; ``multi_label`` keeps every class
        above ``conf`` per location (validation asks for it: it raises recall).
        """
        ...


@dataclass(frozen=True)
class Assignment:
    """What an assigner returns: per-anchor training targets, all ``[B, A, ...]``.

    ``labels [B, A] int64`` (ignored where ``foreground`` is 0), ``boxes [B, A, 4] float32``
    (xyxy pixels), ``scores [B, A, C] float32`` (soft classification targets) and
    ``foreground [B, A] float32`` (1 for positive anchors, else 0: a mask to multiply by).
    """

    labels: torch.Tensor
    boxes: torch.Tensor
    scores: torch.Tensor
    foreground: torch.Tensor


@runtime_checkable
class Assigner(Protocol):
    """A label assigner: a standalone, no-grad function of predictions and padded targets."""

    name: str
    summary: str

    def __call__(
        self,
        pred_scores: torch.Tensor,
        pred_boxes: torch.Tensor,
        anchor_points: torch.Tensor,
        gt_boxes: torch.Tensor,
        gt_labels: torch.Tensor,
        gt_counts: torch.Tensor,
        anchor_strides: torch.Tensor | None = None,
        box_rows: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> Assignment:
        """Assign ground truth to anchors.

        :param pred_scores: ``[B, A, C]`` class probabilities (after sigmoid), detached.
        :param pred_boxes: ``[B, A, 4]`` predicted boxes, xyxy pixels, detached.
        :param anchor_points: ``[A, 2]`` anchor centres ``(x, y)`` in pixels.
        :param gt_boxes: ``[B, M, 4]`` padded ground-truth boxes, xyxy pixels.
        :param gt_labels: ``[B, M]`` padded labels, ``int64``.
        :param gt_counts: ``[B]`` number of real boxes per image, ``int64``.
        :param anchor_strides: ``[A, 1]`` the stride of each anchor's level, in pixels (for
            assigners whose rules are in strides, such as SimOTA's centre radius).
        :param box_rows: ``(box_images [N], box_slots [N])``, the batch's real boxes
            (:mod:`falconet.data.targets`), when the loss has them; an assigner may use them
            to work on ``N`` boxes instead of ``B x M`` slots, and must give the same
            assignment either way, or ignore them. One without this parameter is called
            without it.

        Each anchor is assigned at most one ground-truth box.
        """
        ...


@runtime_checkable
class EvalBackend(Protocol):
    """A COCO bbox evaluator. Every backend must return the reference (pycocotools) numbers;
    ``falconet_testing.contracts.EvalBackendContract`` checks it.

    Input and output are :mod:`falconet.evaluation.contract`: flat numpy arrays with boxes
    ``xywh`` in original-image pixels and the ground truth's own category ids; the result holds
    the 12 COCO stats under ``AP AP50 AP75 APs APm APl AR1 AR10 AR100 ARs ARm ARl``, per-class
    AP and AP50 keyed by category name, and the backend's name and version. Input is validated
    before a backend sees it (every detection's image and category id is in the ground truth).
    """

    name: str
    summary: str

    def version(self) -> str:
        """The version of the library doing the work; imports it, so it raises
        ``EvalBackendUnavailable`` with the install command when the library is missing."""
        ...

    def evaluate(
        self, ground_truth: GroundTruth, detections: Detections, *, threads: int | None = None
    ) -> EvalResult:
        """Evaluate ``detections`` against ``ground_truth``; ``threads=None`` is the library's
        default. Must handle zero detections (every stat with ground truth is then 0)."""
        ...


@runtime_checkable
class PrecisionBackend(Protocol):
    """How the numbers of a step are represented: an autocast context, a scaler, a model wrapper.

    Composed into the trainer, never subclassed into it.
    """

    name: str
    summary: str

    def unavailable_reason(self, device: torch.device) -> str | None:
        """``None`` when the backend can run on ``device``, else why not (one sentence)."""
        ...

    def autocast(self, device: torch.device) -> AbstractContextManager[Any]:
        """The context the forward pass and loss run under."""
        ...

    def grad_scaler(self, device: torch.device) -> torch.amp.GradScaler | None:
        """A gradient scaler when the format needs loss scaling (fp16), else ``None``."""
        ...

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Convert or wrap the model for this format (identity for autocast-only backends)."""
        ...


@dataclass(frozen=True)
class DispatchContext:
    """What a graph backend may inspect before it agrees to dispatch the network.

    ``capture_region`` is the family's declared region (``None``: the family declares none);
    ``world_size`` is 1 outside distributed runs; ``options`` holds the run's resolved training
    keys, so a backend reads its own (``compile_mode`` for ``compile``); ``static_loss`` says
    whether the family declares its loss static-shaped with the run's assigner (see
    :class:`ModelFamily`), which a backend capturing the whole step needs.
    """

    device: torch.device
    precision: str
    world_size: int = 1
    capture_region: nn.Module | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    static_loss: bool = False


@runtime_checkable
class GraphBackend(Protocol):
    """How the network call is dispatched: eagerly, compiled, or replayed from a CUDA graph.

    Optionally a backend also takes over the whole step: ``wrap_step(trainer)`` returns a
    callable ``runner(images, targets, *, optimizer_step) -> (loss, parts) | None`` that the
    trainer calls in place of its step (the trainer has applied the learning-rate schedule to
    its optimizer before an updating batch and counts the update); ``None`` means "run this
    batch eagerly". The runner must leave the trainer's model, optimizer state and EMA as the
    eager step would, so checkpoints and resume do not depend on the backend.

    A wrapper or runner that records graphs as it goes may expose ``counts``, a dict whose
    ``recorded`` and ``failed`` entries count its captures: falconet-profiler starts its
    window only after they stop changing, so a capture is not timed as a training step. A
    runner may also expose ``pending`` (bool), true while it will record but has not yet (its
    batches run eagerly meanwhile): the profiler waits that out too, so it does not time the
    eager steps as the backend's.
    """

    name: str
    summary: str

    def decline_reason(self, context: DispatchContext) -> str | None:
        """``None`` to accept, else the one log line saying why it declines here."""
        ...

    def wrap(self, network: nn.Module, context: DispatchContext) -> Callable[..., Any]:
        """Return a callable with the network's signature that dispatches it this way."""
        ...


@runtime_checkable
class Callback(Protocol):
    """Observer of a training run. Every method is optional to override; all return ``None``.

    Methods: ``on_train_start``, ``on_epoch_start``, ``on_step_end`` (after each batch),
    ``on_val_end(result)``, ``on_epoch_end(row)`` (the epoch's results.csv row),
    ``on_train_end``, ``on_exception(exc)``; each receives the trainer first. Callbacks read
    state the trainer already has on the host; they must not synchronise the device per step.
    """

    name: str


@runtime_checkable
class CallbackFactory(Protocol):
    """What ``register_callbacks`` registers: ``factory(**options) -> Callback``."""

    name: str
    summary: str

    def __call__(self, **options: Any) -> Callback: ...
