"""Transformer Engine is imported with torch's cuDNN as the one it loads (one cuDNN a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from falconet_precision_te_fp8.backend import Fp8Precision
from falconet_precision_te_fp8.te_import import cudnn_folder, cudnn_path, parts

MAPS = """\
7f1c00000000-7f1c00100000 r-xp 00000000 00:2a 101 /site/nvidia/cudnn/lib/libcudnn_graph.so.9
7f1c00200000-7f1c00300000 r-xp 00000000 00:2a 102 /site/nvidia/cudnn/lib/libcudnn.so.9
7f1c00400000-7f1c00500000 r--p 00000000 00:2a 103 /site/torch/lib/libtorch_cuda.so
"""


def test_the_folder_is_the_main_librarys_not_a_parts():
    assert cudnn_folder(MAPS) == "/site/nvidia/cudnn/lib"
    assert cudnn_folder(MAPS.splitlines()[0]) is None  # only a part mapped: no main library
    assert cudnn_folder("") is None


def test_every_versioned_part_loads_the_graph_part_first():
    names = [
        "/lib/libcudnn_ops.so.9", "/lib/libcudnn.so.9", "/lib/libcudnn_graph.so.9",
        "/lib/libcudnn.so", "/lib/libcudnn_adv.so.9.19.0", "/lib/libcublas.so.13",
    ]  # fmt: skip
    assert parts(names) == [
        "/lib/libcudnn_graph.so.9", "/lib/libcudnn.so.9", "/lib/libcudnn_adv.so.9.19.0",
        "/lib/libcudnn_ops.so.9",
    ]  # fmt: skip


def test_the_path_is_set_for_the_block_only(monkeypatch):
    for name in ("CUDNN_HOME", "CUDNN_PATH"):
        monkeypatch.delenv(name, raising=False)
    with cudnn_path("/site/nvidia/cudnn/lib"):
        assert os.environ["CUDNN_PATH"] == "/site/nvidia/cudnn/lib"
    assert "CUDNN_PATH" not in os.environ
    with cudnn_path(None):
        assert "CUDNN_PATH" not in os.environ


@pytest.mark.parametrize("name", ["CUDNN_HOME", "CUDNN_PATH"])
def test_a_users_cudnn_choice_is_kept(monkeypatch, name):
    monkeypatch.delenv("CUDNN_HOME", raising=False)
    monkeypatch.delenv("CUDNN_PATH", raising=False)
    monkeypatch.setenv(name, "/opt/my-cudnn")
    with cudnn_path("/site/nvidia/cudnn/lib"):
        assert os.environ[name] == "/opt/my-cudnn"
        assert os.environ.get("CUDNN_PATH", "/opt/my-cudnn") == "/opt/my-cudnn"
    assert os.environ[name] == "/opt/my-cudnn"


PROBE = """
import json, re, torch
torch.backends.cudnn.version()
from falconet_precision_te_fp8 import te_modules
maps = open("/proc/self/maps").read()
print(json.dumps(sorted(set(re.findall(r"\\S*/libcudnn\\w*\\.so[.\\d]*$", maps, re.MULTILINE)))))
"""


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or Fp8Precision().unavailable_reason(torch.device("cuda")),
    reason="needs Transformer Engine and a CUDA GPU of compute capability 8.9+",
)
def test_after_the_import_every_cudnn_library_is_torchs():
    env = {k: v for k, v in os.environ.items() if k not in ("CUDNN_HOME", "CUDNN_PATH")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    ).stdout
    libraries = json.loads(out.strip().splitlines()[-1])
    assert len({os.path.dirname(p) for p in libraries}) == 1, libraries
    assert sum(os.path.basename(p).startswith("libcudnn.so") for p in libraries) == 1, libraries
