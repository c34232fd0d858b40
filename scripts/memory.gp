# scripts/memory.gp: memory per rank, one stacked bar per config, grouped by plan.
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/memory.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/memory.gp
# Reads  datadir/memory.dat            idx label plan pid mesh peak_mem_bytes status
#                                      params_bytes grads_bytes optimizer_bytes activations_bytes
#        datadir/memory_baselines.dat  idx label framework fid value unit
# Writes outdir/memory.FMT (FMT = png, the default, or svg).
#
# Bars: rank 0's memory in the last timed step, stacked from the bottom: weights,
# gradients, AdamW's states, and the rest of that step's peak (activations, FSDP's
# gathered copies, buffers). Dark red dash: the measured peak, max over ranks and
# the whole run (on or above the stack). A config without the split (NaN: a DB
# before schema version 3) gets an empty outline up to its peak. Dashed grey
# lines separate the plans. Crosses: analytic memory_bytes_per_rank baselines.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'

stats datadir.'/memory.dat' using 1 nooutput
N = int(STATS_max) + 1
# Where one plan's group ends and the next begins (the rows are sorted by plan).
seps = ''
last = ''
stats datadir.'/memory.dat' \
  using ((last ne '' && strcol(3) ne last) ? (seps = seps.sprintf('%g ', $1 - 0.5), 0) : 0, \
         last = strcol(3), 1) nooutput
# How many configs have the split (SPLIT) and how many only the peak (NOSPLIT): a
# key entry only for what is drawn. valid(8) tests for the NaN of a missing split;
# an expression that reads a NaN column ($8) drops the whole row instead.
stats datadir.'/memory.dat' using (valid(8) ? 1 : 0) nooutput
SPLIT = int(STATS_sum)
NOSPLIT = N - SPLIT
# Bytes in the largest binary unit under the tallest bar or peak, so that tics are round.
stats datadir.'/memory.dat' \
  using ((valid(8) && $8 + $9 + $10 + $11 > $6) ? $8 + $9 + $10 + $11 : $6) nooutput
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

set title "Memory per rank by plan: rank 0's split in the last timed step, and the peak (max over ranks)"
set ylabel Uname.' per rank'
set offsets 0, 0, graph 0.08, 0
set yrange [0:*]
set xrange [-0.6:N - 0.4]
set xtics rotate by 35 right font ',9' nomirror
set grid ytics
set key outside right top vertical Left reverse
set boxwidth 0.7
set bmargin BM
do for [k = 1:words(seps)] {
  set arrow from real(word(seps, k)), graph 0 to real(word(seps, k)), graph 1 nohead back \
    dt 2 lc rgb 'gray60'
}

# The parts, bottom to top: data column 7 + k, its colour and key title.
part_t(k) = (SPLIT == 0) ? '' : (k == 1) ? 'weights (params)' : (k == 2) ? 'gradients' : \
  (k == 3) ? 'optimizer (AdamW m, v)' : 'activations + buffers'
part_c(k) = (k == 1) ? 0x1f77b4 : (k == 2) ? 0xff7f0e : (k == 3) ? 0x2ca02c : 0x9e9e9e
# the bytes under part k (the parts below it) and up to its top
below(k) = (k > 1 ? column(8) : 0) + (k > 2 ? column(9) : 0) + (k > 3 ? column(10) : 0)
upto(k) = below(k) + column(7 + k)

plot for [k=1:4] datadir.'/memory.dat' \
       using 1:((below(k) + upto(k)) / 2 / U):($1 - 0.35):($1 + 0.35):(below(k) / U):(upto(k) / U) \
       with boxxyerror lc rgb part_c(k) fs solid 0.85 noborder title part_t(k), \
     datadir.'/memory.dat' using (valid(8) ? NaN : $1):($6 / U) with boxes \
       fs empty border rgb '#8b0000' lw 1.5 lc rgb '#8b0000' \
       title (NOSPLIT > 0 ? 'no split recorded: peak only' : ''), \
     datadir.'/memory.dat' using ($1 - 0.4):($6 / U):(0.8):(0) with vectors nohead lw 3 \
       lc rgb '#8b0000' title 'peak, busiest rank (whole run)', \
     datadir.'/memory.dat' using 1:($6 / U):xticlabels(2) with points pt 0 ps 0 lc rgb 'white' notitle, \
     datadir.'/memory_baselines.dat' using 1:($5 / U) with points pt 2 ps 1.6 lw 2 lc rgb 'black' \
       title 'analytic baseline', \
     datadir.'/memory_baselines.dat' using ($1 + 0.12):($5 / U):3 with labels left font ',8' notitle
