# scripts/cp_memory.gp: peak memory per rank against the context-parallel degree cp,
# for a fixed global sequence.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/cp_memory.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/cp_memory.gp
# Reads  datadir/cp_memory.dat  gid label cp peak_mib activations_mib status
#                               peak_mem_bytes activations_bytes
# Writes outdir/cp_memory.FMT (FMT = png, the default, or svg).
#
# One colour per group (gid 1..G: configs that differ only in cp, rows sorted by
# cp): solid line = the peak of the busiest rank over the run, dashed line = rank
# 0's activations and buffers (NaN where not recorded: no point). x is cp on a
# log2 axis. Red rings mark mismatched results.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

f = datadir.'/cp_memory.dat'
stats f using 1 nooutput
G = int(STATS_max)
stats f using 3 nooutput
CPMIN = STATS_min
CPMAX = STATS_max
# The groups' labels in gid order (labels have no blanks: word(labels, g) is gid g's).
labels = ''
stats f using (int($1) > words(labels) ? (labels = labels.strcol(2).' ', 0) : 0) nooutput
# Whether any row is mismatched, so that the key names the ring only when drawn.
stats f using (strcol(6) eq 'mismatch' ? 1 : 0) nooutput
NMIS = int(STATS_sum)

# The groups with at least one activations point: a key entry only for what is drawn.
acts = ' '
stats f using (valid(5) ? (acts = acts.sprintf('%d ', int($1)), 0) : 0) nooutput
has_acts(g) = strstrt(acts, sprintf(' %d ', g)) > 0

# A 700 px plot and, on the right, the key: the longest label and ' activations
# (rank 0)' at about 6.5 px per character of a 10 pt font, at most 1600 px in all.
# The key lists two lines per group at about 13 px each (font 9): the height grows
# with the groups, from 600 px up to 2000.
stats f using (strlen(strcol(2))) nooutput
W = 700 + int((STATS_max + 24) * 6.5)
W = (W > 1600) ? 1600 : W
H = 120 + 26 * G
H = (H < 600) ? 600 : (H > 2000) ? 2000 : H
if (fmt eq 'svg') {
  set terminal svg size W,H dynamic noenhanced font 'sans,10' background rgb 'white'
} else {
  if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size W,H noenhanced font 'sans,10' background rgb 'white'
  } else {
    set terminal png size W,H noenhanced
  }
}
set output outdir.'/cp_memory.'.fmt

set title 'Peak memory per rank vs context-parallel degree (fixed global sequence)'
set xlabel 'cp (context-parallel degree, log2 axis)'
set ylabel 'MiB per rank'
set logscale x 2
# Half a factor of 2 of room either side of the extreme cp values.
set xrange [CPMIN / sqrt(2):CPMAX * sqrt(2)]
set xtics 2 format '%g' nomirror
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set grid xtics ytics
set key outside right top vertical Left reverse font ',9'

# Curve i: group (i + 1) / 2's peak (odd i, solid) or activations (even i, dashed),
# so that the key lists each group's two lines together.
gid(i) = (i + 1) / 2
# (dt takes a function call; a parenthesised expression would read as a dash pattern)
dash(i) = i % 2 ? 1 : 2
plot for [i=1:2 * G] f using 3:(int($1) == gid(i) ? column(i % 2 ? 4 : 5) : NaN) \
       with linespoints lw (i % 2 ? 2 : 1.5) pt (i % 2 ? 7 : 6) ps (i % 2 ? 1.2 : 1.0) \
       lc gid(i) dt dash(i) \
       title (i % 2 ? word(labels, gid(i)).' peak' : \
              has_acts(gid(i)) ? word(labels, gid(i)).' activations (rank 0)' : ''), \
     f using 3:(strcol(6) eq 'mismatch' ? $4 : NaN) with points pt 6 ps 2.4 lw 2 \
       lc rgb '#d62728' title (NMIS > 0 ? 'mismatch (wrong result)' : '')
