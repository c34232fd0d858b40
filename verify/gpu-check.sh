#!/bin/sh
# verify/gpu-check.sh: the GPU tier, for a machine WITH a GPU (one H200: < 8 min).
#
#   verify/gpu-check.sh [configure args]   build from source, then check
#   verify/gpu-check.sh --bundle DIR       (on a build machine, no GPU needed) build,
#                                          then copy the programs, the .so files they
#                                          need and this script into DIR
#   DIR/run.sh                             (on the GPU machine) check with the bundle:
#                                          LD_LIBRARY_PATH=DIR/lib, no build, no
#                                          OpenBLAS/SQLite/jansson/MPI needed there
#
# The check: every CUDA test program (verify/test_*_cuda, verify/test_nccl when
# built; exit 0 passes, 77 = SKIP is a failure on a GPU machine), `shardbench run
# --device cuda` of the debugmodel with the threads backend on the one GPU (TP,
# FSDP, DP and bf16 TP at world 2, each verified against the one-rank reference:
# its "status: ok" line), NCCL at world 1 (--comm nccl) when this shardbench has
# it, then
# shardbench-gpu (GPU_BENCH_ARGS, default a short setting), and one line
#   gpu-check: PASS|FAIL tests=N/M runs=N/M mfu_block=X gemm_ratio=Y
# Exit: 0 PASS, 1 FAIL, 2 build or bundle error.
# Env: JOBS (16), KEEP=1 keeps the scratch directory, BUILD=DIR uses that
# configured build tree (with CUDA) instead of a fresh copy and configure, STEP_TIMEOUT (s, 300) per
# program, GPU_BENCH_ARGS, BUNDLE_SKIP (an extended regex of .so names not to
# copy, e.g. 'libcublas' when the GPU machine has CUDA).
set -u
here=$(cd "$(dirname "$0")" && pwd)
jobs=${JOBS:-16}
tmo=${STEP_TIMEOUT:-300}
bench_args=${GPU_BENCH_ARGS:---seq 4096 --layers 2 --reps 5 --inner 5}

say() { echo "== gpu-check: $*"; }
# Runs a program under `timeout` when there is one (a hang is a failure).
limit() { if command -v timeout >/dev/null 2>&1; then timeout "$tmo" "$@"; else "$@"; fi; }

# ---- the check, from a directory with bin/ (and verify/ for the tests) ----------
check() {
  root=$1
  tests=0; tests_ok=0; runs=0; runs_ok=0; mfu=NA; ratio=NA
  log=$(mktemp "${TMPDIR:-/tmp}/sb-gpu-log.XXXXXX") || exit 2
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L
  for t in "$root"/verify/test_*_cuda "$root"/verify/test_nccl; do
    [ -x "$t" ] || continue
    tests=$((tests + 1))
    limit "$t" > "$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then
      tests_ok=$((tests_ok + 1)); echo "PASS: ${t##*/}"
    else
      [ $rc -eq 77 ] && why="SKIP (no usable GPU: a failure here)" || why="FAIL (exit $rc)"
      echo "$why: ${t##*/}"; tail -n 20 "$log"
    fi
  done
  sb=$root/bin/shardbench
  for cfg in "tp --mesh tp:2" "fsdp --mesh dp_shard:2 --plan fsdp" \
             "dp --mesh dp_replicate:2 --plan dp" "tp-bf16 --mesh tp:2 --dtype bf16"; do
    runs=$((runs + 1))
    # shellcheck disable=SC2086 # cfg is a word list on purpose
    set -- $cfg
    name=$1; shift
    limit "$sb" run --device cuda --backend threads --steps 2 "$@" \
      ${SB_PLANS:+--plans-dir "$SB_PLANS"} > "$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q '^ *status: ok' "$log"; then
      runs_ok=$((runs_ok + 1)); echo "PASS: run $name: $(grep -m1 'vs reference' "$log")"
    else
      echo "FAIL: run $name (exit $rc)"; tail -n 8 "$log"
    fi
  done
  # NCCL at world 1 (one GPU): refused up front when this shardbench has none
  limit "$sb" run --device cuda --comm nccl --world 1 --steps 2 \
    ${SB_PLANS:+--plans-dir "$SB_PLANS"} > "$log" 2>&1
  rc=$?
  if [ $rc -eq 2 ] && grep -q "not built into" "$log"; then
    echo "note: this shardbench has no nccl comm; not run"
  else
    runs=$((runs + 1))
    if [ $rc -eq 0 ] && grep -q '^ *status: ok' "$log"; then
      runs_ok=$((runs_ok + 1)); echo "PASS: run nccl world 1: $(grep -m1 'vs reference' "$log")"
    else
      echo "FAIL: run nccl world 1 (exit $rc)"; tail -n 8 "$log"
    fi
  fi
  runs=$((runs + 1))
  # shellcheck disable=SC2086 # GPU_BENCH_ARGS is a word list
  limit "$root/bin/shardbench-gpu" --device cuda $bench_args > "$log" 2>&1
  rc=$?
  grep -v '^csv,' "$log"
  [ $rc -eq 0 ] && runs_ok=$((runs_ok + 1)) || echo "FAIL: shardbench-gpu (exit $rc)"
  # csv,part,name,m,n,k,tokens,seconds,tflops,mfu,ratio
  mfu=$(awk -F, '$1 == "csv" && $2 == "block" { print $10 }' "$log")
  ratio=$(awk -F, '$1 == "csv" && $2 == "block" { print $11 }' "$log")
  rm -f "$log"
  verdict=FAIL
  [ "$tests" -gt 0 ] && [ $tests_ok -eq "$tests" ] && [ $runs_ok -eq $runs ] && verdict=PASS
  echo "gpu-check: $verdict tests=$tests_ok/$tests runs=$runs_ok/$runs mfu_block=${mfu:-NA} gemm_ratio=${ratio:-NA}"
  [ $verdict = PASS ]
}

# ---- run from a bundle ------------------------------------------------------------
if [ "${1:-}" = --run-bundle ]; then
  dir=$(cd "$2" && pwd) || exit 2
  LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
  SB_PLANS=$dir/plans
  missing=$(for f in "$dir"/bin/* "$dir"/verify/*; do ldd "$f" 2>/dev/null; done |
    grep 'not found' | sort -u)
  [ -n "$missing" ] && { say "libraries missing on this machine:"; echo "$missing"; }
  check "$dir"
  exit $?
fi

# ---- build from source --------------------------------------------------------------
src=$(cd "$here/.." && pwd)
bundle=
if [ "${1:-}" = --bundle ]; then
  [ $# -ge 2 ] || { echo "gpu-check.sh: --bundle wants a directory" >&2; exit 2; }
  bundle=$2; shift 2
  mkdir -p "$bundle" && bundle=$(cd "$bundle" && pwd) || exit 2
fi
if [ -n "${BUILD:-}" ]; then
  work=$(cd "$BUILD" && pwd) || exit 2
  stage=$(mktemp -d "${TMPDIR:-/tmp}/sb-gpu-stage.XXXXXX") || exit 2
  [ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$stage"' EXIT
  say "build tree $work"
  cd "$work" || exit 2
  step() { say "$*"; "$@" > "$stage/step.log" 2>&1 || { tail -n 60 "$stage/step.log"; say "FAILED: $*"; exit 2; }; }
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/sb-gpu-check.XXXXXX") || exit 2
  stage=$work/stage
  [ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
  say "source $src, scratch $work"
  # A clean copy: git's view of the tree (tracked + untracked, minus .gitignore)
  # when git is there; otherwise everything, minus what configure and make write.
  if command -v git >/dev/null 2>&1 && git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    (cd "$src" && git ls-files -z -co --exclude-standard | tar cf - --null -T -) |
      (cd "$work" && tar xf -) || exit 2
  else
    (cd "$src" && tar cf - .) | (cd "$work" && tar xf -) || exit 2
    (cd "$work" && rm -rf config.status config.h config.log stamp-h1 Makefile autom4te.cache &&
      find . \( -name '*.o' -o -name '*.a' -o -name .deps -o -name .dirstamp \) -prune \
        -exec rm -rf {} +)
  fi
  cd "$work" || exit 2
  step() { say "$*"; "$@" > "$work/step.log" 2>&1 || { tail -n 60 "$work/step.log"; say "FAILED: $*"; exit 2; }; }
  step ./autogen.sh
  # MPI is optional: without mpicc the build has the threads backend only.
  mpi=; command -v mpicc >/dev/null 2>&1 || mpi=--without-mpi
  step ./configure --with-cuda $mpi "$@"
  grep -E 'CUDA \+ cuBLAS|NCCL|MPI' "$work/step.log"
fi
# The programs and every test program (TESTS= runs none).
step make -j"$jobs"
step make -j"$jobs" check TESTS=

mkdir -p "$stage/bin" "$stage/verify"
for p in bench/shardbench bench/shardbench-gpu; do cp "$p" "$stage/bin/" || exit 2; done
for t in verify/test_*_cuda verify/test_nccl; do
  if [ -x "$t" ] && [ -f "$t" ]; then cp "$t" "$stage/verify/" || exit 2; fi
done
cp -R "$src/plans" "$stage/plans" || exit 2

if [ -z "$bundle" ]; then
  SB_PLANS=$stage/plans
  check "$stage"
  exit $?
fi

# ---- the bundle: programs, their non-system .so files, this script, run.sh ----------
# Left out: the C library family and the loader (the target's own must be used),
# and libcuda (the GPU driver's, which belongs to the target machine).
sys='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda)\.so'
rm -rf "${bundle:?}/bin" "${bundle:?}/verify" "${bundle:?}/lib" "${bundle:?}/plans"
mkdir -p "$bundle/lib" || exit 2
cp -R "$stage/bin" "$stage/verify" "$stage/plans" "$bundle/" || exit 2
cp "$here/gpu-check.sh" "$bundle/gpu-check.sh" || exit 2
for f in "$bundle"/bin/* "$bundle"/verify/*; do ldd "$f"; done |
  awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    echo "$name" | grep -Eq "$sys" && continue
    [ -n "${BUNDLE_SKIP:-}" ] && echo "$name" | grep -Eq "$BUNDLE_SKIP" && continue
    cp -L "$path" "$bundle/lib/$name" || exit 2
  done || exit 2
cat > "$bundle/run.sh" <<'EOF'
#!/bin/sh
# Runs the GPU check from this bundle (LD_LIBRARY_PATH=<this dir>/lib).
d=$(cd "$(dirname "$0")" && pwd)
exec sh "$d/gpu-check.sh" --run-bundle "$d"
EOF
chmod +x "$bundle/run.sh"
say "bundle in $bundle: $(find "$bundle/bin" "$bundle/verify" -type f | wc -l) programs," \
  "$(find "$bundle/lib" -type f | wc -l) libraries, $(du -sh "$bundle" | cut -f1);" \
  "on the GPU machine: sh $bundle/run.sh"
(cd "$bundle/lib" && echo ./*)
