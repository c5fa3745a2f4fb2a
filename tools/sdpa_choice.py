"""Which kernel ``scaled_dot_product_attention`` picks for a training step's attention calls,
why the kernels ahead of it were refused, and which cuDNN the process runs.

An fp8 run of detr-s whose gating kept every layer in bf16 measured slower than the bf16 run,
and its step's kernel table had PyTorch's flash and memory-efficient attention where the bf16
step had cuDNN's (and other convolution kernels). This script says whether importing a module
first (``--import-first transformer_engine.pytorch``, as the fp8 backend does before the first
step) is what moves torch's choice: it imports the modules, builds the trainer as ``train``
does (eager), runs one training step on its loader's first batch recording the inputs of every
attention call, and asks torch which backend it picks for each (``torch._fused_sdp_choice``, the
dispatcher's own choice) with the reasons each other backend gave (``can_use_*(debug=True)``
warnings), beside the cuDNN version torch reads at run time and every cuDNN library mapped into
the process. Run it once without and once with the import: torch fixes its backend order at the
first attention call of a process.

    cd tools && python sdpa_choice.py --data ../.data/coco128/coco128.yaml --model detr-s \\
        --imgsz 384 --amp bf16 --batch 64 --import-first transformer_engine.pytorch --out sdpa.json

CUDA only.
"""

from __future__ import annotations

import importlib
import re
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from first_batch import add_row, each_case, new_results, replay_parser, save_results
from torch.nn.attention import SDPBackend

CHECKS = {
    "cudnn": torch.backends.cuda.can_use_cudnn_attention,
    "flash": torch.backends.cuda.can_use_flash_attention,
    "efficient": torch.backends.cuda.can_use_efficient_attention,
}


def recorded_calls(trainer, images, targets) -> list[tuple]:
    """``(q, k, v, mask)`` of every attention call of one training step, one per distinct
    signature (shapes, dtypes, mask or not)."""
    calls: dict[tuple, tuple] = {}
    original = F.scaled_dot_product_attention

    def record(q, k, v, attn_mask=None, *args, **kwargs):
        key = (tuple(q.shape), tuple(k.shape), q.dtype, None if attn_mask is None else tuple(
            attn_mask.shape))  # fmt: skip
        calls.setdefault(key, tuple(
            None if t is None else t.detach().clone() for t in (q, k, v, attn_mask)))  # fmt: skip
        return original(q, k, v, attn_mask, *args, **kwargs)

    F.scaled_dot_product_attention = record
    try:
        trainer.run.step(images, targets, update=True)
        torch.cuda.synchronize()
    finally:
        F.scaled_dot_product_attention = original
    return list(calls.values())


def choice(q, k, v, mask) -> dict:
    """The backend torch dispatches to for these inputs, and each backend's refusal reasons."""
    chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, attn_mask=mask)).name
    params = torch.backends.cuda.SDPAParams(q, k, v, mask, 0.0, False, False)
    refusals = {}
    for name, can_use in CHECKS.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ok = can_use(params, True)
        refusals[name] = "ok" if ok else " | ".join(str(w.message) for w in caught)[:600]
    return {
        "q": list(q.shape), "k": list(k.shape), "dtype": str(q.dtype).split(".")[-1],
        "mask": None if mask is None else list(mask.shape), "chosen": chosen, **refusals,
    }  # fmt: skip


def loaded_cudnn() -> list[str]:
    """The cuDNN libraries mapped into this process, by path."""
    maps = Path("/proc/self/maps").read_text()
    return sorted(set(re.findall(r"\S*libcudnn\S*\.so\S*", maps)))


def state() -> dict:
    """What torch's SDPA choice depends on beyond the inputs: the enabled backends, cuDNN."""
    sdp = torch.backends.cuda
    return {
        "cudnn_compiled": torch._C._cudnn.getCompileVersion(),
        "cudnn_runtime": torch._C._cudnn.getRuntimeVersion(),
        "enabled": {"cudnn": sdp.cudnn_sdp_enabled(), "flash": sdp.flash_sdp_enabled(),
                    "efficient": sdp.mem_efficient_sdp_enabled(), "math": sdp.math_sdp_enabled()},
        "priority": [SDPBackend(b).name for b in torch._C._get_sdp_priority_order()],
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn_libraries": loaded_cudnn(),
    }  # fmt: skip


def main() -> None:
    parser = replay_parser(__doc__)
    parser.add_argument("--import-first", default="", help="modules to import, comma-separated")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sdpa_choice.py needs CUDA")
    imported = [m for m in args.import_first.split(",") if m]
    for module in imported:
        importlib.import_module(module)
    results = new_results()
    results["imported_first"] = imported
    _, _, trainer, images, targets = next(each_case(args, "sdpa"))  # the first --amp, --batch
    calls = recorded_calls(trainer, images, targets)
    add_row(results, state())
    for call in calls:
        add_row(results, choice(*call))
    save_results(args, results)


if __name__ == "__main__":
    main()
