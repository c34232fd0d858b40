/* bench/common/flags.c: the flag parsers and bad-flag messages of
 * bench/common/flags.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flags.h"

int sb_flag_long(const char *s, long lo, long hi, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (end == s || *end || errno == ERANGE || isspace((unsigned char)*s)) return SB_FLAG_SYNTAX;
  *out = v;
  return v < lo || v > hi ? SB_FLAG_RANGE : SB_FLAG_OK;
}

int sb_flag_int(const char *s, int lo, int hi, int *out) {
  long v;
  const int rc = sb_flag_long(s, lo, hi, &v);
  if (rc == SB_FLAG_OK) *out = (int)v;
  return rc;
}

int sb_flag_bytes(const char *s, size_t max, size_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  unsigned shift = 0;
  if (end == s || errno == ERANGE || s[0] == '-' || isspace((unsigned char)*s))
    return SB_FLAG_SYNTAX;
  switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') end++;
  if (*end) return SB_FLAG_SYNTAX;
  if (v > (unsigned long long)max >> shift || (v << shift) == 0) return SB_FLAG_RANGE;
  *out = (size_t)(v << shift);
  return SB_FLAG_OK;
}

int sb_flag_positive(const char *s, double *out) {
  char *end;
  double x = strtod(s, &end);
  if (*s == '\0' || *end != '\0') return SB_FLAG_SYNTAX;
  if (!(x > 0) || !isfinite(x)) return SB_FLAG_RANGE;
  *out = x;
  return SB_FLAG_OK;
}

int sb_flag_vbad(const char *prog, const char *where, const char *fmt, va_list ap) {
  char msg[4096];
  vsnprintf(msg, sizeof msg, fmt, ap);
  /* One line: a newline inside a library reason would split it. */
  for (char *p = msg; *p; p++)
    if (*p == '\n' || *p == '\r') *p = ' ';
  if (where) fprintf(stderr, "%s: %s: %s\n", prog, where, msg);
  else fprintf(stderr, "%s: %s\n", prog, msg);
  return SB_FLAG_EXIT;
}

int sb_flag_bad(const char *prog, const char *where, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = sb_flag_vbad(prog, where, fmt, ap);
  va_end(ap);
  return rc;
}

int sb_flag_getopt_bad(const char *prog, int ch, char **argv) {
  /* optind has moved past the offending word; optopt is the short option, or 0
   * for an unknown long one (then the word itself names it). */
  if (ch == ':') return sb_flag_bad(prog, argv[optind - 1], "missing value");
  if (optopt) {
    const char f[3] = {'-', (char)optopt, 0};
    return sb_flag_bad(prog, f, "unknown flag");
  }
  return sb_flag_bad(prog, argv[optind - 1], "unknown flag");
}

int sb_flag_int_arg(const char *prog, const char *flag, const char *s, int lo, int hi) {
  int v;
  if (sb_flag_int(s, lo, hi, &v) != SB_FLAG_OK) {
    fprintf(stderr, "%s: %s wants an integer in [%d, %d], got \"%s\"\n", prog, flag, lo, hi, s);
    exit(SB_FLAG_EXIT);
  }
  return v;
}

double sb_flag_positive_arg(const char *prog, const char *flag, const char *s) {
  double x;
  if (sb_flag_positive(s, &x) != SB_FLAG_OK) {
    fprintf(stderr, "%s: %s wants a positive number, got \"%s\"\n", prog, flag, s);
    exit(SB_FLAG_EXIT);
  }
  return x;
}
