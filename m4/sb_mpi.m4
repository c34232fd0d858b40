# SB_CHECK_MPI: Open MPI for the mpi comm backend.
#   --with-mpi        require it (error when missing)
#   --without-mpi     do not build it
#   (default)         build it when found
# Flags come from `mpicc --showme` (Open MPI's wrapper), else from pkg-config ompi-c.
AC_DEFUN([SB_CHECK_MPI], [
  AC_ARG_WITH([mpi],
    [AS_HELP_STRING([--with-mpi@<:@=yes|no|auto@:>@], [build the Open MPI comm backend (default: auto)])],
    [], [with_mpi=auto])
  AC_ARG_VAR([MPICC], [Open MPI compiler wrapper used to find MPI flags])
  AC_ARG_VAR([MPIRUN], [mpirun used by the MPI tests])
  sb_have_mpi=no
  MPI_CFLAGS=""
  MPI_LIBS=""
  AS_IF([test "x$with_mpi" != xno], [
    AC_PATH_PROGS([MPICC], [mpicc], [])
    AS_IF([test "x$MPICC" != x], [
      MPI_CFLAGS=`$MPICC --showme:compile 2>/dev/null`
      MPI_LIBS=`$MPICC --showme:link 2>/dev/null`
    ])
    AS_IF([test "x$MPI_LIBS" = x], [
      MPI_CFLAGS=`pkg-config --cflags ompi-c 2>/dev/null`
      MPI_LIBS=`pkg-config --libs ompi-c 2>/dev/null`
    ])
    sb_save_CPPFLAGS="$CPPFLAGS"
    sb_save_LIBS="$LIBS"
    CPPFLAGS="$CPPFLAGS $MPI_CFLAGS"
    LIBS="$MPI_LIBS $LIBS"
    AC_MSG_CHECKING([for a working MPI (mpi.h, MPI_Init_thread)])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([[#include <mpi.h>]],
        [[int p; MPI_Init_thread(0, 0, MPI_THREAD_SERIALIZED, &p); MPI_Finalize();]])],
      [sb_have_mpi=yes], [sb_have_mpi=no])
    AC_MSG_RESULT([$sb_have_mpi])
    CPPFLAGS="$sb_save_CPPFLAGS"
    LIBS="$sb_save_LIBS"
    AS_IF([test "x$sb_have_mpi" = xyes], [AC_PATH_PROGS([MPIRUN], [mpirun mpiexec], [])])
    AS_IF([test "x$sb_have_mpi" = xyes && test "x$MPIRUN" = x], [
      AS_IF([test "x$with_mpi" = xyes],
        [AC_MSG_ERROR([--with-mpi: MPI headers found but no mpirun; install openmpi-bin])])
      AC_MSG_WARN([MPI found but no mpirun: MPI tests will be skipped])])
  ])
  AS_IF([test "x$with_mpi" = xyes && test "x$sb_have_mpi" = xno],
    [AC_MSG_ERROR([--with-mpi was given but no working Open MPI was found (Debian: libopenmpi-dev openmpi-bin)])])
  AS_IF([test "x$sb_have_mpi" = xyes], [
    AC_DEFINE([HAVE_MPI], [1], [Define to 1 to build the MPI comm backend.])
    sb_mpi_summary=", mpi"
  ], [MPI_CFLAGS=""; MPI_LIBS=""; sb_mpi_summary=""])
  AM_CONDITIONAL([HAVE_MPI], [test "x$sb_have_mpi" = xyes])
  AC_SUBST([MPI_CFLAGS])
  AC_SUBST([MPI_LIBS])
  SB_HAVE_MPI="$sb_have_mpi"
  AC_SUBST([SB_HAVE_MPI])
])
