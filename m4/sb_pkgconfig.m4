# SB_PKGCONFIG_DEPS: what a static link against libdtensor needs, for dtensor.pc.
# A dependency that ships its own .pc goes to Requires.private (OpenBLAS as
# openblas, Jansson as jansson, Open MPI as ompi-c: Debian's libopenblas-dev,
# libjansson-dev and libopenmpi-dev ship them), so pkg-config --static adds its own private libraries; the others (CUDA,
# cuBLAS and NCCL have no .pc in the standard search path; a BLAS given as
# BLAS_LIBS) go to Libs.private as configure found them, with the system
# libraries (-lpthread -lm and whatever else LIBS gathered). A shared link needs
# neither: libdtensor.so records its dependencies itself.
# Run after SB_CHECK_OPENBLAS, SB_CHECK_JANSSON, SB_CHECK_MPI, SB_CHECK_CUDA and PKG_PROG_PKG_CONFIG.
AC_DEFUN([SB_PKGCONFIG_DEPS], [
  DT_PC_REQUIRES_PRIVATE=""
  DT_PC_LIBS_PRIVATE="$CUDA_LIBS"
  AS_IF([test "x$BLAS_LIBS" = "x-lopenblas" && test "x$PKG_CONFIG" != x &&
         $PKG_CONFIG --exists openblas],
    [DT_PC_REQUIRES_PRIVATE="openblas"],
    [DT_PC_LIBS_PRIVATE="$DT_PC_LIBS_PRIVATE $BLAS_LIBS"])
  AS_IF([test "x$sb_have_mpi" = xyes], [
    AS_IF([test "x$PKG_CONFIG" != x && $PKG_CONFIG --exists ompi-c],
      [DT_PC_REQUIRES_PRIVATE="${DT_PC_REQUIRES_PRIVATE:+$DT_PC_REQUIRES_PRIVATE, }ompi-c"],
      [DT_PC_LIBS_PRIVATE="$DT_PC_LIBS_PRIVATE $MPI_LIBS"])])
  AS_IF([test "x$sb_jansson_pc" = xyes],
    [DT_PC_REQUIRES_PRIVATE="${DT_PC_REQUIRES_PRIVATE:+$DT_PC_REQUIRES_PRIVATE, }jansson"],
    [DT_PC_LIBS_PRIVATE="$DT_PC_LIBS_PRIVATE $JANSSON_LIBS"])
  sb_pc_sys="$LIBS"
  for sb_lib in -lpthread -lm; do
    AS_CASE([" $sb_pc_sys "], [*" $sb_lib "*], [], [sb_pc_sys="$sb_pc_sys $sb_lib"])
  done
  DT_PC_LIBS_PRIVATE=`echo $DT_PC_LIBS_PRIVATE $sb_pc_sys`
  AC_SUBST([DT_PC_REQUIRES_PRIVATE])
  AC_SUBST([DT_PC_LIBS_PRIVATE])
])
