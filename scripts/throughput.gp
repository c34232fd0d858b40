# scripts/throughput.gp: tokens/s (top) and MFU (bottom) per config, by mesh shape.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/throughput.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/throughput.gp
# Reads  datadir/throughput.dat  idx label mesh plan world tokens_per_s mfu_pct tflops
#                                step_time_s status peak_tflops mfu_axis
# Writes outdir/throughput.FMT (FMT = png, the default, or svg).
#
# Blue bars: status ok; red bars: mismatch (measured, but the numbers were wrong).
# 'no MFU': the result recorded no peak, so no MFU (NaN in mfu_pct). Every row gets
# a label (empty when MFU is there): gnuplot 5.4.4 crashes on a labels plot with no
# valid point.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

stats datadir.'/throughput.dat' using 1 nooutput
N = int(STATS_max) + 1

# The MFU axis names the peak the MFU is against: column 12, the same quoted label
# on every row (shardbench report writes it from the runs' recorded peak).
mfu_axis = ''
stats datadir.'/throughput.dat' using (mfu_axis = strcol(12), 0) nooutput
if (mfu_axis eq '') mfu_axis = 'MFU (% of peak)'

# Bottom margin for the longest label at 35 degrees: about a third of a line per
# character (sin 35 x a character's width over a line's height), plus the axis.
stats datadir.'/throughput.dat' using (strlen(strcol(2))) nooutput
BM = int(STATS_max * 0.35) + 3

# 40 px per bar above a 500 px frame, so that the rotated labels do not collide.
W = (N * 40 + 500 > 1000) ? N * 40 + 500 : 1000
H = 800
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

set multiplot title 'Throughput and MFU by mesh shape (sorted by world, then pp, dp_replicate, dp_shard, cp, tp)'
set lmargin 14
set rmargin 4
set xrange [-0.6:N - 0.4]
set grid ytics
set style fill solid 0.85 noborder
set boxwidth 0.7
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set key off

# Top panel: tokens/s; no tic labels (they are on the bottom panel).
set origin 0, 0.55
set size 1, 0.40
set ylabel 'tokens/s (all ranks)'
set format y '%.1s%c'
set xtics 1 format '' nomirror
plot datadir.'/throughput.dat' using 1:6:(colour(strcol(10))) with boxes lc rgb variable, \
     0 with lines lc rgb 'gray' notitle

# Bottom panel: MFU in percent of the recorded peak; the config labels.
set origin 0, 0
set size 1, 0.55
set bmargin BM
set ylabel mfu_axis
set format y '%g%%'
set xtics rotate by 35 right font ',9' nomirror format '%g'
plot datadir.'/throughput.dat' using 1:7:(colour(strcol(10))):xticlabels(2) \
       with boxes lc rgb variable, \
     datadir.'/throughput.dat' using 1:(0):(strcol(7) eq 'NaN' ? 'no MFU' : '') with labels \
       offset 0, 1 notitle, \
     0 with lines lc rgb 'gray' notitle
unset multiplot
