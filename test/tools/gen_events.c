/*-------------------------------------------------------------------------
 *
 * gen_events.c
 *		Produce synthetic outbox-style events, for load-testing order_check
 *		and the mock cluster without the extension in the loop.
 *
 * Aggregate "<prefix><n>" gets versions 1..V; versions are interleaved
 * across aggregates (all version-1 events first, then all version-2 ...)
 * so that a partition holds many aggregates at once, as it would in real
 * life.  Headers and key follow the publisher's conventions.  The producer
 * is idempotent by default, which keeps per-partition order under retries.
 *
 * test/tools/gen_events.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "tool_common.h"

static long delivery_failures = 0;

static void
usage(FILE *out)
{
	fprintf(out,
			"Usage: gen_events --brokers LIST --topic T [options]\n"
			"\n"
			"  --aggregates N       number of aggregates (default 1000)\n"
			"  --versions V         versions per aggregate (default 10)\n"
			"  --prefix P           aggregate id prefix (default \"agg\")\n"
			"  --expect-out FILE    write \"aggregate_id<TAB>V\" lines for order_check\n"
			"  --no-idempotence     plain producer (retries may duplicate/reorder)\n"
			"  -X PROP=VAL          extra librdkafka producer property (repeatable)\n");
}

static void
dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	(void) rk;
	(void) opaque;

	if (m->err)
	{
		if (delivery_failures < 10)
			fprintf(stderr, "gen_events: delivery failed: %s\n",
					rd_kafka_err2str(m->err));
		delivery_failures++;
	}
}

int
main(int argc, char **argv)
{
	const char *brokers = NULL;
	const char *topic = NULL;
	const char *prefix = "agg";
	const char *expect_out = NULL;
	long		naggs = 1000;
	long		nversions = 10;
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	rd_kafka_t *rk;
	char		errstr[512];
	ToolList	extra = {0};
	bool		no_idempotence = false;
	long		v;
	long		a;
	const ToolOpt opts[] = {
		{"--brokers", OPT_STRING, &brokers, 0, 0},
		{"--topic", OPT_STRING, &topic, 0, 0},
		{"--prefix", OPT_STRING, &prefix, 0, 0},
		{"--expect-out", OPT_STRING, &expect_out, 0, 0},
		{"--aggregates", OPT_LONG, &naggs, 1, 100000000},
		{"--versions", OPT_LONG, &nversions, 1, 100000000},
		{"--no-idempotence", OPT_FLAG, &no_idempotence, 0, 0},
		{"-X", OPT_LIST, &extra, 0, 0},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	parse_options(argc, argv, 1, opts, usage);
	if (brokers == NULL || topic == NULL)
		fatal("--brokers and --topic are required (try --help)");

	conf_set(conf, "bootstrap.servers", brokers);
	conf_set(conf, "client.id", "gen_events");
	conf_set(conf, "enable.idempotence", no_idempotence ? "false" : "true");
	conf_set(conf, "linger.ms", "5");
	/* -X last, so it can override the defaults above */
	conf_set_extra(conf, &extra);
	rd_kafka_conf_set_dr_msg_cb(conf, dr_cb);

	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		fatal("could not create producer: %s", errstr);

	for (v = 1; v <= nversions; v++)
	{
		for (a = 0; a < naggs; a++)
		{
			char		id[256];
			char		ver[32];
			char		evid[320];
			char		payload[512];
			int			idlen;
			rd_kafka_resp_err_t err;

			idlen = snprintf(id, sizeof(id), "%s%ld", prefix, a);
			snprintf(ver, sizeof(ver), "%ld", v);
			snprintf(evid, sizeof(evid), "%s-%ld", id, v);
			snprintf(payload, sizeof(payload),
					 "{\"aggregate\":\"%s\",\"version\":%ld}", id, v);

			for (;;)
			{
				err = rd_kafka_producev(
					rk,
					RD_KAFKA_V_TOPIC(topic),
					RD_KAFKA_V_KEY(id, (size_t) idlen),
					RD_KAFKA_V_VALUE(payload, strlen(payload)),
					RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
					RD_KAFKA_V_HEADER("event_id", evid, -1),
					RD_KAFKA_V_HEADER("event_type", "Generated", -1),
					RD_KAFKA_V_HEADER("aggregate_type", "Gen", -1),
					RD_KAFKA_V_HEADER("aggregate_id", id, idlen),
					RD_KAFKA_V_HEADER("aggregate_version", ver, -1),
					RD_KAFKA_V_END);
				if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL)
					break;
				/* local queue full: let deliveries drain, then retry */
				rd_kafka_poll(rk, 100);
			}
			if (err)
				fatal("produce failed: %s", rd_kafka_err2str(err));
			rd_kafka_poll(rk, 0);
		}
	}

	while (rd_kafka_outq_len(rk) > 0)
	{
		if (rd_kafka_flush(rk, 60 * 1000) == RD_KAFKA_RESP_ERR__TIMED_OUT)
			fatal("timed out flushing %d message(s)", rd_kafka_outq_len(rk));
	}
	rd_kafka_destroy(rk);

	if (expect_out)
	{
		FILE	   *f = fopen(expect_out, "w");

		if (f == NULL)
			fatal("could not create \"%s\": %s", expect_out, strerror(errno));
		for (a = 0; a < naggs; a++)
			fprintf(f, "%s%ld\t%ld\n", prefix, a, nversions);
		if (fclose(f) != 0)
			fatal("could not write \"%s\": %s", expect_out, strerror(errno));
	}

	printf("gen_events: produced %ld event(s), %ld delivery failure(s)\n",
		   naggs * nversions, delivery_failures);
	return delivery_failures ? 1 : 0;
}
