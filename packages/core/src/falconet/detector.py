"""``Detector``: the Python API. ``train``, ``val``, ``predict`` and ``export`` take the same
keys as the CLI.

from falconet import Detector
result = Detector("yolo-n").train(data="shapes", epochs=30)
Detector("runs/train/exp/weights/best.pt").predict("photo.jpg")
Detector("runs/train/exp/weights/best.pt").export(format="onnx", dynamic=True)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from falconet.evaluation.contract import EvalResult
from falconet.plugins import Plugins, get_plugins
from falconet.training.checkpoint import load_checkpoint
from falconet.training.config import TrainConfig, build_config, check_keys, config_model
from falconet.training.planning import default_model

if TYPE_CHECKING:
    from falconet.export import ExportResult


class Detector:
    """A model by name (``yolo-n``: random weights, trained with :meth:`train`) or a checkpoint
    (``.../best.pt`` or ``last.pt``: weights, classes and the keys it was trained with); with
    none, the default model (:func:`~falconet.training.planning.default_model`)."""

    def __init__(self, model: str | Path | None = None, *, plugins: Plugins | None = None) -> None:
        self.plugins = plugins or get_plugins()
        self.source = str(model) if model is not None else default_model(self.plugins)
        self.checkpoint: dict[str, Any] | None = None
        self.checkpoint_path: Path | None = None
        if self.source.endswith(".pt"):
            self.checkpoint = load_checkpoint(self.source)
            self.checkpoint_path = Path(self.source)
            name = self.checkpoint["spec"]["model"]
        else:
            name = self.source
        self.family = self.plugins.families.get(name)
        self.model_name = name
        self._module: torch.nn.Module | None = None

    # ------------------------------------------------------------------------------ train
    def train(self, *, verbose: bool = True, **keys: Any) -> dict[str, Any]:
        """Train with the keys of ``falconet train --help``; returns the summary (run folder,
        best metrics, per-class AP). Afterwards this detector holds the best weights. The
        run shows the CLI's progress on stderr where the program set up no logging of its
        own; ``verbose=False`` trains quietly (:mod:`falconet.training.console`)."""
        from falconet.training.config import ConfigError
        from falconet.training.console import run_output

        if not isinstance(verbose, bool):  # `falconet train verbose=...`: not a run's key
            raise ConfigError(f"verbose={verbose!r}: Detector.train's own, True or False")
        with run_output(verbose):
            return self._train(verbose, keys)

    def _train(self, verbose: bool, keys: dict[str, Any]) -> dict[str, Any]:
        from falconet.training.console import without_progress
        from falconet.training.distributed import world_from_env
        from falconet.training.launch import check_before_launch, gpu_list, launch, write_summary
        from falconet.training.planning import build_callbacks, plan_run
        from falconet.training.trainer import Trainer

        world = world_from_env()
        gpus = None if world.distributed else gpu_list(keys.get("device", "auto"))
        if gpus:  # one process per GPU (training/launch.py); the caller waits for them
            check_before_launch(keys, len(gpus), self.plugins)
            summary = launch(self._launch_keys(keys), gpus)
        else:
            base_weights = self.checkpoint if self.checkpoint and "model" not in keys else None
            plan = plan_run(
                keys, self.plugins, base_model=self.model_name, base_weights=base_weights
            )
            callbacks = build_callbacks(plan.config, self.plugins)
            if not verbose:
                callbacks = without_progress(callbacks)
            trainer = Trainer(plan, self.plugins, callbacks)
            summary = trainer.fit()
            if world.main:
                write_summary(summary)
        best = Path(summary["run_dir"]) / "weights" / "best.pt"
        if best.exists():
            self.checkpoint, self.checkpoint_path = load_checkpoint(best), best
            self.model_name = self.checkpoint["spec"]["model"]
            self.family, self._module = self.plugins.families.get(self.model_name), None
        return summary

    def _launch_keys(self, keys: dict[str, Any]) -> dict[str, Any]:
        """The keys the launched workers train: from the checkpoint this detector holds (the
        file it was loaded from, or the ``best.pt`` of its last run), not the name or file it
        was built with, as a run in this process starts from it; a ``model`` key wins."""
        held = self.checkpoint_path if self.checkpoint is not None else None
        return {"model": str(held) if held is not None else self.source, **keys}

    # ------------------------------------------------------------------- weights, devices
    def _config(self, keys: dict[str, Any]) -> TrainConfig:
        model = config_model(self.plugins)
        check_keys(keys, model)
        saved = dict(self.checkpoint["config"]) if self.checkpoint else {}
        saved.pop("resume", None)
        # keys of plugins not installed here configured the training only (a graph backend's,
        # a precision's): the weights load and evaluate without them
        saved = {k: v for k, v in saved.items() if k in model.model_fields}
        return build_config(model, saved, keys)

    def _evaluation_precision(self, cfg: TrainConfig, asked: bool, device: torch.device):
        """The precision ``val`` runs in: the one trained with, configured for evaluation;
        ``auto`` when that one is not installed or cannot run here and ``amp_dtype`` was not
        asked for (an fp8-trained model evaluates without Transformer Engine)."""
        from falconet.contract import PrecisionContext
        from falconet.training.backends import choose_precision

        name = cfg.amp_dtype
        if not asked and name != "auto":
            backends = self.plugins.precision_backends
            if name not in backends or backends.get(name).unavailable_reason(device):
                name = "auto"
        context = PrecisionContext(device, cfg.model_dump(), imgsz=cfg.imgsz, training=False)
        return choose_precision(name, context, self.plugins)

    def module(self, device: torch.device) -> torch.nn.Module:
        """The network with this detector's weights, in eval mode, on ``device``."""
        if self.checkpoint is None:
            raise ValueError(
                f"Detector({self.source!r}) has random weights: train it first, or load a "
                "checkpoint with Detector('runs/train/<name>/weights/best.pt')"
            )
        if self._module is None:
            spec = self.checkpoint["spec"]
            module = self.family.build_model(spec["model"], len(spec["names"]))
            module.load_state_dict(self.checkpoint["weights"])
            self._module = module
        return self._module.to(device, memory_format=torch.channels_last).eval()

    @property
    def names(self) -> list[str]:
        return list(self.checkpoint["spec"]["names"]) if self.checkpoint else []

    # -------------------------------------------------------------------------------- val
    def val(self, **keys: Any) -> EvalResult:
        """COCO evaluation on ``data``'s val split (default: the data it was trained on)."""
        from falconet.data.resolve import load_dataset
        from falconet.training import validation
        from falconet.training.devices import resolve_device
        from falconet.training.loaders import build_val_loader

        cfg = self._config({**keys, "val": True})
        device = resolve_device(cfg.device)
        dataset = load_dataset(cfg.data, splits=("val",))
        dataset.require_usable()
        if list(dataset.names) != self.names:
            raise ValueError(
                f"data={cfg.data} has classes {dataset.names}, this model was trained on "
                f"{self.names}"
            )
        loader = build_val_loader(cfg.model_copy(update={"cache": "none"}), dataset, device)
        precision = self._evaluation_precision(cfg, "amp_dtype" in keys, device)
        return validation.score_split(
            self.module(device),
            self.family,
            loader,
            dataset,
            device,
            cfg,
            self.plugins,
            autocast=precision.autocast(device),
        )

    # ---------------------------------------------------------------------------- predict
    def predict(
        self,
        source: str | Path | list[str | Path],
        *,
        conf: float = 0.25,
        iou: float = 0.7,
        max_det: int = 300,
        imgsz: int | None = None,
        device: str = "auto",
        batch: int = 16,
    ) -> list[dict[str, Any]]:
        """Detections per image: ``{path, boxes [N, 4] xyxy original pixels, scores, labels,
        names}``, or ``{path, error}`` for an image that cannot be read."""
        from falconet.predict import image_sources, predict_images
        from falconet.training.devices import resolve_device

        cfg = self._config({"device": device, **({"imgsz": imgsz} if imgsz else {})})
        torch_device = resolve_device(cfg.device)
        return predict_images(
            self.module(torch_device),
            self.family,
            image_sources(source),
            imgsz=cfg.imgsz,
            device=torch_device,
            names=self.names,
            conf=conf,
            iou=iou,
            max_det=max_det,
            batch=batch,
        )

    # ----------------------------------------------------------------------------- export
    def export(self, format: str = "onnx", **keys: Any) -> ExportResult:
        """Write this detector's weights as a ``format`` file and check it against PyTorch,
        with the keys of ``falconet export`` (``opset``, ``dynamic``, ``batch``, ``imgsz``,
        ``weights``, ``out``, ``check``, ``source``; docs/cli.md). Returns what was written
        and measured; raises :class:`falconet.export.ExportError` with what to change."""
        from falconet.export import ExportError, export_checkpoint, parse_options

        options = parse_options({"format": format, **keys})
        if self.checkpoint is None or self.checkpoint_path is None:
            raise ExportError(
                f"Detector({self.source!r}) has random weights: export takes a trained "
                "checkpoint, Detector('runs/train/<name>/weights/best.pt'), or train it first"
            )
        return export_checkpoint(self.checkpoint, self.checkpoint_path, self.family, options)
