#!/bin/bash
# Issue 41 item 3 on a lent GPU machine, in one call: the six paper-1 figures at GPT-2's shape (gpt2-random, random
# weights, offline) on CUDA and on the same machine's CPUs, `bench figures` both ways, the figures' CSVs compared,
# and the batched torch path under torch.cuda.set_sync_debug_mode("error") (ATTNLAB_SYNC_DEBUG=1).
#
# Here (once, before the call):  make gpu-pack        (.gpu/: the texts, the GPT-2 tokenizer, wheels the image lacks)
# There (the device tool's run):  bash scripts/gpu_check.sh      carry: [".gpu"]     timeout_s: 600
# Logs and CSV summaries go to $OUT (or ./gpu-out); each stage prints its wall time. Stages stop at STAGE_LIMIT.
# QUICK=1: small grids (a smoke test of this script, e.g. here on the CPU, where the CUDA stages fail in one line).
set -u
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
STAGE_LIMIT=${STAGE_LIMIT:-200}                         # seconds per stage (a 600 s call holds the five below)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 MPLBACKEND=Agg HF_HUB_OFFLINE=1
WORK=$(mktemp -d)                                       # the run's own results cache, wheels and figure folders
export ATTNLAB_DATA_DIR=${ATTNLAB_DATA_DIR:-$PWD/.gpu/data} ATTNLAB_CACHE_DIR=$WORK/cache
PY=${PY:-python3}
if ls .gpu/whl/*.whl >/dev/null 2>&1; then              # entmax, pooch, platformdirs: not in the 'cuda' image
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$WORK/site" .gpu/whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:$WORK/site
fi
Q=${QUICK:+--quick}
CLI=("$PY" -m attnlab)                                  # the `attnlab` command

stage() {   # name, command...: run it with a time limit, log to $OUT/name.log, print its wall time and status
  local name=$1; shift
  local t0=$(date +%s%N)
  timeout "$STAGE_LIMIT" "$@" >"$OUT/$name.log" 2>&1
  local rc=$? ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%-14s rc=%-3s %4d.%03d s\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) | tee -a "$OUT/summary.txt"
  tail -n 12 "$OUT/$name.log"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  $PY -c 'import torch, transformers, numba, scipy; print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
"transformers", transformers.__version__, "numba", numba.__version__, "scipy", scipy.__version__)'
  git log -1 --format='commit %h %s' 2>/dev/null; } | tee "$OUT/summary.txt"

# 1. the batched torch path must not wait on the GPU inside its tiles and windows (raises if it does)
stage sync_debug env ATTNLAB_SYNC_DEBUG=1 "${CLI[@]}" bench figures --model gpt2-random --device cuda --no-oracle --quick
# 2-3. bench figures (vectorised seconds, all layers), CUDA then CPU, same machine, one run
stage bench_cuda "${CLI[@]}" bench figures --model gpt2-random --device cuda --no-oracle $Q
stage bench_cpu "${CLI[@]}" bench figures --model gpt2-random --device cpu --no-oracle $Q
# 4-5. the six figures end to end (three windows), CUDA then CPU, and their CSVs compared
stage figures_cuda "${CLI[@]}" figures fig1 fig2a fig2b fig2c fig3 fig4 --model gpt2-random --device cuda --out "$WORK/cuda" $Q
stage figures_cpu "${CLI[@]}" figures fig1 fig2a fig2b fig2c fig3 fig4 --model gpt2-random --device cpu --out "$WORK/cpu" $Q
$PY scripts/compare_csv.py "$WORK/cuda" "$WORK/cpu" | tee "$OUT/compare.txt"
grep -h "^total\|^figure=" "$OUT"/bench_*.log | sed 's/  */ /g' > "$OUT/bench.txt"
