# scripts/memory.gp: peak memory per rank, one bar per config, grouped by plan.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/memory.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/memory.gp
# Reads  datadir/memory.dat            idx label plan pid mesh peak_mem_bytes status
#        datadir/memory_baselines.dat  idx label framework fid value unit
# Writes outdir/memory.FMT (FMT = png, the default, or svg).
#
# Bar colour: the plan (pid). Crosses: analytic memory_bytes_per_rank baselines.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

stats datadir.'/memory.dat' using 1 nooutput
N = int(STATS_max) + 1
# The plan names in pid order (the rows are sorted by plan), for the key.
plans = ''
last = ''
stats datadir.'/memory.dat' \
  using ((strcol(3) ne last) ? (plans = plans.strcol(3).' ', last = strcol(3), 1) : 0) nooutput
P = words(plans)
# Bytes in the largest binary unit under the tallest bar, so that tics are round.
stats datadir.'/memory.dat' using 6 nooutput
M = STATS_max
U = (M >= 2**30) ? 2**30 : (M >= 2**20) ? 2**20 : (M >= 2**10) ? 2**10 : 1
Uname = (U == 2**30) ? 'GiB' : (U == 2**20) ? 'MiB' : (U == 2**10) ? 'KiB' : 'bytes'

# Bottom margin for the longest label at 35 degrees: about a third of a line per
# character (sin 35 x a character's width over a line's height), plus the axis.
stats datadir.'/memory.dat' using (strlen(strcol(2))) nooutput
BM = int(STATS_max * 0.35) + 3

# 40 px per bar above a 500 px frame, so that the rotated labels do not collide.
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
set output outdir.'/memory.'.fmt

set title 'Peak memory per rank (max over ranks), by plan'
set ylabel 'peak '.Uname.' per rank'
set offsets 0, 0, graph 0.08, 0
set yrange [0:*]
set xrange [-0.6:N - 0.4]
set xtics rotate by 35 right font ',9' nomirror
set grid ytics
set style fill solid 0.85 noborder
set boxwidth 0.7
set key outside right top vertical Left reverse
set bmargin BM

# One plot per plan so that each plan gets a key entry with its name.
plot for [p=1:P] datadir.'/memory.dat' using ($4 == p ? $1 : NaN):($6 / U) with boxes lc p \
       title word(plans, p), \
     datadir.'/memory.dat' using 1:($6 / U):xticlabels(2) with points pt 0 ps 0 lc rgb 'white' notitle, \
     datadir.'/memory_baselines.dat' using 1:($5 / U) with points pt 2 ps 1.6 lw 2 lc rgb 'black' \
       title 'analytic baseline', \
     datadir.'/memory_baselines.dat' using ($1 + 0.12):($5 / U):3 with labels left font ',8' notitle
