#!/bin/sh
# verify/emu-run.sh: `shardbench run --device cuda-emu` end to end: the sharded job's
# ranks compute on the emulated CUDA device (the CUDA kernels built for the host,
# lib/device/device_emu.c), the reference on the CPU.
#   1. The debugmodel (2 layers) under TP (tp 2), DDP (dp_replicate 2), FSDP
#      (dp_shard 2), HSDP (2 x 2), FSDP + TP + SP (2 x 2), ZeRO-1 and ZeRO-2
#      (dp_shard 2) and PP (pp 2, 1F1B): the verdict against the unsharded CPU
#      reference (every step's loss and gradients, the final weights) is ok, and
#      the printed key and the DB's configs row say device=cuda-emu; the same
#      config on the CPU has no device in its key (so the check can tell the two
#      apart). The attention-free workloads (feed_forward, output, embedding)
#      under the data-parallel plans, which run FSDP's all_gather / reduce_scatter
#      / HSDP all_reduce / ZeRO-1 gather, the bf16 param all_gather and DDP's
#      flat buckets on device buffers whatever the state of the attention
#      kernels: their verdict must be ok (never PENDING).
#   2. Bad input, one line on stderr and exit 2 before any work: --device gpu,
#      --device cuda without a GPU (or without a CUDA build), --dtype bf16 on the
#      CPU, and the same for sweep.
# EMU_RUN_PENDING=1 (the default while ops lack device kernels) reports a model
# config that stops at an op without a device kernel ("unsupported", "no kernel",
# "different devices", or sdpa's host scratch handed to the device GEMM: "is not
# a cuda-emu device pointer") as PENDING, counting no check for its verdict; 0
# makes it a failure. The key and DB checks count either way. A workload config
# (--workload, no attention) is never PENDING.
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
  pend_ok=$PENDING_OK
  case " $* " in *" --workload "*) pend_ok=0 ;; esac
  case "$status" in
  ok)
    check "$label: verdict" "$status (rc $rc)" "ok (rc 0)"
    ;;
  failed:*unsupported*|failed:*"no kernel"*|failed:*"different devices"*|failed:*"is not a cuda-emu device pointer"*)
    if [ "$pend_ok" = 1 ]; then
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
emu_config fsdp --dp-shard 2 --plan fsdp
emu_config hsdp --dp-replicate 2 --dp-shard 2 --plan hsdp
emu_config fsdp-tp --dp-shard 2 --tp 2 --plan fsdp-tp-sp
emu_config zero1 --dp-shard 2 --plan zero1
emu_config zero2 --dp-shard 2 --plan zero2
emu_config pp-1f1b --pp 2 --plan pp
# cp 2 (fsdp-cp, dp-cp) joins once sdpa_cp runs on device arrays: its kernel
# writes its device output on the host today (a segfault, not a PENDING stop)
for wl in feed_forward output embedding; do
  emu_config "$wl fsdp" --workload $wl --dp-shard 2 --plan fsdp
  emu_config "$wl ddp" --workload $wl --dp-replicate 2 --plan dp
done
emu_config "feed_forward hsdp" --workload feed_forward --dp-replicate 2 --dp-shard 2 --plan hsdp
emu_config "feed_forward fsdp-tp" --workload feed_forward --dp-shard 2 --tp 2 --plan fsdp-tp-sp
emu_config "output fsdp-tp" --workload output --dp-shard 2 --tp 2 --plan fsdp-tp-sp
emu_config "feed_forward zero1" --workload feed_forward --dp-shard 2 --plan zero1
emu_config "feed_forward zero2" --workload feed_forward --dp-shard 2 --plan zero2
emu_config "feed_forward fsdp-bf16" --workload feed_forward --dp-shard 2 --plan fsdp-bf16
emu_config "output zero1" --workload output --dp-shard 2 --plan zero1

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
