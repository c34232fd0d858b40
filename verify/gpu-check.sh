#!/bin/sh
# verify/gpu-check.sh: the GPU tier of the tests, for a machine WITH a GPU.
# Copies the source tree (no build outputs) to a scratch directory, builds it with
# --with-cuda and runs verify/test_device_cuda through `make check`, then prints
# the test's log. Exit status: 0 pass, 1 fail, or skipped (on a GPU machine a
# SKIP means the GPU was not usable, which is a failure here), 2 build error.
#   usage: verify/gpu-check.sh [extra configure args]   (run from anywhere)
#   env:   JOBS (default 16), KEEP=1 keeps the scratch directory.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
jobs=${JOBS:-16}
work=$(mktemp -d "${TMPDIR:-/tmp}/sb-gpu-check.XXXXXX") || exit 2
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT

echo "== gpu-check: source $src, scratch $work"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L

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
step() { echo "== $*"; "$@" > "$work/step.log" 2>&1 || { tail -n 60 "$work/step.log"; echo "== FAILED: $*"; exit 2; }; }
step ./autogen.sh
step ./configure --with-cuda "$@"
grep -E 'CUDA \+ cuBLAS|NCCL' "$work/step.log"
echo "== make -j$jobs"
if ! make -j"$jobs" > "$work/make.log" 2>&1; then
  tail -n 40 "$work/make.log"
  echo "== WARNING: the full build failed; trying the CUDA test on its own"
fi
# Only this test's program is built, so an unrelated broken test cannot block it.
echo "== make check TESTS=verify/test_device_cuda"
make -j"$jobs" check TESTS=verify/test_device_cuda check_PROGRAMS=verify/test_device_cuda \
  > "$work/check.log" 2>&1
rc=$?
echo "---- verify/test_device_cuda.log ----"
cat verify/test_device_cuda.log 2>/dev/null || tail -n 60 "$work/check.log"
echo "-------------------------------------"
grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' "$work/check.log"
if grep -q '^:test-result: SKIP' verify/test_device_cuda.trs 2>/dev/null; then
  echo "== gpu-check: SKIPPED: no usable GPU, so nothing was tested"
  exit 1
fi
[ $rc -eq 0 ] && echo "== gpu-check: PASS" || echo "== gpu-check: FAIL (make check exit $rc)"
[ $rc -eq 0 ]
