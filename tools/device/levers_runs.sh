#!/usr/bin/env bash
# On the GPU machine (kind nvidia-h200-x2), from the repository root, with .whl and .data
# carried: the kernel-cost levers of issue #8 item 4 side by side, in one call of < 10 min
# (docs/performance.md, "Kernel cost").
#   GPU 0: tools/check_graphs.py (eager vs cuda-graph vs whole-step from the same state in
#          fp32, fp16 and bf16, torch's deterministic algorithms; the bf16 fused arm with
#          fuse_mode), then tools/bench_batchnorm.py (BatchNorm's kernels: native bf16 vs
#          cuDNN), then the isolated step at batch 64 of arms64.
#   GPU 1: the isolated step (tools/bench_train.py --measures step, bf16) at batch 16 of
#          arms16, then in fp16 of arms_fp16.
# Writes $OUT/graphs-check.json, $OUT/bn.json, $OUT/step-b16.json, $OUT/step-b64.json,
# $OUT/step-fp16.json and $OUT/logs.tgz.
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl PYTHONUNBUFFERED=1
mkdir -p /tmp/logs
ws=falconet:graph=whole-step
arms16=${arms16:-$ws,$ws:fuse=inductor,$ws:fuse=inductor-loss,$ws:fuse=inductor-all}
arms64=${arms64:-$ws:fuse=inductor-all,falconet:graph=compile:compile_mode=reduce-overhead}
arms_fp16=${arms_fp16:-falconet,$ws}
step() {  # name, gpu, amp, batch, arms, seconds
  timeout "$6" python tools/bench_train.py --data .data/coco128 --arms "$5" --amp "$3" \
    --batch "$4" --repeats 1 --measures step --gpus "$2" --timeout 200 \
    --out "$OUT/$1.json" > "/tmp/logs/$1.out" 2> "/tmp/logs/$1.err"
}
(
  CUDA_VISIBLE_DEVICES=0 timeout "${check_timeout:-280}" python tools/check_graphs.py \
    --data .data/coco128/coco128.yaml --amp "${check_amp:-fp32,fp16,bf16}" --fuse bf16 \
    --fuse-mode "${fuse_mode:-inductor-all}" --strict --steps 24 \
    --out "$OUT/graphs-check.json" > /tmp/logs/check.out 2> /tmp/logs/check.err
  CUDA_VISIBLE_DEVICES=0 timeout 60 python tools/bench_batchnorm.py --batch 16,64 \
    --out "$OUT/bn.json" > /tmp/logs/bn.out 2> /tmp/logs/bn.err
  [[ -n $arms64 ]] && step step-b64 0 bf16 64 "$arms64" "${b64_timeout:-200}"
) &
step step-b16 1 bf16 16 "$arms16" "${b16_timeout:-400}"
[[ -n $arms_fp16 ]] && step step-fp16 1 fp16 16 "$arms_fp16" "${fp16_timeout:-120}"
wait
tail -n 40 /tmp/logs/check.out
cat /tmp/logs/bn.out /tmp/logs/step-*.out
grep -h "captured\|could not\|declined\|Error" /tmp/logs/*.err | sort | uniq -c | head -20
tar czf "$OUT/logs.tgz" -C /tmp logs
