#!/usr/bin/env bash
# On the GPU machine (kind nvidia-h200-x2), from the repository root, with .whl and .data
# carried: the graph backends' GPU evidence for docs/performance.md, in one call of < 10 min.
#   GPU 0: tools/check_graphs.py -- eager vs cuda-graph vs whole-step from the same state in
#          fp32, fp16 and bf16 (bit-equality, memory), then 3-epoch training runs with each
#          backend (did the capture happen inside the real loop), then the failed-capture test.
#   GPU 1: tools/bench_train.py isolated step of each backend at batch 4, 16 and 64.
# Writes $OUT/graphs-check.json, $OUT/graphs-step.json and $OUT/logs.tgz.
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl
mkdir -p /tmp/logs
arms=${arms:-falconet,falconet:graph=cuda-graph,falconet:graph=whole-step:optimizer=sgd,falconet:graph=compile:compile_mode=reduce-overhead}
(
  export CUDA_VISIBLE_DEVICES=0
  timeout 540 python tools/check_graphs.py --data .data/coco128/coco128.yaml \
    --amp fp32,fp16,bf16 --steps 24 --full-runs eager,cuda-graph,whole-step \
    --out "$OUT/graphs-check.json" > /tmp/logs/check.out 2> /tmp/logs/check.err
) &
timeout 540 python tools/bench_train.py --data .data/coco128 --arms "$arms" \
  --batch "${batches:-4,16,64}" --repeats 1 --measures step --gpus 1 --timeout 200 \
  --out "$OUT/graphs-step.json" > /tmp/logs/step.out 2> /tmp/logs/step.err
wait
cat /tmp/logs/step.out
grep -h "captured\|could not\|declined" /tmp/logs/*.err | sort | uniq -c | head -20
tar czf "$OUT/logs.tgz" -C /tmp logs
