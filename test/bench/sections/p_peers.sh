# test/bench/sections/p_peers.sh -- section p, the peers (peers.sh).
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ------------------------------------------------------------------ p. peers
restart_pg 1
peers_run
