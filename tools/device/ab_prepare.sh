#!/usr/bin/env bash
# Run here: the payload for tools/device/ab_runs.sh, which measures two commits of the project
# side by side in one GPU call (ratios from one machine, one call, runs interleaved).
#   ref_a=main ref_b=my-branch bash tools/device/ab_prepare.sh
# .whl/ gets the third-party wheels (tools/device/prepare.sh); .ab/a and .ab/b (ignored by git)
# each get one ref's project wheels and its tools/ folder, built from a temporary worktree.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
: "${ref_a:?set ref_a (e.g. main)}" "${ref_b:?set ref_b (a branch or commit)}"
bash tools/device/prepare.sh > /dev/null
rm -f .whl/falconet*.whl  # each side brings its own
rm -rf .ab
for side in a b; do
  ref_var="ref_$side"
  tree=$(mktemp -d)/tree
  git worktree add --quiet --detach "$tree" "${!ref_var}"
  (cd "$tree" && uv build --all-packages --wheel --out-dir "$root/.ab/$side/whl" --quiet)
  cp -r "$tree/tools" ".ab/$side/tools"
  git -C "$tree" rev-parse --short HEAD > ".ab/$side/commit"
  git worktree remove --force "$tree"
  echo "side $side: ${!ref_var} at $(cat ".ab/$side/commit")"
done
du -sh .whl .ab
