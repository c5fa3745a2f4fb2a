"""Datasets: YOLO and COCO sources, the built-in ``shapes`` set, and ``falconet data check``.

``load_dataset(data)`` resolves what a user passes as ``data=`` (``shapes``, a YOLO data yaml,
or a yaml naming a COCO instances file) into splits of checked samples.
"""

from falconet.data.records import DataError, Dataset, Problem, Sample, Split
from falconet.data.resolve import load_dataset

__all__ = ["DataError", "Dataset", "Problem", "Sample", "Split", "load_dataset"]
