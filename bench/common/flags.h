/* bench/common/flags.h: flag values and the one-line bad-flag message that the
 * shardbench programs share: the harness (bench/harness/shardbench.c builds its
 * sb_parse_long, sb_parse_bytes and sb_usage_error on them) and the
 * micro-benchmarks of bench/micro.
 *
 * For programs only: they print and exit, which libdtensor never does. The
 * parsers print nothing and tell a malformed value (SB_FLAG_SYNTAX) from one
 * out of range (SB_FLAG_RANGE), so each program keeps its own wording.
 */
#ifndef SB_COMMON_FLAGS_H
#define SB_COMMON_FLAGS_H

#include <stdarg.h>
#include <stddef.h>

#include "dtensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a parser found. */
enum { SB_FLAG_OK = 0, SB_FLAG_SYNTAX = 1, SB_FLAG_RANGE = 2 };
/* The exit code of bad input (bench/harness/cli.h's SB_EXIT_USAGE). */
enum { SB_FLAG_EXIT = 2 };

/* A decimal integer, the whole of s (no leading space, nothing after it), in
 * lo..hi. RANGE: *out is the value; SYNTAX (or beyond long): *out untouched. */
int sb_flag_long(const char *s, long lo, long hi, long *out);
/* sb_flag_long into an int (lo, hi within int); *out set only when OK. */
int sb_flag_int(const char *s, int lo, int hi, int *out);
/* A byte count: 4096, 64K, 1M, 2G (powers of 1024; an optional trailing B),
 * 1..max bytes. */
int sb_flag_bytes(const char *s, size_t max, size_t *out);
/* A finite number > 0 (strtod's syntax, the whole of s). */
int sb_flag_positive(const char *s, double *out);

/* "PROG: WHERE: message" (WHERE omitted when NULL) as one line on stderr (any
 * newline in the message made a space); returns SB_FLAG_EXIT, so that
 * `return sb_flag_bad(...)` ends a program's flag parsing. */
int sb_flag_bad(const char *prog, const char *where, const char *fmt, ...) DT_PRINTF(3, 4);
int sb_flag_vbad(const char *prog, const char *where, const char *fmt, va_list ap);
/* getopt_long's ':' (the optstring begins with ':') and '?': "PROG: FLAG: missing
 * value" or "PROG: FLAG: unknown flag", FLAG the short option ("-x") or the word
 * given; returns SB_FLAG_EXIT. */
int sb_flag_getopt_bad(const char *prog, int ch, char **argv);
/* For argv parsed by hand: the value of flag in lo..hi, or
 * `PROG: FLAG wants an integer in [LO, HI], got "S"` and exit(SB_FLAG_EXIT). */
int sb_flag_int_arg(const char *prog, const char *flag, const char *s, int lo, int hi);
/* The same for a finite number > 0: `PROG: FLAG wants a positive number, got "S"`. */
double sb_flag_positive_arg(const char *prog, const char *flag, const char *s);

#ifdef __cplusplus
}
#endif
#endif
