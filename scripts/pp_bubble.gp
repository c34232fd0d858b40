# scripts/pp_bubble.gp: the pipeline bubble, measured against analytic, per pipelined
# config, and each stage's peak activation memory with its most microbatches in flight.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/pp_bubble.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/pp_bubble.gp
# Reads  datadir/pp_bubble.dat  idx rid label schedule pp v m bubble_measured
#                               bubble_analytic span_ms status
#        datadir/pp_stages.dat  idx rid label pp pp_rank max_in_flight peak_act_mib
#                               busy_ms bubble
# Writes outdir/pp_bubble.FMT (FMT = png, the default, or svg).
#
# Top: per config (idx), the measured bubble (filled) and the analytic one (hollow;
# none for a CSV schedule). Bottom: per config, its stages left to right (pp_rank
# spread over the config's slot), the peak activation MiB, labelled with max_in_flight.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

f = datadir.'/pp_bubble.dat'
g = datadir.'/pp_stages.dat'
stats f using 1 nooutput
N = int(STATS_max) + 1
stats f using (strlen(strcol(3)) + strlen(strcol(4))) nooutput
LL = STATS_max

# 90 px per config above 600 px, at most 1600 px; where that leaves under 12 px per
# config label (a rotated line of font 10), only every L-th config is labelled.
W = 600 + 90 * N
W = (W > 1600) ? 1600 : W
L = ((W - 150.0) / N >= 12) ? 1 : int(ceil(12.0 * N / (W - 150.0)))
# the labels stand vertical (font 9, about 5.5 px a character, 12 px a margin line)
# under each panel, below a 300 px plot
BM = int(LL * 0.5) + 2
H = 80 + 2 * (300 + 12 * BM)
tic(i, s) = (int(i) % L == 0) ? s : ''
if (fmt eq 'svg') {
  set terminal svg size W,H dynamic noenhanced font 'sans,10' background rgb 'white'
} else {
  if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size W,H noenhanced font 'sans,10' background rgb 'white'
  } else {
    set terminal png size W,H noenhanced
  }
}
set output outdir.'/pp_bubble.'.fmt

set multiplot layout 2,1 title 'Pipeline bubble: measured vs analytic, and activation memory per stage'
set xrange [-0.6:N - 0.4]
set grid ytics
set style fill solid 0.8 border lc rgb '#333333'
set boxwidth 0.35
set key above

set ylabel 'bubble (idle share of the step)'
set yrange [0:*]
set xtics () rotate by 90 right font ',9'
set bmargin BM
plot f using ($1 - 0.18):8:xtic(tic($1, strcol(3).' '.strcol(4))) with boxes lc rgb '#1f77b4' title 'measured', \
     f using ($1 + 0.18):9 with boxes fs empty lc rgb '#d62728' lw 2 title 'analytic (p - 1) / (v m + p - 1)', \
     f using ($1 - 0.18):8:(N <= 40 ? sprintf('%.3f', $8) : '') with labels offset 0,0.7 font ',8' notitle

set ylabel 'peak activation MiB per stage'
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set xtics () rotate by 90 right font ',9'
set bmargin BM
set key above
x(i, p, s) = i - 0.35 + 0.7 * (s + 0.5) / p
plot f using 1:(NaN):xtic(tic($1, strcol(3).' '.strcol(4))) notitle, \
     g using (x($1, $4, $5)):7 with impulses lw 6 lc rgb '#2ca02c' title 'peak above the step start (pp rank left to right)', \
     g using (x($1, $4, $5)):7:(sprintf('%d', int($6))) with labels offset 0,0.8 font ',9' title 'label: most microbatches in flight'
unset multiplot
