"""Turn what a user passes as ``data=`` into a checked :class:`Dataset`.

``data`` is ``shapes`` (the built-in synthetic set, made on first use), the path of a data
yaml (YOLO labels, or a COCO instances file it names: see :mod:`falconet.data.yolo` and
:mod:`falconet.data.coco`), or a folder as users bring one: holding a data yaml
(``data.yaml``, or its only ``.yaml``), or in the Roboflow COCO export layout (``train/``,
``valid/``, ``test/``, each with ``_annotations.coco.json`` beside its images: RF-DETR's
format), for which the yaml is written into the cache folder, not into the dataset.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import yaml

from falconet.data.check import check_split
from falconet.data.coco import coco_candidates, coco_categories, read_coco
from falconet.data.records import DataError, Dataset, Problem, Split
from falconet.data.yolo import class_names, dataset_root, image_files, read_yaml, yolo_candidates
from falconet.paths import cache_dir

SPLITS = ("train", "val")


def resolve_data_path(data: str | Path) -> Path:
    """The yaml behind ``data``: ``shapes`` is built (once) in the cache folder."""
    if str(data) == "shapes":
        from falconet.data.shapes import ensure_shapes

        return ensure_shapes()
    path = Path(data).expanduser()
    if path.is_dir():
        return folder_yaml(path)
    if path.suffix not in (".yaml", ".yml"):
        raise DataError(
            f"data={data}: expected `shapes`, a data yaml (.yaml) or a dataset folder; a COCO "
            "file is named inside a yaml with coco_json: (see docs/data.md)"
        )
    if not path.exists():
        raise DataError(f"data={data}: no such file")
    return path.resolve()


ROBOFLOW_JSON = "_annotations.coco.json"
ROBOFLOW_SPLITS = {"train": "train", "val": "valid", "test": "test"}


def folder_yaml(folder: Path) -> Path:
    """The data yaml of a dataset folder (module docstring)."""
    folder = folder.resolve()
    for name in ("data.yaml", "data.yml"):
        if (folder / name).is_file():
            return folder / name
    yamls = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if len(yamls) == 1:
        return yamls[0]
    present = {
        split: sub
        for split, sub in ROBOFLOW_SPLITS.items()
        if (folder / sub / ROBOFLOW_JSON).is_file()
    }
    if "train" in present:
        config: dict = {"path": str(folder)}
        for split, sub in present.items():
            config[split] = sub
            config[f"{split}_json"] = f"{sub}/{ROBOFLOW_JSON}"
        digest = hashlib.sha1(str(folder).encode()).hexdigest()[:16]
        path = cache_dir("datasets") / f"roboflow-{digest}.yaml"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(f"# written by falconet for {folder}\n" + yaml.safe_dump(config))
        os.replace(tmp, path)
        return path
    found = ", ".join(p.name for p in yamls) or "none"
    raise DataError(
        f"data={folder}: a folder needs a data.yaml (yaml files found: {found}) or the "
        f"Roboflow COCO layout (train/{ROBOFLOW_JSON}, valid/{ROBOFLOW_JSON}); name the yaml "
        "itself to choose one"
    )


def load_dataset(
    data: str | Path, *, splits: tuple[str, ...] = SPLITS, workers: int | None = None
) -> Dataset:
    """Read and check every split of ``data`` named in ``splits`` (those the yaml has)."""
    yaml_path = resolve_data_path(data)
    config = read_yaml(yaml_path)
    where = f"data={yaml_path}"
    root = dataset_root(config, yaml_path)
    present = [s for s in splits if config.get(s)]
    if not present:
        raise DataError(
            f"{where}: names no split; give {' and/or '.join(splits)} "
            "(an image folder or a .txt list of images)"
        )
    coco = {s: config.get(f"{s}_json") or config.get("coco_json") for s in present}
    category_ids = None
    if any(coco.values()):
        files = {s: _under(root, c) for s, c in coco.items() if c}
        contents = {p: read_coco(p) for p in set(files.values())}
        category_ids, names = coco_categories(next(iter(contents.values())))
        if "names" in config and class_names(config, where) != names:
            raise DataError(
                f"{where}: names differ from the categories of "
                f"{next(iter(files.values()))}; leave names out or list the "
                "category names in ascending id order"
            )
    else:
        names = class_names(config, where)
    result = {}
    for split in present:
        file_problems: list[Problem] = []
        if coco[split]:
            json_path = _under(root, coco[split])
            image_dir = _under(root, config[split])
            candidates, file_problems = coco_candidates(
                contents[json_path], json_path, image_dir, category_ids
            )
        else:
            try:
                files = image_files(config[split], root, f"{where} {split}")
            except DataError as exc:
                if not config.get("download"):
                    raise
                raise DataError(  # an Ultralytics yaml whose data is fetched by its download:
                    f"{exc}. The yaml's download: is not run (falconet reads no network): "
                    "fetch the data as it says, then point path: at it"
                ) from None
            candidates = yolo_candidates(files)
        checked = check_split(
            split, candidates, len(names), workers=workers, cache_key=f"{yaml_path}|{coco[split]}"
        )
        result[split] = Split(
            split, checked.samples, file_problems + checked.problems, checked.images_total
        )
    return Dataset(str(yaml_path), names, result, category_ids)


def _under(root: Path, entry: str) -> Path:
    path = Path(entry)
    return path if path.is_absolute() else root / path
