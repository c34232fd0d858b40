# SB_CHECK_JANSSON: Jansson (required: libdtensor parses safetensors headers with it).
# Sets JANSSON_CFLAGS / JANSSON_LIBS from jansson.pc when pkg-config knows it
# (sb_jansson_pc=yes, so dtensor.pc can require it), else from a plain search.
AC_DEFUN([SB_CHECK_JANSSON], [
  sb_jansson_pc=no
  AS_IF([test "x$PKG_CONFIG" != x && $PKG_CONFIG --exists 'jansson >= 2.10'],
    [JANSSON_CFLAGS=`$PKG_CONFIG --cflags jansson`
     JANSSON_LIBS=`$PKG_CONFIG --libs jansson`
     sb_jansson_pc=yes],
    [JANSSON_CFLAGS=""
     JANSSON_LIBS="-ljansson"])
  sb_save_CPPFLAGS="$CPPFLAGS"
  sb_save_LIBS="$LIBS"
  CPPFLAGS="$CPPFLAGS $JANSSON_CFLAGS"
  LIBS="$JANSSON_LIBS $LIBS"
  AC_CHECK_HEADER([jansson.h], [],
    [AC_MSG_ERROR([jansson.h not found; install Jansson (Debian: libjansson-dev) or run scripts/install-deps])])
  AC_MSG_CHECKING([for json_loadb in $JANSSON_LIBS])
  AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <jansson.h>]],
                                  [[json_error_t e; return json_loadb("{}", 2, JSON_REJECT_DUPLICATES, &e) == 0;]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([libjansson not usable; install Jansson >= 2.10 (Debian: libjansson-dev)])])
  CPPFLAGS="$sb_save_CPPFLAGS"
  LIBS="$sb_save_LIBS"
  AC_SUBST([JANSSON_CFLAGS])
  AC_SUBST([JANSSON_LIBS])
])
