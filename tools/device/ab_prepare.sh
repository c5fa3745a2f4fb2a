#!/usr/bin/env bash
# Run here: the payload for tools/device/ab_runs.sh, which measures commits of the project
# side by side in one GPU call (ratios from one machine, one call, runs interleaved).
#   bash tools/device/ab_prepare.sh main my-branch [another-ref ...]
# The refs become sides a, b, c, ... in the order given. .whl/ gets the third-party wheels
# (tools/device/prepare.sh); .ab/<side> (ignored by git) gets each ref's project wheels and
# its tools/ folder, built from a temporary worktree.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
if (( $# < 2 )); then
  echo "usage: bash tools/device/ab_prepare.sh REF_A REF_B [REF_C ...]" >&2
  exit 2
fi
bash tools/device/prepare.sh > /dev/null
rm -f .whl/falconet*.whl  # each side brings its own
rm -rf .ab
sides=(a b c d e f)
for i in $(seq 0 $(($# - 1))); do
  ref=${*:i+1:1} side=${sides[i]}
  tree=$(mktemp -d)/tree
  git worktree add --quiet --detach "$tree" "$ref"
  (cd "$tree" && uv build --all-packages --wheel --out-dir "$root/.ab/$side/whl" --quiet)
  cp -r "$tree/tools" ".ab/$side/tools"
  git -C "$tree" rev-parse --short HEAD > ".ab/$side/commit"
  git worktree remove --force "$tree"
  echo "side $side: $ref at $(cat ".ab/$side/commit")"
done
du -sh .whl .ab
