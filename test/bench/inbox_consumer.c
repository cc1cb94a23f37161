/*-------------------------------------------------------------------------
 *
 * inbox_consumer.c
 *		Baseline of the inbox benchmark (test/bench/inbox.sh): the consumer
 *		every team writes by hand, one message per transaction.
 *
 *	inbox_consumer --dsn DSN --brokers LIST --topic T --group G --events N
 *		[--consumer NAME] [--max-seconds S]
 *
 *		A librdkafka high-level consumer (auto.offset.reset=earliest,
 *		offsets stored by hand after the database commit and auto-committed)
 *		and one libpq connection.  For each message:
 *
 *		  BEGIN;
 *		  SELECT inbox_claim(<consumer>, <event_id header>);
 *		  -- if true:
 *		  INSERT INTO bench_applied (aggregate_id, version, payload)
 *		      VALUES (<headers>, <value>);
 *		  COMMIT;
 *		  rd_kafka_offsets_store(<offset + 1>);
 *
 *		which is exactly-once as long as the claim and the effect share the
 *		transaction.  It stops after N messages claimed or skipped as
 *		duplicates and prints one line: "events <n> seconds <s> events/s <r>",
 *		timed from the first message.
 *
 *-------------------------------------------------------------------------
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_kafka.h"

/* A header's value as a NUL-terminated string in buf, or "" if absent. */
static const char *
header(rd_kafka_message_t *m, const char *name, char *buf, size_t len)
{
	rd_kafka_headers_t *hdrs;
	const void *v;
	size_t		sz;

	buf[0] = '\0';
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR &&
		rd_kafka_header_get_last(hdrs, name, &v, &sz) == RD_KAFKA_RESP_ERR_NO_ERROR &&
		v != NULL && sz < len)
	{
		memcpy(buf, v, sz);
		buf[sz] = '\0';
	}
	return buf;
}

int
main(int argc, char **argv)
{
	InboxOptions o;
	const char *consumer = "hand";
	long		done = 0;
	double		t0 = 0,
				start = now_s();
	rd_kafka_t *rk;
	rd_kafka_topic_partition_list_t *tl;
	PGconn	   *db;
	const char *const settings[] = {
		"auto.offset.reset", "earliest",
		"enable.auto.offset.store", "false",
		NULL
	};
	const ToolOpt opts[] = {
		{"--consumer", OPT_STRING, &consumer, 0, 0},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	parse_inbox_options(argc, argv, &o, opts);
	db = connect_db(o.dsn);
	rk = subscribe_consumer(o.brokers, o.group, o.topic, settings, NULL);

	while (done < o.events && now_s() - start < o.max_seconds)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
		char		event_id[128],
					agg[256],
					ver[32],
					*payload;
		const char *claim_p[2],
				   *ins_p[3];
		PGresult   *r;

		if (!m)
			continue;
		if (m->err)
		{
			rd_kafka_message_destroy(m);
			continue;
		}
		if (t0 == 0)
			t0 = now_s();
		payload = strndup(m->payload ? (const char *) m->payload : "null", m->payload ? m->len : 4);
		claim_p[0] = consumer;
		claim_p[1] = header(m, "event_id", event_id, sizeof(event_id));
		ins_p[0] = header(m, "aggregate_id", agg, sizeof(agg));
		ins_p[1] = header(m, "aggregate_version", ver, sizeof(ver));
		ins_p[2] = payload;

		PQclear(exec_params(db, "BEGIN", 0, NULL, PGRES_COMMAND_OK));
		r = exec_params(db, "SELECT inbox_claim($1, $2)", 2, claim_p, PGRES_TUPLES_OK);
		if (strcmp(PQgetvalue(r, 0, 0), "t") == 0)
			PQclear(exec_params(db, "INSERT INTO bench_applied (aggregate_id, version, payload) VALUES ($1, $2, $3)",
						3, ins_p, PGRES_COMMAND_OK));
		PQclear(r);
		PQclear(exec_params(db, "COMMIT", 0, NULL, PGRES_COMMAND_OK));
		/* Only after the commit: a crash before it means re-delivery. */
		rd_kafka_offsets_store(rk, (tl = rd_kafka_topic_partition_list_new(1),
									rd_kafka_topic_partition_list_add(tl, rd_kafka_topic_name(m->rkt),
																	  m->partition)->offset = m->offset + 1,
									tl));
		rd_kafka_topic_partition_list_destroy(tl);
		free(payload);
		rd_kafka_message_destroy(m);
		done++;
	}
	printf("events %ld seconds %.3f events/s %.0f\n", done, now_s() - t0,
		   done / (now_s() - t0));
	rd_kafka_consumer_close(rk);
	rd_kafka_destroy(rk);
	PQfinish(db);
	return done == o.events ? 0 : 1;
}
