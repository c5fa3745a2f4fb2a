#!/usr/bin/env bash
# On the GPU machine (kind nvidia-h200-x2), from the repository root, with .whl and .data
# carried: the graph backends' GPU evidence for docs/performance.md, in one call of < 10 min.
#   GPU 0: tools/check_graphs.py -- eager vs cuda-graph (twice) vs whole-step (and whole-step
#          with fuse=inductor in bf16) from the same state in fp32, fp16 and bf16, with
#          torch's deterministic algorithms (bit-equality, memory), and the failed-capture test;
#          then, unless profile_graphs is empty, `falconet profile run` of those backends
#          (tools/device/profile_runs.sh) at profile_batches.
#   GPU 1: tools/bench_train.py isolated step (bf16) of each arm at batch 16, then 4, then 64.
# Writes $OUT/graphs-check.json, $OUT/graphs-step.json, $OUT/profiles.tgz and $OUT/logs.tgz.
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl
mkdir -p /tmp/logs /tmp/prof
arms=${arms:-falconet:graph=eager,falconet:graph=cuda-graph,falconet:graph=whole-step,falconet:graph=whole-step:fuse=inductor,falconet:graph=compile,falconet:graph=compile:compile_mode=reduce-overhead}
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python tools/check_graphs.py --data .data/coco128/coco128.yaml \
    --amp fp32,fp16,bf16 --fuse bf16 --strict --steps 24 ${full_runs:+--full-runs $full_runs} \
    --out "$OUT/graphs-check.json" > /tmp/logs/check.out 2> /tmp/logs/check.err
  if [[ -n ${profile_graphs-cuda-graph whole-step} ]]; then
    OUT=/tmp/prof graphs=${profile_graphs-cuda-graph whole-step} \
      batches=${profile_batches:-16 64} traces= pair_timeout=${pair_timeout:-120} \
      bash tools/device/profile_runs.sh
    tar czf "$OUT/profiles.tgz" -C /tmp prof
  fi
) &
timeout "${step_timeout:-560}" python tools/bench_train.py --data .data/coco128 --arms "$arms" \
  --amp bf16 --batch "${batches:-16,4,64}" --repeats 1 --measures step --gpus 1 --timeout 200 \
  --out "$OUT/graphs-step.json" > /tmp/logs/step.out 2> /tmp/logs/step.err
wait
cat /tmp/logs/step.out
grep -h "captured\|could not\|declined" /tmp/logs/*.err | sort | uniq -c | head -20
tar czf "$OUT/logs.tgz" -C /tmp logs
