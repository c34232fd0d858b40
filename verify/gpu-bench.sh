#!/bin/sh
# verify/gpu-bench.sh: bench/shardbench-gpu on cuda-emu (the CUDA code on the host),
# so the benchmark the GPU tier runs (verify/gpu-check.sh) is exercised in CI.
# A smoke and regression check, not a measurement: --tiny (dim 64, 2 layers,
# seq 32) must run all three parts (15 GEMM shapes and their mix, one block
# step, the whole model), and each CSV line's shapes must be the tiny model's
# (analytic: QKV fused out = (heads + 2 kv heads) * head dim = (4 + 2*2) * 16 =
# 128; FFN 224; T = 32 tokens). Bad flags: one line, exit 2.
set -u
SB_GPU=${SB_GPU:-bench/shardbench-gpu}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sb-gpu-bench.XXXXXX") || exit 99
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0
check() { # LABEL GOT WANT
  checks=$((checks + 1))
  if [ "$2" != "$3" ]; then echo "FAIL: $1: got '$2', expected '$3'"; fails=$((fails + 1)); fi
}

"$SB_GPU" --device cuda-emu --tiny >"$tmp/out" 2>"$tmp/err"
check "tiny run exit" "$?" 0
check "gemm rows" "$(grep -c '^csv,gemm,' "$tmp/out")" 16
check "qkv forward shape (m T, n 128, k 64)" "$(grep '^csv,gemm,qkv.fwd,' "$tmp/out" | cut -d, -f4-7)" "32,128,64,32"
check "w2 grad-weight shape (m 64, n 224, k T)" "$(grep '^csv,gemm,w2.dw,' "$tmp/out" | cut -d, -f4-7)" "64,224,32,32"
check "block ran" "$(grep -c '^csv,block,layers=1,' "$tmp/out")" 1
check "model ran" "$(grep -c '^csv,model,layers=2,' "$tmp/out")" 1
check "nothing 'did not run'" "$(grep -c 'did not run' "$tmp/out")" 0
# every measured time is positive
check "positive seconds" "$(awk -F, '/^csv,/ && $8 <= 0 {n++} END {print n + 0}' "$tmp/out")" 0

# refusals: one line on stderr, exit 2, before any work
refused() { # LABEL ARGS...
  label=$1
  shift
  "$SB_GPU" "$@" >"$tmp/out" 2>"$tmp/err"
  check "$label: exit" "$?" 2
  check "$label: one line" "$(wc -l <"$tmp/err" | tr -d ' ')" 1
  check "$label: nothing on stdout" "$(wc -c <"$tmp/out" | tr -d ' ')" 0
}
refused "--reps 3" --device cuda-emu --reps 3
refused "--parts foo" --device cuda-emu --parts gemm,foo
refused "--device gpu" --device gpu
if ! nvidia-smi -L >/dev/null 2>&1; then
  refused "--device cuda without a GPU" --device cuda --tiny
fi

echo "gpu-bench: $checks checks, $fails failed"
[ "$fails" -eq 0 ]
