"""Which first-party distribution provides which name, for install hints.

Only used to turn "no graph backend named 'cuda-graph'" into
"graph=cuda-graph needs: pip install falconet-graphs-cuda". Each plugin issue adds its names
here when it ships the plugin that registers them.
"""

from __future__ import annotations

KNOWN_PROVIDERS: dict[str, dict[str, str]] = {
    "families": {
        "yolo": "falconet-detect",
        "yolo-n": "falconet-detect",
        "yolo-s": "falconet-detect",
        "yolo-m": "falconet-detect",
        "detr": "falconet-detr",
        "detr-n": "falconet-detr",
        "detr-s": "falconet-detr",
    },
    "assigners": {
        "tal": "falconet-detect",
        "simota": "falconet-detect",
        "hungarian": "falconet-detect",
    },
    "eval_backends": {
        "vernier": "falconet-eval-vernier",
        "hotcoco": "falconet-eval-hotcoco",
    },
    "precision_backends": {
        "fp8": "falconet-precision-te-fp8",
    },
    "graph_backends": {
        "cuda-graph": "falconet-graphs-cuda",
        "whole-step": "falconet-graphs-cuda",
    },
    "commands": {
        "profile": "falconet-profiler",
    },
    "callbacks": {
        "profiler": "falconet-profiler",
    },
    "train_keys": {
        "fuse": "falconet-graphs-cuda",
        "wgrad_stream": "falconet-graphs-cuda",
        "bn_silu": "falconet-graphs-cuda",
        "profile": "falconet-profiler",
        "profile_warmup": "falconet-profiler",
        "profile_steps": "falconet-profiler",
        "profile_then_stop": "falconet-profiler",
    },
}


def known_provider(kind: str, name: str) -> str | None:
    """The distribution that provides ``name`` of ``kind``, when it is a first-party one."""
    return KNOWN_PROVIDERS.get(kind, {}).get(name)
