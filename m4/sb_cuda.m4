# SB_CHECK_CUDA: the CUDA toolkit with cuBLAS (cuda device) and NCCL (nccl comm, later).
#   --with-cuda[=PREFIX]  require it (PREFIX: the toolkit root)
#   --without-cuda        do not build it
#   (default)             build it when found: nvcc on PATH gives the prefix, else
#                         the toolkit's standard prefix /usr/local/cuda.
# Built and linked whenever found; run only where a GPU exists.
AC_DEFUN([SB_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=PREFIX|yes|no|auto@:>@], [build the CUDA device (default: auto)])],
    [], [with_cuda=auto])
  AC_ARG_WITH([nccl],
    [AS_HELP_STRING([--with-nccl@<:@=PREFIX|yes|no|auto@:>@], [use NCCL with CUDA (default: auto; PREFIX defaults to the CUDA prefix)])],
    [], [with_nccl=auto])
  sb_have_cuda=no
  sb_have_nccl=no
  sb_cuda_prefix=""
  CUDA_CFLAGS=""
  CUDA_LIBS=""
  AS_IF([test "x$with_cuda" != xno], [
    AS_CASE([$with_cuda],
      [yes|auto], [
        AC_PATH_PROG([NVCC], [nvcc], [], [$PATH:/usr/local/cuda/bin])
        AS_IF([test "x$NVCC" != x], [sb_cuda_prefix=`dirname "$NVCC"`; sb_cuda_prefix=`dirname "$sb_cuda_prefix"`],
              [test -d /usr/local/cuda], [sb_cuda_prefix=/usr/local/cuda])],
      [sb_cuda_prefix="$with_cuda"])
    AS_IF([test "x$sb_cuda_prefix" != x], [
      sb_cuda_libdir="$sb_cuda_prefix/lib64"
      AS_IF([test -d "$sb_cuda_libdir"], [], [sb_cuda_libdir="$sb_cuda_prefix/lib"])
      sb_save_CPPFLAGS="$CPPFLAGS"
      sb_save_LIBS="$LIBS"
      CPPFLAGS="$CPPFLAGS -I$sb_cuda_prefix/include"
      LIBS="-L$sb_cuda_libdir -Wl,-rpath,$sb_cuda_libdir -lcublas -lcudart $LIBS"
      AC_MSG_CHECKING([for the CUDA runtime and cuBLAS in $sb_cuda_prefix])
      AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <cuda_runtime.h>
#include <cublas_v2.h>]], [[int n; cublasHandle_t h; cudaGetDeviceCount(&n); cublasCreate(&h);]])],
        [sb_have_cuda=yes], [sb_have_cuda=no])
      AC_MSG_RESULT([$sb_have_cuda])
      AS_IF([test "x$sb_have_cuda" = xyes && test ! -x "$sb_cuda_prefix/bin/nvcc"], [
        AC_MSG_WARN([no nvcc in $sb_cuda_prefix/bin: the CUDA device needs it for its kernels])
        sb_have_cuda=no])
      AS_IF([test "x$sb_have_cuda" = xyes], [
        NVCC="$sb_cuda_prefix/bin/nvcc"
        CUDA_CFLAGS="-I$sb_cuda_prefix/include"
        CUDA_LIBS="-L$sb_cuda_libdir -Wl,-rpath,$sb_cuda_libdir -lcublas -lcudart"
        AS_IF([test "x$with_nccl" != xno], [
          sb_nccl_prefix="$sb_cuda_prefix"
          AS_CASE([$with_nccl], [yes|auto], [], [sb_nccl_prefix="$with_nccl"])
          sb_nccl_libdir="$sb_nccl_prefix/lib64"
          AS_IF([test -d "$sb_nccl_libdir"], [], [sb_nccl_libdir="$sb_nccl_prefix/lib"])
          CPPFLAGS="$CPPFLAGS -I$sb_nccl_prefix/include"
          LIBS="-L$sb_nccl_libdir -lnccl $LIBS"
          AC_MSG_CHECKING([for NCCL])
          AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <nccl.h>]], [[int v; ncclGetVersion(&v);]])],
            [sb_have_nccl=yes], [sb_have_nccl=no])
          AC_MSG_RESULT([$sb_have_nccl])
          AS_IF([test "x$sb_have_nccl" = xyes], [
            AS_IF([test "x$sb_nccl_prefix" != "x$sb_cuda_prefix"], [CUDA_CFLAGS="$CUDA_CFLAGS -I$sb_nccl_prefix/include"])
            AS_IF([test "x$sb_nccl_libdir" = "x$sb_cuda_libdir"], [CUDA_LIBS="-lnccl $CUDA_LIBS"],
              [CUDA_LIBS="-L$sb_nccl_libdir -Wl,-rpath,$sb_nccl_libdir -lnccl $CUDA_LIBS"])])
        ])
      ])
      CPPFLAGS="$sb_save_CPPFLAGS"
      LIBS="$sb_save_LIBS"
    ])
  ])
  AS_IF([test "x$with_cuda" != xno && test "x$with_cuda" != xauto && test "x$sb_have_cuda" = xno],
    [AC_MSG_ERROR([--with-cuda was given but the CUDA runtime and cuBLAS were not found (prefix: ${sb_cuda_prefix:-none})])])
  AS_IF([test "x$with_nccl" != xno && test "x$with_nccl" != xauto && test "x$sb_have_nccl" = xno],
    [AC_MSG_ERROR([--with-nccl was given but NCCL was not found])])
  AS_IF([test "x$sb_have_cuda" = xyes], [AC_DEFINE([HAVE_CUDA], [1], [Define to 1 to build the CUDA device.])])
  AS_IF([test "x$sb_have_nccl" = xyes], [AC_DEFINE([HAVE_NCCL], [1], [Define to 1 when NCCL is available.])])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$sb_have_cuda" = xyes])
  AM_CONDITIONAL([HAVE_NCCL], [test "x$sb_have_nccl" = xyes])
  # NVCCFLAGS: sm_90 (H100, H200) machine code plus compute_90 PTX, which newer
  # GPUs JIT-compile; set NVCCFLAGS to build for others.
  AC_ARG_VAR([NVCCFLAGS], [nvcc flags (default: -O3 for sm_90 with compute_90 PTX)])
  AS_IF([test "x$NVCCFLAGS" = x],
    [NVCCFLAGS="-O3 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90"])
  NVCCFLAGS="$NVCCFLAGS -std=c++17 --extended-lambda"
  AC_SUBST([NVCC])
  AC_SUBST([CUDA_CFLAGS])
  AC_SUBST([CUDA_LIBS])
])
