"""Importing Transformer Engine into a process where torch already runs cuDNN, so that the
process keeps one cuDNN.

On import, Transformer Engine loads a cuDNN globally (``RTLD_GLOBAL``), looking first under
``CUDNN_HOME``, ``CUDNN_PATH``, ``CUDA_HOME``, ``/usr/local/cuda`` and the loader's path, and
only then beside the Python packages torch's own cuDNN comes from; its core library then asks
for every part of cuDNN by name (``libcudnn_graph.so.9``, ...), which the loader finds the same
way. Where the system holds another cuDNN (the GPU machine has 9.14 in /usr/lib beside torch's
9.19), the process ends up with two, torch's later calls bind to the other one, and with a
runtime cuDNN older than 9.15.1 torch stops preferring cuDNN's attention: a run that converted
no layer to FP8 ran slower than bf16. Where only some parts are loaded, the two versions mix
and the import fails on a missing symbol.

:func:`import_te` therefore loads every part of the cuDNN torch mapped, globally, and points
Transformer Engine at its folder (``CUDNN_PATH``, for the import only), unless the user chose
a cuDNN with ``CUDNN_HOME`` or ``CUDNN_PATH``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import torch

CUDNN_VARIABLES = ("CUDNN_HOME", "CUDNN_PATH")
_MAIN_LIBRARY = re.compile(r"(/\S*)/libcudnn\.so[.\d]*$", re.MULTILINE)


def cudnn_folder(maps: str) -> str | None:
    """The folder of the main cuDNN library (``libcudnn.so*``, not its ``libcudnn_*`` parts)
    in a ``/proc/<pid>/maps`` text, or ``None`` where none is mapped."""
    found = _MAIN_LIBRARY.search(maps)
    return found.group(1) if found else None


def torch_cudnn_folder() -> str | None:
    """Where the cuDNN torch runs lies (Linux; ``None`` elsewhere or without cuDNN)."""
    if not torch.backends.cudnn.is_available():
        return None
    torch.backends.cudnn.version()  # makes sure the library is loaded
    try:
        return cudnn_folder(Path("/proc/self/maps").read_text())
    except OSError:
        return None


def parts(names: list[str]) -> list[str]:
    """The cuDNN libraries among ``names`` (``libcudnn*.so.<n>``: not the unversioned
    development links), in an order they load in: the graph part first, the others need it."""
    found = [n for n in names if re.fullmatch(r"libcudnn\w*\.so(\.\d+)+", Path(n).name)]
    return sorted(found, key=lambda n: ("libcudnn_graph" not in Path(n).name, n))


def load_parts(folder: str) -> None:
    """Every cuDNN library in ``folder``, loaded globally, so that a library loaded later that
    asks for one by name gets this one (ctypes never unloads a library)."""
    for path in parts([str(p) for p in Path(folder).iterdir()]):
        ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)


def user_chose_cudnn() -> bool:
    return any(os.environ.get(name) for name in CUDNN_VARIABLES)


@contextlib.contextmanager
def cudnn_path(folder: str | None) -> Iterator[None]:
    """``CUDNN_PATH=folder`` for the block, unless ``folder`` is ``None`` or the user chose a
    cuDNN with ``CUDNN_HOME`` or ``CUDNN_PATH`` (then the environment is left as it is)."""
    if folder is None or user_chose_cudnn():
        yield
        return
    os.environ["CUDNN_PATH"] = folder
    try:
        yield
    finally:
        del os.environ["CUDNN_PATH"]


def import_te(module: str = "transformer_engine.pytorch") -> ModuleType:
    """Transformer Engine's ``module``, imported with torch's cuDNN as the one it loads."""
    folder = None if user_chose_cudnn() else torch_cudnn_folder()
    if folder is not None:
        load_parts(folder)
    with cudnn_path(folder):
        return importlib.import_module(module)
