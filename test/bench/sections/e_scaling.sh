# test/bench/sections/e_scaling.sh -- section e, worker scaling.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ---------------------------------------------------------------- e. scaling
# Rounds interleaved (1, 2, 4 workers, then again), each worker count right
# after its restart: a first ("cold") run, then the measured one.
scaling_run() {
	local r w
	say "e. workers: $N events over $AGGS_MAIN aggregates, $E_REPS interleaved round(s)"
	for r in $(seq "$E_REPS"); do
		for w in 1 2 4; do
			restart_pg "$w"
			measure_ours "e.ours.$w.cold.r$r" "$N" "$AGGS_MAIN"
			measure_ours "e.ours.$w.r$r" "$N" "$AGGS_MAIN"
		done
	done
	for w in 1 2 4; do
		rounds_summary "e.ours.$w" "$E_REPS" eps seconds per_batch
		rounds_summary "e.ours.$w.cold" "$E_REPS" eps
	done
	restart_pg 1
}
scaling_run
