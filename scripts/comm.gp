# scripts/comm.gp: communication per training step, one stacked bar per config.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/comm.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/comm.gp
# Reads  datadir/comm.dat           idx label series sid wire_bytes base top
#        datadir/comm_series.dat    sid series op oid phase_id  (series = phase:op)
#        datadir/comm_baselines.dat idx label framework fid value unit
# Writes outdir/comm.FMT (FMT = png, the default, or svg).
#
# Bars: wire bytes per rank (rank 0) per step, ring model, stacked by phase:op
# in step order; colour = op, shade = phase (forward darkest). Crosses: one per
# config, the frameworks' baseline (comm_bytes_per_step_combined): the sum of the
# published formulas its plan's settings select (Megatron-LM TP or TP + sequence
# parallel for tp, DDP / FSDP / HSDP for the dp dims), labelled with their names.
# The formulas count only what the papers count: a bar above its cross moves
# more than the frameworks, a bar below it less.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

# The series (phase:op) in stack order, with each one's op colour and phase shade.
names = ''
oids = ''
phases = ''
stats datadir.'/comm_series.dat' \
  using (names = names.strcol(2).' ', oids = oids.strcol(4).' ', phases = phases.strcol(5).' ', $1) \
  nooutput
K = STATS_records
# Colour = the op; fill density = the phase (forward solid, backward, optimizer, other paler).
shade(p) = (p == 1) ? 1.0 : (p == 2) ? 0.6 : (p == 3) ? 0.3 : 0.15
stats datadir.'/comm.dat' using 1 nooutput
N = int(STATS_max) + 1
# Bytes in the largest binary unit under the tallest bar, so that tics are round.
stats datadir.'/comm.dat' using 7 nooutput
M = STATS_max
U = (M >= 2**30) ? 2**30 : (M >= 2**20) ? 2**20 : (M >= 2**10) ? 2**10 : 1
Uname = (U == 2**30) ? 'GiB' : (U == 2**20) ? 'MiB' : (U == 2**10) ? 'KiB' : 'bytes'

# Bottom margin for the longest label at 35 degrees: about a third of a line per
# character (sin 35 x a character's width over a line's height), plus the axis.
stats datadir.'/comm.dat' using (strlen(strcol(2))) nooutput
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
set output outdir.'/comm.'.fmt

set title 'Communication per step: wire bytes per rank, by plan and mesh (ring model)'
set ylabel 'wire '.Uname.' per rank per step'
set offsets 0, 0, graph 0.08, 0
set yrange [0:*]
set xrange [-0.6:N - 0.4]
set xtics rotate by 35 right font ',9' nomirror
set grid ytics
set key outside right top vertical Left reverse
set bmargin BM

plot for [i=1:K] datadir.'/comm.dat' \
       using ($4 == i ? $1 : NaN):(($6 + $7) / 2 / U):($1 - 0.35):($1 + 0.35):($6 / U):($7 / U) \
       with boxxyerror lc int(word(oids, i)) fs solid shade(int(word(phases, i))) \
       border rgb 'white' title word(names, i), \
     datadir.'/comm.dat' using 1:($7 / U):xticlabels(2) with points pt 0 ps 0 lc rgb 'white' notitle, \
     datadir.'/comm_baselines.dat' using 1:($5 / U) with points pt 2 ps 1.6 lw 2 lc rgb 'black' \
       title 'frameworks (published formulas)', \
     datadir.'/comm_baselines.dat' using ($1 + 0.12):($5 / U):3 with labels left font ',8' notitle
