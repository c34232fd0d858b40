#!/bin/sh
# shellcheck disable=SC2154 # bindir, libdir, ...: set by Makefile.am (installcheck-local)
# verify/installcheck.sh SRCDIR: `make installcheck` (Makefile.am: installcheck-local),
# run after `make install` into the configured prefix (what `make distcheck` does).
# The Makefile passes the install directories (bindir libdir includedir pkgdatadir
# pkgconfigdir), CC, SAN_CFLAGS, PKG_CONFIG, enable_shared and enable_static.
#
# Checks, each against an oracle of its own, not against what `make install` says:
#   headers   the installed tree is exactly what <dtensor/dtensor.h> reads (the
#             compiler's own dependency list, cc -M, with -I$includedir only), and
#             no header of lib/ that the source umbrella does not reach (a private
#             one) is installed;
#   library   verify/install_smoke.c, built with `pkg-config --cflags --libs dtensor`
#             (PKG_CONFIG_PATH = the installed pkgconfig dir, nothing of the source
#             tree on its paths), runs a 2-rank job and checks its values from
#             formulas (see the file); linked against libdtensor.so (ldd shows the
#             installed one) and, statically, against libdtensor.a with
#             `pkg-config --static` (ldd shows no libdtensor.so);
#   example   examples/train_2d.c, built the same way, trains dp_shard 2 x tp 2 and
#             checks its losses against its own world-1 run (see the file);
#   data      every plan, README, schema, published.csv and gnuplot script of
#             SRCDIR is installed under $pkgdatadir, byte for byte;
#   programs  every installed program is a real executable that does not need
#             libdtensor.so; from an empty directory with no SHARDBENCH_* variable,
#             `shardbench run` trains and verifies one config with the installed
#             plans, names $pkgdatadir/plans when a plan is missing, `report` runs the
#             installed scripts and `baselines --db` loads the installed
#             published.csv (as many new rows as the file has data lines);
#             shardbench-collectives runs an all_reduce with 0 wrong elements;
#             shardbench-fsdp runs its layouts with the installed plans.
# Planted failures prove the checks can fail: a private header added to a copy of
# the installed tree is reported, the smoke program built with -DSMOKE_PLANT
# (a wrong expected value) fails, the example built with -DTRAIN_2D_PLANT (a
# world-1 run from another seed) fails, and `shardbench run` with an empty data
# directory fails with exit 2.
set -u
NAME=installcheck
SRC=$(cd "${1:-.}" && pwd) || { echo "$NAME: no source directory ${1:-}" >&2; exit 1; }
for v in bindir libdir includedir pkgdatadir pkgconfigdir; do
  eval "val=\${$v:-}"
  [ -n "$val" ] || { echo "$NAME: \$$v is not set (run it through make installcheck)" >&2; exit 1; }
done
if [ -n "${DESTDIR:-}" ]; then
  echo "$NAME: checks the installation at the configured prefix; DESTDIR=$DESTDIR is not supported" >&2
  exit 1
fi
CC=${CC:-cc}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
command -v "$PKG_CONFIG" >/dev/null 2>&1 ||
  { echo "$NAME: FAIL: pkg-config ($PKG_CONFIG) is needed to check dtensor.pc" >&2; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/sb-installcheck.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
CLEAN="env -u SHARDBENCH_PLANS -u SHARDBENCH_SCRIPTS -u SHARDBENCH_DATADIR"
CFLAGS_SMOKE="-std=c11 -Wall -Wextra -Werror ${SAN_CFLAGS:-}"

# ---- headers -----------------------------------------------------------------
INC="$includedir/dtensor"
[ -f "$INC/dtensor.h" ] || fail "no $INC/dtensor.h"

# The headers cc reads for `#include <dtensor/dtensor.h>` with -I$1 only, as
# paths under $1/dtensor, one a line, sorted.
reads() {
  printf '#include <dtensor/dtensor.h>\nint main(void) { return 0; }\n' >"$T/inc.c"
  "$CC" -std=c11 -M -I"$1" "$T/inc.c" 2>"$T/cc.err" | tr ' \\' '\n\n' |
    sed -n "s|^$1/dtensor/||p" | sed -e ':a' -e 's|[^/][^/]*/\.\./||' -e 'ta' | sort -u
}
# Reports files under $1/dtensor that the umbrella does not read; returns their count.
extras() {
  reads "$1" >"$T/reads"
  [ -s "$T/reads" ] || { echo "the umbrella does not compile with -I$1: $(head -3 "$T/cc.err")"; return 1; }
  (cd "$1/dtensor" && find . -type f | sed 's|^\./||' | sort) >"$T/all"
  n=0
  for f in $(comm -23 "$T/all" "$T/reads"); do echo "installed but not read by <dtensor/dtensor.h>: $f"; n=$((n + 1)); done
  return $n
}
if out=$(extras "$includedir"); then
  pass "headers: $(wc -l <"$T/reads") installed, all read by <dtensor/dtensor.h> with -I$includedir"
else
  fail "headers: $out"
fi
# private headers: lib/ headers the source umbrella does not reach
"$CC" -std=c11 -MM "$SRC/lib/dtensor.h" 2>/dev/null | tr ' \\' '\n\n' | sed -n "s|^$SRC/lib/||p" |
  sed -e ':a' -e 's|[^/][^/]*/\.\./||' -e 'ta' | sort -u >"$T/pub"
(cd "$SRC/lib" && find . -name '*.h' | sed 's|^\./||' | sort) >"$T/srch"
priv=$(comm -23 "$T/srch" "$T/pub")
[ -n "$priv" ] || fail "no private header found under $SRC/lib (the source umbrella reads them all?)"
np=0
f0=$fails
for h in $priv; do
  if [ -e "$INC/$h" ]; then fail "the private header $h is installed"; fi
  np=$((np + 1))
done
[ "$fails" -eq "$f0" ] && pass "headers: none of the $np private ones installed ($(echo $priv))"
# plant: a private header in a copy of the installed tree must be reported
mkdir -p "$T/plant"
cp -R "$includedir/dtensor" "$T/plant/"
first=$(echo "$priv" | head -1)
mkdir -p "$T/plant/dtensor/$(dirname "$first")"
cp "$SRC/lib/$first" "$T/plant/dtensor/$first"
if out=$(extras "$T/plant"); then
  fail "plant: a private header in the installed tree was not reported"
elif echo "$out" | grep -qF "$first"; then
  pass "plant: reported $first"
else
  fail "plant: unexpected report: $out"
fi

# ---- the library through pkg-config ----------------------------------------------
PKG_CONFIG_PATH="$pkgconfigdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_PATH
if ! "$PKG_CONFIG" --exists dtensor 2>"$T/pc.err"; then
  fail "pkg-config finds no dtensor in $pkgconfigdir: $(cat "$T/pc.err")"
else
  CF=$("$PKG_CONFIG" --cflags dtensor)
  LIBS=$("$PKG_CONFIG" --libs dtensor)
  SLIBS=$("$PKG_CONFIG" --static --libs dtensor)
  echo "pkg-config --cflags --libs dtensor: $CF $LIBS"
  echo "pkg-config --static --libs dtensor: $SLIBS"
  case " $CF " in *" -I$includedir "*) pass "Cflags has -I$includedir" ;; *) fail "Cflags lacks -I$includedir: $CF" ;; esac
  # smoke NAME RUN-ENV LINK-FLAGS...: builds verify/install_smoke.c as $T/NAME
  # and runs it under RUN-ENV (VAR=VALUE); 1: it did not build, 2: it failed.
  smoke() {
    name=$1 runenv=$2
    shift 2
    # shellcheck disable=SC2086 # flag lists
    "$CC" $CFLAGS_SMOKE $CF "$SRC/verify/install_smoke.c" -o "$T/$name" "$@" >"$T/$name.cc" 2>&1 ||
      return 1
    env "$runenv" "$T/$name" >"$T/$name.out" 2>&1 || return 2
  }
  # check NAME LABEL RUN-ENV LINK-FLAGS...: smoke must build, run and print ok
  check() {
    name=$1 label=$2
    shift 2
    smoke "$name" "$@"
    case $? in
      0) grep -qx 'install_smoke: ok' "$T/$name.out" && pass "$label: install_smoke ok" ||
           fail "$label: $(cat "$T/$name.out")" ;;
      1) fail "$label: install_smoke does not build: $(head -5 "$T/$name.cc")"; return 1 ;;
      *) fail "$label: install_smoke failed: $(cat "$T/$name.out")"; return 1 ;;
    esac
  }
  built=""
  if [ "${enable_shared:-yes}" = yes ]; then
    # shellcheck disable=SC2086
    if check smoke_shared shared "LD_LIBRARY_PATH=$libdir" $LIBS; then
      if command -v ldd >/dev/null 2>&1; then
        LD_LIBRARY_PATH=$libdir ldd "$T/smoke_shared" | grep -q "=> $libdir/libdtensor\.so" &&
          pass "shared: uses $libdir/libdtensor.so" || fail "shared: ldd shows no $libdir/libdtensor.so"
      fi
      built="LD_LIBRARY_PATH=$libdir $LIBS"
    fi
  fi
  if [ "${enable_static:-yes}" = yes ]; then
    # libdtensor.a; its dependencies as the system has them (shared)
    SLINK=$(echo " $SLIBS " | sed 's| -ldtensor | -Wl,-Bstatic -ldtensor -Wl,-Bdynamic |')
    # shellcheck disable=SC2086
    if check smoke_static static "SB_STATIC=1" $SLINK; then
      if command -v ldd >/dev/null 2>&1; then
        ldd "$T/smoke_static" | grep -q 'libdtensor\.so' && fail "static: linked to libdtensor.so" ||
          pass "static: no libdtensor.so needed"
      fi
      [ -n "$built" ] || built="SB_STATIC=1 $SLINK"
    fi
  fi
  # plant: the smoke program with a wrong expected value must fail
  if [ -n "$built" ]; then
    CF="$CF -DSMOKE_PLANT"
    # shellcheck disable=SC2086
    smoke smoke_plant $built
    rc=$?
    if [ $rc -eq 2 ] && grep -q 'expected 4' "$T/smoke_plant.out"; then
      pass "plant: install_smoke fails on a wrong expected value: $(head -1 "$T/smoke_plant.out")"
    else
      fail "plant: install_smoke -DSMOKE_PLANT gave $rc: $(cat "$T/smoke_plant.out" "$T/smoke_plant.cc" 2>/dev/null | head -3)"
    fi
  else
    fail "no install_smoke ran"
  fi
  # the example: examples/train_2d.c trains FSDP x TP (dp_shard 2 x tp 2) through the
  # installed library; its own oracle is a world-1 run of the same program (same
  # losses up to f64 rounding) and a loss that falls on its fixed batch
  if [ -n "$built" ]; then
    CF=$("$PKG_CONFIG" --cflags dtensor)
    runenv=${built%% *} flags=${built#* }
    # shellcheck disable=SC2086 # flag lists
    if ! "$CC" $CFLAGS_SMOKE $CF "$SRC/examples/train_2d.c" -o "$T/train_2d" $flags >"$T/ex.cc" 2>&1; then
      fail "examples/train_2d.c does not build: $(head -5 "$T/ex.cc")"
    elif env "$runenv" "$T/train_2d" >"$T/ex.out" 2>&1 && grep -qx 'train_2d: ok' "$T/ex.out" &&
         [ "$(grep -c '^step [0-9]*: loss ' "$T/ex.out")" -ge 2 ]; then
      pass "examples/train_2d: $(grep -c '^step ' "$T/ex.out") steps, the losses of world 1, falling: $(grep '^step' "$T/ex.out" | tail -1)"
    else
      fail "examples/train_2d: $(cat "$T/ex.out")"
    fi
    # plant: a world-1 run from another seed must be reported as a different loss
    # shellcheck disable=SC2086
    "$CC" $CFLAGS_SMOKE $CF -DTRAIN_2D_PLANT "$SRC/examples/train_2d.c" -o "$T/train_2d_plant" $flags \
      >"$T/exp.cc" 2>&1
    if env "$runenv" "$T/train_2d_plant" >"$T/exp.out" 2>&1; then
      fail "plant: examples/train_2d -DTRAIN_2D_PLANT passed"
    elif grep -q 'differs from world 1' "$T/exp.out"; then
      pass "plant: examples/train_2d fails on a wrong reference: $(grep -m1 differs "$T/exp.out")"
    else
      fail "plant: examples/train_2d -DTRAIN_2D_PLANT: $(head -3 "$T/exp.out" "$T/exp.cc")"
    fi
  fi
fi

# ---- data ----------------------------------------------------------------------
nd=0
f0=$fails
for f in "$SRC"/plans/*.plan plans/README.md results/schema.sql results/published.csv "$SRC"/scripts/*.gp \
         "$SRC"/results/hardware/* \
         "$SRC"/schedules/*.csv schedules/README.md; do
  rel=${f#"$SRC"/}
  if cmp -s "$SRC/$rel" "$pkgdatadir/$rel"; then nd=$((nd + 1)); else fail "data: $pkgdatadir/$rel missing or different"; fi
done
[ "$fails" -eq "$f0" ] && pass "data: $nd files under $pkgdatadir match the source"

# ---- programs ------------------------------------------------------------------
f0=$fails
for p in shardbench shardbench-collectives shardbench-redistribute shardbench-dispatch \
         shardbench-model-flops shardbench-fsdp; do
  b="$bindir/$p"
  if [ ! -x "$b" ]; then fail "no $b"; continue; fi
  [ "$(head -c 4 "$b" | od -An -c | tr -d ' ')" = '177ELF' ] || fail "$b is not an ELF executable"
  if command -v ldd >/dev/null 2>&1 && ldd "$b" | grep -q 'libdtensor\.so'; then
    fail "$b needs libdtensor.so"
  fi
done
[ -x "$bindir/shardbench-allreduce-vs-mpi" ] || fail "no $bindir/shardbench-allreduce-vs-mpi"
[ "$fails" -eq "$f0" ] && pass "programs: installed, real executables, no libdtensor.so needed"
for p in shardbench shardbench-collectives shardbench-redistribute shardbench-fsdp; do
  "$bindir/$p" --help >"$T/help" 2>&1 && grep -q usage "$T/help" || fail "$p --help: $(head -2 "$T/help")"
done

mkdir "$T/work" "$T/nodata"
SB="$bindir/shardbench"
RUN="run --tp 2 --world 2 --workload block --batch 2 --seq 4 --steps 1 --warmup 0"
# shellcheck disable=SC2086
if (cd "$T/work" && $CLEAN "$SB" $RUN --db "$T/work/r.db") >"$T/out" 2>"$T/err" &&
   grep -q 'status: ok' "$T/out"; then
  pass "shardbench run from an empty directory: $(grep -m1 'status' "$T/out" | sed 's/^ *//')"
else
  fail "shardbench run from an empty directory: $(cat "$T/err" "$T/out" | head -5)"
fi
(cd "$T/work" && $CLEAN "$SB" run --plan nosuch --tp 2 --world 2) >/dev/null 2>"$T/err"
grep -qF "'$pkgdatadir/plans/nosuch.plan'" "$T/err" && pass "a missing plan is looked for in $pkgdatadir/plans" ||
  fail "a missing plan: $(cat "$T/err")"
# plant: with an empty data directory the same run must fail, before any work
# shellcheck disable=SC2086
(cd "$T/work" && $CLEAN SHARDBENCH_DATADIR="$T/nodata" "$SB" $RUN) >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] && pass "plant: no plans -> exit 2: $(head -1 "$T/err")" || fail "plant: no plans gave exit $rc"
# report: the installed scripts (GNUPLOT=/bin/true: the command is logged, nothing drawn)
(cd "$T/work" && $CLEAN GNUPLOT=/bin/true "$SB" report --db r.db --out rep) >/dev/null 2>&1
grep -qF " $pkgdatadir/scripts/comm.gp" "$T/work/rep/gnuplot.log" 2>/dev/null &&
  pass "report runs $pkgdatadir/scripts/comm.gp" || fail "report: $(head -2 "$T/work/rep/gnuplot.log" 2>&1)"
# baselines --db: the installed schema and published.csv (one new row per data line)
want=$(sed '1d' "$pkgdatadir/results/published.csv" | grep -c .)
(cd "$T/work" && $CLEAN "$SB" baselines --model debugmodel --tp 2 --batch 8 --seq 64 --db b.db) \
  >/dev/null 2>"$T/err"
grep -q "and $want new published rows" "$T/err" && pass "baselines loaded the installed published.csv ($want rows)" ||
  fail "baselines: expected $want published rows: $(cat "$T/err")"
# the collectives benchmark: a small all_reduce, every element right
"$bindir/shardbench-collectives" --backend threads --world 2 --op all_reduce --min-bytes 1K \
  --max-bytes 4K --iters 2 --csv >"$T/coll" 2>&1
rows=$(sed '1d' "$T/coll" | awk -F, '$10 == 0' | wc -l)
[ "$rows" -eq 3 ] && pass "shardbench-collectives: 3 sizes, 0 wrong elements" ||
  fail "shardbench-collectives: $(cat "$T/coll")"
# the FSDP benchmark from an empty directory: the installed plans, every layout to the goal lines
(cd "$T/work" && $CLEAN "$bindir/shardbench-fsdp" --world 2 --batch 2 --seq 4 --steps 1 \
  --warmup 0 --reps 1) >"$T/fsdp" 2>&1
pdir=$(sed -n 's/^# shardbench fsdp: .*; plans from //p' "$T/fsdp")
[ -n "$pdir" ] && [ "$(readlink -f "$pdir")" = "$(readlink -f "$pkgdatadir/plans")" ] &&
  grep -q '^fsdp step time / dp' "$T/fsdp" && pass "shardbench-fsdp ran with the plans of $pdir" ||
  fail "shardbench-fsdp: $(head -3 "$T/fsdp")"

if [ $fails -ne 0 ]; then
  echo "$NAME: $fails failure(s)"
  exit 1
fi
echo "$NAME: all checks passed"
exit 0
