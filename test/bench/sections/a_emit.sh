# test/bench/sections/a_emit.sh -- section a, emit cost.
# Part of run.sh (sourced by it in order, not run): its helpers and
# variables are defined by the parts before.

# ------------------------------------------------------------ a. emit cost
# (mock only: the emit cost does not depend on the broker)
if [ "$real" = 0 ]; then
	# One pgbench script: the business UPDATE, then the statement given (if any).
	emit_script() { # name [statement]
		{
			echo '\set id random(1, 10000)'
			echo 'BEGIN;'
			echo 'UPDATE orders SET total = total + 1, version = version + 1 WHERE id = :id RETURNING version \gset'
			[ -z "${2:-}" ] || echo "$2"
			echo 'END;'
		} >"$work/emit_$1.sql"
	}
	emit_script ours "SELECT event_id FROM outbox_emit('order', 'order-' || :id, 'OrderPaid', '{\"amount\": 10, \"currency\": \"EUR\"}', topic => 'bench.emit.ours');"
	emit_script plain "INSERT INTO relay_outbox (aggregate_id, aggregate_version, topic, headers, payload) VALUES ('order-' || :id, :version, 'bench.emit.plain', jsonb_build_object('event_id', gen_random_uuid()::text, 'event_type', 'OrderPaid', 'aggregate_type', 'order'), '{\"amount\": 10, \"currency\": \"EUR\"}');"
	emit_script update
	emit_script copy "INSERT INTO outbox_copy (event_id, aggregate_type, aggregate_id, aggregate_version, event_type, topic, payload) VALUES (uuid_v7()::text, 'order', 'order-' || :id, :version, 'OrderPaid', 'bench.emit.ours', '{\"amount\": 10, \"currency\": \"EUR\"}');"
	mk topic_create bench.emit.ours 16 3
	mk topic_create bench.emit.plain 16 3

	reset_emit() {
		q <<'EOF'
TRUNCATE outbox, aggregate_publication, relay_outbox, outbox_copy, orders;
INSERT INTO orders SELECT g, 'new', 0, 0 FROM generate_series(1, 10000) g;
VACUUM ANALYZE orders;
CHECKPOINT;
EOF
	}
	emit_run() { # key script
		local log=$work/pgbench.$1.log tps
		reset_emit
		snap_start
		pgbench -n -M prepared -c 2 -j 2 -T "$EMIT_S" -f "$2" >"$log" 2>&1 || { cat "$log" >&2; exit 1; }
		snap_end "$1" "$EMIT_S"
		tps=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' "$log")
		res "$1.tps" "$tps"
		res "$1.backlog" "$(q -c "SELECT (SELECT count(*) FROM outbox_pending) + (SELECT count(*) FROM relay_outbox WHERE published_at IS NULL)")"
		say "  $1: $tps tps"
	}
	script_of() {
		case $1 in
			update.*) echo "$work/emit_update.sql" ;;
			plain.*) echo "$work/emit_plain.sql" ;;
			copy.*) echo "$work/emit_copy.sql" ;;
			ours.*) echo "$work/emit_ours.sql" ;;
		esac
	}
	# ratio of the per-round values of two configurations, and their median
	round_ratios() { # a b
		local r v=""
		for r in $(seq "$EMIT_ROUNDS"); do
			v="$v $(awk -v a="${R[a.$1.r$r.tps]}" -v b="${R[a.$2.r$r.tps]}" 'BEGIN { printf "%.2f", a / b }')"
		done
		echo "$v" | tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{ x[NR] = $1 } END {
			m = NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2
			s = ""; for (i = 1; i <= NR; i++) s = s (i > 1 ? ", " : "") x[i]
			printf "%.2f (rounds, sorted: %s)\n", m, s }'
	}

	say "a. emit cost: pgbench -c 2 -T $EMIT_S x $EMIT_ROUNDS round(s), order alternating"
	W0="update.w0 plain.w0 copy.w0 ours.w0"
	W1="ours.w1 plain.relay plain.w1"
	for r in $(seq "$EMIT_ROUNDS"); do
		if [ $((r % 2)) = 1 ]; then o0=$W0 o1=$W1; else
			o0=$(tr ' ' '\n' <<<"$W0" | tac | xargs) o1=$(tr ' ' '\n' <<<"$W1" | tac | xargs)
		fi
		restart_pg 0
		for c in $o0; do emit_run "a.$c.r$r" "$(script_of "$c")"; done
		restart_pg 1
		warm_ours bench.emit.ours
		for c in $o1; do
			if [ "$c" = plain.relay ]; then
				start_relay "$brokers"
				emit_run "a.$c.r$r" "$work/emit_plain.sql"
				stop_relay
				res "a.$c.r$r.relay" "${RELAY_LINE#relay: }"
			else
				emit_run "a.$c.r$r" "$(script_of "$c")"
			fi
		done
	done
	for k in $W0 $W1; do
		vals=""
		for r in $(seq "$EMIT_ROUNDS"); do vals="$vals ${R[a.$k.r$r.tps]}"; done
		res "a.$k.tps" "$(awk -v v="$vals" 'BEGIN { n = split(v, x, " "); for (i = 1; i <= n; i++) s += x[i]; printf "%.0f\n", s / n }')"
	done
	res a.ratio.w0 "$(round_ratios ours.w0 plain.w0)"
	res a.ratio.w1 "$(round_ratios ours.w1 plain.relay)"
	res a.ratio.copy "$(round_ratios copy.w0 plain.w0)"

	# Where an emitting transaction's CPU goes: perf on the one backend of a
	# 1-client pgbench (publisher stopped).  Inclusive shares of its samples.
	res a.perf ""
	if command -v perf >/dev/null && perf record -q -o "$work/perf.test" -- true >/dev/null 2>&1; then
		restart_pg 0
		reset_emit
		pgbench -n -M prepared -c 1 -T $((PERF_S + 3)) -f "$work/emit_ours.sql" >"$work/pgbench.perf.log" 2>&1 &
		pb=$!
		sleep 1.5
		bpid=$(q -c "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbench' LIMIT 1")
		if [ -n "$bpid" ] && perf record -q -g -p "$bpid" -o "$work/perf.data" -- sleep "$PERF_S" >/dev/null 2>&1; then
			perf report -i "$work/perf.data" --children --sort symbol --stdio -g none 2>/dev/null >"$work/perf.txt" || true
			shares=""
			# (Debian's postgres binary is stripped: static functions do not resolve)
			for sym in PostgresMain emit_event ExecSimpleRelationInsert ExecInsertIndexTuples last_version ExecOpenIndices standard_ExecutorStart ExecInitNode CommitTransactionCommand heap_page_prune_opt; do
				v=$(awk -v s="$sym" '$3 == "[.]" && $4 == s { print $1; exit }' "$work/perf.txt")
				[ -n "$v" ] && shares="$shares $sym=$v"
			done
			shares="$shares samples=$(sed -n 's/^# Samples: \([^ ]*\) .*/\1/p' "$work/perf.txt" | head -n1)"
			res a.perf "${shares# }"
			say "  perf: ${R[a.perf]}"
		fi
		wait "$pb" || true
		restart_pg 1
	fi
fi
