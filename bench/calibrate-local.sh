#!/bin/sh
# bench/calibrate-local.sh: measures this machine and writes the `local`
# hardware file (results/hardware/README.md) the time model reads for CPU runs.
#
#   bench/calibrate-local.sh [OUT]        (default OUT: results/hardware/local)
#
# Run it from the top of the build tree (or set SB_BIN to the directory holding
# shardbench-collectives and shardbench-model-flops). SB_CAL_QUICK=1 measures
# less (one repetition, small sizes: for verify/hardware.sh, a few seconds).
#
# A CPU rank stands for one "GPU" (the threads backend runs a rank per thread):
#   peak_f32 and gemm_f32  the best 1-thread cblas_sgemm rate and each square
#                          size's fraction of it (shardbench-model-flops --sgemm-sweep);
#   hbm                    host RAM: MemTotal of /proc/meminfo, and 2 x the
#                          1-thread memcpy rate (bytes read + written per second;
#                          shardbench-collectives --memcpy);
#   intra                  the threads backend's collectives at world 2
#                          (shardbench-collectives): a 2-rank ring all_reduce is
#                          base + 2 steps, an all_gather base + 1 step (NCCL's
#                          step counts, bench/harness/hardware.c), so the small
#                          sizes' times give the step latency (t_ar - t_ag) and the
#                          base (t_ag - step); the bandwidth is the geometric mean
#                          of the two ops' median bus bandwidth over 1..64 MiB;
#   inter                  none (one host): set equal to intra, unused since
#                          gpus_per_node covers every threads job.
# Times are the minimum over repetitions (other load on the host only adds time).
# Every number it writes cites the command that measured it.
set -u
out=${1:-results/hardware/local}
bin=${SB_BIN:-bench}
coll=$bin/shardbench-collectives
mf=$bin/shardbench-model-flops
for p in "$coll" "$mf"; do
  [ -x "$p" ] || { echo "calibrate-local: no program $p (run from the build tree's top or set SB_BIN)" >&2; exit 2; }
done
if [ "${SB_CAL_QUICK:-0}" = 1 ]; then
  reps=1 small="--min-bytes 8 --max-bytes 256 --iters 50" big="--min-bytes 1M --max-bytes 4M --iters 5"
  sizes=32,128,256 big_range="1..4 MiB" small_range="<= 256 B"
else
  reps=3 small="--min-bytes 8 --max-bytes 1K --iters 200" big="--min-bytes 1M --max-bytes 64M --iters 20"
  sizes=16,32,64,128,256,512,1024 big_range="1..64 MiB" small_range="<= 1 KiB"
fi
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM
run() { # file, command...: appends the command's csv (header lines dropped)
  f=$1; shift
  "$@" > "$tmp/run" 2> "$tmp/err" || { echo "calibrate-local: failed: $*" >&2; cat "$tmp/err" >&2; exit 1; }
  grep -v '^backend,\|^sgemm,n,\|^memcpy_bytes' "$tmp/run" >> "$tmp/$f"
}
c_ar_small="$coll --backend threads --world 2 --op all_reduce $small --csv"
c_ag_small="$coll --backend threads --world 2 --op all_gather $small --csv"
c_ar_big="$coll --backend threads --world 2 --op all_reduce $big --csv"
c_ag_big="$coll --backend threads --world 2 --op all_gather $big --csv"
c_memcpy="$coll --memcpy --csv"
c_sweep="$mf --sgemm-sweep $sizes --threads 1 --reps 5"
load=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo '?')
i=0
# shellcheck disable=SC2086 # the commands are split into words on purpose
while [ $i -lt $reps ]; do
  run ar_small $c_ar_small
  run ag_small $c_ag_small
  run ar_big $c_ar_big
  run ag_big $c_ag_big
  run memcpy $c_memcpy
  run sweep $c_sweep
  i=$((i + 1))
done
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)
[ -n "$mem_kb" ] || { echo "calibrate-local: no MemTotal in /proc/meminfo" >&2; exit 1; }
cpu=$(awk -F': *' '/^model name/ {print $2; exit}' /proc/cpuinfo 2>/dev/null)
ncpu=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo '?')
day=$(date -u +%Y-%m-%d)

# csv: backend,op,dtype,world,bytes,count,time_us,algbw,busbw,wrong
min_t() { awk -F, '{ if (m == "" || $7 < m) m = $7 } END { print m }' "$tmp/$1"; }
# median over sizes of busbw = factor x bytes / (min time of that size)
med_bw() {
  awk -F, -v f="$2" '{ if (!($5 in t) || $7 < t[$5]) t[$5] = $7 }
    END { n = 0; for (b in t) v[++n] = f * b / (t[b] * 1e-6) / 1e9;
          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { x = v[i]; v[i] = v[j]; v[j] = x }
          print (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }' "$tmp/$1"
}
t_ar=$(min_t ar_small)
t_ag=$(min_t ag_small)
bw_ar=$(med_bw ar_big 1)     # 2-rank all_reduce: bus factor 2(n-1)/n = 1
bw_ag=$(med_bw ag_big 0.5)   # 2-rank all_gather: (n-1)/n = 1/2
memcpy=$(awk -F, '{ if ($3 > m) m = $3 } END { print m }' "$tmp/memcpy")
# sgemm,n,flops,seconds,gflops: the best rate per n; peak = the best of all
gemm=$(awk -F, '{ if ($5 > g[$2]) g[$2] = $5; f[$2] = $3; if ($5 > p) p = $5 }
  END { for (n in g) print n, f[n], g[n] / p }' "$tmp/sweep" | sort -n |
  awk '{ printf "%s%s:%.3f", (NR > 1 ? " " : ""), $2, $3 }')
peak=$(awk -F, '{ if ($5 > p) p = $5 } END { printf "%.2f", p }' "$tmp/sweep")

# step = t_ar - t_ag within [0, t_ar / 2], base = t_ar - 2 step (>= 0): the
# all_reduce's two steps and base are never more than its measured time
# shellcheck disable=SC2046 # two numbers, split on purpose
set -- $(awk -v a="$t_ar" -v g="$t_ag" 'BEGIN { s = a - g; if (s < 0) s = 0; if (s > a / 2) s = a / 2;
  printf "%.3f %.3f", s, a - 2 * s }')
lat=$1 base=$2
awk -v a="$t_ar" -v g="$t_ag" 'BEGIN { exit !(g > a) }' &&
  echo "calibrate-local: warning: all_gather ($t_ag us) slower than all_reduce ($t_ar us) at small sizes: a loaded host? (load: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null))" >&2
bw=$(awk -v a="$bw_ar" -v g="$bw_ag" 'BEGIN { printf "%.3f", sqrt(a * g) }')
hbm=$(awk -v m="$memcpy" 'BEGIN { printf "%.2f", 2 * m }')
gib=$(awk -v k="$mem_kb" 'BEGIN { printf "%.2f", k / 1048576 }')

tmpout="$tmp/out"
cat > "$tmpout" <<EOF
# results/hardware/local: this machine as one "GPU" per rank (CPU, threads
# backend), written by bench/calibrate-local.sh on $day; format:
# results/hardware/README.md. Re-measure with: bench/calibrate-local.sh
# Load average when it started: $load (the rates are this host's under that load).
description = $ncpu CPU(s), ${cpu:-unknown CPU}; one rank = one thread = one "GPU"

peak_f32_gflops = $peak  # measured: $c_sweep (best rate of any size, 1 thread)
gemm_f32 = $gemm  # measured: $c_sweep (each size's best rate over the peak, flops = 2 n^3)

hbm_gib = $gib  # measured: MemTotal of /proc/meminfo ($mem_kb kB)
hbm_gbps = $hbm  # measured: $c_memcpy (2 x $memcpy GB/s copied: bytes read + written, 1 thread, best of 7 x $reps run(s))
hbm_eff = 0.26  # calibrated: the one parameter chosen on the 7 even-numbered configs of bench/local-check.py (world-8 step times measured on 2026-12-04, an idle 2-core host whose OpenBLAS runs its Prescott sgemm): median |ln(predicted / measured)| 0.122 on them, 0.081 on the 6 held out; lib's host loops (f64 accumulation, strided rows) reach about a quarter of memcpy's rate. On another host refit it: bench/local-check.py --save-measured M once, then --hardware FILE --load-measured M per value

gpus_per_node = 1024  # lib/comm/comm.h DT_THREADS_MAX_WORLD: every rank of a threads job is on this host
intra_gbps = $bw  # measured: sqrt($bw_ar x $bw_ag): median busbw over $big_range (min time of $reps run(s) per size) of: $c_ar_big; $c_ag_big
intra_lat_us = $lat  # measured: t_ar - t_ag = $t_ar - $t_ag us (min over sizes $small_range and $reps run(s)) of: $c_ar_small; $c_ag_small
coll_base_lat_us = $base  # measured: t_ar - 2 x intra_lat_us from the same runs (all_reduce at world 2 = base + 2 steps)
inter_gbps = $bw  # assumption: one host, no inter-node link: equal to intra_gbps (unused while gpus_per_node covers the group)
inter_lat_us = $lat  # assumption: one host: equal to intra_lat_us (unused, as inter_gbps)

attn_f32_eff = 0.5  # assumption: attention's tiles are 256-row sgemms (lib/ops/attention.c sdpa blocks), near gemm_f32's rate at that size less the row kernels between them; calibrate with bench/shardbench-model-flops
shared_cores = $ncpu  # measured: nproc; the ranks of a threads job share these cores
kernel_us = 1  # assumption: the runtime's per-op overhead, 0.3-0.9 us per cached op in bench/shardbench-dispatch
alloc_overhead = 0  # assumption: host malloc, no caching allocator rounding modelled
reserved_gib = 0  # assumption: no device runtime to reserve memory (the host's other users are not modelled)
EOF
mkdir -p "$(dirname "$out")" && cp "$tmpout" "$out" || exit 1
echo "calibrate-local: wrote $out (peak $peak GFLOP/s, RAM $hbm GB/s, intra $bw GB/s, step $lat us, base $base us)"
