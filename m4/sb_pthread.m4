# SB_CHECK_PTHREAD: POSIX threads (required: the threads comm backend).
AC_DEFUN([SB_CHECK_PTHREAD], [
  AC_CHECK_HEADER([pthread.h], [], [AC_MSG_ERROR([pthread.h not found; POSIX threads are required])])
  sb_save_CFLAGS="$CFLAGS"
  CFLAGS="$CFLAGS -pthread"
  AC_SEARCH_LIBS([pthread_create], [pthread], [],
    [AC_MSG_ERROR([pthread_create not found; POSIX threads are required])])
  CFLAGS="$sb_save_CFLAGS"
  PTHREAD_CFLAGS="-pthread"
  AC_SUBST([PTHREAD_CFLAGS])
])
