#!/usr/bin/env bash
# Record the GPU scenario zoo (gpu_*.py) on a machine with a CUDA GPU, in one pass that fits a
# short lease: scenarios in order of priority, each under its own time limit, the whole pass
# under BUDGET_S seconds (a scenario that would not fit is skipped and named in the log).
# Recordings go to benchmarks/scenarios/recorded/gpu_*; with OUT set (the device tool), each pair
# of scenarios is also packed into $OUT/zoo_<k>.tar as soon as it is recorded, and the log is
# written to $OUT/record.log.
#   usage: OUT=/some/dir BUDGET_S=480 bash benchmarks/scenarios/record_gpu.sh [scenario ...]
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HERMES_QUIET_WAIT_S=${HERMES_QUIET_WAIT_S:-5}
PY=${PY:-python3}
BUDGET_S=${BUDGET_S:-480}
OUTDIR=${OUT:-}
LOG=${OUTDIR:+$OUTDIR/record.log}
LOG=${LOG:-/tmp/record_gpu.log}
# name:limit_s (expected cost, slowest last)
ALL="gpu_healthy_control:60 gpu_launch_bound:60 gpu_fp32_matmul:60 gpu_item_sync:60 gpu_explicit_sync:60
gpu_pageable_copy:60 gpu_launch_blocking:70 gpu_loader_transform:80 gpu_allocator_churn:90
gpu_sdpa_mask:60 gpu_sdpa_math:60 gpu_embedding_dense:60 gpu_optimizer_foreach:60 gpu_conv_nchw:60
gpu_cudnn_multiscale:80 gpu_fp64_logits:70 gpu_cudnn_benchmark:60 gpu_unfused_elementwise:150"
WANT="$*"
$PY -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA GPU: the GPU zoo is recorded on a GPU only")' || exit 2
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())'; nproc; } 2>&1 | tee -a "$LOG"
t0=$(date +%s); k=0; n=0
for entry in $ALL; do
  s=${entry%%:*}; lim=${entry##*:}
  if [ -n "$WANT" ] && ! [[ " $WANT " == *" $s "* ]]; then continue; fi
  used=$(( $(date +%s) - t0 ))
  left=$(( BUDGET_S - used )); (( lim > left )) && lim=$left
  if (( lim < 25 )); then echo "SKIP $s: ${used}s of ${BUDGET_S}s used" | tee -a "$LOG"; continue; fi
  echo "=== $s (limit ${lim}s, ${used}s used)" | tee -a "$LOG"
  timeout --kill-after=5 "$lim" $PY "benchmarks/scenarios/$s.py" >>"$LOG" 2>&1
  rc=$?
  echo "=== $s rc=$rc after $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
  tail -n 4 "$LOG"
  if [ -n "$OUTDIR" ] && [ -d "benchmarks/scenarios/recorded/$s" ]; then
    # pairs of scenarios per archive (the device tool returns at most 8 files)
    n=$((n + 1)); k=$(( (n + 1) / 2 ))
    if (( n % 2 == 1 )); then group=("$s"); else group+=("$s"); fi
    (cd benchmarks/scenarios/recorded && tar cf "$OUTDIR/zoo_$k.tar" "${group[@]}")
  fi
done
echo "done in $(( $(date +%s) - t0 ))s" | tee -a "$LOG"
