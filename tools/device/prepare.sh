#!/usr/bin/env bash
# Run here (not on the GPU machine): put every wheel the GPU machine needs into .whl/ (ignored by
# git): the project's own, built with `uv build --all-packages`, and the third-party wheels that
# machine lacks (Python 3.12, manylinux x86-64). Then one device call installs from that folder:
# see docs/development.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl
uv build --all-packages --wheel --out-dir .whl --quiet
python3 tools/device/missing_wheels.py .whl  # needs pip, which a uv venv lacks
if [[ "${bench:-0}" == 1 ]]; then  # the benchmark's peers (tools/device/bench-peers.txt)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --dest .whl -r tools/device/bench-peers.txt
fi
if [[ "${diag:-0}" == 1 ]]; then  # py-spy and the like (tools/device/diagnosis.txt)
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux2014_x86_64 --dest .whl -r tools/device/diagnosis.txt
fi
size_kib=$(du -sk .whl | cut -f1)
ls -1 .whl
echo "prepare: .whl holds $((size_kib / 1024)) MiB (a device call carries at most 64 MiB in all)"
if (( size_kib > 60 * 1024 )); then
  echo "prepare: .whl is too large to carry; ship fewer wheels" >&2
  exit 1
fi
