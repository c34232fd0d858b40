# SB_CHECK_GNUPLOT: gnuplot for `shardbench report` (optional at build time: the
# report still writes its data files; charts need gnuplot at run time).
AC_DEFUN([SB_CHECK_GNUPLOT], [
  AC_PATH_PROG([GNUPLOT], [gnuplot], [])
  AS_IF([test "x$GNUPLOT" != x], [sb_have_gnuplot=yes], [sb_have_gnuplot=no])
])
