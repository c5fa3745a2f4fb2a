#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .te carried (made here by
# tools/device/te_bundle.sh): NVIDIA Transformer Engine into each site folder given, beside what
# the folder holds already (the project's device scripts install into /tmp/site-<side> with pip
# --target; ab_runs.sh with with_te=1 calls this for every one of them).
#   bash tools/device/te_install.sh /tmp/site-a /tmp/site-b      # or: TE_SITE=/tmp/site bash ...
#   PYTHONPATH=/tmp/site-a python3 -c "import transformer_engine.pytorch as te"
# One line per step, with its seconds:
#   unpack   .te/te-sm*.tar.xz into $TE_WORK (/tmp/te-bundle), every file's sha256 checked
#   build    the transformer_engine_torch wheel from the bundle's sdist (~110 s on 16 cores), with
#            NVTE_CUDA_ARCHS=90, MAX_JOBS=$(nproc), CUDA_HOME=/usr/local/cuda-13.0 and the include
#            folders of nvidia.cudnn and nvidia.nccl on CPLUS_INCLUDE_PATH (then nvidia.cu13's,
#            where it exists: it only fills in what the toolkit lacks), unless .te/ holds a built
#            one of the same version. A fresh one is copied to $OUT/te/ (when $OUT is set): put that wheel into
#            .te/ here and carry it with the archive, and later calls skip the build.
#   install  into each site: pip install --no-index --no-deps --target (TE files of an earlier
#            install there are removed first); pydantic and its set only where the site has no
#            copy of its own (the project's .whl has pydantic too)
#   check    in each site, with PYTHONPATH=<site>: TE's requirements are met (typing-extensions
#            from the bundle's fallback/ only where the machine's is older than pydantic needs),
#            then `import transformer_engine.pytorch` is timed (after torch's, untimed in it) and
#            te.is_fp8_available() must be True
# Settings: TE_SKIP_BUILD=1 (no build, hence no import check: a dry run of unpack and install on
# a machine without CUDA), TE_SKIP_CHECK=1 (no import), TE_CHECK=first (import in the first site
# only; an import takes ~8 s), TE_PYTHON (python3), TE_CUDA_HOME (/usr/local/cuda-13.0), TE_WORK,
# MAX_JOBS. Exits non-zero, saying why, at the first thing that is wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${TE_PYTHON:-python3}
work=${TE_WORK:-/tmp/te-bundle}
cuda_home=${TE_CUDA_HOME:-/usr/local/cuda-13.0}
die() { echo "te_install: ERROR: $*" >&2; exit 1; }
say() { echo "te_install: $*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
start=$(now)

sites=("$@")
if (( ${#sites[@]} == 0 )) && [[ -n ${TE_SITE:-} ]]; then
  read -r -a sites <<< "${TE_SITE//:/ }"
fi
(( ${#sites[@]} > 0 )) \
  || die "usage: bash tools/device/te_install.sh SITE_DIR [SITE_DIR ...]  (or TE_SITE=SITE_DIR)"
for site in "${sites[@]}"; do
  [[ $site != *[*?[]* ]] || die "site '$site' looks like a pattern that matched nothing"
done
command -v "$py" > /dev/null || die "$py not found (TE_PYTHON)"
archives=()
for archive in .te/te-sm*.tar.xz; do
  if [[ -f $archive ]]; then archives+=("$archive"); fi
done
(( ${#archives[@]} == 1 )) || die "want one .te/te-sm*.tar.xz, found ${#archives[@]} in $PWD/.te
  ($(find .te -maxdepth 1 -printf '%f ' 2>&1)); make it here with tools/device/te_bundle.sh, carry .te"

# 1. unpack
t=$(now)
rm -rf "$work"
mkdir -p "$work"
bundle=$("$py" - "${archives[0]}" "$work" <<'PY'
import hashlib, sys, tarfile
from pathlib import Path
archive, work = sys.argv[1], Path(sys.argv[2])
try:
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
except Exception as error:  # a truncated or damaged copy
    sys.exit(f"te_install: ERROR: cannot unpack {archive}: {error!r}")
(top,) = [p for p in work.iterdir() if p.is_dir()]
bad = []
for line in (top / "SHA256SUMS").read_text().splitlines():
    digest, name = line.split("  ", 1)
    h = hashlib.sha256()
    with open(top / name, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    if h.hexdigest() != digest:
        bad.append(name)
if bad:
    sys.exit(f"te_install: ERROR: {archive}: sha256 differs for {bad}")
print(top)
PY
) || exit 1
read -r version archs < <("$py" -c 'import json, sys; b = json.load(open(sys.argv[1]))
print(b["te_version"], b["sm_archs"])' "$bundle/bundle.json")
say "unpack: ${archives[0]} ($(du -m "${archives[0]}" | cut -f1) MiB) -> $bundle: TE $version, sm $archs, in $(since "$t")"

# 2. build the torch extension (or take the one carried in .te/)
t=$(now)
built=
for whl in .te/transformer_engine_torch-"$version"-*.whl; do
  if [[ -f $whl ]]; then built=$whl; fi
done
carried=$built
if [[ -n $built ]]; then
  say "build: skipped, using $built (carried in .te/)"
elif [[ ${TE_SKIP_BUILD:-0} == 1 ]]; then
  say "build: skipped (TE_SKIP_BUILD=1): without the extension transformer_engine.pytorch cannot import"
else
  [[ -x $cuda_home/bin/nvcc ]] || die "no CUDA toolkit at $cuda_home (no bin/nvcc); set TE_CUDA_HOME"
  includes=$("$py" - <<'PY'
import importlib, os, sys
folders = []
for module, header in (("nvidia.cudnn", "cudnn.h"), ("nvidia.nccl", "nccl.h")):
    try:
        folder = os.path.join(list(importlib.import_module(module).__path__)[0], "include")
    except ImportError as error:
        sys.exit(f"te_install: ERROR: {module} is not importable ({error}): its headers are needed")
    if not os.path.isfile(os.path.join(folder, header)):
        sys.exit(f"te_install: ERROR: no {header} in {folder}")
    folders.append(folder)
# the pip CUDA headers (nvidia-cusparse and co. put theirs in nvidia/cu13/include), searched only
# for what the toolkit's include folder (CUDA_HOME, first on the compiler's line) lacks
try:
    folder = os.path.join(list(importlib.import_module("nvidia.cu13").__path__)[0], "include")
    if os.path.isdir(folder):
        folders.append(folder)
except ImportError:
    pass
print(":".join(folders))
PY
  ) || exit 1
  jobs=${MAX_JOBS:-$(nproc)}
  mkdir -p "$work/built"
  log=$work/build.log
  sdists=("$bundle"/sdist/transformer_engine_torch-"$version".tar.gz)
  say "build: transformer_engine_torch $version for sm $archs, $jobs jobs, CUDA_HOME=$cuda_home (log: $log)"
  if ! env NVTE_PYTORCH_FORCE_BUILD=TRUE NVTE_FRAMEWORK=pytorch NVTE_WITH_NCCL_EP=0 \
    NVTE_CUDA_ARCHS="${archs//,/;}" MAX_JOBS="$jobs" CUDA_HOME="$cuda_home" \
    CPLUS_INCLUDE_PATH="$includes${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}" \
    "$py" -m pip wheel --no-build-isolation --no-index --no-deps --no-cache-dir \
    -w "$work/built" "${sdists[0]}" > "$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "the build of transformer_engine_torch failed after $(since "$t") (the log's end is above; all of it in $log)"
  fi
  for whl in "$work"/built/transformer_engine_torch-"$version"-*.whl; do
    if [[ -f $whl ]]; then built=$whl; fi
  done
  [[ -n $built ]] || die "the build ended well but left no wheel in $work/built (see $log)"
  say "build: $(basename "$built") ($(du -k "$built" | cut -f1) KiB) in $(since "$t")"
  if [[ -n ${OUT:-} ]]; then
    mkdir -p "$OUT/te"
    cp "$built" "$OUT/te/"
    say "build: copied to \$OUT/te/: put it into .te/ and carry it to skip this build next time"
  fi
fi

# 3. install into each site, 4. check each
te_wheels=("$bundle"/wheels/transformer_engine-*.whl "$bundle"/wheels/transformer_engine_cu*.whl)
if [[ -n $built ]]; then te_wheels+=("$built"); fi
pip_target=("$py" -m pip install --quiet --disable-pip-version-check --no-index --no-deps
  --no-compile --no-cache-dir --upgrade --target)
check_requirements() {  # site: TE's and the shipped wheels' requirements, as seen from the site
  PYTHONPATH=$1 "$py" - "$bundle/bundle.json" "$1" "${built:+transformer-engine-torch}" <<'PY'
import json, sys
from importlib import metadata
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
bundle, site = json.load(open(sys.argv[1])), Path(sys.argv[2]).resolve()
te = ["transformer-engine", "transformer-engine-cu13"] + [a for a in sys.argv[3:] if a]
left_out = set(bundle["left_out"])
for name in te + bundle["shipped"]:
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        print(f"{name}\tnot installed")
        continue
    where = Path(dist.locate_file("")).resolve()
    if name in te and where != site:
        print(f"{name}\tfound in {where}, not in {site}")
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        dep = canonicalize_name(req.name)
        if dep in left_out:
            continue
        try:
            found = metadata.version(dep)
        except metadata.PackageNotFoundError:
            print(f"{dep}\t{name} {dist.version} needs {req}, none is installed")
            continue
        if not req.specifier.contains(found, prereleases=True):
            print(f"{dep}\t{name} {dist.version} needs {req}, {found} is installed")
PY
}
checked=0
for site in "${sites[@]}"; do
  t=$(now)
  mkdir -p "$site"
  earlier=$(find "$site" -maxdepth 1 -name 'transformer_engine*' | wc -l)
  rm -rf "$site"/transformer_engine "$site"/transformer_engine-*.dist-info \
    "$site"/transformer_engine_cu1[23]-*.dist-info "$site"/transformer_engine_torch*
  wheels=("${te_wheels[@]}") kept=()
  for whl in "$bundle"/wheels/*.whl; do
    dist=$(basename "$whl")
    dist=${dist%%-*}
    [[ $dist == transformer_engine* ]] && continue
    if compgen -G "$site/$dist-*.dist-info" > /dev/null; then
      kept+=("$dist")
    else
      wheels+=("$whl")
    fi
  done
  "${pip_target[@]}" "$site" "${wheels[@]}" \
    || die "pip could not install into $site: ${wheels[*]##*/}"
  note=
  if (( earlier > 0 )); then note+=", replacing an earlier TE there"; fi
  if (( ${#kept[@]} > 0 )); then note+=", the site's own ${kept[*]} kept"; fi
  say "install: $site: $(( ${#wheels[@]} )) wheels$note, in $(since "$t")"

  t=$(now)
  unmet=$(check_requirements "$site") || die "the requirements check failed in $site"
  if [[ -n $unmet ]]; then
    fallbacks=()
    while read -r dep; do
      for whl in "$bundle"/fallback/"${dep//-/_}"-*.whl; do
        if [[ -f $whl ]]; then
          fallbacks+=("$whl")
          say "check: $site: $(grep "^$dep"$'\t' <<< "$unmet" | cut -f2 | paste -sd ';' | sed 's/;/; /g'):" \
            "installing $(basename "$whl") from the bundle's fallback/"
        fi
      done
    done < <(cut -f1 <<< "$unmet" | sort -u)
    if (( ${#fallbacks[@]} > 0 )); then
      "${pip_target[@]}" "$site" "${fallbacks[@]}" || die "pip could not install ${fallbacks[*]##*/}"
      unmet=$(check_requirements "$site") || die "the requirements check failed in $site"
    fi
    [[ -z $unmet ]] || die "unmet requirements in $site:
$(cut -f2 <<< "$unmet" | sed 's/^/  /')"
  fi
  say "check: $site: the requirements of TE and of the wheels shipped with it are met, in $(since "$t")"

  if [[ -z ${carried}${built} ]]; then
    say "check: $site: no import (no extension built: TE_SKIP_BUILD=1)"
    continue
  elif [[ ${TE_SKIP_CHECK:-0} == 1 ]] || { [[ ${TE_CHECK:-all} == first ]] && (( checked > 0 )); }; then
    say "check: $site: no import (TE_SKIP_CHECK=1 or TE_CHECK=first)"
    continue
  fi
  t=$(now)
  # torch first, as falconet's fp8 plugin imports it (it also puts its CUDA libraries, libnccl
  # among them, in the process, which libtransformer_engine.so needs); the TE import is timed apart.
  # transformer_engine.pytorch has no __version__ of its own: the version is transformer_engine's.
  if ! result=$(PYTHONPATH=$site "$py" -c '
import time
start = time.perf_counter()
import torch
middle = time.perf_counter()
import transformer_engine
import transformer_engine.pytorch as te
end = time.perf_counter()
try:
    fp8, reason = te.is_fp8_available(return_reason=True)
except Exception as error:  # no driver, no GPU
    fp8, reason = False, repr(error)
print("te-check", transformer_engine.__version__, fp8, f"{middle - start:.1f}", f"{end - middle:.1f}",
      transformer_engine.__file__, " ".join(str(reason).split()) or "-", sep="\t")
' 2> "$work/import.err"); then
    tail -n 25 "$work/import.err" >&2
    hint=
    if [[ -n $carried ]]; then
      hint=" (with the extension carried in .te/, $carried: built for another torch? remove it from .te/ to build it afresh)"
    fi
    die "import transformer_engine.pytorch failed in $site$hint"
  fi
  line=$(grep $'^te-check\t' <<< "$result" | tail -n 1) || true
  [[ -n $line ]] || die "the import check in $site printed no result line: $result"
  IFS=$'\t' read -r _ got fp8 torch_s te_s file reason <<< "$line"
  [[ $file == "$site"/* || $file == "$(cd "$site" && pwd -P)"/* ]] \
    || die "transformer_engine was imported from $file, not from $site"
  [[ $got == "$version" ]] || die "TE $got was imported from $site, not $version"
  [[ $fp8 == True ]] || die "TE $got imported in $site (in $te_s s), but FP8 is not available: $reason"
  say "check: $site: TE $got, is_fp8_available $fp8, import transformer_engine.pytorch $te_s s" \
    "(torch before it $torch_s s; the process $(since "$t"))"
  checked=$((checked + 1))
done
say "done in $(since "$start"): TE $version in ${sites[*]}"
