#!/usr/bin/env bash
# Run here (a machine with the registry; no GPU needed), from anywhere in the repository: NVIDIA
# Transformer Engine as one archive the GPU machine can take, .te/te-sm<archs>.tar.xz, which
# tools/device/te_install.sh unpacks there (the machine has no network, and a call carries 64 MiB:
# the registry's TE is ~280 MB, most of it kernels for GPUs other than the H200's).
#   bash tools/device/te_bundle.sh                      # TE 2.20.2, sm_90 (H100/H200)
#   TE_VERSION=2.20.2 TE_ARCHS=90 bash tools/device/te_bundle.sh
# One line per step, with its seconds:
#   download  transformer-engine and transformer-engine-cu13 (wheels), the transformer_engine_torch
#             sdist (its sha256 checked against the registry's index; the C++ extension is built
#             on the GPU machine against its torch), and the Python packages TE imports that the
#             machine lacks (pydantic and its set, importlib-metadata, packaging, einops) as
#             cp312 x86-64 wheels; typing-extensions goes to fallback/ (te_install.sh installs it
#             only where the machine's copy is older than pydantic needs)
#   prune     libtransformer_engine.so keeps only the kernels of TE_ARCHS (TE_FATPRUNE,
#             ../shared/te/fatprune.py, rewrites the .nv_fatbin section; then strip), libnccl_ep
#             is left out (the extension is built with NVTE_WITH_NCCL_EP=0), and the wheel's
#             RECORD is rewritten to the new files' hashes
#   pack      bundle.json (version, archs, what is shipped and what is left to the machine),
#             SHA256SUMS of every file, then tar.xz; an archive above TE_MAX_MIB (40) is an error
# Settings: TE_VERSION (2.20.2), TE_ARCHS (90; comma-separated), TE_FATPRUNE, TE_WORK
# (/tmp/te-bundle-make), TE_MAX_MIB. The torch extension built on the GPU machine comes back under
# $OUT/te/ (te_install.sh); put it into .te/ beside the archive and later calls skip the build.
set -euo pipefail
cd "$(dirname "$0")/../.."
version=${TE_VERSION:-2.20.2}
archs=${TE_ARCHS:-90}
fatprune=${TE_FATPRUNE:-../shared/te/fatprune.py}
work=${TE_WORK:-/tmp/te-bundle-make}
max_mib=${TE_MAX_MIB:-40}
name=te-sm${archs//,/-}
top=$work/$name
die() { echo "te_bundle: ERROR: $*" >&2; exit 1; }
say() { echo "te_bundle: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
start=$(now)
[[ -f $fatprune ]] || die "no pruner at $fatprune (set TE_FATPRUNE)"
for tool in readelf strip curl xz; do
  command -v "$tool" > /dev/null || die "$tool is not installed (binutils, curl, xz-utils)"
done

# 1. download
t=$(now)
rm -rf "$work"
mkdir -p "$top"/{wheels,fallback,sdist} "$work/raw"
wheel_args=(--quiet --disable-pip-version-check --only-binary=:all: --python-version 3.12
  --implementation cp --abi cp312 --abi abi3 --abi none
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform any)
python3 -m pip download "${wheel_args[@]}" --no-deps -d "$work/raw" \
  "transformer-engine==$version" "transformer-engine-cu13==$version" 2> "$work/pip.err" \
  || { cat "$work/pip.err" >&2; die "pip could not download TE $version"; }
python3 -m pip download "${wheel_args[@]}" -d "$work/deps" \
  pydantic importlib-metadata packaging einops 2> "$work/pip.err" \
  || { cat "$work/pip.err" >&2; die "pip could not download TE's Python requirements"; }
mv "$work"/deps/typing_extensions-*.whl "$top/fallback/"
mv "$work"/deps/*.whl "$top/wheels/"
mv "$work"/raw/transformer_engine-"$version"-*.whl "$top/wheels/"
sdist=transformer_engine_torch-$version.tar.gz
link=$(curl -fsS https://pypi.org/simple/transformer-engine-torch/ \
  | grep -o "href=\"[^\"]*/$sdist#sha256=[0-9a-f]*\"" | head -n 1 | sed 's/^href="//; s/"$//') \
  || die "cannot read the registry's index of transformer-engine-torch"
[[ -n $link ]] || die "the registry lists no $sdist"
curl -fsSL -o "$top/sdist/$sdist" "${link%%#*}" || die "cannot download ${link%%#*}"
want=${link##*sha256=}
got=$(sha256sum "$top/sdist/$sdist" | cut -d' ' -f1)
[[ $got == "$want" ]] || die "$sdist: sha256 $got, the registry says $want"
say "download: TE $version, its sdist and $(ls "$top/wheels" | wc -l) wheels in $(since "$t")"

# 2. prune the library to the kernels of $archs
t=$(now)
cu13=("$work"/raw/transformer_engine_cu13-"$version"-*.whl)
[[ -f ${cu13[0]} ]] || die "no transformer_engine_cu13 wheel was downloaded"
python3 - "${cu13[0]}" "$top/wheels" "$fatprune" "$archs" "$work/prune" <<'PY'
"""Rewrite the cu13 wheel: its library pruned and stripped, libnccl_ep left out, RECORD anew."""
import base64, hashlib, shutil, subprocess, sys, zipfile
from pathlib import Path

source, out_dir, fatprune, archs, scratch = sys.argv[1:]
scratch = Path(scratch)
scratch.mkdir(parents=True)
library = "transformer_engine/wheel_lib/libtransformer_engine.so"


def pruned(data: bytes) -> bytes:
    raw, small = scratch / "full.so", scratch / "pruned.so"
    raw.write_bytes(data)
    said = subprocess.run([sys.executable, fatprune, raw, small, archs], check=True,
                          capture_output=True, text=True).stdout.split()
    kept = int(said[said.index("kept") + 1])
    if kept == 0:
        sys.exit(f"te_bundle: ERROR: the library holds no kernels for sm {archs}")
    subprocess.run(["strip", "--strip-unneeded", small], check=True)
    print(f"te_bundle: prune: {library}: {kept} kernel images kept, "
          f"{len(data) / 2**20:.0f} -> {small.stat().st_size / 2**20:.0f} MiB", flush=True)
    return small.read_bytes()


def record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


target = Path(out_dir) / Path(source).name
# stored, not deflated: the archive's xz then compresses the library (and the zeros where the
# pruned kernels were) far better than deflate did
with zipfile.ZipFile(source) as wheel, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
    (record,) = [n for n in wheel.namelist() if n.endswith(".dist-info/RECORD")]
    lines = []
    for info in wheel.infolist():
        if info.filename == record or "/libnccl_ep" in info.filename:
            continue
        data = wheel.read(info)
        if info.filename == library:
            data = pruned(data)
        info.compress_type = zipfile.ZIP_STORED
        new.writestr(info, data)
        lines.append(record_line(info.filename, data))
    lines.append(f"{record},,")
    new.writestr(record, "\n".join(lines) + "\n")
shutil.rmtree(scratch)
PY
say "prune: $(basename "${cu13[0]}") is $(du -m "$top"/wheels/transformer_engine_cu13-*.whl | cut -f1) MiB, in $(since "$t")"

# 3. pack
t=$(now)
python3 - "$top" "$version" "$archs" <<'PY'
"""bundle.json: what te_install.sh installs and which requirements the machine must meet itself."""
import json, sys, tarfile, zipfile
from email.parser import Parser
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

top, version, archs = Path(sys.argv[1]), sys.argv[2], sys.argv[3]


def requirements(metadata: str) -> set[str]:
    found = set()
    for text in Parser().parsestr(metadata).get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.add(canonicalize_name(req.name))
    return found


shipped, needed = [], set()
for whl in sorted((top / "wheels").glob("*.whl")) + sorted((top / "fallback").glob("*.whl")):
    dist = canonicalize_name(whl.name.split("-")[0])
    with zipfile.ZipFile(whl) as wheel:
        (meta,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        needed |= requirements(wheel.read(meta).decode())
    if not dist.startswith("transformer-engine") and whl.parent.name == "wheels":
        shipped.append(dist)
with tarfile.open(top / "sdist" / f"transformer_engine_torch-{version}.tar.gz") as sdist:
    info = sdist.extractfile(f"transformer_engine_torch-{version}/PKG-INFO").read().decode()
needed |= requirements(info)
fallback = {canonicalize_name(w.name.split("-")[0]) for w in (top / "fallback").glob("*.whl")}
te = {"transformer-engine", "transformer-engine-cu13", "transformer-engine-torch"}
left_out = sorted(needed - set(shipped) - fallback - te)
(top / "bundle.json").write_text(json.dumps({
    "te_version": version,
    "sm_archs": archs,
    "shipped": shipped,
    "fallback": sorted(fallback),
    # the extension's requirements the machine brings (torch) or TE imports only on use (onnx,
    # onnxscript, nvdlfw-inspect, nvidia-cudnn-frontend): te_install.sh's import check decides
    "left_out": left_out,
}, indent=1) + "\n")
print(f"te_bundle: pack: shipped {' '.join(shipped)}; left to the machine {' '.join(left_out)}")
PY
(cd "$top" && find . -type f ! -name SHA256SUMS -printf '%P\n' | sort | xargs sha256sum > SHA256SUMS)
mkdir -p .te
rm -f .te/te-sm*.tar.xz
archive=.te/$name.tar.xz
XZ_OPT="-9 -T0" tar -C "$work" -cJf "$archive" "$name"
mib=$(du -m "$archive" | cut -f1)
(( mib <= max_mib )) || die "$archive is $mib MiB, above $max_mib (a call carries 64 MiB in all)"
say "pack: $archive ($mib MiB) in $(since "$t")"
say "done in $(since "$start"): carry .te with the call, then bash tools/device/te_install.sh SITE"
