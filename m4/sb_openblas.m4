# SB_CHECK_OPENBLAS: cblas from OpenBLAS (required: the CPU device's GEMM).
AC_DEFUN([SB_CHECK_OPENBLAS], [
  AC_ARG_VAR([BLAS_LIBS], [linker flags for cblas (default: -lopenblas)])
  AC_CHECK_HEADER([cblas.h], [],
    [AC_MSG_ERROR([cblas.h not found; install OpenBLAS (Debian: libopenblas-dev) or run scripts/install-deps])])
  sb_save_LIBS="$LIBS"
  AS_IF([test "x$BLAS_LIBS" = x], [
    AC_SEARCH_LIBS([cblas_sgemm], [openblas cblas blas], [],
      [AC_MSG_ERROR([cblas_sgemm not found; install OpenBLAS (Debian: libopenblas-dev)])])
    AS_IF([test "x$ac_cv_search_cblas_sgemm" != "xnone required"],
          [BLAS_LIBS="$ac_cv_search_cblas_sgemm"])
  ], [LIBS="$BLAS_LIBS $LIBS"])
  AC_CHECK_FUNCS([openblas_set_num_threads openblas_get_num_threads])
  LIBS="$sb_save_LIBS"
  AC_SUBST([BLAS_LIBS])
])
