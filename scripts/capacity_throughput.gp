# scripts/capacity_throughput.gp: predicted tokens/s per GPU against the GPU count,
# one line per plan (its best ranked layout that fits).
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/capacity_throughput.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/capacity_throughput.gp
# Reads  datadir/capacity_throughput.dat  gpus plan pid mesh tokens_per_s_per_gpu mfu_pct
#                                         rank step_s best
#        datadir/capacity_hw.dat          gpus capacity_gb hardware desc
# Writes outdir/capacity_throughput.FMT (FMT = png, the default, or svg), 1100 px wide.
#
# Per plan (pid, rows sorted by pid then gpus) and GPU count that any of its layouts
# fits: its best ranked layout (rank 1 = the fastest that fits). The fastest point at
# each GPU count over all plans (best = 1) is labelled plan/mesh: the layout to choose.
# Colours repeat after 8 plans; the dash and point type change with each 8.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/capacity_throughput.dat'
h = datadir.'/capacity_hw.dat'

stats f using 3 nooutput
P = int(STATS_max)

# pid p's name is the p-th distinct one (pids run 1.. in row order, with gaps where a
# plan fits nowhere): keep them by pid
array PL[P]
do for [p = 1:P] { PL[p] = '' }
stats f using (PL[int($3)] = strcol(2), 0) nooutput
desc = ''
stats h using (desc = strcol(4), 0) nooutput
stats h using 1 nooutput
GMIN = STATS_min
GMAX = STATS_max

W = 1100
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
set output outdir.'/capacity_throughput.'.fmt

set title "Predicted tokens/s per GPU vs GPU count (each plan's best layout that fits)\n".desc
set xlabel 'GPUs (log2 axis)'
set ylabel 'tokens/s per GPU'
set format y '%.1s%c'
set logscale x 2
set xrange [GMIN / sqrt(2):GMAX * sqrt(2)]
set xtics 2 format '%g' nomirror
set yrange [0:*]
set offsets 0, 0, graph 0.12, 0
set grid xtics ytics
set key outside right top vertical Left reverse

# (dt takes a function call; a parenthesised expression would read as a dash pattern)
dash(p) = 1 + int((p - 1) / 8) % 5
ptype(p) = word('7 5 9 11 13', 1 + int((p - 1) / 8) % 5) + 0
plot for [p=1:P] f using 1:($3 == p ? $5 : NaN) with linespoints lw 2 pt ptype(p) ps 1.2 lc p \
       dt dash(p) title PL[p], \
     f using 1:5:($9 == 1 ? strcol(2).'/'.strcol(4) : '') with labels offset 0, 1.2 font ',8' \
       notitle
