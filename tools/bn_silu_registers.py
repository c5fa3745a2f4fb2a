"""The bn_silu kernels compiled for a GPU that need not be present: registers a thread,
bytes spilled to the stack, shared memory, for a tiling (``bn_silu_tiling.Tiling``, the defaults
with any ``FALCONET_BN_SILU_*`` set) and each channel block width.

Triton compiles for a named target with its own ``ptxas``, and ``cuobjdump`` (shipped with
Triton as well) reads the resources off the cubin, so this runs on a machine without a GPU.
It is how a tiling is checked before GPU time is spent on it: a kernel that spills or needs
all 255 registers runs few programs per SM (at 8,192-element merge tiles and 4 warps the
merge kernels do). What the kernels' time is, only the GPU says (``tools/bench_bn_silu.py``).

    python tools/bn_silu_registers.py --arch 90 --dtype fp16
    FALCONET_BN_SILU_MERGE_ELEMENTS=2048 python tools/bn_silu_registers.py --json
"""

from __future__ import annotations

import argparse
import inspect
import json
import re
import subprocess
import tempfile
from pathlib import Path

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from falconet_graphs_cuda import bn_silu_kernels
from falconet_graphs_cuda.bn_silu_tiling import KERNEL_KINDS, Tiling, plan_launch, tiling_from_env

# in the input's dtype; the other pointers float32
ACTIVATIONS = ("x_ptr", "z_ptr", "dz_ptr", "dx_ptr", "res_ptr")
FLOATS = ("momentum", "eps")
# switches a kernel takes besides its tiles, set to the variant that does more (a residual
# read: C2f's bottlenecks end in one)
SWITCHES = {"HAS_RESIDUAL": True}
DTYPES = {"fp16": "fp16", "bf16": "bf16", "fp32": "fp32"}


def signature(kernel, dtype: str, constants: dict[str, int]) -> dict[str, str]:
    """Triton's type of each argument as the op passes it (pointers, 32-bit sizes)."""
    types = {}
    for name in inspect.signature(kernel.fn).parameters:
        if name in constants:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = f"*{dtype}" if name in ACTIVATIONS else "*fp32"
        else:
            types[name] = "fp32" if name in FLOATS else "i32"
    return types


LAUNCH_OPTIONS = ("num_warps", "enable_fp_fusion")
"""The keys of a plan's launch settings that are compile options, not the kernel's constants."""


def resources(kernel, meta: dict[str, int], dtype: str, arch: int) -> dict[str, int]:
    """Compile ``kernel`` with ``meta`` (tiles and :data:`LAUNCH_OPTIONS`) for ``sm_<arch>``;
    read its registers, stack (spills) and shared memory off the cubin."""
    options = {k: meta[k] for k in LAUNCH_OPTIONS}
    constants = {k: v for k, v in meta.items() if k not in LAUNCH_OPTIONS}
    names = inspect.signature(kernel.fn).parameters
    constants |= {k: v for k, v in SWITCHES.items() if k in names}
    source = ASTSource(kernel, signature(kernel, dtype, constants), constexprs=constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        out = subprocess.run(
            [str(tool), "--dump-resource-usage", cubin.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    found = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", out))
    return {
        "registers": int(found["REG"]),
        "stack": int(found["STACK"]),
        "shared": int(found["SHARED"]),
    }


def table(tiling: Tiling, dtype: str, arch: int, widths=(16, 32, 64)) -> list[dict]:
    """Every kernel at each channel block width (the op's ``block_c``: 16, 32 or 64)."""
    rows = []
    for width in widths:
        plan = plan_launch(torch.empty(1, width, 1, 1, device="meta"), tiling)
        for name, kind in KERNEL_KINDS.items():
            meta = plan.meta(kind)
            got = resources(getattr(bn_silu_kernels, name), meta, dtype, arch)
            rows.append({"kernel": name, "block_c": width, **meta, **got})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    parser.add_argument("--dtype", choices=DTYPES, default="fp16")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tiling = tiling_from_env()
    rows = table(tiling, DTYPES[args.dtype], args.arch)
    if args.json:
        print(json.dumps({"tiling": tiling.__dict__, "arch": args.arch, "rows": rows}, indent=1))
        return
    print(f"sm_{args.arch}, {args.dtype}, {tiling}")
    print(f"{'kernel':28s} {'block_c':>7s} {'warps':>5s} {'regs':>5s} {'stack':>5s} {'shared':>6s}")
    for r in rows:
        print(
            f"{r['kernel']:28s} {r['block_c']:7d} {r['num_warps']:5d} {r['registers']:5d} "
            f"{r['stack']:5d} {r['shared']:6d}"
        )


if __name__ == "__main__":
    main()
