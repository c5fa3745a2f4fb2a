#!/usr/bin/env bash
# Issue 28's "behaviour unchanged" A/B, in one GPU call: side a is commit 9f7be47 (before the
# step seam) run with this tree's tools/check_graphs.py, side b this working tree (after).
# Here, once the rewrite is done:
#   bash tools/device/ab_prepare.sh 9f7be47+tools/check_graphs.py .
# then one `run` (kind nvidia-h200, carry .whl .ab .data, timeout_s 600):
#   bash tools/device/seam_ab.sh
# Jobs (tools/device/ab_runs.sh), in order:
#   check:a,check:b,warm:a,warm:b   at once (nothing of them is timed): tools/check_graphs.py
#                     --strict, fp32, fp16 and bf16, 24 batches (6 updates, fp16's scaler
#                     started at 2^8, update 2 forced to overflow), each side comparing its arms
#                     in its own process; and each side's step arms run once, so that the fused
#                     arm's compiled kernels are in Inductor's caches for the step jobs
#   step:a step:b step:a step:b   the isolated step (tools/bench_train.py --measures step,
#                     batch 16) of the default arm (graph=auto, bf16: whole-step) and the
#                     fastest opt-in arm (fp16 whole-step, fuse=inductor-loss, bn_silu=triton)
# What to compare: the check's verdict lines of a and b (the same lines: updates per arm and
# precision, bit for bit where it was) and the step_ms lines (a against b, within the spread
# of a against a). Knobs: seam_jobs replaces the job list (e.g. "check:a,warm:a step:a" for side
# a alone); the ab_runs.sh knobs (check_timeout, step_timeout, ab_check_args ...) pass through.
# Writes $OUT/<n>-<job>-<side>.json and $OUT/logs.tgz.
set -uo pipefail
cd "$(dirname "$0")/../.."
export ab_jobs=${seam_jobs:-check:a,check:b,warm:a,warm:b step:a step:b step:a step:b}
export ab_check_amp=${ab_check_amp:-fp32,fp16,bf16}
export ab_step_arms=${ab_step_arms:-falconet:graph=auto:amp_dtype=bf16,falconet:graph=whole-step:amp_dtype=fp16:fuse=inductor-loss:bn_silu=triton}
export check_timeout=${check_timeout:-300}
export warm_timeout=${warm_timeout:-300}  # the fused arm's compilation, about 100 s, and more
export step_timeout=${step_timeout:-150}  # the step jobs load it from Inductor's caches
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
exec bash tools/device/ab_runs.sh
