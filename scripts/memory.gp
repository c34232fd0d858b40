# scripts/memory.gp: memory per rank: one panel per plan, one stacked bar per config,
# sorted by its peak (the least first).
#
# Redraw by hand (no DB needed, only the .dat files `shardbench report` wrote):
#   gnuplot -e "datadir='report/data'; outdir='report'" scripts/memory.gp
#   gnuplot -e "datadir='report/data'; outdir='report'; fmt='svg'" scripts/memory.gp
# Reads  datadir/memory.dat            idx label plan pid mesh peak_mem_bytes status
#                                      params_bytes grads_bytes optimizer_bytes activations_bytes
#                                      pid pos npos mark panel short
#        datadir/memory_baselines.dat  idx label framework fid value unit pid pos
# Writes outdir/memory.FMT (FMT = png, the default, or svg), at most 1600 px wide.
#
# Bars: rank 0's memory in the last timed step, stacked from the bottom: weights,
# gradients, AdamW's states, and the rest of that step's peak (activations, FSDP's
# gathered copies, buffers). Dark red dash: the measured peak, max over ranks and
# the whole run (on or above the stack). A config without the split (NaN: a DB
# before schema version 3) gets an empty outline up to its peak. Crosses: analytic
# memory_bytes_per_rank baselines.
# Panels (small multiples): pid numbers the plans, pos places a config in its panel
# by peak (rows sorted by pid, then pos), mark 1/2 its panel's least/most; every
# panel has the same y scale, so panels compare. Each bar is labelled with its mesh
# (short) where the panel leaves 10 px per bar, else only the least and the most.

if (!exists("datadir")) datadir = 'report/data'
if (!exists("outdir")) outdir = 'report'
if (!exists("fmt")) fmt = 'png'
f = datadir.'/memory.dat'
b = datadir.'/memory_baselines.dat'

# How many configs have the split (SPLIT) and how many only the peak (NOSPLIT): a
# key entry only for what is drawn. valid(8) tests for the NaN of a missing split;
# an expression that reads a NaN column ($8) drops the whole row instead.
stats f using (valid(8) ? 1 : 0) nooutput
SPLIT = int(STATS_sum)
NOSPLIT = STATS_records - SPLIT
# Bytes in the largest binary unit under the tallest bar or peak, so that tics are
# round. (No stats on the baselines file: stats stops the script on an empty file.)
stats f using ((valid(8) && $8 + $9 + $10 + $11 > $6) ? $8 + $9 + $10 + $11 : $6) nooutput
M = STATS_max
U = (M >= 2**30) ? 2**30 : (M >= 2**20) ? 2**20 : (M >= 2**10) ? 2**10 : 1
Uname = (U == 2**30) ? 'GiB' : (U == 2**20) ? 'MiB' : (U == 2**10) ? 'KiB' : 'bytes'

# ---- the panel grid (the same block in every panel chart) ----
# P panels in C columns and R rows; NMAX the most bars in a panel; LL the longest
# short label. 40 px per bar up to 1600 px in all; labels rotated 90 degrees at
# font 8 take about 0.45 of a 10 pt line per character (about 5.5 px against 12).
stats f using 12 nooutput
P = int(STATS_max)
stats f using 14 nooutput
NMAX = int(STATS_max)
stats f using (strlen(strcol(17))) nooutput
LL = int(STATS_max)
C = (P <= 3) ? P : (P == 4) ? 2 : (P <= 9) ? 3 : (P <= 16) ? 4 : 5
R = int((P + C - 1) / C)
W = C * (NMAX * 40 + 180)
W = (W < 1000) ? 1000 : (W > 1600) ? 1600 : W
# label every bar where the panel's plot area (its width less about 90 px of
# margins) leaves 10 px per bar (a rotated line of font 8); else only the marked ones
allbars(n) = (W / C - 90) / n >= 10
BM = int(LL * 0.45) + 2
KE = 7
KPR = int(W / 230)
KH = 16 + 18 * int((KE + KPR - 1) / KPR)
TOP = 56
PHpx = 230 + 12 * BM
PHpx = (TOP + KH + R * PHpx > 1900) ? int((1900 - TOP - KH) / R) : PHpx
H = TOP + KH + R * PHpx
# panel p's first and last row (the rows are sorted by pid), its plan and bars
array S[P]
array E[P]
array PN[P]
array NP[P]
do for [p = 1:P] {
  stats f using ($12 == p ? $0 : NaN) nooutput
  S[p] = int(STATS_min)
  E[p] = int(STATS_max)
  stats f every ::S[p]::S[p] using (PN[p] = strcol(16), NP[p] = int($14), 0) nooutput
}

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

# The parts, bottom to top: data column 7 + k, its colour and key title.
part_t(k) = (k == 1) ? 'weights (params)' : (k == 2) ? 'gradients' : \
  (k == 3) ? 'optimizer (AdamW m, v)' : 'activations + buffers'
part_c(k) = (k == 1) ? 0x1f77b4 : (k == 2) ? 0xff7f0e : (k == 3) ? 0x2ca02c : 0x9e9e9e
# the bytes under part k (the parts below it) and up to its top
below(k) = (k > 1 ? column(8) : 0) + (k > 2 ? column(9) : 0) + (k > 3 ? column(10) : 0)
upto(k) = below(k) + column(7 + k)

# the least peak over all panels, for the title
BEST = 1e300
BL = ''
stats f using ($6 < BEST ? (BEST = $6, BL = strcol(2), 0) : 0) nooutput
set multiplot title "Memory per rank, one panel per plan, the least peak first: rank 0's split in the last timed step, and the peak (max over ranks)\nleast of all: ".BL.' ('.sprintf('%.3g', BEST / U).' '.Uname.')'
set lmargin 9
set rmargin 2
set tmargin 2
set bmargin BM
# the same top in every panel, or higher where a panel's cross is above it
set yrange [0:M / U * 1.12<*]
set grid ytics
set ytics font ',8'
set boxwidth 0.7
set key off
do for [p = 1:P] {
  n = NP[p]
  set origin ((p - 1) % C) * 1.0 / C, (KH + (R - 1 - int((p - 1) / C)) * PHpx) * 1.0 / H
  set size 1.0 / C, PHpx * 1.0 / H
  set title PN[p].' ('.n.(n == 1 ? ' config)' : ' configs)') font ',10'
  set xrange [-0.6:n - 0.4]
  set xtics rotate by 90 right font ',8' nomirror
  set ylabel (((p - 1) % C) == 0 ? Uname.' per rank' : '') font ',9'
  all = allbars(n)
  plot for [k=1:4] f every ::S[p]::E[p] \
         using 13:((below(k) + upto(k)) / 2 / U):($13 - 0.35):($13 + 0.35):(below(k) / U):(upto(k) / U) \
         with boxxyerror lc rgb part_c(k) fs solid 0.85 noborder notitle, \
       f every ::S[p]::E[p] using (valid(8) ? NaN : $13):($6 / U) with boxes \
         fs empty border rgb '#8b0000' lw 1.5 lc rgb '#8b0000' notitle, \
       f every ::S[p]::E[p] using ($13 - 0.4):($6 / U):(0.8):(0) with vectors nohead lw 3 \
         lc rgb '#8b0000' notitle, \
       f every ::S[p]::E[p] using 13:($6 / U):xticlabels((all || $15 > 0) ? strcol(17) : '') \
         with points pt 0 ps 0 lc rgb 'white' notitle, \
       b using ($7 == p ? $8 : NaN):($5 / U) with points pt 2 ps 1.2 lw 2 lc rgb 'black' notitle, \
       f every ::S[p]::E[p] using ($13 - 0.45):($6 / U):($15 == 1 ? sprintf('least %.3g', $6 / U) : '') \
         with labels left offset 0, 0.7 font ',8' tc rgb '#222222' notitle, \
       f every ::S[p]::E[p] using ($13 + 0.45):($6 / U):($15 == 2 ? sprintf('most %.3g', $6 / U) : '') \
         with labels right offset 0, 0.7 font ',8' tc rgb '#222222' notitle
}
set origin 0, 0
set size 1, KH * 1.0 / H
unset title
unset border
unset tics
unset grid
unset ylabel
set lmargin 0
set rmargin 0
set tmargin 0
set bmargin 0
set xrange [0:1]
set yrange [0:1]
set key horizontal center center Left reverse maxcols KPR font ',9'
# key entries only for what is drawn (an empty title leaves no entry)
plot for [k=1:4] NaN with boxes lc rgb part_c(k) fs solid 0.85 title (SPLIT > 0 ? part_t(k) : ''), \
     NaN with boxes fs empty border rgb '#8b0000' lw 1.5 lc rgb '#8b0000' \
       title (NOSPLIT > 0 ? 'no split recorded: peak only' : ''), \
     NaN with lines lw 3 lc rgb '#8b0000' title 'peak, busiest rank (whole run)', \
     NaN with points pt 2 ps 1.2 lw 2 lc rgb 'black' title 'analytic baseline'
unset multiplot
