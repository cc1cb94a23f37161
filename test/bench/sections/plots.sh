# test/bench/sections/plots.sh -- the gnuplot plots.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ------------------------------------------------------------------ plots
say "plots and report"
{
	echo "0 ${R[b.ours.10000.eps]} ${R[b.relay.10000.eps]} ${R[b.raw.10000.eps]}"
	for rtt in 1 5 20; do echo "$rtt ${R[c.ours.$rtt.eps]} ${R[c.relay.$rtt.eps]} ${R[c.raw.$rtt.eps]}"; done
} >"$work/rtt.dat"
if [ -s "$work/d.ours.2000.cdf" ] && [ -s "$work/d.relay.2000.cdf" ]; then
	cdf_ours=$work/d.ours.2000.cdf cdf_relay=$work/d.relay.2000.cdf
else
	cdf_ours=/dev/null cdf_relay=/dev/null
fi
gnuplot <<EOF
set terminal pngcairo size 960,600 font "DejaVu Sans,11" noenhanced
set output "$out/throughput_vs_rtt.png"
set title "Publish throughput vs broker round trip\n($N preloaded events over $AGGS_MAIN aggregates; mock Kafka, 3 brokers, 16 partitions)"
set xlabel "round-trip delay added by the mock broker (ms)"
set ylabel "events/s (log scale)"
set logscale y
set format y "%.0s%c"
set yrange [500:2000000]
set grid ytics mytics
set key bottom left box opaque
set xrange [-0.3:3.3]
plot "$work/rtt.dat" using 0:2:xtic(1) with linespoints lw 2 pt 7 ps 1.3 lc rgb "#0072B2" title "outbox extension (1 worker)", \
     "$work/rtt.dat" using 0:3 with linespoints lw 2 pt 5 ps 1.3 lc rgb "#D55E00" title "polling relay (100 rows/batch)", \
     "$work/rtt.dat" using 0:4 with linespoints lw 1 dt 2 pt 6 lc rgb "#666666" title "raw librdkafka producer (limit)", \
     "$work/rtt.dat" using 0:(\$1 == 5 ? 10000 : 1/0) with points pt 2 ps 2.5 lw 2 lc rgb "red" title "target: 10,000 events/s at 5 ms"

set output "$out/latency_cdf.png"
set title "Emit-to-acknowledgement latency at 2,000 events/s\n(publish time - created_at of every event; mock Kafka, 3 brokers)"
set xlabel "latency (ms, log scale)"
set ylabel "fraction of events"
unset logscale y
set format y "%g"
set format x "%g"
set logscale x
set xrange [0.2:500]
set yrange [0:1.02]
set xtics auto
set grid xtics ytics mxtics
set key bottom right box opaque
set arrow 1 from 20, graph 0 to 20, graph 1 nohead dt 3 lc rgb "red"
set label 1 "20 ms (p99 target at 1,000/s)" at 21, graph 0.5 tc rgb "red"
plot "$cdf_ours" using 1:2 with lines lw 2 lc rgb "#0072B2" title "outbox extension (1 worker)", \
     "$cdf_relay" using 1:2 with lines lw 2 lc rgb "#D55E00" title "polling relay (100 rows/batch, 100 ms idle poll)"
EOF
