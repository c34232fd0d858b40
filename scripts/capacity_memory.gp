# scripts/capacity_memory.gp: predicted peak memory per GPU against the GPU count,
# one line per plan, with the hardware's HBM capacity.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/capacity_memory.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/capacity_memory.gp
# Reads  datadir/capacity_memory.dat  gpus plan pid mesh peak_gb fits rank over_gb
#                                     capacity_gb ac local_batch microbatches
#        datadir/capacity_hw.dat      gpus capacity_gb hardware desc
# Writes outdir/capacity_memory.FMT (FMT = png, the default, or svg), 1100 px wide.
#
# Per plan (pid 1..P, rows sorted by pid then gpus) and GPU count: its best ranked
# layout that fits (filled point) or, where none fits, its smallest-peak layout
# (hollow point). GB = 1e9 bytes. The dashed red line: the capacity (hbm_gb, or hbm_gib
# in GB, of the plan run's hardware file) at each GPU count.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/capacity_memory.dat'
h = datadir.'/capacity_hw.dat'

stats f using 3 nooutput
P = int(STATS_max)
# the plans' names in pid order (names have no blanks: word(plans, p) is pid p's)
plans = ''
stats f using (int($3) > words(plans) ? (plans = plans.strcol(2).' ', 0) : 0) nooutput
desc = ''
hw = ''
stats h using (desc = strcol(4), hw = strcol(3), 0) nooutput
# the capacity for the key (NaN: the hardware file gave none; 0 stands for it here)
stats h using (valid(2) ? $2 : 0) nooutput
CAP = STATS_max
captitle = (CAP > 0) ? sprintf('HBM capacity: %s, %.4g GB', hw, CAP) : 'HBM capacity: not in the hardware file '.hw
stats f using 1 nooutput
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
set output outdir.'/capacity_memory.'.fmt

set title "Predicted peak memory per GPU vs GPU count (each plan's best layout that fits; hollow: none fits)\n".desc
set xlabel 'GPUs (log2 axis)'
set ylabel 'peak GB per GPU (1e9 bytes)'
set logscale x 2
# half a factor of 2 of room either side of the extreme GPU counts
set xrange [GMIN / sqrt(2):GMAX * sqrt(2)]
set xtics 2 format '%g' nomirror
set yrange [0:*]
set offsets 0, 0, graph 0.08, 0
set grid xtics ytics
set key outside right top vertical Left reverse

# Colours repeat after 8 plans; the dash and point type change with each 8 (dt takes
# a function call; a parenthesised expression would read as a dash pattern).
dash(p) = 1 + int((p - 1) / 8) % 5
ptype(p) = word('7 5 9 11 13', 1 + int((p - 1) / 8) % 5) + 0
plot h using 1:2 with linespoints dt 2 lw 2 pt 0 lc rgb '#d62728' title captitle, \
     for [p=1:P] f using 1:($3 == p ? $5 : NaN) with lines lw 2 lc p dt dash(p) title word(plans, p), \
     for [p=1:P] f using 1:($3 == p && $6 == 1 ? $5 : NaN) with points pt ptype(p) ps 1.3 lc p notitle, \
     for [p=1:P] f using 1:($3 == p && $6 == 0 ? $5 : NaN) with points pt (ptype(p) - 1) ps 1.6 lw 2 lc p notitle
