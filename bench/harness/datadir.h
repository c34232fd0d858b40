/* bench/harness/datadir.h: where shardbench finds its data files at run time.
 *
 * The data root holds plans/ (*.plan, README.md), results/ (schema.sql,
 * published.csv) and scripts/ (the gnuplot *.gp of `shardbench report`): the
 * top of the source tree and the installed $(pkgdatadir) (= $(datadir)/shardbench)
 * have the same layout. A directory is chosen by the first rule that applies:
 *   1. the command-line flag (--plans-dir, --scripts), as given;
 *   2. the kind's own variable, $SHARDBENCH_PLANS or $SHARDBENCH_SCRIPTS, as given;
 *   3. $SHARDBENCH_DATADIR/<sub>, as given;
 *   4. ./<sub> in the working directory, when it holds the kind's files (so the
 *      programs run from the top of the source tree use its plans and scripts);
 *   5. <directory of the executable>/../share/shardbench/<sub>, when it holds
 *      them (an installed tree moved elsewhere, or staged with DESTDIR; Linux's
 *      /proc/self/exe);
 *   6. the installed $(pkgdatadir)/<sub>, fixed at configure time, when it holds them.
 * "Holds the kind's files": plans/ has a *.plan file, scripts/ has comm.gp,
 * results/ has schema.sql. A directory given by rules 1-3 is not probed: what
 * is missing in it is reported against the path the user gave. */
#ifndef SB_DATADIR_H
#define SB_DATADIR_H

#include <stdbool.h>
#include <stddef.h>

typedef enum sb_data_kind { SB_DATA_PLANS = 0, SB_DATA_SCRIPTS, SB_DATA_RESULTS } sb_data_kind;

/* Room for a data path; callers' buffers of this size never truncate in practice. */
enum { SB_DATA_PATH = 1024 };

/* Writes the directory of `kind` to out[0..n) (flag: the command-line value, or
 * NULL / "" when none). Returns true when a rule chose it; false when no
 * directory holds the files (out then names the installed one, rule 6, for the
 * caller's message) or the path does not fit in n. */
bool sb_data_dir(sb_data_kind kind, const char *flag, char *out, size_t n);

/* out = the directory of `kind` (no flag) + "/" + name; returns out, so that a
 * default can be computed in an initializer. The path is the installed one when
 * no directory holds the files (the open that follows then names it). */
const char *sb_data_file(sb_data_kind kind, const char *name, char *out, size_t n);

#endif
