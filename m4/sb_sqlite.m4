# SB_CHECK_SQLITE: SQLite 3 (required: the results store).
AC_DEFUN([SB_CHECK_SQLITE], [
  AC_CHECK_HEADER([sqlite3.h], [],
    [AC_MSG_ERROR([sqlite3.h not found; install SQLite (Debian: libsqlite3-dev) or run scripts/install-deps])])
  sb_save_LIBS="$LIBS"
  AC_SEARCH_LIBS([sqlite3_open_v2], [sqlite3], [],
    [AC_MSG_ERROR([libsqlite3 not found; install SQLite (Debian: libsqlite3-dev)])])
  SQLITE_LIBS="$ac_cv_search_sqlite3_open_v2"
  AS_IF([test "x$SQLITE_LIBS" = "xnone required"], [SQLITE_LIBS=""])
  LIBS="$sb_save_LIBS"
  AC_SUBST([SQLITE_LIBS])
])
