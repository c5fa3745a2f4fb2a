"""Turn what a user passes as ``data=`` into a checked :class:`Dataset`.

``data`` is ``shapes`` (the built-in synthetic set, made on first use) or the path of a data
yaml (YOLO labels, or a COCO instances file it names: see :mod:`falconet.data.yolo` and
:mod:`falconet.data.coco`).
"""

from __future__ import annotations

from pathlib import Path

from falconet.data.check import check_split
from falconet.data.coco import coco_candidates, coco_categories, read_coco
from falconet.data.records import DataError, Dataset, Problem, Split
from falconet.data.yolo import class_names, dataset_root, image_files, read_yaml, yolo_candidates

SPLITS = ("train", "val")


def resolve_data_path(data: str | Path) -> Path:
    """The yaml behind ``data``: ``shapes`` is built (once) in the cache folder."""
    if str(data) == "shapes":
        from falconet.data.shapes import ensure_shapes

        return ensure_shapes()
    path = Path(data).expanduser()
    if path.suffix not in (".yaml", ".yml"):
        raise DataError(
            f"data={data}: expected `shapes` or a data yaml (.yaml); a COCO file "
            "is named inside a yaml with coco_json: (see docs/data.md)"
        )
    if not path.exists():
        raise DataError(f"data={data}: no such file")
    return path.resolve()


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
            candidates = yolo_candidates(image_files(config[split], root, f"{where} {split}"))
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
