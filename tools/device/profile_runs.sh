#!/usr/bin/env bash
# On the GPU machine, from the repository root, with .whl and .data carried (see
# docs/development.md): the profiler's "Measure" for docs/profiling.md (issue #9). Profiles
# yolo-n on COCO128 (imgsz 640, cache=ram, 8 workers, bf16) at each batch size with each graph
# backend, one `falconet profile run` per pair, and writes under $OUT:
#   index.txt          per pair: exit status, seconds, and the verdict report
#   <graph>-b<N>.txt   the report (`falconet profile run` stdout); .log: its stderr
#   profiles.tgz       every profile.json, profile_summary.json, timeline.html and trial log
#   traces.tgz         the Chrome traces of the pairs in $traces (they are tens of MB each)
# Knobs (environment): graphs (default: eager, compile and cuda-graph where installed; an
# entry may carry training keys after colons: compile:compile_mode=reduce-overhead), batches (default "4 16 64"), repeat (trials per pair, default 1), traces (default
# "eager-b4 eager-b64"), pair_timeout (seconds per pair, default 420).
set -uo pipefail
source tools/device/install.sh
export FALCONET_CACHE_DIR=/tmp/falconet-cache MPLCONFIGDIR=/tmp/mpl
batches=${batches:-4 16 64}
repeat=${repeat:-1}
traces=${traces:-eager-b4 eager-b64}
if [[ -z ${graphs:-} ]]; then
  graphs=$(python3 -c "
from falconet.plugins import get_plugins
names = get_plugins().graph_backends.names()
print(' '.join(g for g in ('eager', 'compile', 'cuda-graph') if g in names))")
fi
data=.data/coco128/coco128.yaml
common=(imgsz=640 cache=ram workers=8 amp_dtype=bf16 deterministic=false)
for entry in $graphs; do
  IFS=: read -r -a parts <<< "$entry"
  graph=${parts[0]} extra=("${parts[@]:1}")
  for batch in $batches; do
    name=${entry//[:=]/-}-b$batch
    SECONDS=0
    timeout "${pair_timeout:-420}" falconet profile run "$data" --model yolo-n "${common[@]}" \
      batch="$batch" graph="$graph" "${extra[@]}" project=/tmp/profiles name="$name" \
      --repeat "$repeat" \
      > "$OUT/$name.txt" 2> "$OUT/$name.log"
    status=$?
    echo "== $name rc=$status seconds=$SECONDS" | tee -a "$OUT/index.txt"
    cat "$OUT/$name.txt" >> "$OUT/index.txt"
  done
done
tar czf "$OUT/profiles.tgz" --exclude='profile_trace.json' --exclude='*.pt' -C /tmp profiles
kept=()
for name in $traces; do
  [[ -f /tmp/profiles/$name/trial1/profile_trace.json ]] && kept+=("profiles/$name/trial1/profile_trace.json")
done
(( ${#kept[@]} )) && tar czf "$OUT/traces.tgz" -C /tmp "${kept[@]}"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  nproc; } > "$OUT/gpu.txt" 2>&1
