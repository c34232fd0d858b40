# scripts/throughput.gp: tokens/s and MFU per config: one panel per plan, the
# fastest first.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/throughput.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/throughput.gp
# Reads  datadir/throughput.dat  idx label mesh plan world tokens_per_s mfu_pct tflops
#                                step_time_s status peak_tflops pid pos npos mark panel
#                                short mfu_axis
# Writes outdir/throughput.FMT (FMT = png, the default, or svg), at most 1600 px wide.
#
# Bars: tokens/s over all ranks (left axis), blue for status ok, red for mismatch
# (measured, but the numbers were wrong). Black diamonds: MFU (right axis, % of the
# recorded peak; none where the result recorded no peak: NaN in mfu_pct).
# Panels (small multiples): pid numbers the plans, pos places a config in its panel
# by tokens/s (rows sorted by pid, then pos), mark 1/2 its panel's fastest/slowest;
# every panel has the same scales, so panels compare. Each bar is labelled with its
# mesh (short) where the panel leaves 10 px per bar, else only the fastest and
# slowest. Every labels plot has a label on each of its rows (empty where unmarked):
# gnuplot 5.4.4 crashes on a labels plot with no valid point.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/throughput.dat'

# The MFU axis names the peak the MFU is against: column 18, the same quoted label
# on every row (shardbench report writes it from the runs' recorded peak).
mfu_axis = ''
stats f using (mfu_axis = strcol(18), 0) nooutput
if (mfu_axis eq '') mfu_axis = 'MFU (% of peak)'
stats f using 6 nooutput
M = STATS_max
stats f using (valid(7) ? $7 : 0) nooutput
MM = (STATS_max > 0) ? STATS_max : 1

# ---- the panel grid (the same block in every panel chart) ----
# P panels in C columns and R rows; NMAX the most bars in a panel; LL the longest
# short label. 40 px per bar up to 1600 px in all; labels rotated 90 degrees at
# font 8 take about 0.45 of a 10 pt line per character (about 5.5 px against 12).
stats f using 12 nooutput
P = int(STATS_max)
stats f using 14 nooutput
NMAX = int(STATS_max)
stats f using (strlen(strcol(17))) nooutput
LL = int(STATS_max)
C = (P <= 3) ? P : (P == 4) ? 2 : (P <= 9) ? 3 : (P <= 16) ? 4 : 5
R = int((P + C - 1) / C)
W = C * (NMAX * 40 + 200)
W = (W < 1000) ? 1000 : (W > 1600) ? 1600 : W
# label every bar where the panel's plot area (its width less about 110 px of
# margins, both axes) leaves 10 px per bar (a rotated line of font 8); else only
# the marked ones
allbars(n) = (W / C - 110) / n >= 10
BM = int(LL * 0.45) + 2
KE = 3
KPR = int(W / 230)
KH = 16 + 18 * int((KE + KPR - 1) / KPR)
TOP = 40
PHpx = 230 + 12 * BM
PHpx = (TOP + KH + R * PHpx > 1900) ? int((1900 - TOP - KH) / R) : PHpx
H = TOP + KH + R * PHpx
# panel p's first and last row (the rows are sorted by pid), its plan and bars
array S[P]
array E[P]
array PN[P]
array NP[P]
do for [p = 1:P] {
  stats f using ($12 == p ? $0 : NaN) nooutput
  S[p] = int(STATS_min)
  E[p] = int(STATS_max)
  stats f every ::S[p]::S[p] using (PN[p] = strcol(16), NP[p] = int($14), 0) nooutput
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
set output outdir.'/throughput.'.fmt

ok_rgb = 0x3b75af    # blue: ok
bad_rgb = 0xd62728   # red: mismatch
colour(s) = (s eq 'ok') ? ok_rgb : bad_rgb

# the fastest config over all panels, for the title
BEST = -1
BL = ''
stats f using ($6 > BEST ? (BEST = $6, BL = strcol(2), 0) : 0) nooutput
set multiplot title 'Throughput (tokens/s, all ranks) and MFU, one panel per plan, the fastest first; fastest of all: '.BL.' ('.gprintf('%.3s%c', BEST).' tokens/s)'
set lmargin 8
set rmargin 9
set tmargin 2
set bmargin BM
set yrange [0:M * 1.15]
set y2range [0:MM * 1.15]
set format y '%.1s%c'
set format y2 '%g%%'
set ytics font ',8' nomirror
set y2tics font ',8'
set grid ytics
set style fill solid 0.85 noborder
set boxwidth 0.7
set key off
do for [p = 1:P] {
  n = NP[p]
  set origin ((p - 1) % C) * 1.0 / C, (KH + (R - 1 - int((p - 1) / C)) * PHpx) * 1.0 / H
  set size 1.0 / C, PHpx * 1.0 / H
  set title PN[p].' ('.n.(n == 1 ? ' config)' : ' configs)') font ',10'
  set xrange [-0.6:n - 0.4]
  set xtics rotate by 90 right font ',8' nomirror
  set ylabel (((p - 1) % C) == 0 ? 'tokens/s' : '') font ',9'
  set y2label (((p - 1) % C) == C - 1 || p == P ? mfu_axis : '') font ',9'
  all = allbars(n)
  plot f every ::S[p]::E[p] using 13:6:(colour(strcol(10))):xticlabels((all || $15 > 0) ? strcol(17) : '') \
         with boxes lc rgb variable notitle, \
       f every ::S[p]::E[p] using 13:7 axes x1y2 with points pt 13 ps 0.8 lc rgb 'black' notitle, \
       f every ::S[p]::E[p] using ($13 - 0.45):6:($15 == 1 ? 'fastest '.gprintf('%.1s%c', $6) : '') \
         with labels left offset 0, 0.7 font ',8' tc rgb '#222222' notitle, \
       f every ::S[p]::E[p] using ($13 + 0.45):6:($15 == 2 ? 'slowest '.gprintf('%.1s%c', $6) : '') \
         with labels right offset 0, 0.7 font ',8' tc rgb '#222222' notitle
}
set origin 0, 0
set size 1, KH * 1.0 / H
unset title
unset border
unset tics
unset grid
unset ylabel
unset y2label
set lmargin 0
set rmargin 0
set tmargin 0
set bmargin 0
set xrange [0:1]
set yrange [0:1]
set key horizontal center center Left reverse maxcols KPR font ',9'
plot NaN with boxes lc rgb ok_rgb fs solid 0.85 title 'tokens/s, status ok', \
     NaN with boxes lc rgb bad_rgb fs solid 0.85 title 'tokens/s, mismatch (wrong result)', \
     NaN with points pt 13 ps 0.8 lc rgb 'black' title mfu_axis
unset multiplot
