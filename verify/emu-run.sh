#!/bin/sh
# verify/emu-run.sh: `shardbench run --device cuda-emu` end to end: the sharded job's
# ranks compute on the emulated CUDA device (the CUDA kernels built for the host,
# lib/device/device_emu.c), the reference on the CPU.
#   1. The debugmodel (2 layers) under TP (tp 2) and DP (dp_replicate 2): the verdict against the unsharded CPU reference
#      (every step's loss and gradients, the final weights) is ok, and the printed
#      key and the DB's configs row say device=cuda-emu; the same config on the CPU
#      has no device in its key (so the check can tell the two apart).
#   2. Bad input, one line on stderr and exit 2 before any work: --device gpu,
#      --device cuda without a GPU (or without a CUDA build), --dtype bf16 on the
#      CPU, and the same for sweep.
# EMU_RUN_PENDING=1 (the default while ops lack device kernels) reports a config
# that stops at an op without a device kernel ("unsupported", "no kernel",
# "different devices") as PENDING, counting no check for its verdict; 0 makes it
# a failure. The key and DB checks count either way.
NAME=emu-run
. "${srcdir:-.}/verify/harness-common.sh"

PENDING_OK=${EMU_RUN_PENDING:-1}
MODEL="debugmodel:n_layers=2"
db="$tmp/emu.db"
pending=0

# emu_config LABEL FLAGS...: one cuda-emu run, checked.
emu_config() {
  label=$1
  shift
  "$SB" run --device cuda-emu --model "$MODEL" --batch 4 --seq 16 --steps 1 --warmup 1 \
    --db "$db" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  key=$(head -n 1 "$tmp/out")
  status=$(sed -n 's/^  status: //p' "$tmp/out")
  case "$key" in
  *" device=cuda-emu") check "$label: key ends with device=cuda-emu" yes yes ;;
  *) check "$label: key ends with device=cuda-emu" "$key" "... device=cuda-emu" ;;
  esac
  check "$label: DB row" "$(q "$db" "SELECT count(*) FROM configs WHERE key = '$key'")" 1
  case "$status" in
  ok)
    check "$label: verdict" "$status (rc $rc)" "ok (rc 0)"
    ;;
  failed:*unsupported*|failed:*"no kernel"*|failed:*"different devices"*)
    if [ "$PENDING_OK" = 1 ]; then
      pending=$((pending + 1))
      echo "PENDING: $label: $status"
    else
      check "$label: verdict" "$status" ok
    fi
    ;;
  *) check "$label: verdict" "$status (rc $rc; $(head -c 200 "$tmp/err"))" "ok (rc 0)" ;;
  esac
}

# 1. the configs
emu_config tp --tp 2
emu_config dp --dp-replicate 2 --plan dp
# FSDP (--dp-shard 2 --plan fsdp, and fsdp-tp-sp at world 4) joins once
# lib/parallel/fsdp.c packs device buffers on the device: its host pack faults on
# cuda-emu's tagged pointers today

# the same TP config on the CPU: no device in the key, so the checks above can fail
"$SB" run --model "$MODEL" --batch 4 --seq 16 --steps 1 --warmup 0 --tp 2 >"$tmp/out" 2>&1
case "$(head -n 1 "$tmp/out")" in
*device=*) check "cpu key has no device" "$(head -n 1 "$tmp/out")" "no device=" ;;
*) check "cpu key has no device" yes yes ;;
esac
check "cpu verdict" "$(sed -n 's/^  status: //p' "$tmp/out")" ok

# 2. bad input
refused "run --device gpu" "^shardbench run: --device: expected cpu, cuda or cuda-emu, got 'gpu'$" \
  "$SB" run --device gpu --tp 2
refused "run --dtype bf16 on the cpu" "^shardbench run: --dtype: bf16 runs on a device" \
  "$SB" run --dtype bf16 --tp 2
refused "run --dtype f16" "^shardbench run: --dtype: expected f32, f64 or bf16" \
  "$SB" run --dtype f16 --device cuda-emu
refused "sweep --device gpu" "^shardbench sweep: --device: expected cpu, cuda or cuda-emu" \
  "$SB" sweep --world 2 --device gpu --db "$tmp/s.db"
refused "sweep --dtypes bf16 on the cpu" "^shardbench sweep: --dtypes: bf16 runs on a device" \
  "$SB" sweep --world 2 --dtypes bf16 --db "$tmp/s.db"
if [ -n "$(nvidia-smi -L 2>/dev/null)" ]; then
  echo "note: a GPU is visible: --device cuda's refusal is not checked here"
else
  refused "run --device cuda without a GPU" "^shardbench run: --device: cuda: " \
    "$SB" run --device cuda --tp 2
fi
check "nothing written for refused runs" "$(test -e "$tmp/s.db" && echo exists)" ""

[ "$pending" -gt 0 ] && echo "$NAME: $pending config(s) pending device kernels"
finish
