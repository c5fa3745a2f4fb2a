#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .whl, .ab and .data carried
# (tools/device/ab_prepare.sh): commits of the project side by side in one call. Each side
# (.ab/a, .ab/b, ...) is installed into its own /tmp/site-<side>; the jobs of ab_jobs run one at
# a time, in order, each with its side's wheels and its side's tools/ (so a job A B A B
# interleaves the sides).
#   ab_jobs="update:a update:b step:a step:b step:a step:b check:b"
# Jobs:
#   update  tools/bench_update.py: the whole step's update, whole and part by part (ab_amp)
#   step    tools/bench_train.py --measures step at batch 16: ab_step_arms (fp16 and bf16
#           whole-step by default)
#   check   tools/check_graphs.py --strict in ab_amp, 24 steps, no fused arm
#   e2e     tools/bench_train.py --measures e2e, COCO128 x4, epochs 2-4 of 4, batch 16,
#           ab_e2e_arms (fp16 whole-step by default)
#   checkpoint  tools/bench_checkpoint.py, fp16 whole-step at batch 16 (a side that has it)
#   startup tools/bench_startup.py: a short run's wall time from spawn to exit, COCO128, 3
#           epochs, batch 16, ab_startup_arms (fp16 whole-step and eager by default)
# Writes $OUT/<n>-<job>-<side>.json and $OUT/logs.tgz.
set -uo pipefail
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl PYTHONUNBUFFERED=1
# bytecode written once and reused by the call's later processes, as an installation's .pyc
# files are (the machine's torch has none, and compiling its modules took 3-4 s a process)
export PYTHONPYCACHEPREFIX=/tmp/pycache
root=$PWD
base_path=$PATH
data=$root/.data/coco128
rm -rf /tmp/logs && mkdir -p /tmp/logs
for dir in .ab/*/; do
  side=$(basename "$dir")
  rm -rf "/tmp/site-$side"
  python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir \
    --target "/tmp/site-$side" .whl/*.whl ".ab/$side"/whl/*.whl || exit 1
  echo "side $side: commit $(cat ".ab/$side/commit")"
done
ws=falconet:graph=whole-step
amp=${ab_amp:-fp16,bf16}
n=0
for entry in ${ab_jobs:-update:a update:b step:a step:b step:a step:b}; do
  name=${entry%%:*} side=${entry##*:}
  n=$((n + 1))
  out="$OUT/$n-$name-$side.json" log="/tmp/logs/$n-$name-$side"
  export PYTHONPATH="/tmp/site-$side" PATH="/tmp/site-$side/bin:$base_path"
  cd "$root/.ab/$side/tools" || exit 1
  start=$SECONDS
  case $name in
    update)
      timeout "${update_timeout:-150}" python bench_update.py --data "$data/coco128.yaml" \
        --batch 16 --amp "$amp" --out "$out" ;;
    step)
      timeout "${step_timeout:-150}" python bench_train.py --data "$data" --batch 16 \
        --arms "${ab_step_arms:-$ws:amp_dtype=fp16,$ws:amp_dtype=bf16}" --repeats 1 \
        --measures step --gpus 0 --timeout "${step_timeout:-150}" --out "$out" ;;
    check)
      timeout "${check_timeout:-240}" python check_graphs.py --data "$data/coco128.yaml" \
        --amp "$amp" --fuse "" --strict --steps 24 --out "$out" ;;
    e2e)
      timeout "${e2e_timeout:-200}" python bench_train.py --data "$data" --amp fp16 --batch 16 \
        --arms "${ab_e2e_arms:-$ws:amp_dtype=fp16}" --repeats 1 --epochs 4 --repeat-data 4 \
        --measures e2e --gpus 0 --timeout "${e2e_timeout:-200}" --out "$out" ;;
    checkpoint)
      timeout "${checkpoint_timeout:-120}" python bench_checkpoint.py \
        --data "$data/coco128.yaml" --amp fp16 --batch 16 --graph whole-step --out "$out" ;;
    startup)
      timeout "${startup_timeout:-300}" python bench_startup.py --data "$data/coco128.yaml" \
        --arms "${ab_startup_arms:-graph=whole-step:amp_dtype=fp16,graph=eager:amp_dtype=fp16}" \
        --epochs 3 --batch 16 --timeout "${startup_timeout:-300}" --out "$out" ;;
    *) echo "unknown job $name" >&2 ;;
  esac > "$log.out" 2> "$log.err"
  echo "$n $name $side: rc $? in $((SECONDS - start)) s"
  cd "$root" || exit 1
done
for f in /tmp/logs/*.out; do echo "== $f"; tail -n 12 "$f"; done
grep -h "captured\|could not\|declined\|Error" /tmp/logs/*.err | sort | uniq -c | head -20
tar czf "$OUT/logs.tgz" -C /tmp logs
