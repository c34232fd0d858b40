# scripts/capacity_breakdown.gp: the predicted step time of the newest plan run's top
# ranked layouts, one stacked bar each.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/capacity_breakdown.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/capacity_breakdown.gp
# Reads  datadir/capacity_breakdown.dat  idx rank label mesh plan compute_s recompute_s
#                                        bubble_s exposed_pp_s exposed_dp_replicate_s
#                                        exposed_dp_shard_s exposed_cp_s exposed_tp_s step_s
#        datadir/capacity_hw.dat         gpus capacity_gb hardware desc
# Writes outdir/capacity_breakdown.FMT (FMT = png, the default, or svg), at most 1600 px.
#
# Bars, rank 1 (the fastest that fits) on the left: compute, recompute, the bubble
# and the exposed communication per mesh dim, stacked from the bottom (columns 6 to
# 13); the black dash is the predicted step time (column 14). The time model's step is
# not always the sum of its parts (bench/harness/timemodel.h: the slowest role's
# makespan, the optimizer once per step): an empty box from the stack to the step time
# shows the rest where the step is longer.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/capacity_breakdown.dat'
h = datadir.'/capacity_hw.dat'

stats f using 1 nooutput
N = int(STATS_max) + 1
desc = ''
stats h using (desc = strcol(4), 0) nooutput
stats f using (strlen(strcol(3)) + 4) nooutput
LL = STATS_max
BM = int(LL * 0.35) + 4

# 50 px per bar above a 500 px frame (the key on the right), at most 1600 px.
W = 500 + 50 * N
W = (W < 900) ? 900 : (W > 1600) ? 1600 : W
H = 700
if (fmt eq 'svg') {
  set terminal svg size W,H dynamic noenhanced font 'sans,10' background rgb 'white'
} else {
  if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size W,H noenhanced font 'sans,10' background rgb 'white'
  } else {
    set terminal png size W,H noenhanced
  }
}
set output outdir.'/capacity_breakdown.'.fmt

part_t(k) = word('compute recompute bubble exposed_pp exposed_dp_replicate exposed_dp_shard exposed_cp exposed_tp', k)
part_c(k) = (k == 1) ? 0x1f77b4 : (k == 2) ? 0xaec7e8 : (k == 3) ? 0x7f7f7f : \
  (k == 4) ? 0x9467bd : (k == 5) ? 0xff7f0e : (k == 6) ? 0xffbb78 : (k == 7) ? 0x2ca02c : 0xd62728
# the seconds under part k and up to its top
below(k) = (k > 1 ? column(6) : 0) + (k > 2 ? column(7) : 0) + (k > 3 ? column(8) : 0) + \
  (k > 4 ? column(9) : 0) + (k > 5 ? column(10) : 0) + (k > 6 ? column(11) : 0) + \
  (k > 7 ? column(12) : 0)
upto(k) = below(k) + column(5 + k)

set title "Predicted step time of the top ranked layouts (rank 1 = the fastest that fits)\n".desc
set ylabel 'seconds per step'
set xrange [-0.6:N - 0.4]
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set xtics rotate by 35 right font ',9' nomirror
set grid ytics
set key outside right top vertical Left reverse
set bmargin BM
# room on the left for the first label, which runs left of its bar at 35 degrees
# (cos 35 x a character's width, about 0.55 of the margin's unit per character)
set lmargin (LL * 0.55 > 10 ? int(LL * 0.55) : 10)

plot for [k=1:8] f using 1:((below(k) + upto(k)) / 2):($1 - 0.35):($1 + 0.35):(below(k)):(upto(k)) \
       with boxxyerror lc rgb part_c(k) fs solid 0.9 noborder title part_t(k), \
     f using 1:(($14 + upto(8)) / 2):($1 - 0.35):($1 + 0.35):(upto(8)):($14 > upto(8) ? $14 : upto(8)) \
       with boxxyerror fs empty border rgb 'gray40' lc rgb 'gray40' \
       title 'rest of the step', \
     f using ($1 - 0.4):14:(0.8):(0) with vectors nohead lw 2 lc rgb 'black' title 'step time', \
     f using 1:14:xticlabels(sprintf('#%d %s', int($2), strcol(3))) with points pt 0 ps 0 \
       lc rgb 'white' notitle
