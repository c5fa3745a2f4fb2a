#!/usr/bin/env bash
# On the GPU machine (kind nvidia-h200-x2), from the repository root, with .whl and .data
# carried: end-to-end speed and the accuracy check of the graph backends (docs/performance.md)
# and the profiler's verdicts (docs/profiling.md), in one call of < 10 min, bf16, batch 16.
#   GPU 0: `falconet profile run` of whole-step and eager at batches 16, 4, 64
#          (tools/device/profile_runs.sh), then the overfit check of eager.
#   GPU 1: tools/bench_train.py end to end (COCO128 x4, epochs 2-4) of eager, cuda-graph,
#          whole-step and whole-step with fuse=inductor, then the overfit check of the latter.
# The overfit check trains on COCO128 and validates on it (300 epochs, batch 16). Writes
# $OUT/e2e.json, $OUT/overfit-*.json, $OUT/profiles.tgz and $OUT/logs.tgz.
# Knobs (environment): profile_graphs, profile_batches, pair_timeout, overfit_epochs,
# overfit_seed (default 0; another seed measures the check's spread), e2e_arms, e2e_timeout
# (seconds per arm, default 150; fuse=inductor compiles first and needs about 300) and
# e2e_total (seconds for all arms, default 300).
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl
mkdir -p /tmp/logs /tmp/prof
epochs=${overfit_epochs:-300}
overfit() {  # arm, gpu
  timeout 260 python tools/bench_train.py --data .data/coco128 --arms "$1:seed=${overfit_seed:-0}" --amp bf16 \
    --measures overfit --overfit-epochs "$epochs" --overfit-batch 16 --gpus "$2" \
    --timeout 250 --out "$OUT/overfit-$2.json" > "/tmp/logs/overfit-$2.out" 2>&1
}
(
  OUT=/tmp/prof graphs="${profile_graphs:-whole-step eager}" batches="${profile_batches:-16 4 64}" \
    traces= pair_timeout=${pair_timeout:-100} bash tools/device/profile_runs.sh
  tar czf "$OUT/profiles.tgz" -C /tmp prof
  overfit falconet:graph=eager 0
) &
timeout "${e2e_total:-300}" python tools/bench_train.py --data .data/coco128 --amp bf16 --batch 16 \
  --arms "${e2e_arms:-falconet:graph=eager,falconet:graph=cuda-graph,falconet:graph=whole-step,falconet:graph=whole-step:fuse=inductor}" \
  --repeats 1 --epochs 4 --repeat-data 4 --measures e2e --gpus 1 --timeout "${e2e_timeout:-150}" \
  --out "$OUT/e2e.json" > /tmp/logs/e2e.out 2> /tmp/logs/e2e.err
overfit falconet:graph=whole-step:fuse=inductor 1
wait
cat /tmp/logs/e2e.out /tmp/logs/overfit-*.out | grep -v WARNING | tail -30
tar czf "$OUT/logs.tgz" -C /tmp logs
