#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .whl, .ab and .data carried
# (tools/device/ab_prepare.sh): commits of the project side by side in one call. Each side
# (.ab/a, .ab/b, ...) is installed into its own /tmp/site-<side>; the jobs of ab_jobs run one at
# a time, in order, each with its side's wheels and its side's tools/ (so a job A B A B
# interleaves the sides). Jobs joined by "," run at the same time (each its own process on the
# one GPU: for jobs that time nothing, e.g. "check:a,check:b"), the next entry after all end.
#   ab_jobs="update:a update:b step:a step:b step:a step:b check:b"
# Jobs:
#   update  tools/bench_update.py: the whole step's update, whole and part by part (ab_amp)
#   step    tools/bench_train.py --measures step at step_batches (16): ab_step_arms (fp16 and bf16
#           whole-step by default); step_args adds arguments (e.g. --no-gpu-profile)
#   warm    untimed, the step job's arms once each, all at a time: Inductor's caches on the
#           machine then hold the compiled (fuse=) arms, which later step jobs load in seconds
#   check   tools/check_graphs.py --strict in ab_check_amp (ab_amp by default), 24 steps, no
#           fused arm unless ab_check_args says (e.g. "--fuse fp16 --fuse-mode inductor-loss
#           --fused-keys bn_silu=triton"); its rc is 1 when the check's verdict is FAIL (a
#           check_graphs.py that counts updates), and its verdict lines close the output
#   e2e     tools/bench_train.py --measures e2e, COCO128 x4, epochs 2-N of e2e_epochs (4),
#           e2e_batches (16), ab_e2e_arms (fp16 whole-step by default); e2e_args adds arguments
#           (e.g. --trace-last-epoch: the kernels of the last epoch against the step's)
#   overfit tools/bench_train.py --measures overfit (COCO128, train = val, overfit_epochs 30),
#           overfit_arms (e.g. seeds: "$ws:seed=0,$ws:seed=1"); overfit_gpus (0) runs arms
#           side by side, e.g. "0,0,0" three at a time on the one GPU (nothing is timed)
#   syncs   tools/find_syncs.py: each host sync of a step with the line that asked, for
#           syncs_model (yolo-n) at syncs_imgsz (640), syncs_batches (16), syncs_amp (bf16),
#           syncs_graphs (eager)
#   data    tools/bench_data.py --gpu: cache=gpu's fill and loader rate against cache=ram with
#           8 workers, at data_batches (16,64); data_args adds arguments (e.g.
#           --render-configs 512x4,1024x8: the render kernel alone by launch shape)
#   checkpoint  tools/bench_checkpoint.py, fp16 whole-step at batch 16 (a side that has it)
#   ddp     tools/bench_ddp.py: end to end at world size 1 and ddp_gpus, ddp_batches per GPU,
#           ddp_arms (graph=auto and graph=eager by default); ddp_args adds --kill, --overfit-epochs
#   autobatch  tools/bench_autobatch.py: batch=-1 and batch=0.5, graph=auto and eager, 2
#           epochs of COCO128 x4 each: the batch chosen, the probe's seconds, the run's peak
#   startup tools/bench_startup.py: a short run's wall time from spawn to exit, COCO128, 3
#           epochs, batch 16, ab_startup_arms (fp16 whole-step and eager by default),
#           startup_repeats runs of each (1); startup_profile=1 adds cProfile's profiles
#           and startup_fill=1 the cache=gpu fill's parts, synchronized (both slow the
#           points measured)
#   firstuse  tools/bench_first_use.py: the GPU's first use in a fresh process, part by part
#           (context, cuDNN's and cuBLAS's libraries, the start-up's copy), in firstuse_modes
#           (serial,cold,beside,driver), firstuse_repeats processes each (3)
#   profile falconet train ... profile=true profile_then_stop=true (falconet-profiler): 40
#           batches of yolo-n on COCO128 with profile_keys (cache=gpu batch=16); the report in
#           the log, profile.json as the result
#   fp8sweep  tools/fp8_crossover.py (with_te=1): FP8 against bf16, one product at a time,
#           by rows and width; fp8sweep_args adds arguments (e.g. --recipes current)
#   tests   pytest on tests_paths (the working tree's, with the side's packages): the GPU-only
#           tests that skip on the CPU, e.g. tests_paths=plugins/precision-te-fp8/tests
# A job may name a set of settings, name@set:side (e.g. "step@detr:b"): each setting the job
# reads (ab_step_arms, step_batches, step_args, ab_e2e_arms, e2e_batches, e2e_epochs,
# overfit_arms, overfit_epochs, overfit_gpus, startup_repeats, startup_profile, startup_fill) is
# then taken from <setting>_<set> where that is set, so one call measures different models side
# by side, or profiles one start-up among unprofiled ones ("startup@diag:a", startup_fill_diag=1).
# With with_te=1, Transformer Engine (.te, carried: tools/device/te_bundle.sh) is installed
# beside every side's packages first (tools/device/te_install.sh), for amp_dtype=fp8 arms.
# Writes /tmp/results/<n>-<job>[@set]-<side>.json and /tmp/logs, both in $OUT/results.tgz
# (a call brings back at most 8 files), written again after each entry of ab_jobs.
set -uo pipefail
export MPLCONFIGDIR=/tmp/mpl PYTHONUNBUFFERED=1
# bytecode written once and reused by the call's later processes, as an installation's .pyc
# files are (the machine's torch has none, and compiling its modules took 3-4 s a process)
export PYTHONPYCACHEPREFIX=/tmp/pycache
# the machine sets PYTHONDONTWRITEBYTECODE=1, which also stops the prefix's cache: every process
# then compiled the modules it imported (about 4 s of torch's in a start-up measurement)
unset PYTHONDONTWRITEBYTECODE
root=$PWD
base_path=$PATH
data=$root/.data/coco128
rm -rf /tmp/logs /tmp/results && mkdir -p /tmp/logs /tmp/results
for dir in .ab/*/; do
  side=$(basename "$dir")
  rm -rf "/tmp/site-$side"
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "/tmp/site-$side" .whl/*.whl ".ab/$side"/whl/*.whl || exit 1
  echo "side $side: commit $(cat ".ab/$side/commit")"
done
if [[ ${with_te:-0} == 1 ]]; then
  bash tools/device/te_install.sh /tmp/site-* || exit 1
fi
ws=falconet:graph=whole-step
amp=${ab_amp:-fp16,bf16}
job() {  # n name[@set] side: one job, in its side's tools/ with its side's packages
  local n=$1 name=${2%@*} set= side=$3
  [[ $2 == *@* ]] && set=${2#*@}
  local out="/tmp/results/$n-$2-$side.json" log="/tmp/logs/$n-$2-$side" start=$SECONDS
  local ab_step_arms=${ab_step_arms:-} step_batches=${step_batches:-} step_args=${step_args:-}
  local ab_e2e_arms=${ab_e2e_arms:-} e2e_batches=${e2e_batches:-} overfit_arms=${overfit_arms:-}
  local overfit_epochs=${overfit_epochs:-} overfit_gpus=${overfit_gpus:-} setting named
  local e2e_epochs=${e2e_epochs:-4} startup_repeats=${startup_repeats:-1}
  local startup_profile=${startup_profile:-} startup_fill=${startup_fill:-}
  if [[ -n $set ]]; then
    for setting in ab_step_arms step_batches step_args ab_e2e_arms e2e_batches e2e_epochs \
      overfit_arms overfit_epochs overfit_gpus startup_repeats startup_profile startup_fill; do
      named=${setting}_$set
      [[ -n ${!named:-} ]] && printf -v "$setting" %s "${!named}"
    done
  fi
  local arms=${ab_step_arms:-$ws:amp_dtype=fp16,$ws:amp_dtype=bf16}
  export PYTHONPATH="/tmp/site-$side" PATH="/tmp/site-$side/bin:$base_path"
  export FALCONET_CACHE_DIR=/tmp/falconet-cache-$side  # sides may write their caches apart
  cd "$root/.ab/$side/tools" || exit 1
  case $name in
    update)
      timeout "${update_timeout:-150}" python bench_update.py --data "$data/coco128.yaml" \
        --batch 16 --amp "$amp" --out "$out" ;;
    step)
      timeout "${step_timeout:-150}" python bench_train.py --data "$data" --batch "${step_batches:-16}" \
        --arms "$arms" --repeats 1 ${step_args:-} \
        --measures step --gpus 0 --timeout "${step_timeout:-150}" --out "$out" ;;
    warm)
      # untimed: the step arms once, all at a time, so that the step jobs load compiled (fuse=)
      # arms from Inductor's caches on the machine instead of compiling each (~100 s an arm)
      IFS=, read -r -a each <<< "$arms"
      lanes=$(printf "0,%.0s" "${each[@]}")
      out=$log.json  # under results.tgz: a call brings back at most 8 files
      timeout "${warm_timeout:-240}" python bench_train.py --data "$data" --batch 16 \
        --arms "$arms" --repeats 1 --measures step --gpus "${lanes%,}" --warmup 40 --steps 1 \
        --timeout "${warm_timeout:-240}" --out "$out" ;;
    check)
      # shellcheck disable=SC2086  # ab_check_args: several arguments
      timeout "${check_timeout:-240}" python check_graphs.py --data "$data/coco128.yaml" \
        --amp "${ab_check_amp:-$amp}" --fuse "" --strict --steps 24 ${ab_check_args:-} \
        --out "$out" ;;
    e2e)
      # shellcheck disable=SC2086  # e2e_args: several arguments
      timeout "${e2e_timeout:-200}" python bench_train.py --data "$data" --amp fp16 \
        --batch "${e2e_batches:-16}" --arms "${ab_e2e_arms:-$ws:amp_dtype=fp16}" --repeats 1 \
        --epochs "$e2e_epochs" --repeat-data 4 ${e2e_args:-} \
        --measures e2e --gpus 0 --timeout "${e2e_timeout:-200}" --out "$out" ;;
    checkpoint)
      timeout "${checkpoint_timeout:-120}" python bench_checkpoint.py \
        --data "$data/coco128.yaml" --amp fp16 --batch 16 --graph whole-step --out "$out" ;;
    startup)
      timeout "${startup_timeout:-300}" python bench_startup.py --data "$data/coco128.yaml" \
        --arms "${ab_startup_arms:-graph=whole-step:amp_dtype=fp16,graph=eager:amp_dtype=fp16}" \
        --epochs 3 --batch 16 --repeats "${startup_repeats:-1}" \
        --timeout "${startup_timeout:-300}" ${startup_profile:+--profile} \
        ${startup_fill:+--fill-breakdown} --out "$out" ;;
    firstuse)
      timeout "${firstuse_timeout:-300}" python bench_first_use.py --data "$data/coco128.yaml" \
        --modes "${firstuse_modes:-serial,cold,beside,driver}" \
        --repeats "${firstuse_repeats:-3}" --out "$out" ;;
    profile)
      # shellcheck disable=SC2086  # profile_keys: several keys
      timeout "${profile_timeout:-200}" falconet train model=yolo-n data="$data/coco128.yaml" \
        epochs=30 imgsz=640 val=false plots=false profile=true profile_then_stop=true \
        profile_steps=40 project=/tmp/profile-$n ${profile_keys:-cache=gpu batch=16} \
        && cat /tmp/profile-"$n"/*/profile.json > "$out" ;;
    ddp)
      # tools/bench_ddp.py: end to end at world size 1 and ddp_gpus (when the machine has them)
      timeout "${ddp_timeout:-560}" python bench_ddp.py --data "$data" \
        --gpus "${ddp_gpus:-2}" --batches "${ddp_batches:-16,64}" \
        --arms "${ddp_arms:-graph=auto,graph=eager}" --epochs "${ddp_epochs:-5}" \
        ${ddp_args:-} --out "$out" ;;
    overfit)
      timeout "${overfit_timeout:-500}" python bench_train.py --data "$data" --amp fp16 \
        --arms "${overfit_arms:-$ws:amp_dtype=fp16}" --repeats 1 --measures overfit \
        --overfit-epochs "${overfit_epochs:-30}" --gpus "${overfit_gpus:-0}" --timeout "${overfit_timeout:-500}" \
        --out "$out" ;;
    fp8sweep)
      # shellcheck disable=SC2086  # fp8sweep_args: several arguments
      timeout "${fp8sweep_timeout:-300}" python fp8_crossover.py ${fp8sweep_args:-} --out "$out" ;;
    tests)
      # shellcheck disable=SC2086  # tests_paths: several paths
      (cd "$root" && timeout "${tests_timeout:-200}" python -m pytest -q -p no:cacheprovider \
        -o addopts="--import-mode=importlib" ${tests_paths:-plugins} -rs) ;;
    syncs)
      timeout "${syncs_timeout:-200}" python find_syncs.py --data "$data/coco128.yaml" \
        --model "${syncs_model:-yolo-n}" --imgsz "${syncs_imgsz:-640}" \
        --batch "${syncs_batches:-16}" --amp "${syncs_amp:-bf16}" \
        --graph "${syncs_graphs:-eager}" --repeats 5 --out "$out" ;;
    data)
      # shellcheck disable=SC2086  # data_args: several arguments
      timeout "${data_timeout:-200}" python bench_data.py "$data/coco128.yaml" --gpu \
        --gpu-batches "${data_batches:-16,64}" --no-cpu-table ${data_args:-} --out "$out" ;;
    autobatch)
      timeout "${autobatch_timeout:-400}" python bench_autobatch.py --data "$data" \
        --arms "${autobatch_arms:-batch=-1;batch=0.5}" --graphs "${autobatch_graphs:-auto,eager}" \
        --epochs 2 --out "$out" ;;
    *) echo "unknown job $name" >&2 ;;
  esac > "$log.out" 2> "$log.err"
  echo "$n $2 $side: rc $? in $((SECONDS - start)) s"
  cd "$root" || exit 1
}
n=0
for entry in ${ab_jobs:-update:a update:b step:a step:b step:a step:b}; do
  IFS=, read -r -a group <<< "$entry"
  for one in "${group[@]}"; do
    n=$((n + 1))
    if (( ${#group[@]} > 1 )); then
      job "$n" "${one%%:*}" "${one##*:}" &
    else
      job "$n" "${one%%:*}" "${one##*:}"
    fi
  done
  wait
  # after each entry, so that a call stopped at its time limit still brings back what ran
  tar czf "$OUT/results.tgz" -C /tmp results logs
done
for f in /tmp/logs/*.out; do
  echo "== $f"
  case $f in
    *-check-*) grep -E "^(fp32|fp16|bf16|verdict)" "$f" || tail -n 12 "$f" ;;  # the verdict
    *) tail -n 12 "$f" ;;
  esac
done
# the step jobs' times, one line per job and arm
for f in /tmp/results/*-step*.json; do
  [[ -e $f ]] && python3 -c 'import json, sys; f = sys.argv[1]
for r in json.load(open(f))["results"]:
    print(f.rsplit("/", 1)[-1], r["arm"], r.get("graph"), "step_ms", r.get("step_ms"))' "$f"
done
grep -h "captured\|could not\|declined\|Error" /tmp/logs/*.err | sort | uniq -c | head -20
tar czf "$OUT/results.tgz" -C /tmp results logs
