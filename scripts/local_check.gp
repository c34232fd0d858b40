# scripts/local_check.gp: the time model's predicted step against the measured one on
# this machine (bench/local-check.py --dat DATADIR/local_check.dat), log-log, with the
# y = x line and the 0.25 band of the goal. Redraw:
#   gnuplot -e "datadir='DIR'; outdir='DIR'; fmt='png'" scripts/local_check.gp
if (!exists("datadir")) datadir = "."
if (!exists("outdir")) outdir = "."
if (!exists("fmt")) fmt = "png"
if (fmt eq "svg") set terminal svg size 900,700; else set terminal pngcairo size 900,700
set output outdir . "/local_check." . fmt
set title "Predicted against measured step time, world 8, debugmodel (hardware file: local)"
set logscale xy
set xlabel "measured step time (s)"
set ylabel "predicted step time (s)"
set key top left
set grid
f(x) = x
plot datadir . "/local_check.dat" using 3:4:1 with labels point pt 7 offset 0.5,0.5 font ",8" notitle, \
     f(x) with lines lc rgb "black" title "predicted = measured", \
     f(x) * exp(0.25) with lines dt 2 lc rgb "gray" title "|ln ratio| = 0.25", \
     f(x) * exp(-0.25) with lines dt 2 lc rgb "gray" notitle
