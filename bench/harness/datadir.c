/* bench/harness/datadir.c: the run-time lookup of plans/, scripts/ and results/
 * (rules in datadir.h). SB_PKGDATADIR is $(pkgdatadir), given by Makefile.am. */
#include "config.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "datadir.h"

#ifndef SB_PKGDATADIR
#error "SB_PKGDATADIR (the installed data directory) must be defined by the build"
#endif

static const char *const sub_of[] = {"plans", "scripts", "results"};
static const char *const env_of[] = {"SHARDBENCH_PLANS", "SHARDBENCH_SCRIPTS", NULL};

static bool is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* out = a, or a/b when b is not NULL; false when it does not fit. */
static bool put(char *out, size_t n, const char *a, const char *b) {
  int k = b ? snprintf(out, n, "%s/%s", a, b) : snprintf(out, n, "%s", a);
  return k >= 0 && (size_t)k < n;
}

/* Does dir hold the files of kind (plans: a *.plan; scripts: comm.gp; results: schema.sql)? */
static bool holds(sb_data_kind kind, const char *dir) {
  char p[SB_DATA_PATH];
  if (kind != SB_DATA_PLANS)
    return put(p, sizeof p, dir, kind == SB_DATA_SCRIPTS ? "comm.gp" : "schema.sql") && is_file(p);
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  for (struct dirent *e; !found && (e = readdir(d));) {
    size_t l = strlen(e->d_name);
    found = l > 5 && !strcmp(e->d_name + l - 5, ".plan") && put(p, sizeof p, dir, e->d_name) &&
            is_file(p);
  }
  closedir(d);
  return found;
}

/* The prefix the running executable is installed under: /proc/self/exe with
 * its last two components (bin/NAME) removed; false where there is no such link. */
static bool exe_prefix(char *out, size_t n) {
  ssize_t l = readlink("/proc/self/exe", out, n - 1);
  if (l <= 0 || (size_t)l >= n - 1) return false;
  out[l] = '\0';
  for (int i = 0; i < 2; i++) {
    char *slash = strrchr(out, '/');
    if (!slash) return false;
    *slash = '\0';
  }
  return true;
}

bool sb_data_dir(sb_data_kind kind, const char *flag, char *out, size_t n) {
  const char *sub = sub_of[kind];
  if (flag && *flag) return put(out, n, flag, NULL);
  const char *env = env_of[kind] ? getenv(env_of[kind]) : NULL;
  if (env && *env) return put(out, n, env, NULL);
  if ((env = getenv("SHARDBENCH_DATADIR")) && *env) return put(out, n, env, sub);
  if (holds(kind, sub)) return put(out, n, sub, NULL);
  char prefix[SB_DATA_PATH], dir[SB_DATA_PATH + 32];
  if (exe_prefix(prefix, sizeof prefix) &&
      snprintf(dir, sizeof dir, "%s/share/" PACKAGE "/%s", prefix, sub) < (int)sizeof dir &&
      holds(kind, dir))
    return put(out, n, dir, NULL);
  return put(out, n, SB_PKGDATADIR, sub) && holds(kind, out);
}

const char *sb_data_file(sb_data_kind kind, const char *name, char *out, size_t n) {
  char dir[SB_DATA_PATH];
  sb_data_dir(kind, NULL, dir, sizeof dir);
  put(out, n, dir, name);
  return out;
}
