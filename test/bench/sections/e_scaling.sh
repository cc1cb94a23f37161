# test/bench/sections/e_scaling.sh -- section e, worker scaling.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ---------------------------------------------------------------- e. scaling
set_debug on
say "e. workers: $N events over $AGGS_MAIN aggregates"
for w in 1 2 4; do
	restart_pg "$w"
	measure_ours "e.ours.$w.cold" "$N" "$AGGS_MAIN"   # first run after the restart
	measure_ours "e.ours.$w" "$N" "$AGGS_MAIN"
done
set_debug off
