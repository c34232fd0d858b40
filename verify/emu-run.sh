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
#   3. Context parallel (all-gather and ring attention, with DDP and FSDP over
#      dp_shard x cp), FSDP inside pipeline stages, bf16 (TP and FSDP: the bf16
#      tolerance) and all five dims at once (pp x dp_replicate x dp_shard x cp x
#      tp, 32 ranks, torchtitan-5d) verify on cuda-emu as on the CPU.
#   4. Point to point on device buffers stays on the device (the threads backend's
#      device-to-device messages, lib/comm/comm_threads.c): pipeline (pp 2, 1F1B)
#      and ring attention (cp 2, pass-KV) traffic stage host_staged_bytes 0 in
#      --json. It can fail: SHARDBENCH_FAULT=host-staging sends the same messages
#      through host memory, a D2H copy at each send and an H2D copy at each
#      receive, so the count is the sum over ranks of (bytes sent + bytes
#      received); every rank of these runs moves what rank 0 does (pp 2: one
#      stage's sends are the other's receives, equal in size; cp: the ring is
#      symmetric), so it is world x rank 0's send and recv payload bytes, with
#      the verdict still ok.
# Every op has a device kernel, so any verdict but ok fails (a missing kernel
# says "unsupported"; a host dereference of device memory is a segfault).
NAME=emu-run
. "${srcdir:-.}/verify/harness-common.sh"

MODEL="debugmodel:n_layers=2"
db="$tmp/emu.db"
BATCH=4 SEQ=16

# emu_config LABEL FLAGS...: one cuda-emu run, checked.
emu_config() {
  label=$1
  shift
  "$SB" run --device cuda-emu --model "$MODEL" --batch "$BATCH" --seq "$SEQ" \
    --steps 1 --warmup 1 --db "$db" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
  key=$(head -n 1 "$tmp/out")
  status=$(sed -n 's/^  status: //p' "$tmp/out")
  case "$key" in
  *" device=cuda-emu") check "$label: key ends with device=cuda-emu" yes yes ;;
  *) check "$label: key ends with device=cuda-emu" "$key" "... device=cuda-emu" ;;
  esac
  check "$label: DB row" "$(q "$db" "SELECT count(*) FROM configs WHERE key = '$key'")" 1
  got="$status (rc $rc)"
  [ "$got" = "ok (rc 0)" ] || got="$got; $(head -c 200 "$tmp/err")"
  check "$label: verdict" "$got" "ok (rc 0)"
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
emu_config cp-allgather-ddp --dp-replicate 2 --cp 2 --plan dp-cp
emu_config cp-fsdp --dp-shard 2 --cp 2 --plan fsdp-cp
emu_config pp-fsdp --pp 2 --dp-shard 2 --plan pp-fsdp
emu_config tp-bf16 --tp 2 --dtype bf16
emu_config fsdp-bf16 --dp-shard 2 --plan fsdp --dtype bf16
emu_config cp-ddp-bf16 --dp-replicate 2 --cp 2 --plan dp-cp --dtype bf16
emu_config pp-ddp-bf16 --pp 2 --dp-replicate 2 --plan pp --dtype bf16
BATCH=8 SEQ=32 # 32 ranks: a batch for dp 4, a sequence for 2 cp x 2 tp
emu_config 5d --pp 2 --dp-replicate 2 --dp-shard 2 --cp 2 --tp 2 --plan torchtitan-5d
BATCH=4 SEQ=16
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

# 4. host staging of point to point: none, unless planted
if command -v python3 >/dev/null 2>&1; then
  for c in "pp 2 --pp 2 --plan pp" "cp 2 --cp 2 --plan dp-cp"; do
    set -- $c
    label="$1 $2" world=$2
    shift 2
    for fault in "" host-staging; do
      SHARDBENCH_FAULT=$fault "$SB" run --device cuda-emu --model "$MODEL" --batch "$BATCH" \
        --seq "$SEQ" --steps 1 --warmup 1 --json "$@" >"$tmp/j" 2>"$tmp/err"
      got=$(python3 - "$tmp/j" "$world" "$fault" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
p2p = sum(c["payload_bytes"] for c in r["comm"] if c["op"] in ("send", "recv"))
want = int(sys.argv[2]) * p2p if sys.argv[3] else 0
ok = r["status"] == "ok" and p2p > 0 and r["host_staged_bytes"] == want
print("ok" if ok else "status %s, p2p %d bytes, staged %s, want %d"
      % (r["status"], p2p, r["host_staged_bytes"], want))
EOF
)
      check "$label${fault:+ $fault}: host-staged bytes" "$got" ok
    done
  done
else
  echo "note: python3 is missing: the host-staging checks are skipped"
fi

# 2. bad input
refused "run --device gpu" "^shardbench run: --device: expected cpu, cuda, cuda-emu or meta, got 'gpu'$" \
  "$SB" run --device gpu --tp 2
refused "run --dtype bf16 on the cpu" "^shardbench run: --dtype: bf16 runs on a device" \
  "$SB" run --dtype bf16 --tp 2
refused "run --dtype f16" "^shardbench run: --dtype: expected f32, f64 or bf16" \
  "$SB" run --dtype f16 --device cuda-emu
refused "sweep --device gpu" "^shardbench sweep: --device: expected cpu, cuda, cuda-emu or meta" \
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

finish
