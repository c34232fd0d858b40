# scripts/error.gp: numerical error against the unsharded reference: one panel per
# plan, one point per config, sorted by its error (the smallest first).
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/error.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/error.gp
# Reads  datadir/error.dat  idx label status ok max_rel_err tolerance max_abs_err
#                           pid pos npos mark panel short
# Writes outdir/error.FMT (FMT = png, the default, or svg), at most 1600 px wide.
#
# Points: max_rel_err (green ok, red mismatch), log scale; the red dash over each
# point is that config's tolerance. An exact result (0) is drawn at floor.
# Panels (small multiples): pid numbers the plans, pos places a config in its panel
# by error (rows sorted by pid, then pos), mark 1/2 its panel's smallest/largest;
# every panel has the same y scale. Each point is labelled with its mesh (short)
# where the panel leaves 10 px per point, else only the smallest and the largest.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/error.dat'

# 1e-17 sits under the f64 epsilon (2.2e-16): no real error is that small.
floor = 1e-17
err(e) = (e > floor) ? e : floor
stats f using (err($5) > $6 ? err($5) : $6) nooutput
M = STATS_max

# ---- the panel grid (the same block in every panel chart) ----
# P panels in C columns and R rows; NMAX the most points in a panel; LL the longest
# short label. 40 px per point up to 1600 px in all; labels rotated 90 degrees at
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
# label every point where the panel's plot area (its width less about 90 px of
# margins) leaves 10 px per point (a rotated line of font 8); else only the marked ones
allbars(n) = (W / C - 90) / n >= 10
BM = int(LL * 0.45) + 2
KE = 3
KPR = int(W / 230)
KH = 16 + 18 * int((KE + KPR - 1) / KPR)
TOP = 40
PHpx = 230 + 12 * BM
PHpx = (TOP + KH + R * PHpx > 1900) ? int((1900 - TOP - KH) / R) : PHpx
H = TOP + KH + R * PHpx
# panel p's first and last row (the rows are sorted by pid), its plan and points
array S[P]
array E[P]
array PN[P]
array NP[P]
do for [p = 1:P] {
  stats f using ($8 == p ? $0 : NaN) nooutput
  S[p] = int(STATS_min)
  E[p] = int(STATS_max)
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
set output outdir.'/error.'.fmt

set multiplot title 'Numerical error vs the unsharded reference (max relative error, log scale), one panel per plan, the smallest first'
set lmargin 9
set rmargin 2
set tmargin 2
set bmargin BM
set logscale y
set format y '1e%L'
# Room under the floor (a tic names it), and a factor 30 over the largest for the labels.
set yrange [floor / 10:M * 30]
set ytics add ('exact 0' floor) font ',8'
set grid ytics
set key off
do for [p = 1:P] {
  n = NP[p]
  set origin ((p - 1) % C) * 1.0 / C, (KH + (R - 1 - int((p - 1) / C)) * PHpx) * 1.0 / H
  set size 1.0 / C, PHpx * 1.0 / H
  set title PN[p].' ('.n.(n == 1 ? ' config)' : ' configs)') font ',10'
  set xrange [-0.6:n - 0.4]
  set xtics rotate by 90 right font ',8' nomirror
  set ylabel (((p - 1) % C) == 0 ? 'max_rel_err' : '') font ',9'
  all = allbars(n)
  plot f every ::S[p]::E[p] using ($9 - 0.4):6:(0.8):(0) with vectors nohead lw 2 \
         lc rgb '#d62728' notitle, \
       f every ::S[p]::E[p] using 9:(err($5)):xticlabels((all || $11 > 0) ? strcol(13) : '') \
         with points pt 0 ps 0 lc rgb 'white' notitle, \
       f every ::S[p]::E[p] using 9:($4 == 1 ? err($5) : NaN) with points pt 7 ps 0.9 \
         lc rgb '#2ca02c' notitle, \
       f every ::S[p]::E[p] using 9:($4 == 0 ? err($5) : NaN) with points pt 9 ps 1.3 \
         lc rgb '#d62728' notitle, \
       f every ::S[p]::E[p] using ($9 + 0.45):(err($5)):($11 == 2 ? sprintf('largest %.2g', $5) : '') \
         with labels right offset 0, 0.8 font ',8' tc rgb '#222222' notitle
}
set origin 0, 0
set size 1, KH * 1.0 / H
unset title
unset border
unset tics
unset grid
unset ylabel
unset logscale y
set lmargin 0
set rmargin 0
set tmargin 0
set bmargin 0
set xrange [0:1]
set yrange [0:1]
set key horizontal center center Left reverse maxcols KPR font ',9'
plot NaN with lines lw 2 lc rgb '#d62728' title 'tolerance', \
     NaN with points pt 7 ps 0.9 lc rgb '#2ca02c' title 'ok', \
     NaN with points pt 9 ps 1.3 lc rgb '#d62728' title 'mismatch'
unset multiplot
