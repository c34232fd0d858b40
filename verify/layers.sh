#!/bin/sh
# verify/layers.sh: the include graph of lib/ against the layering of libdtensor,
# and the public headers against what installing them needs.
#
# The graph is every #include "..." of every lib/**/*.c and lib/**/*.h, resolved
# as the compiler does (next to the including file first, then under lib/, the
# -I of the build). Checks:
#   1. an include crosses layers only downward, as ALLOWED says (a layer is the
#      first directory under lib/; lib/dtensor.h is the umbrella, which may
#      include every layer);
#   2. the public headers are exactly PUBLIC, and PUBLIC is what lib/dtensor.h
#      reaches; a public header includes public headers only, by a path
#      relative to itself (installed as $(includedir)/dtensor/<layer>/<name>.h
#      next to the umbrella $(includedir)/dtensor/dtensor.h, with no -Ilib),
#      never config.h, and from <...> only the C standard headers of STD_HEADERS;
#   3. a private header (any other) is included only by its own layer, or by
#      the layers SHARED names for it;
#   4. every header compiles alone: the public ones from a copy laid out as
#      installed, with -I<that copy> only (`#include <dtensor/...>`), the
#      private ones in place.
# Then it proves it can fail: each planted defect below, in a copy of lib/,
# must be reported with the expected message.
set -u

SRC=$(cd "${srcdir:-.}/lib" 2>/dev/null && pwd) || { echo "layers: no lib/ under ${srcdir:-.}" >&2; exit 99; }
CC="${CC:-cc}"
NAME=layers

# Layers each layer may include, besides its own (core < device, comm < launch
# < mesh < dtensor < ops < autograd < nn < parallel; device and comm know
# nothing of each other, and only the umbrella includes launch).
allowed_of() {
  case "$1" in
    core) echo "" ;;
    device) echo "core" ;;
    comm) echo "core" ;;
    launch) echo "core device comm" ;;
    mesh) echo "core comm" ;;
    dtensor) echo "core comm mesh device" ;;
    ops) echo "core comm mesh dtensor device" ;;
    autograd) echo "core comm mesh dtensor device ops" ;;
    nn) echo "core comm mesh dtensor device ops autograd" ;;
    parallel) echo "core comm mesh dtensor device ops autograd nn" ;;
    umbrella) echo "core device comm launch mesh dtensor ops autograd nn parallel" ;;
    *) return 1 ;;
  esac
}

# The installed headers (paths under lib/; dtensor.h is the umbrella): those
# Makefile.am installs, the lib/ files of its dtensorinc*_HEADERS variables.
AM="${srcdir:-.}/Makefile.am"
PUBLIC=$(sed -e ':a' -e '/\\$/N' -e 's/\\\n//' -e 'ta' "$AM" 2>/dev/null |
  sed -n 's/^dtensorinc[A-Za-z0-9_]*_HEADERS[[:space:]]*=//p' | tr ' \t' '\n\n' | sed -n 's|^lib/||p')
[ -n "$PUBLIC" ] || { echo "layers: no dtensorinc*_HEADERS in $AM" >&2; exit 99; }

# Private headers another layer may include: "header:layer ...".
SHARED="comm/comm_job.h:launch"

STD_HEADERS="stdarg.h stdbool.h stddef.h stdint.h stdio.h stdlib.h string.h math.h limits.h"

command -v "$CC" >/dev/null 2>&1 || { echo "$NAME: no C compiler ($CC)" >&2; exit 99; }
[ -f "$SRC/dtensor.h" ] || { echo "$NAME: no $SRC/dtensor.h" >&2; exit 99; }

T=$(mktemp -d "${TMPDIR:-/tmp}/sb-layers.XXXXXX") || exit 99
trap 'rm -rf "$T"' EXIT INT TERM

in_list() { # WORD LIST...: is WORD one of the words of LIST?
  w=$1
  shift
  for x in $*; do [ "$x" = "$w" ] && return 0; done
  return 1
}

layer_of() { # path under lib/ -> its layer
  case "$1" in
    dtensor.h) echo umbrella ;;
    */*) echo "${1%%/*}" ;;
    *) echo "?" ;;
  esac
}

# Writes "FROM TARGET HOW" for every #include "..." under root $1 to $2, where
# TARGET is the resolved path under root (or "!unresolved:<text>" / "config.h")
# and HOW is "rel" (found next to FROM) or "lib" (found under root, as -Ilib).
graph() {
  root=$1
  (cd "$root" && find . -type f \( -name '*.c' -o -name '*.h' \) | sed 's|^\./||' | sort) |
  while read -r f; do
    case "$f" in */*) d=${f%/*} ;; *) d=. ;; esac
    sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$root/$f" |
    while read -r inc; do
      if [ "$inc" = config.h ]; then
        echo "$f config.h lib"
      elif [ -f "$root/$d/$inc" ]; then
        echo "$f $d/$inc rel"
      elif [ -f "$root/$inc" ]; then
        echo "$f $inc lib"
      else
        echo "$f !unresolved:$inc lib"
      fi
    done
  done | sed -e 's| \./| |' -e ':a' -e 's|\([ /]\)[^ /][^ /]*/\.\./|\1|' -e 'ta' >"$2"
}

# Headers reachable from the umbrella, one a line.
closure() { # graph-file
  echo dtensor.h >"$T/reach"
  while :; do
    n=$(wc -l <"$T/reach")
    while read -r from to how; do
      case "$from" in *.h) ;; *) continue ;; esac
      grep -qx "$from" "$T/reach" && ! grep -qx "$to" "$T/reach" && echo "$to" >>"$T/reach"
    done <"$1"
    [ "$(wc -l <"$T/reach")" -eq "$n" ] && break
  done
  sort "$T/reach"
}

# Checks the tree under $1 (an absolute path); prints one line per defect;
# returns their count (capped). $2 = nocompile skips check 4.
check_tree() {
  root=$1
  bad=0
  graph "$root" "$T/graph"
  pub_sorted=$(for h in $PUBLIC; do echo "$h"; done | sort)
  # 1 and 3: every edge
  while read -r from to how; do
    lf=$(layer_of "$from")
    if ! allowed_of "$lf" >/dev/null; then
      echo "lib/$from: not in a known layer ($lf)"; bad=$((bad + 1)); continue
    fi
    case "$to" in
      !unresolved:*) echo "lib/$from: #include \"${to#!unresolved:}\" does not resolve"; bad=$((bad + 1)); continue ;;
      config.h)
        case "$from" in
          *.h) echo "lib/$from: a header includes config.h"; bad=$((bad + 1)) ;;
        esac
        continue ;;
    esac
    lt=$(layer_of "$to")
    if [ "$lf" != "$lt" ] && ! in_list "$lt" "$(allowed_of "$lf")"; then
      echo "lib/$from: layer $lf may not include $to (layer $lt)"; bad=$((bad + 1))
    fi
    if in_list "$from" "$PUBLIC"; then
      if ! in_list "$to" "$PUBLIC"; then
        echo "lib/$from: public header includes the private header $to"; bad=$((bad + 1))
      elif [ "$how" != rel ]; then
        echo "lib/$from: includes $to by a path that is not relative to itself"; bad=$((bad + 1))
      fi
    elif ! in_list "$to" "$PUBLIC" && [ "$lf" != "$lt" ]; then
      ok=no
      for s in $SHARED; do
        [ "${s%%:*}" = "$to" ] && in_list "$lf" "$(echo "${s#*:}" | tr ',' ' ')" && ok=yes
      done
      [ $ok = yes ] || { echo "lib/$from: includes $to, private to layer $lt"; bad=$((bad + 1)); }
    fi
  done <"$T/graph"
  # 2: the public set is what the umbrella reaches
  reach=$(closure "$T/graph")
  for h in $reach; do
    in_list "$h" "$PUBLIC" || { echo "lib/$h: reached from lib/dtensor.h but not in PUBLIC"; bad=$((bad + 1)); }
  done
  for h in $pub_sorted; do
    [ -f "$root/$h" ] || { echo "lib/$h: in PUBLIC but missing"; bad=$((bad + 1)); continue; }
    in_list "$h" "$reach" || { echo "lib/$h: in PUBLIC but not reached from lib/dtensor.h"; bad=$((bad + 1)); }
    for s in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*<\([^>]*\)>.*/\1/p' "$root/$h"); do
      in_list "$s" "$STD_HEADERS" || { echo "lib/$h: includes <$s>, not a C standard header"; bad=$((bad + 1)); }
    done
  done
  # 4: each header alone; the public ones as installed
  if [ "${2:-}" = nocompile ]; then
    [ $bad -gt 100 ] && bad=100
    return $bad
  fi
  inc="$T/include"
  rm -rf "$inc"
  for h in $pub_sorted; do
    [ -f "$root/$h" ] || continue
    mkdir -p "$inc/dtensor/$(dirname "$h")"
    cp "$root/$h" "$inc/dtensor/$h"
  done
  for h in $(cd "$root" && find . -name '*.h' | sed 's|^\./||' | sort); do
    if in_list "$h" "$PUBLIC"; then
      printf '#include <dtensor/%s>\n' "$h" >"$T/one.c"
      flags="-I$inc"
    else
      printf '#include "%s"\n' "$root/$h" >"$T/one.c"
      flags="-I$root"
    fi
    printf 'int main(void) { return 0; }\n' >>"$T/one.c"
    # shellcheck disable=SC2086 # flags is one word, split on purpose
    if ! "$CC" -std=c11 -Wall -Wextra -Werror -fsyntax-only $flags "$T/one.c" >"$T/cc.err" 2>&1; then
      echo "lib/$h: does not compile alone: $(grep -m1 'error' "$T/cc.err")"; bad=$((bad + 1))
    fi
  done
  [ $bad -gt 100 ] && bad=100
  return $bad
}

fails=0
out=$(check_tree "$SRC")
n=$?
if [ $n -ne 0 ]; then
  echo "FAIL: lib/ has $n layering defect(s):"
  echo "$out" | sed 's/^/  /'
  fails=$((fails + 1))
else
  echo "ok: lib/ include graph, public headers and self-contained headers"
fi

# ---- it can fail: planted defects in a copy of lib/ ----
# plant CASE EXPECTED SED-SCRIPT FILE [nocompile]: a fresh copy with FILE
# edited must fail with a line containing EXPECTED.
plant() {
  case_=$1 want=$2 script=$3 file=$4 mode=${5:-}
  rm -rf "$T/lib"
  mkdir -p "$T/lib"
  (cd "$SRC" && find . -type f \( -name '*.c' -o -name '*.h' \) | tar -cf - -T -) |
    (cd "$T/lib" && tar -xf -) || { echo "FAIL: plant $case_: cannot copy lib/"; fails=$((fails + 1)); return; }
  sed -i "$script" "$T/lib/$file" || { echo "FAIL: plant $case_: cannot edit $file"; fails=$((fails + 1)); return; }
  if got=$(check_tree "$T/lib" "$mode"); then
    echo "FAIL: plant $case_: the planted defect in lib/$file was not reported"
    fails=$((fails + 1))
  elif ! echo "$got" | grep -qF -- "$want"; then
    echo "FAIL: plant $case_: expected a line with '$want', got:"
    echo "$got" | sed 's/^/  /'
    fails=$((fails + 1))
  else
    echo "ok: plant $case_: $(echo "$got" | grep -F -m1 -- "$want")"
  fi
}

plant upward "layer core may not include ops/ops.h" \
  '/#include "core\/core.h"/a #include "ops/ops.h"' core/array.c nocompile
plant sideways "layer device may not include comm/comm.h" \
  '/#include "device\/device.h"/a #include "comm/comm.h"' device/device.c nocompile
plant launch-from-ops "layer ops may not include launch/launch.h" \
  '/#include "ops\/ops.h"/a #include "launch/launch.h"' ops/registry.c nocompile
plant private-across "includes dtensor/tensor_impl.h, private to layer dtensor" \
  '/#include "ops\/ops.h"/a #include "dtensor/tensor_impl.h"' ops/dispatch.c nocompile
plant public-includes-private "public header includes the private header comm/comm_impl.h" \
  '/#include "..\/comm\/comm.h"/a #include "../comm/comm_impl.h"' mesh/mesh.h nocompile
plant not-relative "includes core/core.h by a path that is not relative to itself" \
  's|#include "../core/core.h"|#include "core/core.h"|' device/device.h nocompile
plant config-in-header "a header includes config.h" \
  '/#define DT_MESH_H/a #include "config.h"' mesh/mesh.h nocompile
plant foreign-header "includes <cblas.h>, not a C standard header" \
  '/#include "..\/core\/core.h"/a #include <cblas.h>' device/device.h nocompile
plant not-self-contained "ops/ops.h: does not compile alone" \
  's|#include "../dtensor/dtensor.h"||' ops/ops.h
plant umbrella-gap "lib/launch/launch.h: in PUBLIC but not reached" \
  '/#include "launch\/launch.h"/d' dtensor.h nocompile

if [ $fails -ne 0 ]; then
  echo "$NAME: $fails failure(s)"
  exit 1
fi
echo "$NAME: all checks passed"
exit 0
