#!/usr/bin/env bash
# Run here: the payload for tools/device/ab_runs.sh, which measures commits of the project
# side by side in one GPU call (ratios from one machine, one call, runs interleaved).
#   bash tools/device/ab_prepare.sh main my-branch [another-ref ...]
#   bash tools/device/ab_prepare.sh 9f7be47+tools/check_graphs.py .
# The sides become a, b, c, ... in the order given; each is one of
#   REF                a commit (any git ref);
#   .                  this working tree as it is now: HEAD plus its changed and untracked
#                      (not ignored) files, less its deleted ones;
#   SIDE+PATH[,PATH]   SIDE (a REF or .) with these paths taken from this working tree, e.g.
#                      an old commit run with today's check (both sides run the same script).
# .whl/ gets the third-party wheels (tools/device/prepare.sh); .ab/<side> (ignored by git) gets
# each side's project wheels and its tools/ folder, built from a temporary worktree, and
# .ab/<side>/commit says what it is (e.g. "9f7be47+tools/check_graphs.py", "1a2b3c4+worktree").
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
if (( $# < 1 )); then
  echo "usage: bash tools/device/ab_prepare.sh SIDE_A [SIDE_B ...]  (SIDE: REF, ., SIDE+PATH,...)" >&2
  exit 2
fi
bash tools/device/prepare.sh > /dev/null
rm -f .whl/falconet*.whl  # each side brings its own
rm -rf .ab
sides=(a b c d e f)
for i in $(seq 0 $(($# - 1))); do
  spec=${*:i+1:1} side=${sides[i]}
  ref=${spec%%+*} overlay=
  [[ $spec == *+* ]] && overlay=${spec#*+}
  tree=$(mktemp -d)/tree
  if [[ $ref == . ]]; then
    git worktree add --quiet --detach "$tree" HEAD
    # the working tree's files over HEAD's: changed and untracked (not ignored) ones copied,
    # deleted ones removed
    git ls-files -z --cached --others --exclude-standard \
      | tar --null -T - --ignore-failed-read -cf - 2> /dev/null | tar -xf - -C "$tree"
    git ls-files -z --deleted | (cd "$tree" && xargs -0 -r rm -f)
    label="$(git rev-parse --short HEAD)+worktree"
  else
    git worktree add --quiet --detach "$tree" "$ref"
    label=$(git -C "$tree" rev-parse --short HEAD)
  fi
  if [[ -n $overlay ]]; then
    IFS=, read -r -a paths <<< "$overlay"
    for path in "${paths[@]}"; do
      [[ -e $path ]] || { echo "ab_prepare: $path is not in this working tree" >&2; exit 1; }
      mkdir -p "$tree/$(dirname "$path")"
      cp -rT "$path" "$tree/$path"
    done
    label+="+$overlay"
  fi
  (cd "$tree" && uv build --all-packages --wheel --out-dir "$root/.ab/$side/whl" --quiet)
  cp -r "$tree/tools" ".ab/$side/tools"
  echo "$label" > ".ab/$side/commit"
  git worktree remove --force "$tree"
  echo "side $side: $label"
done
du -sh .whl .ab
