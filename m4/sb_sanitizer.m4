# SB_CHECK_SANITIZER: --enable-sanitizer=thread | address (address adds UBSan).
# `./configure --enable-sanitizer=thread && make check` runs the suite under TSan.
AC_DEFUN([SB_CHECK_SANITIZER], [
  AC_ARG_ENABLE([sanitizer],
    [AS_HELP_STRING([--enable-sanitizer=thread|address], [build everything with ThreadSanitizer, or AddressSanitizer + UBSan])],
    [], [enable_sanitizer=no])
  AS_CASE([$enable_sanitizer],
    [no], [sb_sanitizer=none; SAN_CFLAGS=""],
    [thread|tsan], [sb_sanitizer=thread; SAN_CFLAGS="-fsanitize=thread -fno-omit-frame-pointer -O1 -g"],
    [address|asan|yes], [sb_sanitizer=address; SAN_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1 -g"],
    [AC_MSG_ERROR([--enable-sanitizer: expected thread or address, got '$enable_sanitizer'])])
  AS_IF([test "x$SAN_CFLAGS" != x], [
    sb_save_CFLAGS="$CFLAGS"; sb_save_LDFLAGS="$LDFLAGS"
    CFLAGS="$CFLAGS $SAN_CFLAGS"; LDFLAGS="$LDFLAGS $SAN_CFLAGS"
    AC_MSG_CHECKING([whether $CC supports $SAN_CFLAGS])
    AC_LINK_IFELSE([AC_LANG_PROGRAM([], [])], [AC_MSG_RESULT([yes])],
      [AC_MSG_RESULT([no]); AC_MSG_ERROR([the compiler cannot build with $SAN_CFLAGS])])
    CFLAGS="$sb_save_CFLAGS"; LDFLAGS="$sb_save_LDFLAGS"
  ])
  SB_SANITIZER="$sb_sanitizer"
  AC_SUBST([SAN_CFLAGS])
  AC_SUBST([SB_SANITIZER])
])
