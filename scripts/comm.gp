# scripts/comm.gp: communication per training step: one panel per plan, one stacked
# bar per config, sorted by its total (the least first).
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/comm.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/comm.gp
# Reads  datadir/comm.dat           idx label series sid wire_bytes base top
#                                   pid pos npos mark panel short
#        datadir/comm_series.dat    sid series op oid phase_id  (series = phase:op)
#        datadir/comm_baselines.dat idx label framework fid value unit pid pos
# Writes outdir/comm.FMT (FMT = png, the default, or svg), at most 1600 px wide.
#
# Bars: wire bytes per rank (rank 0) per step, ring model, stacked by phase:op
# in step order; colour = op, shade = phase (forward darkest). Crosses: one per
# config, the frameworks' baseline (comm_bytes_per_step_combined): the sum of the
# published formulas its plan's settings select (Megatron-LM TP or TP + sequence
# parallel for tp, DDP / FSDP / HSDP for the dp dims), labelled with their names.
# The formulas count only what the papers count: a bar above its cross moves
# more than the frameworks, a bar below it less. The crosses name their frameworks in
# panels of up to 3 bars (more would overlap).
# Panels (small multiples): pid numbers the plans, pos places a config in its
# panel (rows are sorted by pid, then pos), mark 1/2 its panel's least/most; every
# panel has the same y scale, so panels compare. Each bar is labelled with its mesh
# (short) where the panel leaves 10 px per bar, else only the least and the most.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/comm.dat'
b = datadir.'/comm_baselines.dat'

# The series (phase:op) in stack order, with each one's op colour and phase shade.
names = ''
oids = ''
phases = ''
stats datadir.'/comm_series.dat' \
  using (names = names.strcol(2).' ', oids = oids.strcol(4).' ', phases = phases.strcol(5).' ', $1) \
  nooutput
K = STATS_records
# Colour = the op; fill density = the phase (forward solid, backward, optimizer, other paler).
shade(p) = (p == 1) ? 1.0 : (p == 2) ? 0.6 : (p == 3) ? 0.3 : 0.15
# Bytes in the largest binary unit under the tallest bar, so that tics are round.
stats f using 7 nooutput
M = STATS_max
# (No stats on the baselines file: stats stops the script on an empty file.)
U = (M >= 2**30) ? 2**30 : (M >= 2**20) ? 2**20 : (M >= 2**10) ? 2**10 : 1
Uname = (U == 2**30) ? 'GiB' : (U == 2**20) ? 'MiB' : (U == 2**10) ? 'KiB' : 'bytes'

# ---- the panel grid (the same block in every panel chart) ----
# P panels in C columns and R rows; NMAX the most bars in a panel; LL the longest
# short label. 40 px per bar up to 1600 px in all; labels rotated 90 degrees at
# font 8 take about 0.45 of a 10 pt line per character (about 5.5 px against 12).
stats f using 8 nooutput
P = int(STATS_max)
stats f using 10 nooutput
NMAX = int(STATS_max)
stats f using (strlen(strcol(13))) nooutput
LL = int(STATS_max)
C = (P <= 3) ? P : (P == 4) ? 2 : (P <= 9) ? 3 : (P <= 16) ? 4 : 5
R = int((P + C - 1) / C)
W = C * (NMAX * 40 + 180)
W = (W < 1000) ? 1000 : (W > 1600) ? 1600 : W
# label every bar where the panel's plot area (its width less about 90 px of
# margins) leaves 10 px per bar (a rotated line of font 8); else only the marked ones
allbars(n) = (W / C - 90) / n >= 10
BM = int(LL * 0.45) + 2
# the key strip at the bottom: about 230 px per entry, 18 px per row of entries
KE = K + 1
KPR = int(W / 230)
KH = 16 + 18 * int((KE + KPR - 1) / KPR)
TOP = 40
PHpx = 230 + 12 * BM
PHpx = (TOP + KH + R * PHpx > 1900) ? int((1900 - TOP - KH) / R) : PHpx
H = TOP + KH + R * PHpx
# panel p's first and last row (the rows are sorted by pid), for `every`
array S[P]
array E[P]
do for [p = 1:P] {
  stats f using ($8 == p ? $0 : NaN) nooutput
  S[p] = int(STATS_min)
  E[p] = int(STATS_max)
}
# each panel's plan and bars
array PN[P]
array NP[P]
do for [p = 1:P] {
  stats f every ::S[p]::S[p] using (PN[p] = strcol(12), NP[p] = int($10), 0) nooutput
}

if (fmt eq 'svg') {
  set terminal svg size W,H dynamic noenhanced font 'sans,10' background rgb 'white'
} else {
  if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size W,H noenhanced font 'sans,10' background rgb 'white'
  } else {
    set terminal png size W,H noenhanced
  }
}
set output outdir.'/comm.'.fmt

# the least communication over all panels, for the title: a panel's least (mark 1,
# on its top segment, whose top is its total)
BEST = 1e300
BL = ''
stats f using ($11 == 1 && $7 < BEST ? (BEST = $7, BL = strcol(2), 0) : 0) nooutput
set multiplot title 'Communication per step: wire bytes per rank (ring model), one panel per plan, the least first; least of all: '.BL.' ('.sprintf('%.3g', BEST / U).' '.Uname.')'
set lmargin 9
set rmargin 2
set tmargin 2
set bmargin BM
# the same top in every panel, or higher where a panel's cross is above it
set yrange [0:M / U * 1.12<*]
set grid ytics
set ytics font ',8'
set key off
do for [p = 1:P] {
  n = NP[p]
  set origin ((p - 1) % C) * 1.0 / C, (KH + (R - 1 - int((p - 1) / C)) * PHpx) * 1.0 / H
  set size 1.0 / C, PHpx * 1.0 / H
  set title PN[p].' ('.n.(n == 1 ? ' config)' : ' configs)') font ',10'
  set xrange [-0.6:n - 0.4]
  set xtics rotate by 90 right font ',8' nomirror
  set ylabel (((p - 1) % C) == 0 ? Uname.' per rank per step' : '') font ',9'
  all = allbars(n)
  plot for [i=1:K] f every ::S[p]::E[p] \
         using ($4 == i ? $9 : NaN):(($6 + $7) / 2 / U):($9 - 0.35):($9 + 0.35):($6 / U):($7 / U) \
         with boxxyerror lc int(word(oids, i)) fs solid shade(int(word(phases, i))) \
         border rgb 'white' notitle, \
       f every ::S[p]::E[p] using 9:($7 / U):xticlabels((all || $11 > 0) ? strcol(13) : '') \
         with points pt 0 ps 0 lc rgb 'white' notitle, \
       b using ($7 == p ? $8 : NaN):($5 / U) with points pt 2 ps 1.2 lw 2 lc rgb 'black' notitle, \
       b using ($7 == p && n <= 3 ? $8 + 0.12 : NaN):($5 / U):3 with labels left font ',7' notitle, \
       f every ::S[p]::E[p] using ($9 - 0.45):($7 / U):($11 == 1 ? sprintf('least %.3g', $7 / U) : '') \
         with labels left offset 0, 0.7 font ',8' tc rgb '#222222' notitle, \
       f every ::S[p]::E[p] using ($9 + 0.45):($7 / U):($11 == 2 ? sprintf('most %.3g', $7 / U) : '') \
         with labels right offset 0, 0.7 font ',8' tc rgb '#222222' notitle
}
# the key strip
set origin 0, 0
set size 1, KH * 1.0 / H
unset title
unset border
unset tics
unset grid
unset ylabel
set lmargin 0
set rmargin 0
set tmargin 0
set bmargin 0
set xrange [0:1]
set yrange [0:1]
set key horizontal center center Left reverse maxcols KPR font ',9'
plot for [i=1:K] NaN with boxes lc int(word(oids, i)) fs solid shade(int(word(phases, i))) \
       title word(names, i), \
     NaN with points pt 2 ps 1.2 lw 2 lc rgb 'black' title 'frameworks (published formulas)'
unset multiplot
