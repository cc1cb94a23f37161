# test/bench/sections/f_nagle.sh -- section f, the mock as shipped (Nagle).
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ------------------------------------------- f. the mock as shipped (Nagle)
say "f. the mock without the TCP_NODELAY shim"
start_mock mock2 ""
brokers2=$(cat "$work/mock2.bootstrap")
ctl_main=$ctl
ctl=$work/mock2.control
brokers_main=$brokers
brokers=$brokers2
q -c "ALTER SYSTEM SET outbox.brokers = '$brokers2'"
restart_pg 1
measure_ours f.ours.10000 "$N" "$AGGS_MAIN"
measure_relay f.relay.10000 "$NAGLE_RELAY_N" "$AGGS_MAIN"
lat_run f.d.ours.2000 ours 2000
lat_run f.d.relay.2000 relay 2000
brokers=$brokers_main
ctl=$ctl_main

res machine.load_end "$(cut -d' ' -f1-3 /proc/loadavg)"
res total_s "$(($(date +%s) - started))"
