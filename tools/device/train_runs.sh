#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .whl and .data carried (see
# docs/development.md): the trainer's GPU evidence. Writes under $OUT. Its records:
# docs/lab/2026-11-convergence-and-resume.md, docs/lab/2026-11-graph-backends.md.
#   part=overfit  two COCO128 overfit runs from scratch at once (train = val, 640 px, batch 16):
#                 the family recipe (SGD, mosaic) and a pure-overfit recipe (AdamW, no mosaic)
#   part=checks   a short shapes run per graph/precision backend (eager bf16, compile bf16,
#                 eager fp16, compile reduce-overhead) for loss agreement, then
#                 tools/bench_step.py for what #5 left; variants= and steps= (;-separated)
#                 choose a subset
#   part=resume   the same shapes run twice, one killed with SIGKILL after its second epoch and
#                 resumed; both results.csv side by side (GPU resume within nondeterminism)
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl
part=${part:-overfit}
common=(data=.data/coco128/coco128.yaml imgsz=640 batch=16 cache=ram workers=8 amp_dtype=bf16
        val_interval=10 eval_backend=hotcoco deterministic=false plots=true project=/tmp/runs
        graph=eager)  # the eager trainer, as these runs measured it (the default is now auto)
if [[ $part == resume ]]; then
  keys=(data=shapes epochs=6 batch=32 workers=8 seed=0 project=/tmp/runs plots=false graph=eager)
  falconet train "${keys[@]}" name=whole > "$OUT/resume_whole.log" 2>&1 &
  falconet train "${keys[@]}" name=killed > "$OUT/resume_killed.log" 2>&1 &
  killed=$!
  until [[ $( (wc -l < /tmp/runs/killed/results.csv) 2>/dev/null || echo 0) -ge 3 ]]; do
    sleep 0.2
  done
  kill -9 $killed
  wait
  falconet train resume=/tmp/runs/killed/weights/last.pt >> "$OUT/resume_killed.log" 2>&1
  paste -d'|' /tmp/runs/whole/results.csv /tmp/runs/killed/results.csv > "$OUT/resume_side_by_side.csv"
elif [[ $part == overfit ]]; then
  epochs=${epochs:-300}
  timeout 560 python tools/convergence.py --target mAP50-95=0.5 --json "$OUT/overfit_sgd.json" \
    "${common[@]}" epochs="$epochs" close_mosaic=$((epochs / 3)) name=sgd \
    > "$OUT/overfit_sgd.log" 2>&1 &
  timeout 560 python tools/convergence.py --target mAP50-95=0.5 --json "$OUT/overfit_adamw.json" \
    "${common[@]}" epochs="$epochs" optimizer=adamw lr0=0.002 nbs=16 mosaic=0 scale=0.25 \
    name=adamw > "$OUT/overfit_adamw.log" 2>&1 &
  wait
else
  shapes=(data=shapes epochs=6 batch=32 workers=8 seed=0 val_interval=3 project=/tmp/runs plots=false)
  IFS=';' read -ra variants <<< "${variants:-eager bf16 default;compile bf16 default;eager fp16 default;compile bf16 reduce-overhead}"
  for variant in "${variants[@]}"; do
    set -- $variant
    name=$1-$2-$3
    SECONDS=0
    python tools/convergence.py --target mAP50=0.5 "${shapes[@]}" graph=$1 amp_dtype=$2 \
      compile_mode=$3 name=$name > "/tmp/shapes_$name.log" 2>&1
    echo "$name rc=$? seconds=$SECONDS" | tee -a "$OUT/checks.txt"
    grep -E "^epoch|declined|failed|Error" "/tmp/shapes_$name.log" >> "$OUT/checks.txt"
  done
  IFS=';' read -ra steps <<< "${steps-yolo-n 16 simota;yolo-n 16 hungarian;yolo-s 16,64 tal;yolo-m 16,64 tal}"
  for args in "${steps[@]}"; do
    set -- $args
    echo "== bench_step --model $1 --batch $2 --assigner $3" >> "$OUT/steps.txt"
    python tools/bench_step.py --model $1 --batch $2 --assigner $3 >> "$OUT/steps.txt" 2>&1
  done
fi
[[ $part == resume ]] || tar czf "$OUT/runs.tgz" --exclude='*.pt' -C /tmp runs /tmp/shapes_*.log 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt"
