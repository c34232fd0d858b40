# scripts/error.gp: numerical error against the unsharded reference, per config.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/error.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/error.gp
# Reads  datadir/error.dat  idx label status ok max_rel_err tolerance max_abs_err
# Writes outdir/error.FMT (FMT = png, the default, or svg).
#
# Points: max_rel_err (green ok, red mismatch), log scale; the red dash over each
# point is that config's tolerance. An exact result (0) is drawn at floor.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

# 1e-17 sits under the f64 epsilon (2.2e-16): no real error is that small.
floor = 1e-17

stats datadir.'/error.dat' using 1 nooutput
N = int(STATS_max) + 1

# Bottom margin for the longest label at 35 degrees: about a third of a line per
# character (sin 35 x a character's width over a line's height), plus the axis.
stats datadir.'/error.dat' using (strlen(strcol(2))) nooutput
BM = int(STATS_max * 0.35) + 3

# 40 px per point above a 500 px frame, so that the rotated labels do not collide.
W = (N * 40 + 500 > 1000) ? N * 40 + 500 : 1000
H = 650
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

set title 'Numerical error vs the unsharded reference (max relative error, log scale)'
set ylabel 'max_rel_err'
set logscale y
set format y '1e%L'
# Room under the floor, and a tic that names it.
set yrange [floor / 10:*]
set ytics add ('exact 0' floor)
set offsets 0, 0, graph 0.05, 0
set xrange [-0.6:N - 0.4]
set xtics rotate by 35 right font ',9' nomirror
set grid ytics
set key outside right top vertical Left reverse
set bmargin BM

err(e) = (e > floor) ? e : floor
plot datadir.'/error.dat' using ($1 - 0.4):6:(0.8):(0) with vectors nohead lw 3 \
       lc rgb '#d62728' title 'tolerance', \
     datadir.'/error.dat' using 1:(err($5)):xticlabels(2) with points pt 0 ps 0 lc rgb 'white' \
       notitle, \
     datadir.'/error.dat' using 1:($4 == 1 ? err($5) : NaN) with points pt 7 ps 1.4 \
       lc rgb '#2ca02c' title 'ok', \
     datadir.'/error.dat' using 1:($4 == 0 ? err($5) : NaN) with points pt 9 ps 1.8 \
       lc rgb '#d62728' title 'mismatch'
