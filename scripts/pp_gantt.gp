# scripts/pp_gantt.gp: one pipelined result's last timed step as a Gantt chart.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'; rid=12" scripts/pp_gantt.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'; rid=12" scripts/pp_gantt.gp
# Reads  datadir/pp_gantt_RID.dat  rank pp_rank action kid stage microbatch t0_ms t1_ms text
#        datadir/pp_bubble.dat     idx rid label schedule pp v m bubble_measured
#                                  bubble_analytic span_ms status (the title)
# Writes outdir/pp_gantt_RID.FMT (FMT = png, the default, or svg).
#
# One row per rank (rank 0 on top), one box per action from t0 to t1: F (kid 1) and B
# (kid 2) full height, labelled with the microbatch (or stage:microbatch); SEND_* (3)
# and the waits of RECV_* (4) thin.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
if (!exists("rid")) {
  print "pp_gantt.gp: give the result id: -e \"rid=RID\""
  exit status 1
}

f = datadir.sprintf('/pp_gantt_%d.dat', int(rid))
meta = datadir.'/pp_bubble.dat'

# The title from the result's pp_bubble.dat row.
ttl = sprintf('result %d', int(rid))
stats meta using (int($2) == int(rid) ? (ttl = sprintf('%s: %s, p %d, v %d, m %d; bubble measured %.3f, analytic %s', \
  strcol(3), strcol(4), int($5), int($6), int($7), $8, valid(9) ? sprintf('%.3f', $9) : 'n/a'), 0) : 0) nooutput

stats f using 1 nooutput
R = int(STATS_max)
stats f using 8 nooutput
TMAX = STATS_max
# each rank's pp rank, in rank order (rows are sorted by rank)
ppr = ''
stats f using (int($1) >= words(ppr) ? (ppr = ppr.sprintf('%d ', int($2)), 0) : 0) nooutput

W = 1000
H = 160 + 45 * (R + 1)
if (fmt eq 'svg') {
  set terminal svg size W,H dynamic noenhanced font 'sans,10' background rgb 'white'
} else {
  if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {
    set terminal pngcairo size W,H noenhanced font 'sans,10' background rgb 'white'
  } else {
    set terminal png size W,H noenhanced
  }
}
set output outdir.sprintf('/pp_gantt_%d.', int(rid)).fmt

set title ttl
set xlabel "ms from the step's zero (the barrier before the step)"
set xrange [0:TMAX * 1.02]
set yrange [R + 0.7:-0.7]
set ytics ()
do for [i=0:R] {
  set ytics add (sprintf('rank %d (pp %s)', i, word(ppr, i + 1)) i)
}
set grid xtics
set key outside bottom center horizontal
set style fill solid 0.85 border lc rgb '#333333'

col(k) = word('#1f77b4 #ff7f0e #7f7f7f #d62728', k)
name(k) = word('F B SEND RECV-wait', k)
h(k) = k <= 2 ? 0.38 : 0.12

plot for [k=1:4] f using (int($4) == k ? ($7 + $8) / 2 : NaN):1:7:8:($1 - h(k)):($1 + h(k)) \
       with boxxyerror lc rgb col(k) title name(k), \
     f using (int($4) <= 2 ? ($7 + $8) / 2 : NaN):1:9 with labels font ',8' tc rgb 'white' notitle
