/* bench/stats.h: the median every benchmark reports (header-only; the bench
 * programs are separate executables). */
#ifndef SB_STATS_H
#define SB_STATS_H

#include <stdlib.h>

static inline int sb_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n), n >= 1; sorts v in place (v[0] and v[n-1] are then
 * the minimum and maximum). */
static inline double sb_median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, sb_cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#endif
