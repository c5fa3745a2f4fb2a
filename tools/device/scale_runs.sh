#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .whl and .data carried (docs/development.md):
# the data tiers at COCO's scale and beyond (docs/data.md, "Where the training images live").
# The generated sets live in /tmp/scale, so the parts after the first need the same warm machine.
#   part=a  the 118k-image set (tools/make_scale_set.py from COCO128), its dataset check, and the
#           loader alone per tier (tools/bench_data.py --tiers)
#   part=b  on the 118k set: the GPU tests of the decoding loader first, then per batch the
#           isolated step, end to end with cache=encoded, and Ultralytics on its first
#           ${ultra:-8000} images (tools/bench_scale.py; ultra=0 leaves it out); caches_B and
#           span_B give batch B arms and a span of its own (caches_64=encoded,encoded:cpu_decode=0;
#           an empty caches_B with nostep=1 runs Ultralytics alone)
#   part=c  the overfit check, cache=encoded against cache=gpu, seeds a side (bench_train.py)
#   part=d  ${big:-300000} images (the 118k set and more beside it), cache=encoded and stream
#           end to end at batch 64, then stream again with the page cache dropped
#   part=e  where a batch's time goes at batch 64 (${images:-20000} images): the isolated step
#           and cache=encoded end to end with a torch.profiler trace of 8 steps after the span,
#           py-spy's samples of the threads holding the GIL and of every thread (raw, collapsed
#           stacks), and the loader alone per tier (bench_data.py --tiers, CPU by thread)
set -uo pipefail
[[ -d /tmp/site ]] || source tools/device/install.sh
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl PYTHONUNBUFFERED=1
scale=/tmp/scale
part=${part:-a}
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  df -h / /tmp; free -g; nproc
  python3 -c "import sys, torch, torchvision; print(sys.version, torch.__version__, torchvision.__version__)"
} > "$OUT/machine-$part.txt" 2>&1
if [[ $part == e ]]; then
  SECONDS=0
  python tools/make_scale_set.py --source .data/coco128/coco128.yaml --images ${images:-20000} \
    --val 200 --out $scale/diag > "$OUT/e-generate.log" 2>&1
  falconet data check $scale/diag/data.yaml > /tmp/e-check.log 2>&1
  echo "generate and check rc=$? seconds=$SECONDS" | tee -a "$OUT/e-generate.log"
  data=$scale/diag/data.yaml
  # spans within the set's one epoch (20k images: 312 batches of 64)
  python tools/bench_scale.py --data $data --caches encoded --batch 64 --span 100,180 \
    --trace 8 --trace-to "$OUT/e-trace-{cache}-{batch}.json.gz" --out "$OUT/e-scale.json" 2>&1 \
    | tee "$OUT/e-scale.log" | grep -v '^{'
  for mode in gil idle; do
    flags=(--gil); [[ $mode == idle ]] && flags=(--idle)
    timeout 240 py-spy record "${flags[@]}" --threads --subprocesses --nonblocking -r 200 -f raw \
      -o "$OUT/e-pyspy-$mode.txt" -- python tools/bench_scale.py --data $data --caches encoded \
      --batch 64 --span 100,180 --no-step --out "$OUT/e-scale-pyspy-$mode.json" \
      > "$OUT/e-pyspy-$mode.log" 2>&1
    echo "py-spy $mode rc=$?" | tee -a "$OUT/e-pyspy-$mode.log"
  done
  python tools/bench_data.py $data --tiers --tier-images 20000 --gpu-batches 16,64 --epochs 3 \
    --no-cpu-table --out "$OUT/e-loader-tiers.json" > "$OUT/e-loader-tiers.log" 2>&1
  echo "loader rc=$?" | tee -a "$OUT/e-loader-tiers.log"
fi
if [[ $part == a || ($part != e && ! -f $scale/coco118k/data.yaml) ]]; then  # the set first
  SECONDS=0
  python tools/make_scale_set.py --source .data/coco128/coco128.yaml --images 118287 --val 500 \
    --out $scale/coco118k > "$OUT/a-generate.log" 2>&1
  echo "generate rc=$? seconds=$SECONDS" | tee -a "$OUT/a-generate.log"
  SECONDS=0
  falconet data check $scale/coco118k/data.yaml > /tmp/a-check.log 2>&1
  echo "check rc=$? seconds=$SECONDS" | tee -a "$OUT/a-generate.log"
  tail -5 /tmp/a-check.log >> "$OUT/a-generate.log"
fi
if [[ $part == a ]]; then
  SECONDS=0
  python tools/bench_data.py $scale/coco118k/data.yaml --tiers --tier-images 20000 \
    --gpu-batches 16,64 --epochs 3 --png-images 2000 --no-cpu-table \
    --out "$OUT/a-loader-tiers.json" > "$OUT/a-loader-tiers.log" 2>&1
  echo "loader rc=$? seconds=$SECONDS" | tee -a "$OUT/a-loader-tiers.log"
elif [[ $part == b ]]; then
  timeout 120 python -m pytest -q -p no:cacheprovider packages/core/tests/test_gpu_decode.py \
    ${gpu_tests:-packages/core/tests/test_gpu_data.py} > "$OUT/b-gpu-tests.log" 2>&1
  echo "gpu tests rc=$?" | tee -a "$OUT/b-gpu-tests.log"; tail -3 "$OUT/b-gpu-tests.log"
  for b in ${batches:-16 64}; do  # caches_64=..., span_64=... set one batch's own
    cs=caches_$b; cs=${!cs:-${caches:-encoded}}; sp=span_$b; sp=${!sp:-${span:-300,1500}}
    python tools/bench_scale.py --data $scale/coco118k/data.yaml --caches $cs --batch $b \
      --span $sp --ultralytics-images ${ultra:-8000} ${nostep:+--no-step} \
      --out "$OUT/b-scale-118k-b$b.json" 2>&1 \
      | tee "$OUT/b-scale-118k-b$b.log" | grep -v '^{'
  done
elif [[ $part == c ]]; then
  arms=""
  for seed in ${seeds:-0 1 2}; do
    arms+="falconet:cache=gpu:seed=$seed,falconet:cache=encoded:seed=$seed,"
  done
  python tools/bench_train.py --data .data/coco128 --arms "${arms%,}" --measures overfit \
    --overfit-epochs ${epochs:-150} --overfit-batch 16 --repeats 1 --gpus 0,0,0 \
    --out "$OUT/c-overfit.json" > "$OUT/c-overfit.log" 2>&1
  tail -20 "$OUT/c-overfit.log"
elif [[ $part == d ]]; then
  big=${big:-300000}
  SECONDS=0
  python tools/make_scale_set.py --source .data/coco128/coco128.yaml --images $((big - 118287)) \
    --val 500 --seed 1 --out $scale/more > "$OUT/d-generate.log" 2>&1
  python3 -c "import yaml, sys; c = yaml.safe_load(open('$scale/coco118k/data.yaml'));
c.update(path='$scale', train=['coco118k/images/train', 'more/images/train'],
         val='coco118k/images/val'); open('$scale/big.yaml', 'w').write(yaml.safe_dump(c))"
  echo "generate rc=$? seconds=$SECONDS" | tee -a "$OUT/d-generate.log"
  df -h / >> "$OUT/d-generate.log"
  SECONDS=0
  falconet data check $scale/big.yaml > /tmp/d-check.log 2>&1
  echo "check rc=$? seconds=$SECONDS" | tee -a "$OUT/d-generate.log"
  python tools/bench_scale.py --data $scale/big.yaml --caches encoded,stream --batch 64 \
    --span ${span:-300,1500} --out "$OUT/d-scale-big.json" 2>&1 | tee "$OUT/d-scale-big.log" \
    | grep -v '^{'
  sync && echo 3 > /proc/sys/vm/drop_caches
  python tools/bench_scale.py --data $scale/big.yaml --caches stream --batch 64 --no-step \
    --span ${span:-300,1500} --out "$OUT/d-scale-big-cold.json" 2>&1 \
    | tee "$OUT/d-scale-big-cold.log" | grep -v '^{'
fi
# at most 8 files come back from a call: the logs and results in one archive beside the traces
cd "$OUT" && tar czf "results-$part.tgz" --exclude='*.tgz' --exclude='*trace*' -- * \
  && find . -maxdepth 1 -type f ! -name '*.tgz' ! -name '*trace*' -delete
