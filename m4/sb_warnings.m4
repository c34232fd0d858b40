# SB_CHECK_WARNINGS: the warning set every build uses (add -Werror through CFLAGS
# or --enable-werror). Each flag is kept only when the compiler accepts it.
AC_DEFUN([SB_CHECK_WARNINGS], [
  AC_ARG_ENABLE([werror],
    [AS_HELP_STRING([--enable-werror], [treat compiler warnings as errors])],
    [], [enable_werror=no])
  SB_WARN_CFLAGS=""
  sb_save_CFLAGS="$CFLAGS"
  for sb_flag in -Wall -Wextra -Wshadow -Wformat=2 -Wstrict-prototypes -Wmissing-prototypes \
                 -Wno-unused-parameter; do
    CFLAGS="$sb_save_CFLAGS -Werror $sb_flag"
    AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])],
      [SB_WARN_CFLAGS="$SB_WARN_CFLAGS $sb_flag"])
  done
  CFLAGS="$sb_save_CFLAGS"
  AS_IF([test "x$enable_werror" = xyes], [SB_WARN_CFLAGS="$SB_WARN_CFLAGS -Werror"])
  AC_SUBST([SB_WARN_CFLAGS])
  # C++ (the host build of the GPU kernels): the flags of the C set that apply.
  SB_WARN_CXXFLAGS="-Wall -Wextra -Wshadow -Wno-unused-parameter"
  AS_IF([test "x$enable_werror" = xyes], [SB_WARN_CXXFLAGS="$SB_WARN_CXXFLAGS -Werror"])
  AC_SUBST([SB_WARN_CXXFLAGS])
])
