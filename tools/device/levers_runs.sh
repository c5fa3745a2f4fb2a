#!/usr/bin/env bash
# On the GPU machine (kind nvidia-h200-x2), from the repository root, with .whl and .data
# carried: the speed levers side by side, with their numerics and accuracy checks, in one call
# of < 10 min (docs/performance.md says what each lever does; docs/lab/ records the runs). Two lanes, each a list of jobs run in order (knobs
# lane0 and lane1) on its own GPU (knob gpus, "0 1"; "0 0" on a one-GPU machine, where only
# jobs that time nothing should share it); each job has a time limit, so a call ends in time.
# inductor_env (e.g. TORCHINDUCTOR_EMULATE_PRECISION_CASTS=1) is exported to every job.
# precompile=1 runs a step job's arms once first, all at a time on its GPU and untimed, so that
# compiled (fuse=) arms load from Inductor's caches in the timed run: a fused arm then takes
# seconds to start instead of about 100 s each.
# Jobs:
#   check      tools/check_graphs.py: eager vs cuda-graph vs whole-step from the same state in
#              check_amp, torch's deterministic algorithms, check_steps steps; the fused arms
#              (in check_fuse's precisions) with fuse_mode and fused_keys (e.g. bn_silu=triton)
#              and check_env's settings (e.g. FALCONET_BN_SILU_MAP_WARPS=8) in its process
#   bn         tools/bench_batchnorm.py: BatchNorm's kernels, native bf16 vs cuDNN fp16
#   bn-silu    tools/bench_bn_silu.py: BatchNorm + SiLU, PyTorch's kernels vs the fused Triton
#              op (bn_silu=triton), fp16 and bf16, batch 16 and 64: time and error vs float64
#              (or bn_silu_args, e.g. "--batch 16 --sweep": the op's time under other tilings)
#   bn-silu-tiled  after a batch-16 sweep: the fp16 step at batch 16 (fuse=inductor-loss,
#              bn_silu=triton) with the default tiling and with the sweep's best
#   step-b16   isolated step (tools/bench_train.py --measures step), bf16, batch 16, arms16
#   step-b64   the same at batch 64, arms64
#   step-fp16  the same in fp16 at batch 16, arms_fp16
#   step-b4    the same at batch 4, arms4 (bf16 and fp16 whole-step)
#   e2e        end to end (tools/bench_train.py --measures e2e: COCO128 x4, epochs 2-4 of 4,
#              8 workers), bf16, batch e2e_batch (16, or a list: 4,16,64), e2e_arms
#   assigner   tools/bench_assigner.py: the TAL assigner per slot against per box (the
#              batch's real boxes), batch 16 and 64 (bit-for-bit check and replayed time)
#   update     tools/bench_update.py: the whole step's update (clip, SGD, scaler, EMA), whole and
#              part by part, fp16 and bf16, batch 16
#   profile    falconet profile run (COCO128, 640 px, cache=ram, 8 workers) with profile_keys
#              (fp16 fused whole-step at batch 16 by default), then `profile kernels` by kind
#              and the top 30 (profile.txt, profile-kernels.txt, profile.json)
#   overfit    the accuracy check (COCO128, train = val, overfit_epochs epochs, batch 16,
#              overfit_amp, bf16 by default) of each of overfit_arms (comma-separated, each
#              with its seed; an arm's amp_dtype key wins), on overfit_gpus (one per arm run
#              at once, e.g. 0,0,0)
# Writes $OUT/<job>.json and $OUT/logs.tgz.
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl PYTHONUNBUFFERED=1
rm -rf /tmp/logs && mkdir -p /tmp/logs  # a warm machine keeps the last call's
[[ -n "${inductor_env:-}" ]] && export "${inductor_env?}"
read -r gpu_a gpu_b <<< "${gpus:-0 1}"
python -c "import torch, torch._inductor.config as c; print('torch', torch.__version__,
  'emulate_precision_casts', c.emulate_precision_casts, 'on_saved_tensors',
  getattr(c, 'emulate_precision_casts_on_saved_tensors', 'absent'))" > /tmp/logs/inductor.out
ws=falconet:graph=whole-step
step() {  # job, gpu, amp, batch, arms, seconds
  if [[ -n "${precompile:-}" ]]; then  # every arm once, all at a time, untimed: Inductor's
    # caches then hold each compiled arm, which the timed run below loads in seconds
    IFS=, read -r -a each <<< "$5"
    lanes=$(printf "$2,%.0s" "${each[@]}")
    timeout "$6" python tools/bench_train.py --data .data/coco128 --arms "$5" --amp "$3" \
      --batch "$4" --repeats 1 --measures step --gpus "${lanes%,}" --timeout "$6" --warmup 40 \
      --steps 1 --out "/tmp/logs/$1-precompile.json" > "/tmp/logs/$1-precompile.out" 2>&1
  fi
  timeout "$6" python tools/bench_train.py --data .data/coco128 --arms "$5" --amp "$3" \
    --batch "$4" --repeats 1 --measures step --gpus "$2" --timeout "$6" \
    --out "$OUT/$1.json" > "/tmp/logs/$1-gpu$2.out" 2> "/tmp/logs/$1-gpu$2.err"
}
job() {  # name, gpu
  case $1 in
    check)
      # shellcheck disable=SC2086  # check_env: settings for this job only, word-split
      CUDA_VISIBLE_DEVICES=$2 timeout "${check_timeout:-280}" env ${check_env:-} python tools/check_graphs.py \
        --data .data/coco128/coco128.yaml --amp "${check_amp:-fp32,fp16,bf16}" \
        --fuse "${check_fuse-bf16}" --fuse-mode "${fuse_mode:-inductor-all}" --strict \
        --fused-keys ${fused_keys:-} \
        --steps "${check_steps:-24}" --out "$OUT/check.json" > /tmp/logs/check-gpu$2.out 2> /tmp/logs/check-gpu$2.err ;;
    bn)
      CUDA_VISIBLE_DEVICES=$2 timeout 60 python tools/bench_batchnorm.py --batch 16,64 \
        --out "$OUT/bn.json" > /tmp/logs/bn-gpu$2.out 2> /tmp/logs/bn-gpu$2.err ;;
    bn-silu)
      read -r -a extra <<< "${bn_silu_args:---batch 16,64 --dtypes fp16,bf16}"
      (cd tools && CUDA_VISIBLE_DEVICES=$2 timeout "${bn_silu_timeout:-150}" python \
        bench_bn_silu.py "${extra[@]}" --out "$OUT/bn-silu.json") \
        > /tmp/logs/bn-silu-gpu$2.out 2> /tmp/logs/bn-silu-gpu$2.err ;;
    bn-silu-tiled)  # after `bn-silu` with bn_silu_args="--batch 16 --sweep": the step at
      # batch 16 in fp16 with the default tiling and with the sweep's best, side by side
      best=$(python -c "import json, sys; b = json.load(open(sys.argv[1]))['sweep']['16'][0]['best']
print(':'.join(f'FALCONET_BN_SILU_{k.upper()}={v}' for k, v in b.items()))" "$OUT/bn-silu.json")
      arm="$ws:fuse=inductor-loss:bn_silu=triton"
      step "$1" "$2" fp16 16 "$arm,$arm:$best" "${tiled_timeout:-200}" ;;
    step-b16)
      step "$1" "$2" bf16 16 "${arms16:-$ws,$ws:fuse=inductor,$ws:fuse=inductor-loss,$ws:fuse=inductor-all}" "${b16_timeout:-400}" ;;
    step-b64)
      step "$1" "$2" bf16 64 "${arms64:-$ws:fuse=inductor-all}" "${b64_timeout:-200}" ;;
    step-fp16)
      step "$1" "$2" fp16 16 "${arms_fp16:-falconet:graph=eager,$ws}" "${fp16_timeout:-120}" ;;
    step-b4)
      step "$1" "$2" bf16 4 "${arms4:-$ws,$ws:amp_dtype=fp16}" "${b4_timeout:-150}" ;;
    e2e)
      timeout "${e2e_timeout:-500}" python tools/bench_train.py --data .data/coco128 --amp bf16 \
        --batch "${e2e_batch:-16}" --arms "${e2e_arms:-$ws,$ws:fuse=inductor-all}" --repeats 1 --epochs 4 \
        --repeat-data 4 --measures e2e --gpus "$2" --timeout "${e2e_timeout:-500}" \
        --out "$OUT/e2e.json" > /tmp/logs/e2e-gpu$2.out 2> /tmp/logs/e2e-gpu$2.err ;;
    assigner)
      (cd tools && CUDA_VISIBLE_DEVICES=$2 timeout 240 python bench_assigner.py \
        --data ../.data/coco128/coco128.yaml --batch 16,64 --out "$OUT/assigner.json") \
        > /tmp/logs/assigner-gpu$2.out 2> /tmp/logs/assigner-gpu$2.err ;;
    update)
      (cd tools && CUDA_VISIBLE_DEVICES=$2 timeout 180 python bench_update.py --batch 16 \
        --amp fp16,bf16 --out "$OUT/update.json") > /tmp/logs/update-gpu$2.out 2> /tmp/logs/update-gpu$2.err ;;
    profile)
      read -r -a keys <<< "${profile_keys:-graph=whole-step amp_dtype=fp16 fuse=inductor-all batch=16 profile_warmup=40 profile_steps=40}"
      CUDA_VISIBLE_DEVICES=$2 timeout "${profile_timeout:-240}" falconet profile run \
        .data/coco128/coco128.yaml --model yolo-n imgsz=640 cache=ram workers=8 \
        deterministic=false "${keys[@]}" project=/tmp/profiles name=levers \
        > "$OUT/profile.txt" 2> /tmp/logs/profile-gpu$2.err
      cp /tmp/profiles/levers/profile.json "$OUT/profile.json"
      { falconet profile kernels /tmp/profiles/levers/profile.json --by-what
        falconet profile kernels /tmp/profiles/levers/profile.json --top 30
      } > "$OUT/profile-kernels.txt" 2>> /tmp/logs/profile-gpu$2.err ;;
    overfit)
      timeout "${overfit_timeout:-480}" python tools/bench_train.py --data .data/coco128 \
        --arms "${overfit_arms:-$ws:fuse=inductor-all:seed=0}" --amp "${overfit_amp:-bf16}" \
        --measures overfit --overfit-epochs "${overfit_epochs:-300}" --overfit-batch 16 \
        --gpus "${overfit_gpus:-$2}" --timeout "${overfit_timeout:-480}" --out "$OUT/overfit.json" \
        > /tmp/logs/overfit-gpu$2.out 2> /tmp/logs/overfit-gpu$2.err ;;
    *) echo "unknown job $1" >&2 ;;
  esac
}
lane() {  # gpu, jobs
  for name in $2; do job "$name" "$1"; done
}
lane "$gpu_a" "${lane0-check bn step-b64}" &
lane "$gpu_b" "${lane1-step-b16 step-fp16}"
wait
for f in /tmp/logs/*.out; do echo "== $f"; tail -n 25 "$f"; done
grep -h "captured\|could not\|declined\|Error" /tmp/logs/*.err | sort | uniq -c | head -20
tar czf "$OUT/logs.tgz" -C /tmp logs
