"""``graph=whole-step``: forward, loss, backward, clipping, optimizer and EMA replayed from CUDA
graphs, for a family whose loss is static-shaped.

:class:`WholeStep` is the run's step (:class:`falconet.contract.TrainStep`), built from
the step's parts; it keeps an :class:`~falconet.graph_backends.eager_step.EagerStep` of the
same parts for the batches it does not replay. Per batch:

* the **key** is the image shape and the targets' bucket ``(M, N)``: the padded slots per image
  and the padded boxes of the batch (powers of two, :mod:`falconet.data.targets`). A batch
  that fits a recorded bucket of the same image shape is padded up to the smallest such
  bucket (padding is ignored by the loss) and replayed; another key is counted and recorded
  on its ``capture_after``-th call (at the largest ``M`` recorded so far: ``_widened``),
  once the optimizer has its state (made on the first call: SGD's momentum buffers as
  zeros, AdamW's as torch makes it, :meth:`StaticStep.make_state`). Until then
  the batch runs on the eager step, so a batch with more boxes than any bucket runs eager
  until its larger bucket has repeated. With the run's first recording the bucket above it
  is recorded too (:func:`ahead_bucket`), in the first epoch rather than in the middle of a
  later one;
* each recording is the forward + loss + backward graph of its key; one more graph, shared by
  every key, is the optimizer step (clip, SGD, EMA, zero gradients), replayed on the batches
  that update the weights (every ``accumulate``-th). Learning rates, momenta and the EMA weight
  are device tensors filled before each replay (:mod:`falconet_graphs_cuda.static_step`);
* a recording that fails is logged once and the run continues eagerly (the same decision as
  ``cuda-graph``, docs/performance.md).

Eager and replayed batches mix freely inside an accumulation window: the static gradient
buffers are the parameters' ``.grad`` whenever the whole step replays, and an eager batch adds
into them as autograd does.

**Distributed** (``parts.collectives`` set): the update's graph begins with the all-reduce of
the gradients (their flat buffer, once per update) and gives every rank rank 0's buffers
before the EMA, so NCCL's collectives are recorded inside the step's graph
(:meth:`StaticStep.update`). Every rank must then record and replay the same graphs at the
same batch: before each batch the ranks agree on its key on the host (one Gloo all-reduce,
no device sync): each rank's targets are padded to the largest bucket of any rank, a batch
whose image shape differs between ranks runs the eager DDP step on every rank, and a
recording that fails on any rank is given up on every rank. The eager step, for the batches
not replayed, calls the network through DDP.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Protocol

import torch

from falconet.contract import CaptureStats, StepOutput
from falconet.data.targets import Targets, fits
from falconet.graph_backends.eager_step import EagerStep
from falconet_graphs_cuda.graphed import describe_failure
from falconet_graphs_cuda.static_step import StaticStep

if TYPE_CHECKING:
    from falconet.contract import StepParts
    from falconet_graphs_cuda.keys import GraphsCudaKeys

log = logging.getLogger("falconet.train")


class MicroRecording(Protocol):
    """A recorded forward + loss + backward for one (image shape, bucket)."""

    bucket: tuple[int, ...]
    phases: dict[str, float]
    """Host seconds of the recording's phases, by name (shown in its log line; may be empty)."""

    def replay(
        self, images: torch.Tensor, targets: Targets
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class UpdateRecording(Protocol):
    def replay(self) -> None: ...


class StepRecorder(Protocol):
    """Records the two kinds of graph; raises when it cannot."""

    def micro(
        self,
        step: StaticStep,
        images: torch.Tensor,
        targets: Targets,
        bucket: tuple[int, ...],
        *,
        trained: bool = False,
    ) -> MicroRecording:
        """``trained``: the eager step has trained batches of exactly these images' shape
        and ``bucket`` in this process (what a warm-up pass would do is done)."""
        ...

    def update(self, step: StaticStep) -> UpdateRecording: ...


def ahead_bucket(bucket: tuple[int, int]) -> tuple[int, int]:
    """The bucket recorded ahead with a run's first (``WholeStep._record_ahead``): twice the
    slots per image and twice the boxes of ``bucket`` ``(M, N)``, the next power of two of
    each. Its replays cost the per-box work of ``2N`` boxes for a batch that fits it and not
    ``(M, N)``; the slots per image cost next to nothing (``WholeStep._widened``)."""
    slots, boxes = bucket
    return (2 * slots, 2 * boxes)


class WholeStep:
    """The training step, replayed from graphs where recorded (module docstring)."""

    def __init__(
        self,
        parts: StepParts,
        keys: GraphsCudaKeys,
        recorder: StepRecorder,
        capture_after: int = 3,
    ) -> None:
        self.parts = parts
        self.eager = EagerStep(parts)
        self.step = StaticStep(parts, keys)
        self.recorder = recorder
        self.capture_after = capture_after
        self.micros: dict[tuple, list[MicroRecording]] = {}  # image key -> buckets, smallest first
        self.update: UpdateRecording | None = None
        self.seen: dict[tuple, int] = {}
        self.failed: str | None = None
        self.counts = {"replayed": 0, "eager": 0, "recorded": 0, "failed": 0}
        self.capture_seconds = 0.0  # host wall time of every recording: warm-up and capture
        self.collectives = parts.collectives

    @property
    def pending(self) -> bool:
        """Nothing recorded yet, and nothing failed: every batch runs eagerly until the first
        recording (a key must repeat ``capture_after`` times, and the optimizer have its state)."""
        return self.failed is None and not self.micros

    def stats(self) -> CaptureStats:
        return CaptureStats.from_counts(
            self.counts, pending=self.pending, capture_seconds=self.capture_seconds
        )

    def __call__(self, images: torch.Tensor, targets: Targets, *, update: bool) -> StepOutput:
        """Replay the recording of this batch's key, or run the eager step."""
        image_key = (tuple(images.shape), images.stride(), images.dtype)
        bucket = targets.bucket
        if self.collectives is not None:
            bucket = self._agreed(images, bucket)
            if bucket is None:  # the ranks' images differ in shape: none replays
                self.counts["eager"] += 1
                return self.eager(images, targets, update=update)
        recording = next(
            (r for r in self.micros.get(image_key, ()) if fits(bucket, r.bucket)), None
        )
        if recording is None:
            recording = self._maybe_record(image_key, images, targets, bucket)
            if recording is None:
                self.counts["eager"] += 1
                return self.eager(images, targets, update=update)
        parts = self.parts
        with parts.phases("step"):
            if update:
                parts.set_rates()
            if self.step.params[0].grad is not self.step.grads[0]:
                self.step.bind()  # an eager optimizer step dropped .grad, or the first replay
            self.step.fill_scalars(update=update)
            loss, loss_parts = recording.replay(images, targets.padded(recording.bucket))
            if update:
                self.update.replay()
                self.step.after_update()
                parts.progress.updates += 1
        self.counts["replayed"] += 1
        return StepOutput(loss, loss_parts)

    def _maybe_record(
        self,
        image_key: tuple,
        images: torch.Tensor,
        targets: Targets,
        bucket: tuple[int, ...],
    ) -> MicroRecording | None:
        if self.failed is not None:
            return None
        self.step.make_state()  # after a resume: a restored state is kept
        if not self.step.ready():
            return None
        key = (image_key, bucket)
        seen = self.seen[key] = self.seen.get(key, 0) + 1
        if seen < self.capture_after:
            return None
        widened = self._widened(image_key, bucket)
        # the key's earlier batches ran on the eager step: at the bucket recorded they built
        # what a warm-up pass would. Not in a distributed run: a rank's eager batches ran its
        # own bucket, not the agreed one, and a recording retried after a pass on one rank
        # alone would meet no loss collective on the others
        trained = widened == bucket and self.capture_after > 1 and self.collectives is None
        first = not self.micros
        recording = self._record(image_key, images, targets, widened, trained=trained)
        if recording is None:
            return None
        if first and len(widened) == 2:
            self._record_ahead(image_key, images, targets, ahead_bucket(widened))
        return recording

    def _record(
        self,
        image_key: tuple,
        images: torch.Tensor,
        targets: Targets,
        bucket: tuple[int, ...],
        *,
        trained: bool,
        ahead: bool = False,
    ) -> MicroRecording | None:
        """``bucket`` recorded for this batch's image shape (the update's graph too, with the
        first recording), or ``None`` where that failed on any rank: then the run records no
        more (:meth:`_give_up`), unless the recording was ``ahead`` (:meth:`_record_ahead`)."""
        recorder = self.recorder
        self.step.bind()  # the update graph reads and zeroes the static gradients
        start = time.perf_counter()
        failure = None
        try:
            recording = recorder.micro(
                self.step, images, targets.padded(bucket), bucket, trained=trained
            )
            if self.update is None:
                self.update = recorder.update(self.step)
        except Exception as exc:  # a failed capture comes in many types; each is logged
            failure = describe_failure(exc)
        failure = self._failed_anywhere(failure)
        if failure is not None:
            self.capture_seconds += time.perf_counter() - start
            if ahead:
                log.warning(
                    "graph=whole-step did not capture the step ahead for target bucket %s: "
                    "%s; a batch that needs it records it then",
                    bucket,
                    failure,
                )
            else:
                self._give_up(images, bucket, failure)
            return None
        seconds = time.perf_counter() - start
        self.capture_seconds += seconds
        buckets = self.micros.setdefault(image_key, [])
        buckets.append(recording)
        buckets.sort(key=lambda r: r.bucket[::-1])  # the fewest boxes first: the least work
        self.counts["recorded"] += 1
        log.info(
            "graph=whole-step: captured the step for input %s with target bucket %s%s in %.0f ms%s",
            list(images.shape),
            bucket,
            " ahead" if ahead else "",
            seconds * 1e3,
            "".join(f", {name} {t * 1e3:.0f} ms" for name, t in recording.phases.items()),
        )
        return recording

    def _record_ahead(
        self, image_key: tuple, images: torch.Tensor, targets: Targets, bucket: tuple[int, int]
    ) -> None:
        """With the run's first recording, the bucket above it (:func:`ahead_bucket`) too, on
        the same batch padded up to it. A batch's box count wanders around the power of two
        of the first recording (with mosaic, over two or three of them), so the bucket above
        comes within the first epochs: met then, it costs a recording in the middle of an
        epoch and ``capture_after - 1`` eager batches before it, where the training thread's
        lead over the GPU runs out; recorded here, one capture and one warm-up pass in the
        first epoch, whose batches are eager or recording anyway. It holds the memory a batch
        of that bucket needs, also in a run whose batches never reach it
        (docs/lab/2026-12-cache-gpu-history.md, "call 20", has the cost). A failure here is
        logged and not given up on: a batch that needs the bucket records it by the usual
        rule."""
        self._record(image_key, images, targets, bucket, trained=False, ahead=True)

    def _failed_anywhere(self, failure: str | None) -> str | None:
        """This rank's recording failure, or in a distributed run another rank's (one host
        all-reduce after every recording), so that every rank gives up together and none
        replays a graph whose collectives the others would never join."""
        if self.collectives is None:
            return failure
        anywhere = self.collectives.agree_max([failure is not None])[0]
        return failure or ("another rank's recording failed" if anywhere else None)

    def _give_up(self, images: torch.Tensor, bucket: tuple[int, ...], why: str) -> None:
        """Record no more: the run continues eagerly."""
        self.failed = why
        self.counts["failed"] += 1
        log.error(
            "graph=whole-step could not capture the step for input %s with target bucket "
            "%s: %s; the run continues eagerly",
            list(images.shape),
            bucket,
            why,
        )

    def _agreed(self, images: torch.Tensor, bucket: tuple[int, ...]) -> tuple[int, ...] | None:
        """The bucket every rank trains this batch in (the largest of the ranks'), or ``None``
        where the ranks' image shapes differ (a host-side all-reduce of the shape, its
        negation and the bucket: the largest of the negated shape is the smallest shape)."""
        shape = list(images.shape)
        agreed = self.collectives.agree_max([*shape, *(-n for n in shape), *bucket])
        largest, smallest = agreed[: len(shape)], [-n for n in agreed[len(shape) : 2 * len(shape)]]
        if largest != smallest:
            return None
        return tuple(agreed[2 * len(shape) :])

    def _widened(self, image_key: tuple, bucket: tuple[int, ...]) -> tuple[int, ...]:
        """The bucket to record a batch of ``bucket`` in. With the per-box view (``(M, N)``)
        the slots per image ``M`` cost next to nothing (``tal`` works on the ``N`` boxes and
        only gathers from ``[B, M]``), so a recording takes the largest ``M`` recorded so far:
        recordings then differ in ``N`` alone, and a run makes few of them (each costs a
        capture and ``capture_after`` eager batches). Per slot (``(M,)``) the bucket stays."""
        recorded = self.micros.get(image_key, ())
        if len(bucket) < 2 or not recorded:
            return bucket
        return (max(bucket[0], *(r.bucket[0] for r in recorded)), *bucket[1:])
