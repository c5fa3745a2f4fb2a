"""The contract of each kind of thing a plugin can register (:mod:`falconet.contract`'s face).

Every kind is a runtime-checkable :class:`typing.Protocol`: a registry refuses an item that lacks
the attributes below, with the plugin named. Conventions shared by all kinds:

* images: ``float`` tensors ``[B, 3, H, W]`` in ``[0, 1]``, RGB, on the training device;
* boxes: ``xyxy`` in pixels of the tensor they refer to, ``float32``, unless a docstring says
  otherwise (COCO evaluation uses ``xywh`` in original-image pixels, as COCO does);
* labels: contiguous class indices ``0..C-1``, ``int64``;
* ground truth in a batch is *padded*: ``boxes [B, M, 4]``, ``labels [B, M]`` and a
  ``counts [B]`` (``int64``) of real boxes per image, so model, assigner and loss code is
  static-shaped (``M`` depends on the batch's bucket, never on Python-side data inspection),
  with the same boxes per box, ``box_images [N]`` and ``box_slots [N]``, for code that works
  on the real boxes only: :class:`falconet.data.targets.Targets` holds both views.

Every item carries ``name`` (what users type) and ``summary`` (one line for
``falconet plugins list``). Torch is imported only for type checking here, so importing this
module costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

if TYPE_CHECKING:
    import torch
    from pydantic import BaseModel
    from torch import nn

    from falconet.contract.step import StepParts, TrainStep
    from falconet.loss_scaler import LossScaler
    from falconet.training.config import TrainConfig

    KeysT = TypeVar("KeysT", bound=BaseModel)

    from falconet.data.targets import Targets
    from falconet.evaluation.contract import Detections, EvalResult, GroundTruth


@runtime_checkable
class ModelFamily(Protocol):
    """A family of detectors (YOLO, DETR-style, ...) and everything needed to train it.

    ``models`` lists the selectable model names (``yolo-n``, ``yolo-s``, ...); they share one
    namespace with family names across all plugins. ``priority`` picks the model a run trains
    when it names none: the first of ``models`` of the installed family of highest priority
    (ties by family name), so the core names no model of its own.
    """

    name: str
    summary: str
    models: Sequence[str]
    priority: int

    def build_model(self, model: str, num_classes: int) -> nn.Module:
        """Build ``model`` (one of ``models``) with ``num_classes`` classes, randomly initialised.

        In training mode the module maps images ``[B, 3, H, W]`` to raw head outputs (whatever
        the family's loss consumes); :meth:`postprocess` turns those into detections.
        """
        ...

    def build_loss(self, model: nn.Module, assigner: Assigner) -> Callable[..., Any]:
        """Return ``loss(outputs, targets) -> (total [], parts {name: []})`` using ``assigner``.

        ``outputs`` is what the model returns; ``targets`` a
        :class:`falconet.data.targets.Targets` (the padded ground truth of the module
        docstring). ``total`` is a scalar normalised so it does not depend on the world size
        (DDP averages gradients).
        """
        ...

    def default_recipe(self, model: str) -> Mapping[str, Any]:
        """Training keys this model trains best with (``optimizer``, ``lr0``, ``imgsz``, ...)."""
        ...

    def static_loss(self, assigner: Assigner, device: torch.device) -> bool:
        """Whether the loss built with ``assigner`` is static-shaped and free of host
        synchronisation on ``device`` for a fixed input shape and target bucket, so a graph
        backend may capture the whole step (``False`` when unsure). What the assigner does is
        its own to declare (:meth:`Assigner.static_on`): the family asks it, and answers for
        the rest of its loss."""
        ...

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


@dataclass(frozen=True, eq=False)
class ExportGraph:
    """A family's trained network made exportable: what ``falconet export`` traces and writes.

    ``module`` (eval mode, float32) maps ``images [B, 3, H, W]`` float32 in ``[0, 1]`` (RGB,
    letterboxed as ``falconet predict`` does) to two tensors, the graph's outputs in order:

    * ``boxes [B, N, 4]`` float32: each candidate's box, ``xyxy`` in pixels of the input;
    * ``scores [B, N, C]`` float32: each candidate's class probabilities (after the sigmoid).

    ``N`` depends only on ``H`` and ``W``; the module has no data-dependent Python control flow
    and its shape arithmetic keeps ``B`` dynamic. ``candidates`` says what one of the ``N`` is
    (``anchor point``, ``decoder query``) and ``selection`` how detections are chosen from them
    outside the graph, one line each, for the docs and the file's metadata; ``detections(boxes,
    scores, *, conf, iou, max_det)`` does that selection on the outputs as torch tensors (the
    family's :meth:`ModelFamily.postprocess` result). ``min_opset``: the oldest ONNX opset that
    has every operator the graph uses.
    """

    module: nn.Module
    candidates: str
    selection: str
    min_opset: int
    detections: Callable[..., list[dict]]


@runtime_checkable
class ExportableFamily(Protocol):
    """A :class:`ModelFamily` whose models ``falconet export`` can write (optional: a family
    without :meth:`export_graph` trains and predicts as before, and export says it cannot)."""

    def export_graph(self, model: nn.Module) -> ExportGraph:
        """``model`` (built by :meth:`ModelFamily.build_model`, trained weights loaded, eval
        mode, on the CPU) wrapped to the :class:`ExportGraph` contract."""
        ...


@runtime_checkable
class CheckpointingFamily(Protocol):
    """A :class:`ModelFamily` whose networks can recompute their blocks' activations in the
    backward (the ``grad_checkpoint`` key, :mod:`falconet.grad_checkpoint`; optional: a run
    asking a family without it for a region is refused when it is planned).

    ``grad_checkpoint_regions`` names the regions it can checkpoint (``backbone``, ``neck``);
    its ``configure(options)`` reads the key (:func:`falconet.grad_checkpoint.regions`) and its
    networks run each block of those regions through :func:`falconet.grad_checkpoint.checkpoint`,
    so a step computes the same numbers with less memory."""

    grad_checkpoint_regions: Sequence[str]


@dataclass(frozen=True, eq=False)
class Predictions:
    """What an assigner sees of the network's predictions, per anchor (detached).

    ``scores [B, A, C] float32``: class probabilities (after sigmoid); ``boxes [B, A, 4]
    float32``: predicted boxes, xyxy pixels; ``anchor_points [A, 2]``: anchor centres ``(x,
    y)`` in pixels; ``anchor_strides [A, 1]``: the stride of each anchor's level in pixels
    (for rules in strides, such as SimOTA's centre radius).
    """

    scores: torch.Tensor
    boxes: torch.Tensor
    anchor_points: torch.Tensor
    anchor_strides: torch.Tensor


@dataclass(frozen=True, eq=False)
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

    def __call__(self, predictions: Predictions, targets: Targets) -> Assignment:
        """Assign ground truth to anchors: each anchor gets at most one real box of its image.

        ``targets`` carries both views of the boxes (:class:`falconet.data.targets.Targets`):
        an assigner may work on the ``N`` real boxes or on the ``B x M`` slots; padding (slots
        past ``counts``, rows of image ``B``) must change nothing.
        """
        ...

    def static_on(self, device: torch.device) -> bool:
        """Whether on ``device`` the assignment is static-shaped (its tensors' shapes depend
        on the inputs' shapes alone) and reads nothing back to the host, so that a loss built
        on it may be recorded with the whole step (``False`` when unsure).
        ``falconet_testing.contracts.AssignerContract`` checks a ``True``: on the CPU by
        running the assigner on shapes alone (``meta`` tensors), on a GPU with CUDA's sync
        debug mode set to error and inside a CUDA graph."""
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

    ``priority`` orders ``eval_backend=auto``: the installed backend of highest priority whose
    library imports is used (the reference ``pycocotools`` has priority 0).
    """

    name: str
    summary: str
    priority: int

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


@dataclass(frozen=True)
class PrecisionContext:
    """What a precision backend may know of the run it is configured for.

    ``options`` holds the run's resolved training keys, the backend's own among them (read
    them typed with :meth:`keys`); ``batch`` (per rank; ``None`` while autobatch has not
    chosen it) and ``imgsz`` are the training input's shape, for a backend that chooses by the
    run's matrix sizes; ``world_size`` is 1 outside distributed runs; ``training`` is False
    when a trained model is only evaluated or used for prediction; ``replays`` says whether
    the run's step will replay recordings, as the graph backend it asks for declares
    (:attr:`GraphBackend.replays`; ``graph=auto``: the first backend ``auto`` tries), for a
    backend that times its kernels as the step will run them.
    """

    device: torch.device
    options: Mapping[str, Any] = field(default_factory=dict)
    batch: int | None = None
    imgsz: int = 640
    world_size: int = 1
    training: bool = True
    replays: bool = False

    def keys(self, model: type[KeysT]) -> KeysT:
        """The run's values of the keys ``model`` declares, validated; defaults elsewhere."""
        return validated_keys(self.options, model)


@runtime_checkable
class PrecisionBackend(Protocol):
    """How the numbers of a step are represented: an autocast context, a scaler, a model wrapper.

    Composed into the trainer, never subclassed into it. The registered instance is
    configured (:meth:`configure`) for each run; what it returns is the run's backend (an
    autocast-only backend returns itself).
    """

    name: str
    summary: str

    def unavailable_reason(self, device: torch.device) -> str | None:
        """``None`` when the backend can run on ``device``, else why not (one sentence)."""
        ...

    def configure(self, context: PrecisionContext) -> PrecisionBackend:
        """The backend for this run: its keys read, its choices made (raise
        :class:`falconet.training.config.ConfigError` for a key value the device cannot
        do). With ``context.training`` False, the backend a trained model is evaluated in."""
        ...

    def autocast(self, device: torch.device) -> AbstractContextManager[Any]:
        """The context the forward pass and loss run under."""
        ...

    def grad_scaler(self, device: torch.device) -> LossScaler | None:
        """A loss scaler when the format needs loss scaling (fp16), else ``None``: a
        :class:`falconet.loss_scaler.LossScaler`, which a graph backend can drive on the
        device."""
        ...

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """Convert or wrap the model for this format (identity for autocast-only backends).
        The state dict must keep the plain model's keys and shapes, so checkpoints load
        into the family's network wherever this backend is not installed."""
        ...


def validated_keys(options: Mapping[str, Any], model: type[KeysT]) -> KeysT:
    """``options``' values of the keys ``model`` declares (a plugin's
    :class:`falconet.keys.KeyGroup` model), validated; defaults where ``options`` has none."""
    return model.model_validate({k: options[k] for k in model.model_fields if k in options})


@dataclass(frozen=True)
class GraphContext:
    """What a graph backend may inspect before it agrees to run the step: the parts it decides
    by are the step's own objects, to be asked, never names of them.

    ``precision`` is the run's configured precision backend (what its ``autocast`` computes
    in: :func:`falconet.precision.autocast_dtype`); ``optimizer`` and ``scaler`` are the
    step's built optimizer and loss scaler (``None``: none, or none to show, as for a
    backend's first look at a model); ``capture_region`` is the family's declared region
    (``None``: the family declares none); ``world_size`` is 1 outside distributed runs;
    ``static_loss`` says whether the family declares its loss static-shaped with the run's
    assigner on ``device`` (:meth:`ModelFamily.static_loss`), which a backend capturing the
    whole step needs. ``config`` is the run's resolved configuration, which holds every key
    a plugin declares: a backend reads its own back, typed, with :meth:`keys`.
    """

    device: torch.device
    precision: PrecisionBackend
    world_size: int = 1
    capture_region: nn.Module | None = None
    static_loss: bool = False
    optimizer: torch.optim.Optimizer | None = None
    scaler: LossScaler | None = None
    config: BaseModel | None = None

    def keys(self, model: type[KeysT]) -> KeysT:
        """The run's values of the keys ``model`` declares (a plugin's
        :class:`falconet.keys.KeyGroup` model), validated; defaults where the run has none."""
        return validated_keys({} if self.config is None else dict(self.config), model)


@runtime_checkable
class GraphBackend(Protocol):
    """How a training step runs: op by op, compiled, or replayed from CUDA graphs.

    The backend receives the step's parts (:class:`falconet.contract.StepParts`) and
    returns a :class:`falconet.contract.TrainStep`; it never sees the trainer. A backend
    that dispatches only the network gives :class:`falconet.graph_backends.eager_step.EagerStep` its
    network callable; one that takes over the whole step keeps an eager step for the batches
    it does not replay. Either way the step leaves the model, optimizer state, scaler and EMA
    as the eager step would, so checkpoints and resume do not depend on the backend.

    ``priority`` orders ``graph=auto``: the installed backend of highest priority that does not
    decline is used (``None``: never chosen by ``auto``, only by name). The built-in ``eager``
    has priority 0 and never declines. ``replays`` says whether the step it builds replays
    recordings (CUDA graphs), so that the kernels run without their launches from the host,
    or launches every kernel as eager does: what a precision backend that times kernels asks
    (:attr:`PrecisionContext.replays`).
    """

    name: str
    summary: str
    priority: int | None
    replays: bool

    def decline_reason(self, context: GraphContext) -> str | None:
        """``None`` to accept, else the one log line saying why it declines here."""
        ...

    def build_step(self, parts: StepParts, context: GraphContext) -> TrainStep:
        """The step that trains with ``parts`` this way."""
        ...


@runtime_checkable
class Callback(Protocol):
    """Observer of a training run. Every method is optional to override; all return ``None``.

    Methods: ``on_train_start``, ``on_epoch_start``, ``on_step_end`` (after each batch),
    ``on_val_end(result)``, ``on_epoch_end(row)`` (the epoch's results.csv row),
    ``on_train_end``, ``on_exception(exc)``; each receives the run's typed view first
    (:class:`falconet.training.run_state.RunState`). Callbacks read what the run already has on
    the host; they must not synchronise the device per step.
    """

    name: str


@runtime_checkable
class CallbackFactory(Protocol):
    """What ``register_callbacks`` registers: ``factory(**options) -> Callback``.

    ``wanted(config)`` says whether a run adds the callback without ``callbacks=`` naming it
    (the core's loggers: always, or when ``plots``; the profiler: when its ``profile`` key is
    on); a callback only added by name returns ``False``.
    """

    name: str
    summary: str

    def wanted(self, config: TrainConfig) -> bool: ...

    def __call__(self, **options: Any) -> Callback: ...
