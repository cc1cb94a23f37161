/*-------------------------------------------------------------------------
 *
 * order_check.c
 *		Read back topics written by the outbox publisher and judge, per
 *		aggregate, whether events arrived complete and in order.
 *
 * Every topic-partition is read from its low to its high watermark (as
 * queried at startup) with a plain assign()ed consumer: no group
 * membership, no commits.  Messages are buffered compactly and judged
 * afterwards partition by partition, so the verdict does not depend on how
 * the client happened to interleave fetches from different partitions.
 *
 * Per aggregate we keep the highest version seen plus the "holes": ranges
 * of versions below the highest that have not been seen.  Accepted runs are
 * contiguous, so holes only appear through gaps; that keeps the state tiny
 * even for versions in the millions, and makes every rule exact:
 *
 *	v == highest + 1				accepted
 *	v >  highest + 1				gap (hole [highest+1, v-1] added)
 *	v <= highest, not in a hole		duplicate (re-delivery)
 *	v <  highest, in a hole			inversion (v removed from the hole)
 *
 * The first message of an aggregate is accepted only if it is version 1 (or
 * any version with --any-start); versions below it become a hole.
 *
 * With --events, every message's event_id header is also compared with the
 * database's event at its (aggregate, version): a version that Kafka holds
 * with another event (an event published although its transaction was lost
 * in a crash, its version then reused) is a "mismatch", which judging by
 * versions alone takes for a harmless re-delivery.
 *
 * Exit status: 0 all good, 1 anomalies, 2 read incomplete (timeout),
 * 3 usage or setup error.
 *
 * test/tools/order_check.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "tool_common.h"

#define EXIT_ANOMALIES	1
#define EXIT_TIMEOUT	2
#define EXIT_SETUP		3

/* versions above this are treated as malformed, so highest + 1 can't wrap */
#define MAX_VERSION		(INT64_MAX / 2)

/* how many unexpected aggregates to list without --verbose */
#define MAX_UNEXPECTED_LISTED 100

/* how many consumer errors to print before going quiet */
#define MAX_CONSUMER_ERRORS 20

static const char *const required_headers[] = {
	"event_id", "event_type", "aggregate_type", "aggregate_id",
	"aggregate_version"
};

#define NREQUIRED (sizeof(required_headers) / sizeof(required_headers[0]))

/* The database's event at one version of an aggregate (--events). */
typedef struct DbEvent
{
	int64_t		version;
	char	   *event_id;
} DbEvent;

/* Inclusive range of versions below "highest" that were never seen. */
typedef struct Hole
{
	int64_t		lo;
	int64_t		hi;
} Hole;

typedef struct Agg
{
	char	   *id;
	size_t		idlen;			/* ids come from headers: may hold NULs */
	uint64_t	hash;
	int64_t		highest;		/* 0 = nothing judged yet */
	int64_t		expected;		/* last_version from --expect, -1 if absent */
	Hole	   *holes;			/* sorted, disjoint */
	int			nholes;
	int			maxholes;
	int			home;			/* index into parts[] of first partition */
	bool		seen;			/* appeared in a well-formed message */
	bool		split;
	DbEvent    *events;			/* from --events, sorted by version */
	int			nevents;
	int			maxevents;
} Agg;

/* One well-formed message, waiting to be judged. */
typedef struct Rec
{
	uint32_t	agg;
	int64_t		version;
	int64_t		offset;
} Rec;

typedef struct Part
{
	int			topic;			/* index into topics[] */
	int32_t		partition;
	int64_t		lo;				/* watermarks queried at startup */
	int64_t		hi;
	int64_t		next;			/* next offset we have not processed yet */
	bool		done;
	Rec		   *recs;
	size_t		nrecs;
	size_t		maxrecs;
} Part;

/* options */
static const char *brokers;
static const char **topics;
static int	ntopics;
static const char *expect_file;
static const char *events_file;
static bool opt_print;
static bool opt_verbose;
static bool opt_any_start;
static long timeout_ms = 30000;
static ToolList extra_conf;		/* "prop=val" strings from -X */

/* aggregates, plus an open-addressing hash index over them */
static Agg *aggs;
static uint32_t naggs;
static uint32_t maxaggs;
static uint32_t *slots;			/* agg index + 1; 0 = empty */
static uint64_t nslots;			/* power of two */

static Part *parts;
static int	nparts;
static int *topic_first_part;	/* parts[] index of partition 0 per topic */
static int *topic_nparts;

/* counters */
static uint64_t n_messages;
static uint64_t n_accepted;
static uint64_t n_duplicates;
static uint64_t n_gaps;
static uint64_t n_inversions;
static uint64_t n_lost;
static uint64_t n_split;
static uint64_t n_malformed;
static uint64_t n_unexpected;
static uint64_t n_mismatched;
static uint64_t n_seen_aggs;

static void
usage(FILE *out)
{
	fprintf(out,
			"Usage: order_check --brokers LIST --topic T [--topic T ...] [options]\n"
			"\n"
			"Reads every message of the topics up to the high watermark and judges\n"
			"per-aggregate ordering from the aggregate_id/aggregate_version headers.\n"
			"\n"
			"Options:\n"
			"  --brokers LIST     bootstrap servers (required)\n"
			"  --topic T          topic to read (repeatable, required)\n"
			"  --expect FILE      lines \"aggregate_id<TAB>last_version\"; judge lost\n"
			"                     and unexpected aggregates\n"
			"  --events FILE      lines \"aggregate_id<TAB>version<TAB>event_id\": the\n"
			"                     database's events; a message whose event_id differs\n"
			"                     (or whose version is not listed) is a mismatch\n"
			"  --any-start        an aggregate may start at any version\n"
			"  --print            print every message\n"
			"  --verbose          print every anomaly\n"
			"  --timeout-ms N     overall time limit (default 30000)\n"
			"  -X PROP=VAL        extra librdkafka consumer property (repeatable)\n"
			"\n"
			"Exit status: 0 ok, 1 anomalies, 2 read incomplete, 3 usage/setup error.\n");
}

static void *
xrealloc(void *p, size_t size)
{
	void	   *r = realloc(p, size ? size : 1);

	if (r == NULL)
		fatal("out of memory");
	return r;
}

static int64_t
now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Strict decimal parse of a non-NUL-terminated buffer. */
static bool
parse_int64(const char *s, size_t len, int64_t min, int64_t max,
			int64_t *result)
{
	int64_t		val = 0;
	size_t		i;

	if (len == 0 || len > 19)
		return false;
	for (i = 0; i < len; i++)
	{
		if (s[i] < '0' || s[i] > '9')
			return false;
		/* 19 digits can overflow int64; check before multiplying */
		if (val > (INT64_MAX - (s[i] - '0')) / 10)
			return false;
		val = val * 10 + (s[i] - '0');
	}
	if (val < min || val > max)
		return false;
	*result = val;
	return true;
}

/* Print a possibly binary buffer readably. */
static void
print_escaped(FILE *out, const void *data, size_t len)
{
	const unsigned char *p = data;
	size_t		i;

	if (data == NULL)
	{
		fputs("(null)", out);
		return;
	}
	for (i = 0; i < len; i++)
	{
		if (p[i] == '\\')
			fputs("\\\\", out);
		else if (p[i] >= 0x20 && p[i] != 0x7f)
			fputc(p[i], out);
		else
			fprintf(out, "\\x%02x", p[i]);
	}
}

/* ---- aggregate table ---- */

static uint64_t
hash_bytes(const char *s, size_t len)
{
	uint64_t	h = 1469598103934665603ULL;	/* FNV-1a */
	size_t		i;

	for (i = 0; i < len; i++)
	{
		h ^= (unsigned char) s[i];
		h *= 1099511628211ULL;
	}
	/* final mix: FNV's low bits are weak for similar keys like "agg123" */
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	return h;
}

static void
grow_slots(void)
{
	uint64_t	newn = nslots ? nslots * 2 : 1024;
	uint32_t   *newslots = calloc(newn, sizeof(uint32_t));
	uint32_t	i;

	if (newslots == NULL)
		fatal("out of memory");
	for (i = 0; i < naggs; i++)
	{
		uint64_t	pos = aggs[i].hash & (newn - 1);

		while (newslots[pos] != 0)
			pos = (pos + 1) & (newn - 1);
		newslots[pos] = i + 1;
	}
	free(slots);
	slots = newslots;
	nslots = newn;
}

/* Find the aggregate with this id, creating it if needed. */
static uint32_t
agg_lookup(const char *id, size_t len)
{
	uint64_t	h = hash_bytes(id, len);
	uint64_t	pos;
	Agg		   *a;

	/* keep load factor <= 1/2 so probe sequences stay short */
	if ((uint64_t) (naggs + 1) * 2 > nslots)
		grow_slots();

	for (pos = h & (nslots - 1); slots[pos] != 0;
		 pos = (pos + 1) & (nslots - 1))
	{
		a = &aggs[slots[pos] - 1];
		if (a->hash == h && a->idlen == len && memcmp(a->id, id, len) == 0)
			return slots[pos] - 1;
	}

	if (naggs == UINT32_MAX - 1)
		fatal("too many aggregates");
	if (naggs == maxaggs)
	{
		maxaggs = maxaggs ? maxaggs * 2 : 1024;
		aggs = xrealloc(aggs, (size_t) maxaggs * sizeof(Agg));
	}
	a = &aggs[naggs];
	memset(a, 0, sizeof(*a));
	a->id = xrealloc(NULL, len + 1);
	memcpy(a->id, id, len);
	a->id[len] = '\0';
	a->idlen = len;
	a->hash = h;
	a->expected = -1;
	a->home = -1;
	slots[pos] = naggs + 1;
	return naggs++;
}

/* ---- holes ---- */

static void
hole_append(Agg *a, int64_t lo, int64_t hi)
{
	if (a->nholes == a->maxholes)
	{
		a->maxholes = a->maxholes ? a->maxholes * 2 : 2;
		a->holes = xrealloc(a->holes, (size_t) a->maxholes * sizeof(Hole));
	}
	a->holes[a->nholes].lo = lo;
	a->holes[a->nholes].hi = hi;
	a->nholes++;
}

/* bsearch(3) order of a version (key) against a hole's range [lo, hi]. */
static int
cmp_version_hole(const void *key, const void *elem)
{
	int64_t		v = *(const int64_t *) key;
	const Hole *h = elem;

	return v < h->lo ? -1 : v > h->hi ? 1 : 0;
}

/* bsearch(3) order of a version (key) against a database event's. */
static int
cmp_version_event(const void *key, const void *elem)
{
	int64_t		v = *(const int64_t *) key;
	const DbEvent *e = elem;

	return v < e->version ? -1 : v > e->version ? 1 : 0;
}

/* Index of the hole containing v, or -1. */
static int
hole_find(const Agg *a, int64_t v)
{
	const Hole *h;

	if (a->nholes == 0)
		return -1;
	h = bsearch(&v, a->holes, (size_t) a->nholes, sizeof(Hole), cmp_version_hole);
	return h ? (int) (h - a->holes) : -1;
}

/* Mark v (inside hole i) as seen. */
static void
hole_fill(Agg *a, int i, int64_t v)
{
	Hole	   *h = &a->holes[i];

	if (h->lo == h->hi)
	{
		memmove(&a->holes[i], &a->holes[i + 1],
				(size_t) (a->nholes - i - 1) * sizeof(Hole));
		a->nholes--;
	}
	else if (v == h->lo)
		h->lo++;
	else if (v == h->hi)
		h->hi--;
	else
	{
		int64_t		oldhi = h->hi;

		/* split in two; make room first (may move the array) */
		hole_append(a, 0, 0);
		h = &a->holes[i];
		memmove(&a->holes[i + 2], &a->holes[i + 1],
				(size_t) (a->nholes - i - 2) * sizeof(Hole));
		h->hi = v - 1;
		a->holes[i + 1].lo = v + 1;
		a->holes[i + 1].hi = oldhi;
	}
}

/* ---- expect and events files ---- */

/* One line of a file, without its line end; a file's line handler. */
typedef void (*LineFn) (char *line, const char *path, int lineno);

/* Call fn for each line of path that is neither empty nor a # comment. */
static void
read_lines(const char *path, const char *what, LineFn fn)
{
	FILE	   *f = fopen(path, "r");
	char	   *line = NULL;
	size_t		cap = 0;
	ssize_t		len;
	int			lineno = 0;

	if (f == NULL)
		fatal("could not open %s file \"%s\": %s", what, path, strerror(errno));
	while ((len = getline(&line, &cap, f)) >= 0)
	{
		lineno++;
		while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (len == 0 || line[0] == '#')
			continue;
		fn(line, path, lineno);
	}
	if (ferror(f))
		fatal("could not read %s file \"%s\": %s", what, path, strerror(errno));
	free(line);
	fclose(f);
}

/* An expect file's line: aggregate_id<TAB>last_version. */
static void
expect_line(char *line, const char *path, int lineno)
{
	char	   *sep;
	int64_t		last;
	uint32_t	idx;

	/* aggregate ids may contain blanks, so prefer the TAB */
	sep = strchr(line, '\t');
	if (sep == NULL)
		sep = strrchr(line, ' ');
	if (sep == NULL || sep == line)
		fatal("%s:%d: expected \"aggregate_id<TAB>last_version\"",
			  path, lineno);
	if (!parse_int64(sep + 1, strlen(sep + 1), 0, MAX_VERSION, &last))
		fatal("%s:%d: invalid last_version \"%s\"", path, lineno, sep + 1);

	idx = agg_lookup(line, (size_t) (sep - line));
	if (aggs[idx].expected >= 0)
		fprintf(stderr, "order_check: %s:%d: aggregate %s listed twice, "
				"using the larger version\n", path, lineno, aggs[idx].id);
	if (last > aggs[idx].expected)
		aggs[idx].expected = last;
}

/* An events file's line: aggregate_id<TAB>version<TAB>event_id. */
static void
events_line(char *line, const char *path, int lineno)
{
	char	   *sep1;
	char	   *sep2;
	int64_t		version;
	uint32_t	idx;
	Agg		   *a;

	sep1 = strchr(line, '\t');
	sep2 = sep1 ? strchr(sep1 + 1, '\t') : NULL;
	if (sep1 == NULL || sep1 == line || sep2 == NULL)
		fatal("%s:%d: expected \"aggregate_id<TAB>version<TAB>event_id\"",
			  path, lineno);
	if (!parse_int64(sep1 + 1, (size_t) (sep2 - sep1 - 1), 1, MAX_VERSION, &version))
		fatal("%s:%d: invalid version", path, lineno);

	idx = agg_lookup(line, (size_t) (sep1 - line));	/* may move aggs */
	a = &aggs[idx];
	if (a->nevents == a->maxevents)
	{
		a->maxevents = a->maxevents ? a->maxevents * 2 : 4;
		a->events = xrealloc(a->events, (size_t) a->maxevents * sizeof(DbEvent));
	}
	a->events[a->nevents].version = version;
	a->events[a->nevents].event_id = strdup(sep2 + 1);
	if (a->events[a->nevents].event_id == NULL)
		fatal("out of memory");
	a->nevents++;
}

static int
dbevent_cmp(const void *a, const void *b)
{
	int64_t		va = ((const DbEvent *) a)->version;
	int64_t		vb = ((const DbEvent *) b)->version;

	return va < vb ? -1 : va > vb;
}

/* Read the last version expected of each aggregate. */
static void
load_expect(const char *path)
{
	read_lines(path, "expect", expect_line);
}

/* Read the database's events, each aggregate's sorted by version. */
static void
load_events(const char *path)
{
	read_lines(path, "events", events_line);
	for (uint32_t i = 0; i < naggs; i++)
		qsort(aggs[i].events, (size_t) aggs[i].nevents, sizeof(DbEvent), dbevent_cmp);
}

/* Compare a message's event_id with the database's at its position. */
static void
match_event(const rd_kafka_message_t *m, const Agg *a, int64_t version,
			const char *event_id, size_t len)
{
	const DbEvent *found = NULL;

	if (a->nevents > 0)
		found = bsearch(&version, a->events, (size_t) a->nevents, sizeof(DbEvent),
						cmp_version_event);
	if (found != NULL && strlen(found->event_id) == len &&
		memcmp(found->event_id, event_id, len) == 0)
		return;
	n_mismatched++;
	if (opt_verbose)
	{
		printf("order_check: mismatch: aggregate %s at %s [%" PRId32 "] offset %"
			   PRId64 ": version %" PRId64 " has event_id ",
			   a->id, rd_kafka_topic_name(m->rkt), m->partition, m->offset, version);
		print_escaped(stdout, event_id, len);
		if (found)
			printf(", the database's is %s\n", found->event_id);
		else
			printf(", the database has no such version\n");
	}
}

/* ---- reading ---- */

/* The message's timestamp and its type (CreateTime or LogAppendTime) for --print. */
static void
print_timestamp(const rd_kafka_message_t *m)
{
	rd_kafka_timestamp_type_t type;
	int64_t		ts = rd_kafka_message_timestamp(m, &type);

	printf("    timestamp: %s %" PRId64 "\n",
		   type == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME ? "append" :
		   type == RD_KAFKA_TIMESTAMP_CREATE_TIME ? "create" : "none", ts);
}

static void
print_message(const rd_kafka_message_t *m, int64_t version, bool version_ok)
{
	rd_kafka_headers_t *hdrs = NULL;

	printf("%s [%" PRId32 "] @%" PRId64 " key=",
		   rd_kafka_topic_name(m->rkt), m->partition, m->offset);
	print_escaped(stdout, m->key, m->key_len);
	if (version_ok)
		printf(" version=%" PRId64 "\n", version);
	else
		printf(" version=(invalid)\n");

	printf("    headers:");
	if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		const char *name;
		const void *val;
		size_t		size;
		size_t		i;

		for (i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) ==
			 RD_KAFKA_RESP_ERR_NO_ERROR; i++)
		{
			printf(" %s=", name);
			print_escaped(stdout, val, size);
		}
	}
	else
		printf(" (none)");
	printf("\n    payload: ");
	print_escaped(stdout, m->payload, m->len);
	printf("\n");
	print_timestamp(m);
}

static void
malformed(const rd_kafka_message_t *m, const char *why)
{
	n_malformed++;
	if (opt_verbose)
		printf("order_check: malformed: %s [%" PRId32 "] offset %" PRId64
			   ": %s\n",
			   rd_kafka_topic_name(m->rkt), m->partition, m->offset, why);
}

/* Validate one message and queue it for judging. */
static void
process_message(Part *p, const rd_kafka_message_t *m)
{
	rd_kafka_headers_t *hdrs = NULL;
	const void *vals[NREQUIRED];
	size_t		sizes[NREQUIRED];
	const char *id;
	size_t		idlen;
	int64_t		version = 0;
	bool		version_ok = false;
	char		why[128];
	size_t		i;

	n_messages++;

	if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
		hdrs = NULL;

	why[0] = '\0';
	for (i = 0; i < NREQUIRED; i++)
	{
		vals[i] = NULL;
		sizes[i] = 0;
		if (hdrs == NULL ||
			rd_kafka_header_get_last(hdrs, required_headers[i], &vals[i],
									 &sizes[i]) != RD_KAFKA_RESP_ERR_NO_ERROR ||
			vals[i] == NULL)
		{
			if (why[0] == '\0')
				snprintf(why, sizeof(why), "missing header %s",
						 required_headers[i]);
			vals[i] = NULL;
		}
	}

	/* indexes follow required_headers[] */
	id = vals[3];
	idlen = sizes[3];
	if (vals[4] != NULL)
		version_ok = parse_int64(vals[4], sizes[4], 1, MAX_VERSION, &version);

	if (opt_print)
		print_message(m, version, version_ok);

	if (why[0] == '\0' && idlen == 0)
		snprintf(why, sizeof(why), "empty aggregate_id header");
	if (why[0] == '\0' && !version_ok)
		snprintf(why, sizeof(why),
				 "aggregate_version is not a positive decimal integer");
	/* the key decides the partition, so it has to be the aggregate id */
	if (why[0] == '\0' &&
		(m->key == NULL || m->key_len != idlen ||
		 memcmp(m->key, id, idlen) != 0))
		snprintf(why, sizeof(why), "message key does not match aggregate_id");
	if (why[0] != '\0')
	{
		malformed(m, why);
		return;
	}

	if (p->nrecs == p->maxrecs)
	{
		p->maxrecs = p->maxrecs ? p->maxrecs * 2 : 1024;
		p->recs = xrealloc(p->recs, p->maxrecs * sizeof(Rec));
	}
	p->recs[p->nrecs].agg = agg_lookup(id, idlen);
	if (events_file)
		match_event(m, &aggs[p->recs[p->nrecs].agg], version, vals[0], sizes[0]);
	p->recs[p->nrecs].version = version;
	p->recs[p->nrecs].offset = m->offset;
	p->nrecs++;
}

static rd_kafka_t *
make_consumer(void)
{
	rd_kafka_conf_t *conf = rd_kafka_conf_new();
	char		errstr[512];
	char		group[64];
	rd_kafka_t *rk;
	const char *const settings[][2] = {
		{"bootstrap.servers", brokers},
		{"client.id", "order_check"},
		/* assign() needs a group.id configured, but we never join it */
		{"group.id", group},
		{"enable.auto.commit", "false"},
		{"enable.auto.offset.store", "false"},
		{"enable.partition.eof", "true"},
		{"auto.offset.reset", "earliest"},
		{"allow.auto.create.topics", "false"},
		{"fetch.wait.max.ms", "50"},
		{"log_level", "3"},
	};
	size_t		i;

	snprintf(group, sizeof(group), "order_check-%d", (int) getpid());
	for (i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
		conf_set(conf, settings[i][0], settings[i][1]);
	conf_set_extra(conf, &extra_conf);
	rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		fatal("could not create consumer: %s", errstr);
	return rk;
}

static int64_t
remaining_ms(int64_t deadline)
{
	int64_t		r = deadline - now_ms();

	return r > 0 ? r : 0;
}

/*
 * Find out the partitions of every topic.  A topic that does not exist is
 * reported and treated as empty; other errors are retried until the
 * deadline.  Returns false on timeout.
 *
 * We ask for all topics rather than the ones we want: the mock broker only
 * speaks Metadata v2, which has no AllowAutoTopicCreation flag, so naming
 * a missing topic would silently create it.
 */
static bool
discover_partitions(rd_kafka_t *rk, int64_t deadline)
{
	const rd_kafka_metadata_t *md = NULL;
	rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;
	int			t;

	topic_first_part = xrealloc(NULL, (size_t) ntopics * sizeof(int));
	topic_nparts = xrealloc(NULL, (size_t) ntopics * sizeof(int));

	for (;;)
	{
		int64_t		left = remaining_ms(deadline);
		bool		retry = false;

		if (left == 0)
		{
			fprintf(stderr, "order_check: timeout: could not fetch topic "
					"metadata: %s\n", rd_kafka_err2str(err));
			return false;
		}
		err = rd_kafka_metadata(rk, 1, NULL, &md, (int) left);
		if (err)
		{
			usleep(100 * 1000);
			continue;
		}

		/* a topic still being created may show up without partitions */
		for (t = 0; t < ntopics && !retry; t++)
		{
			int			i;

			for (i = 0; i < md->topic_cnt; i++)
			{
				rd_kafka_resp_err_t terr = md->topics[i].err;

				if (strcmp(md->topics[i].topic, topics[t]) == 0 &&
					(terr || md->topics[i].partition_cnt == 0) &&
					terr != RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART)
					retry = true;
			}
		}
		if (!retry)
			break;
		rd_kafka_metadata_destroy(md);
		usleep(100 * 1000);
	}

	for (t = 0; t < ntopics; t++)
	{
		int			cnt = 0;
		int			i;

		for (i = 0; i < md->topic_cnt; i++)
		{
			if (strcmp(md->topics[i].topic, topics[t]) == 0 &&
				md->topics[i].err == 0)
				cnt = md->topics[i].partition_cnt;
		}
		if (cnt == 0)
			fprintf(stderr, "order_check: warning: topic %s does not exist, "
					"treating it as empty\n", topics[t]);

		topic_first_part[t] = nparts;
		topic_nparts[t] = cnt;
		parts = xrealloc(parts, (size_t) (nparts + cnt) * sizeof(Part));
		for (i = 0; i < cnt; i++)
		{
			Part	   *p = &parts[nparts++];

			memset(p, 0, sizeof(*p));
			p->topic = t;
			p->partition = i;
		}
	}
	rd_kafka_metadata_destroy(md);
	return true;
}

/* Returns false on timeout. */
static bool
query_watermarks(rd_kafka_t *rk, int64_t deadline)
{
	int			i;

	for (i = 0; i < nparts; i++)
	{
		Part	   *p = &parts[i];
		rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR__TIMED_OUT;

		for (;;)
		{
			int64_t		left = remaining_ms(deadline);

			if (left == 0)
			{
				fprintf(stderr, "order_check: timeout: %s [%" PRId32 "]: "
						"could not query watermarks: %s\n",
						topics[p->topic], p->partition, rd_kafka_err2str(err));
				return false;
			}
			err = rd_kafka_query_watermark_offsets(rk, topics[p->topic],
												   p->partition, &p->lo,
												   &p->hi, (int) left);
			if (!err)
				break;
			usleep(100 * 1000);
		}

		if (p->lo > 0)
			fprintf(stderr, "order_check: warning: %s [%" PRId32 "] starts at "
					"offset %" PRId64 ", not 0: older messages were deleted "
					"(the librdkafka mock keeps only ~5 MB per partition)\n",
					topics[p->topic], p->partition, p->lo);
		p->next = p->lo;
		p->done = (p->hi <= p->lo);
	}
	return true;
}

static Part *
find_part(const rd_kafka_message_t *m)
{
	const char *name = rd_kafka_topic_name(m->rkt);
	int			t;

	for (t = 0; t < ntopics; t++)
	{
		if (strcmp(topics[t], name) == 0)
		{
			if (m->partition < 0 || m->partition >= topic_nparts[t])
				return NULL;
			return &parts[topic_first_part[t] + m->partition];
		}
	}
	return NULL;
}

/* Consume until every partition reached its watermark; false on timeout. */
static bool
consume_all(rd_kafka_t *rk, int64_t deadline)
{
	rd_kafka_topic_partition_list_t *assignment;
	rd_kafka_resp_err_t err;
	int			pending = 0;
	int			nerrors = 0;
	int			i;

	assignment = rd_kafka_topic_partition_list_new(nparts > 0 ? nparts : 1);
	for (i = 0; i < nparts; i++)
	{
		if (parts[i].done)
			continue;
		rd_kafka_topic_partition_list_add(assignment, topics[parts[i].topic],
										  parts[i].partition)->offset =
			parts[i].lo;
		pending++;
	}

	if (pending == 0)
	{
		rd_kafka_topic_partition_list_destroy(assignment);
		return true;
	}

	err = rd_kafka_assign(rk, assignment);
	rd_kafka_topic_partition_list_destroy(assignment);
	if (err)
		fatal("assign failed: %s", rd_kafka_err2str(err));

	while (pending > 0)
	{
		int64_t		left = remaining_ms(deadline);
		rd_kafka_message_t *m;
		Part	   *p;

		if (left == 0)
			break;
		m = rd_kafka_consumer_poll(rk, left < 100 ? (int) left : 100);
		if (m == NULL)
			continue;

		p = find_part(m);
		if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF)
		{
			if (p != NULL && !p->done && m->offset >= p->hi)
			{
				p->done = true;
				pending--;
			}
		}
		else if (m->err)
		{
			if (nerrors++ < MAX_CONSUMER_ERRORS)
				fprintf(stderr, "order_check: consumer error: %s\n",
						rd_kafka_message_errstr(m));
		}
		else if (p != NULL && !p->done && m->offset >= p->next)
		{
			/* offset >= next also guards against client-side re-fetches */
			if (m->offset < p->hi)
			{
				process_message(p, m);
				p->next = m->offset + 1;
			}
			if (m->offset + 1 >= p->hi)
			{
				p->done = true;
				pending--;
			}
		}
		rd_kafka_message_destroy(m);
	}

	if (pending > 0)
	{
		for (i = 0; i < nparts; i++)
		{
			if (!parts[i].done)
				fprintf(stderr, "order_check: timeout: %s [%" PRId32 "] did "
						"not reach its high watermark %" PRId64
						" (next offset %" PRId64 ", low watermark %" PRId64
						")\n",
						topics[parts[i].topic], parts[i].partition,
						parts[i].hi, parts[i].next, parts[i].lo);
		}
		return false;
	}
	return true;
}

static void say_anomaly(const char *kind, const Agg *a, const char *tname,
						int32_t partition, int64_t offset, const char *fmt,...)
			__attribute__((format(printf, 6, 7)));

/*
 * With --verbose, say one anomaly at a message: "order_check: <kind>:
 * aggregate <id> at <topic> [<partition>] offset <offset>: <what>".
 */
static void
say_anomaly(const char *kind, const Agg *a, const char *tname, int32_t partition,
			int64_t offset, const char *fmt,...)
{
	va_list		ap;

	if (!opt_verbose)
		return;
	printf("order_check: %s: aggregate %s at %s [%" PRId32 "] offset %" PRId64 ": ",
		   kind, a->id, tname, partition, offset);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
}

/* ---- judging ---- */

static void
judge_part(int pidx)
{
	Part	   *p = &parts[pidx];
	const char *tname = topics[p->topic];
	size_t		r;

	for (r = 0; r < p->nrecs; r++)
	{
		Rec		   *rec = &p->recs[r];
		Agg		   *a = &aggs[rec->agg];
		int64_t		v = rec->version;

		if (!a->seen)
		{
			a->seen = true;
			a->home = pidx;
			n_seen_aggs++;
		}
		else if (a->home != pidx && !a->split)
		{
			a->split = true;
			n_split++;
			if (opt_verbose)
				printf("order_check: split: aggregate %s in %s [%" PRId32
					   "] and %s [%" PRId32 "] (first seen there at offset %"
					   PRId64 ")\n",
					   a->id, topics[parts[a->home].topic],
					   parts[a->home].partition, tname, p->partition,
					   rec->offset);
		}

		if (a->highest == 0)
		{
			/* first message of this aggregate */
			if (v == 1 || opt_any_start)
				n_accepted++;
			else
			{
				n_gaps++;
				say_anomaly("gap", a, tname, p->partition, rec->offset,
							"starts at version %" PRId64 " (1..%" PRId64 " not seen)",
							v, v - 1);
			}
			if (v > 1)
				hole_append(a, 1, v - 1);
			a->highest = v;
		}
		else if (v == a->highest + 1)
		{
			n_accepted++;
			a->highest = v;
		}
		else if (v > a->highest + 1)
		{
			n_gaps++;
			say_anomaly("gap", a, tname, p->partition, rec->offset,
						"version %" PRId64 " after %" PRId64 " (%" PRId64 "..%"
						PRId64 " not seen)", v, a->highest, a->highest + 1, v - 1);
			hole_append(a, a->highest + 1, v - 1);
			a->highest = v;
		}
		else
		{
			int			h = hole_find(a, v);

			if (h < 0)
			{
				n_duplicates++;
				say_anomaly("duplicate", a, tname, p->partition, rec->offset,
							"version %" PRId64 " seen before (highest %" PRId64 ")",
							v, a->highest);
			}
			else
			{
				n_inversions++;
				say_anomaly("inversion", a, tname, p->partition, rec->offset,
							"version %" PRId64 " after %" PRId64, v, a->highest);
				hole_fill(a, h, v);
			}
		}
	}
}

static void
judge_expectations(void)
{
	uint32_t	i;
	uint64_t	listed = 0;

	for (i = 0; i < naggs; i++)
	{
		Agg		   *a = &aggs[i];
		int64_t		exp = a->expected;
		int64_t		lost = 0;
		int			h;

		if (exp < 0)
		{
			if (!a->seen)
				continue;		/* can't happen: only expect adds unseen */
			n_unexpected++;
			if (opt_verbose || listed < MAX_UNEXPECTED_LISTED)
				printf("order_check: unexpected: aggregate %s (highest version "
					   "%" PRId64 ") is not in the expect file\n",
					   a->id, a->highest);
			else if (listed == MAX_UNEXPECTED_LISTED)
				printf("order_check: unexpected: more not listed, use "
					   "--verbose\n");
			listed++;
			continue;
		}

		for (h = 0; h < a->nholes && a->holes[h].lo <= exp; h++)
		{
			int64_t		hi = a->holes[h].hi < exp ? a->holes[h].hi : exp;

			lost += hi - a->holes[h].lo + 1;
			if (opt_verbose)
				printf("order_check: lost: aggregate %s versions %" PRId64
					   "..%" PRId64 " never seen\n",
					   a->id, a->holes[h].lo, hi);
		}
		if (exp > a->highest)
		{
			lost += exp - a->highest;
			if (opt_verbose)
				printf("order_check: lost: aggregate %s versions %" PRId64
					   "..%" PRId64 " never seen%s\n",
					   a->id, a->highest + 1, exp,
					   a->seen ? "" : " (aggregate never seen at all)");
		}
		else if (a->highest > exp && opt_verbose)
			printf("order_check: note: aggregate %s reached version %" PRId64
				   ", beyond the expected %" PRId64 "\n",
				   a->id, a->highest, exp);
		n_lost += (uint64_t) lost;
	}
}

int
main(int argc, char **argv)
{
	rd_kafka_t *rk;
	int64_t		deadline;
	bool		complete;
	int			rc;
	int			i;
	ToolList	topic_list = {0};
	bool		help = false;
	const ToolOpt opts[] = {
		{"-h", OPT_FLAG, &help, 0, 0},
		{"--print", OPT_FLAG, &opt_print, 0, 0},
		{"--verbose", OPT_FLAG, &opt_verbose, 0, 0},
		{"--any-start", OPT_FLAG, &opt_any_start, 0, 0},
		{"--brokers", OPT_STRING, &brokers, 0, 0},
		{"--topic", OPT_LIST, &topic_list, 0, 0},
		{"--expect", OPT_STRING, &expect_file, 0, 0},
		{"--events", OPT_STRING, &events_file, 0, 0},
		{"--timeout-ms", OPT_LONG, &timeout_ms, 1, 86400 * 1000},
		{"-X", OPT_LIST, &extra_conf, 0, 0},
		{NULL, OPT_FLAG, NULL, 0, 0}
	};

	fatal_exit_status = EXIT_SETUP;
	parse_options(argc, argv, 1, opts, usage);
	if (help)
	{
		usage(stdout);
		return 0;
	}
	/* a topic given twice would be assigned twice */
	topics = xrealloc(NULL, (size_t) (topic_list.n + 1) * sizeof(char *));
	for (i = 0; i < topic_list.n; i++)
	{
		int			t;

		for (t = 0; t < ntopics && strcmp(topics[t], topic_list.items[i]) != 0; t++)
			;
		if (t == ntopics)
			topics[ntopics++] = topic_list.items[i];
	}
	if (brokers == NULL || ntopics == 0)
		fatal("--brokers and at least one --topic are required (try --help)");

	/* line-buffer so --print output interleaves sanely with stderr */
	setvbuf(stdout, NULL, _IOLBF, 0);

	deadline = now_ms() + timeout_ms;

	if (expect_file)
		load_expect(expect_file);
	if (events_file)
		load_events(events_file);

	rk = make_consumer();
	complete = discover_partitions(rk, deadline) &&
		query_watermarks(rk, deadline) &&
		consume_all(rk, deadline);

	/* no group membership to leave; don't let a dead cluster stall exit */
	rd_kafka_destroy_flags(rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);

	for (i = 0; i < nparts; i++)
		judge_part(i);
	if (expect_file)
		judge_expectations();

	printf("order_check: messages=%" PRIu64 " aggregates=%" PRIu64
		   " accepted=%" PRIu64 " duplicates=%" PRIu64 " gaps=%" PRIu64
		   " inversions=%" PRIu64,
		   n_messages, n_seen_aggs, n_accepted, n_duplicates, n_gaps,
		   n_inversions);
	if (expect_file)
		printf(" lost=%" PRIu64, n_lost);
	else
		printf(" lost=?");
	printf(" split=%" PRIu64 " malformed=%" PRIu64 " unexpected=%" PRIu64,
		   n_split, n_malformed, n_unexpected);
	if (events_file)
		printf(" mismatched=%" PRIu64, n_mismatched);
	printf("\n");

	if (!complete)
		rc = EXIT_TIMEOUT;
	else if (n_gaps || n_inversions || n_lost || n_split || n_malformed ||
			 n_unexpected || n_mismatched)
		rc = EXIT_ANOMALIES;
	else
		rc = 0;
	return rc;
}
