/*-------------------------------------------------------------------------
 *
 * mock_kafka.c
 *		Run a librdkafka mock cluster as a standalone, remotely controllable
 *		process for the outbox test suite.
 *
 * The cluster lives inside a dummy producer handle, the same way
 * librdkafka's own test suite creates one.  Tests talk to it over a tiny
 * line-based TCP protocol on 127.0.0.1 (see usage() and handle_command())
 * to take brokers down, inject protocol errors, add latency and so on.
 *
 * Every command line gets exactly one reply line: "ok", "ok <data>" or
 * "err <message>".
 *
 * test/tools/mock_kafka.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include "tool_common.h"

#define MAX_CLIENTS		32
#define MAX_LINE		4096
#define MAX_TOKENS		1024
#define MAX_TOPICS		64
#define MAX_BROKERS		100
#define MAX_APIKEY		1000
#define POLL_MS			200

typedef struct Client
{
	int			fd;
	size_t		len;			/* bytes buffered in buf */
	bool		discarding;		/* skipping the rest of an overlong line */
	char		buf[MAX_LINE];
} Client;

typedef struct TopicSpec
{
	char	   *name;
	int			partitions;
} TopicSpec;

static volatile sig_atomic_t got_signal = 0;

static rd_kafka_t *rk;
static rd_kafka_mock_cluster_t *mcluster;
static int	broker_cnt = 3;
static const char *bootstrap_file;
static const char *control_file;
static bool quit_requested = false;

/*
 * Which (broker, apikey) pairs ever got broker_errors.  The mock consults a
 * broker's error stack before the cluster's and never deletes it, so even
 * once drained it hides cluster-wide "errors" for that broker: warn.
 */
static bool broker_stack_used[MAX_BROKERS + 1][MAX_APIKEY + 1];

static Client clients[MAX_CLIENTS];
static int	nclients = 0;

static void
usage(FILE *out)
{
	fprintf(out,
			"Usage: mock_kafka [options]\n"
			"\n"
			"Runs a librdkafka mock Kafka cluster until SIGTERM/SIGINT, \"quit\"\n"
			"or --max-seconds.\n"
			"\n"
			"Options:\n"
			"  --brokers N              number of brokers (default 3)\n"
			"  --bootstrap-file PATH    write the bootstrap server list here\n"
			"  --control-file PATH      write the control TCP port here\n"
			"  --max-seconds S          exit after S seconds (default 3600)\n"
			"  --topic NAME:PARTITIONS  pre-create a topic (repeatable)\n"
			"\n"
			"Environment: MOCK_KAFKA_DEBUG=mock logs requests and group states.\n"
			"\n"
			"Control commands (one per line, one reply line each):\n"
			"  ping | bootstrap | help | quit\n"
			"  down <broker> | up <broker> | all_down | all_up\n"
			"  rtt <broker|all> <ms>\n"
			"  errors <apikey> <errcode> [<errcode> ...]\n"
			"  broker_errors <broker> <apikey> <errcode>:<rtt_ms> [...]\n"
			"  clear_errors <apikey>\n"
			"  topic_create <topic> <partitions> <replication>\n"
			"  leader <topic> <partition> <broker|-1>\n");
}

/*
 * From librdkafka 2.5 the mock answers a Produce (v10 and later) or Fetch
 * (v12 and later) that reaches a broker which is not the partition's leader
 * with the current leader (KIP-951), read from the partition without a
 * check: when the partition is leaderless ("leader <topic> <p> -1"), NULL
 * is dereferenced and the whole mock cluster dies (seen with 2.8 and 2.14),
 * which every client sees as "all brokers are down".  Clients then use the
 * versions before, where the mock answers NOT_LEADER alone, as a broker
 * that predates KIP-951 does.
 */
static void
cap_leader_discovery_versions(void)
{
	const int16_t produce_key = 0;	/* ApiKey Produce */
	const int16_t fetch_key = 1;	/* ApiKey Fetch */

	if (rd_kafka_version() < 0x02050000)
		return;
	if (rd_kafka_mock_set_apiversion(mcluster, produce_key, 0, 9) ||
		rd_kafka_mock_set_apiversion(mcluster, fetch_key, 0, 11))
		fatal("could not cap the Produce and Fetch versions of the mock cluster");
}

static void
signal_handler(int signo)
{
	got_signal = signo;
}

/*
 * Write contents to path atomically: readers polling for the file must
 * never see it half-written, so write a temporary file and rename it.
 */
static bool
write_file_atomically(const char *path, const char *contents)
{
	char		tmp[PATH_MAX];
	FILE	   *f;

	if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int) getpid()) >=
		(int) sizeof(tmp))
	{
		fprintf(stderr, "mock_kafka: path too long: %s\n", path);
		return false;
	}
	f = fopen(tmp, "w");
	if (f == NULL)
	{
		fprintf(stderr, "mock_kafka: could not create \"%s\": %s\n",
				tmp, strerror(errno));
		return false;
	}
	if (fprintf(f, "%s\n", contents) < 0 || fflush(f) != 0 ||
		fsync(fileno(f)) != 0)
	{
		fprintf(stderr, "mock_kafka: could not write \"%s\": %s\n",
				tmp, strerror(errno));
		fclose(f);
		unlink(tmp);
		return false;
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0)
	{
		fprintf(stderr, "mock_kafka: could not rename \"%s\" to \"%s\": %s\n",
				tmp, path, strerror(errno));
		unlink(tmp);
		return false;
	}
	return true;
}

/* Kafka's legal topic name characters; keeps junk away from the mock. */
static bool
valid_topic_name(const char *s)
{
	size_t		len = strlen(s);

	if (len == 0 || len > 249)
		return false;
	for (; *s; s++)
	{
		if (!isalnum((unsigned char) *s) && *s != '.' && *s != '_' &&
			*s != '-')
			return false;
	}
	return true;
}

/*
 * Accept any error code librdkafka knows a name for: Kafka protocol codes
 * plus the internal negative ones (e.g. -195 __TRANSPORT makes the mock
 * broker drop the connection).
 */
static bool
parse_errcode(const char *s, rd_kafka_resp_err_t *err)
{
	const struct rd_kafka_err_desc *descs;
	size_t		ndescs;
	size_t		i;
	long		val;

	if (!parse_long(s, RD_KAFKA_RESP_ERR__BEGIN + 1,
					RD_KAFKA_RESP_ERR_END_ALL - 1, &val))
		return false;
	rd_kafka_get_err_descs(&descs, &ndescs);
	for (i = 0; i < ndescs; i++)
	{
		if (descs[i].code == (rd_kafka_resp_err_t) val && descs[i].name)
		{
			*err = (rd_kafka_resp_err_t) val;
			return true;
		}
	}
	return false;
}

static bool
parse_apikey(const char *s, int16_t *apikey)
{
	long		val;

	/* Kafka API keys are small non-negative int16 values. */
	if (!parse_long(s, 0, MAX_APIKEY, &val))
		return false;
	*apikey = (int16_t) val;
	return true;
}

static bool
parse_broker(const char *s, int32_t *broker)
{
	long		val;

	if (!parse_long(s, 1, broker_cnt, &val))
		return false;
	*broker = (int32_t) val;
	return true;
}

/* Append formatted text to a reply buffer, truncating safely. */
static void
appendf(char *buf, size_t size, const char *fmt,...)
{
	size_t		len = strlen(buf);
	va_list		ap;

	if (len + 1 >= size)
		return;
	va_start(ap, fmt);
	vsnprintf(buf + len, size - len, fmt, ap);
	va_end(ap);
}

#define REPLY_ERR(...) \
	do { snprintf(reply, replysize, "err " __VA_ARGS__); return; } while (0)

/*
 * Execute one control command.  tokens[0] is the command name; the reply
 * line (without newline) is written to reply.
 */
static void
handle_command(int ntokens, char **tokens, char *reply, size_t replysize)
{
	const char *cmd = tokens[0];
	rd_kafka_resp_err_t err;

	snprintf(reply, replysize, "ok");

	if (strcmp(cmd, "ping") == 0)
	{
		if (ntokens != 1)
			REPLY_ERR("usage: ping");
	}
	else if (strcmp(cmd, "help") == 0)
	{
		snprintf(reply, replysize,
				 "ok commands: ping bootstrap help quit down up all_down "
				 "all_up rtt errors broker_errors clear_errors "
				 "topic_create leader");
	}
	else if (strcmp(cmd, "bootstrap") == 0)
	{
		if (ntokens != 1)
			REPLY_ERR("usage: bootstrap");
		snprintf(reply, replysize, "ok %s",
				 rd_kafka_mock_cluster_bootstraps(mcluster));
	}
	else if (strcmp(cmd, "quit") == 0)
	{
		if (ntokens != 1)
			REPLY_ERR("usage: quit");
		quit_requested = true;
	}
	else if (strcmp(cmd, "down") == 0 || strcmp(cmd, "up") == 0)
	{
		int32_t		broker;

		if (ntokens != 2)
			REPLY_ERR("usage: %s <broker_id>", cmd);
		if (!parse_broker(tokens[1], &broker))
			REPLY_ERR("invalid broker id \"%s\" (valid: 1..%d)",
					  tokens[1], broker_cnt);
		if (cmd[0] == 'd')
			err = rd_kafka_mock_broker_set_down(mcluster, broker);
		else
			err = rd_kafka_mock_broker_set_up(mcluster, broker);
		if (err)
			REPLY_ERR("%s %d failed: %s", cmd, (int) broker,
					  rd_kafka_err2str(err));
	}
	else if (strcmp(cmd, "all_down") == 0 || strcmp(cmd, "all_up") == 0)
	{
		if (ntokens != 1)
			REPLY_ERR("usage: %s", cmd);
		/* broker id -1 means all brokers in the mock API */
		if (strcmp(cmd, "all_down") == 0)
			err = rd_kafka_mock_broker_set_down(mcluster, -1);
		else
			err = rd_kafka_mock_broker_set_up(mcluster, -1);
		if (err)
			REPLY_ERR("%s failed: %s", cmd, rd_kafka_err2str(err));
	}
	else if (strcmp(cmd, "rtt") == 0)
	{
		int32_t		broker;
		long		ms;

		if (ntokens != 3)
			REPLY_ERR("usage: rtt <broker_id|all> <ms>");
		if (strcmp(tokens[1], "all") == 0)
			broker = -1;
		else if (!parse_broker(tokens[1], &broker))
			REPLY_ERR("invalid broker id \"%s\" (valid: 1..%d or all)",
					  tokens[1], broker_cnt);
		if (!parse_long(tokens[2], 0, 3600 * 1000, &ms))
			REPLY_ERR("invalid rtt \"%s\" (valid: 0..3600000 ms)", tokens[2]);
		err = rd_kafka_mock_broker_set_rtt(mcluster, broker, (int) ms);
		if (err)
			REPLY_ERR("rtt failed: %s", rd_kafka_err2str(err));
	}
	else if (strcmp(cmd, "errors") == 0)
	{
		int16_t		apikey;
		rd_kafka_resp_err_t errs[MAX_TOKENS];
		int			i;

		if (ntokens < 3)
			REPLY_ERR("usage: errors <apikey> <errcode> [<errcode> ...]");
		if (!parse_apikey(tokens[1], &apikey))
			REPLY_ERR("invalid apikey \"%s\"", tokens[1]);
		for (i = 2; i < ntokens; i++)
		{
			if (!parse_errcode(tokens[i], &errs[i - 2]))
				REPLY_ERR("unknown error code \"%s\"", tokens[i]);
		}
		rd_kafka_mock_push_request_errors_array(mcluster, apikey,
												(size_t) (ntokens - 2), errs);
		snprintf(reply, replysize, "ok pushed apikey %d:", (int) apikey);
		for (i = 0; i < ntokens - 2; i++)
			appendf(reply, replysize, " %s", rd_kafka_err2name(errs[i]));
		for (i = 1; i <= broker_cnt; i++)
		{
			if (broker_stack_used[i][apikey])
				appendf(reply, replysize,
						" (warning: not seen by broker %d, which has its own "
						"apikey %d error stack from broker_errors)",
						i, (int) apikey);
		}
	}
	else if (strcmp(cmd, "broker_errors") == 0)
	{
		int32_t		broker;
		int16_t		apikey;
		rd_kafka_resp_err_t errs[MAX_TOKENS];
		int			rtts[MAX_TOKENS];
		int			i;

		if (ntokens < 4)
			REPLY_ERR("usage: broker_errors <broker_id> <apikey> "
					  "<errcode>:<rtt_ms> [...]");
		if (!parse_broker(tokens[1], &broker))
			REPLY_ERR("invalid broker id \"%s\" (valid: 1..%d)",
					  tokens[1], broker_cnt);
		if (!parse_apikey(tokens[2], &apikey))
			REPLY_ERR("invalid apikey \"%s\"", tokens[2]);

		/* validate everything before pushing anything */
		for (i = 3; i < ntokens; i++)
		{
			char	   *colon = strchr(tokens[i], ':');
			long		rtt;

			if (colon == NULL)
				REPLY_ERR("expected <errcode>:<rtt_ms>, got \"%s\"", tokens[i]);
			*colon = '\0';
			if (!parse_errcode(tokens[i], &errs[i - 3]))
				REPLY_ERR("unknown error code \"%s\"", tokens[i]);
			if (!parse_long(colon + 1, 0, 3600 * 1000, &rtt))
				REPLY_ERR("invalid rtt \"%s\" (valid: 0..3600000 ms)",
						  colon + 1);
			rtts[i - 3] = (int) rtt;
		}

		/*
		 * The API is variadic only; pushing one tuple per call is
		 * equivalent because each call appends to the broker's stack.
		 */
		snprintf(reply, replysize, "ok pushed broker %d apikey %d:",
				 (int) broker, (int) apikey);
		for (i = 0; i < ntokens - 3; i++)
		{
			err = rd_kafka_mock_broker_push_request_error_rtts(mcluster,
															   broker, apikey,
															   1, errs[i],
															   rtts[i]);
			if (err)
				REPLY_ERR("broker_errors failed: %s", rd_kafka_err2str(err));
			appendf(reply, replysize, " %s:%d",
					rd_kafka_err2name(errs[i]), rtts[i]);
		}
		broker_stack_used[broker][apikey] = true;
	}
	else if (strcmp(cmd, "clear_errors") == 0)
	{
		int16_t		apikey;
		int			i;

		if (ntokens != 2)
			REPLY_ERR("usage: clear_errors <apikey>");
		if (!parse_apikey(tokens[1], &apikey))
			REPLY_ERR("invalid apikey \"%s\"", tokens[1]);
		rd_kafka_mock_clear_request_errors(mcluster, apikey);
		for (i = 1; i <= broker_cnt; i++)
		{
			size_t		left = 0;

			if (broker_stack_used[i][apikey] &&
				rd_kafka_mock_broker_error_stack_cnt(mcluster, i, apikey,
													 &left) == 0 &&
				left > 0)
				appendf(reply, replysize,
						" (warning: broker %d still has %zu apikey %d "
						"error(s) from broker_errors; the mock cannot clear "
						"those)", i, left, (int) apikey);
		}
	}
	else if (strcmp(cmd, "topic_create") == 0)
	{
		long		partitions;
		long		replication;

		if (ntokens != 4)
			REPLY_ERR("usage: topic_create <topic> <partitions> <replication>");
		if (!valid_topic_name(tokens[1]))
			REPLY_ERR("invalid topic name \"%s\"", tokens[1]);
		if (!parse_long(tokens[2], 1, 10000, &partitions))
			REPLY_ERR("invalid partition count \"%s\" (valid: 1..10000)",
					  tokens[2]);
		if (!parse_long(tokens[3], 1, broker_cnt, &replication))
			REPLY_ERR("invalid replication factor \"%s\" (valid: 1..%d)",
					  tokens[3], broker_cnt);
		err = rd_kafka_mock_topic_create(mcluster, tokens[1], (int) partitions,
										 (int) replication);
		if (err)
			REPLY_ERR("topic_create %s failed: %s", tokens[1],
					  rd_kafka_err2str(err));
	}
	else if (strcmp(cmd, "leader") == 0)
	{
		long		partition;
		int32_t		broker;

		if (ntokens != 4)
			REPLY_ERR("usage: leader <topic> <partition> <broker_id|-1>");
		if (!valid_topic_name(tokens[1]))
			REPLY_ERR("invalid topic name \"%s\"", tokens[1]);
		if (!parse_long(tokens[2], 0, 9999, &partition))
			REPLY_ERR("invalid partition \"%s\"", tokens[2]);
		/* -1 makes the partition leaderless */
		if (strcmp(tokens[3], "-1") == 0)
			broker = -1;
		else if (!parse_broker(tokens[3], &broker))
			REPLY_ERR("invalid broker id \"%s\" (valid: 1..%d or -1)",
					  tokens[3], broker_cnt);
		err = rd_kafka_mock_partition_set_leader(mcluster, tokens[1],
												 (int32_t) partition, broker);
		if (err)
			REPLY_ERR("leader %s %ld failed: %s", tokens[1], partition,
					  rd_kafka_err2str(err));
	}
	else
		REPLY_ERR("unknown command \"%s\" (try \"help\")", cmd);
}

/* Send a whole reply line; the client may have gone away, which is fine. */
static void
send_reply(int fd, const char *reply)
{
	char		line[MAX_LINE + 2];
	size_t		len;
	size_t		off = 0;

	len = (size_t) snprintf(line, sizeof(line), "%s\n", reply);
	if (len >= sizeof(line))
	{
		len = sizeof(line) - 1;
		line[len - 1] = '\n';
	}
	while (off < len)
	{
		ssize_t		n = send(fd, line + off, len - off, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return;
		off += (size_t) n;
	}
}

static void
process_line(int fd, char *line)
{
	char	   *tokens[MAX_TOKENS];
	int			ntokens = 0;
	char	   *saveptr;
	char	   *tok;
	char		reply[MAX_LINE];
	size_t		len = strlen(line);

	/* tolerate CRLF clients (e.g. telnet, nc -C) */
	if (len > 0 && line[len - 1] == '\r')
		line[len - 1] = '\0';

	for (tok = strtok_r(line, " \t", &saveptr); tok != NULL;
		 tok = strtok_r(NULL, " \t", &saveptr))
	{
		if (ntokens == MAX_TOKENS)
		{
			send_reply(fd, "err too many arguments");
			return;
		}
		tokens[ntokens++] = tok;
	}

	if (ntokens == 0)
	{
		send_reply(fd, "err empty command");
		return;
	}

	handle_command(ntokens, tokens, reply, sizeof(reply));
	send_reply(fd, reply);
}

static void
close_client(int idx)
{
	close(clients[idx].fd);
	clients[idx] = clients[nclients - 1];
	nclients--;
}

/*
 * Read what is available from a client and run every complete line.
 * Returns false if the client should be closed.
 */
static bool
service_client(Client *c)
{
	ssize_t		n;
	size_t		start = 0;
	size_t		i;

	n = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
	if (n < 0)
		return errno == EINTR || errno == EAGAIN;
	if (n == 0)
		return false;
	c->len += (size_t) n;

	for (i = 0; i < c->len; i++)
	{
		if (c->buf[i] != '\n')
			continue;
		c->buf[i] = '\0';
		if (c->discarding)
			c->discarding = false;
		else
			process_line(c->fd, c->buf + start);
		start = i + 1;
		if (quit_requested)
			return false;
	}

	if (start > 0)
	{
		memmove(c->buf, c->buf + start, c->len - start);
		c->len -= start;
	}
	else if (c->len == sizeof(c->buf))
	{
		/* overlong line: reply once, then drop bytes up to its newline */
		if (!c->discarding)
			send_reply(c->fd, "err line too long");
		c->discarding = true;
		c->len = 0;
	}
	return true;
}

static int
open_control_socket(int *port)
{
	struct sockaddr_in addr;
	socklen_t	addrlen = sizeof(addr);
	int			fd;
	int			one = 1;

	fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		fatal("socket: %s", strerror(errno));
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&addr, 0, sizeof(addr));
	addr.sin_family = AF_INET;
	addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	addr.sin_port = 0;
	if (bind(fd, (struct sockaddr *) &addr, sizeof(addr)) != 0)
		fatal("bind 127.0.0.1:0: %s", strerror(errno));
	if (listen(fd, 16) != 0)
		fatal("listen: %s", strerror(errno));
	if (getsockname(fd, (struct sockaddr *) &addr, &addrlen) != 0)
		fatal("getsockname: %s", strerror(errno));
	*port = ntohs(addr.sin_port);
	return fd;
}

static void
log_cb(const rd_kafka_t *rkh, int level, const char *fac, const char *buf)
{
	struct timespec ts;
	struct tm	tm;

	(void) rkh;

	/*
	 * The dummy producer has no bootstrap.servers on purpose; don't let it
	 * alarm anyone reading the log.
	 */
	if (strstr(buf, "No `bootstrap.servers` configured") != NULL)
		return;
	/* Wall-clock time, to line the mock's lines up with the server log's. */
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	fprintf(stderr, "%02d:%02d:%02d.%03ld mock_kafka: librdkafka %d %s: %s\n",
			tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000, level, fac, buf);
}

static double
now_seconds(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int
main(int argc, char **argv)
{
	TopicSpec	topics[MAX_TOPICS];
	int			ntopics = 0;
	long		max_seconds = 3600;
	rd_kafka_conf_t *conf;
	char		errstr[512];
	struct sigaction sa;
	int			listen_fd;
	int			port;
	char		portstr[32];
	double		deadline;
	int			exit_code = 0;
	int			i;

	for (i = 1; i < argc; i++)
	{
		const char *arg = argv[i];
		const char *val = (i + 1 < argc) ? argv[i + 1] : NULL;
		long		n;

		if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0)
		{
			usage(stdout);
			return 0;
		}
		if (val == NULL)
		{
			usage(stderr);
			fatal("option %s needs an argument (or is unknown)", arg);
		}
		if (strcmp(arg, "--brokers") == 0)
		{
			if (!parse_long(val, 1, MAX_BROKERS, &n))
				fatal("invalid --brokers \"%s\" (valid: 1..%d)", val,
					MAX_BROKERS);
			broker_cnt = (int) n;
		}
		else if (strcmp(arg, "--bootstrap-file") == 0)
			bootstrap_file = val;
		else if (strcmp(arg, "--control-file") == 0)
			control_file = val;
		else if (strcmp(arg, "--max-seconds") == 0)
		{
			if (!parse_long(val, 1, LONG_MAX / 2, &n))
				fatal("invalid --max-seconds \"%s\"", val);
			max_seconds = n;
		}
		else if (strcmp(arg, "--topic") == 0)
		{
			char	   *copy;
			char	   *colon;

			if (ntopics == MAX_TOPICS)
				fatal("too many --topic options (max %d)", MAX_TOPICS);
			copy = strdup(val);
			colon = strrchr(copy, ':');
			if (colon == NULL)
				fatal("--topic wants NAME:PARTITIONS, got \"%s\"", val);
			*colon = '\0';
			if (!valid_topic_name(copy))
				fatal("invalid topic name \"%s\"", copy);
			if (!parse_long(colon + 1, 1, 10000, &n))
				fatal("invalid partition count in --topic \"%s\"", val);
			topics[ntopics].name = copy;
			topics[ntopics].partitions = (int) n;
			ntopics++;
		}
		else
		{
			usage(stderr);
			fatal("unknown option \"%s\"", arg);
		}
		i++;
	}

	/* Install handlers before anything slow so SIGTERM is never lost. */
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = signal_handler;
	sigemptyset(&sa.sa_mask);
	/* no SA_RESTART: poll() must return EINTR so we notice the signal */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	conf = rd_kafka_conf_new();
	rd_kafka_conf_set_log_cb(conf, log_cb);
	conf_set(conf, "client.id", "mock_kafka");
	/* MOCK_KAFKA_DEBUG=mock: the group coordinator's states, in the log. */
	if (getenv("MOCK_KAFKA_DEBUG") != NULL)
		conf_set(conf, "debug", getenv("MOCK_KAFKA_DEBUG"));
	rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
	if (rk == NULL)
		fatal("could not create dummy producer: %s", errstr);

	mcluster = rd_kafka_mock_cluster_new(rk, broker_cnt);
	if (mcluster == NULL)
		fatal("could not create mock cluster with %d brokers", broker_cnt);
	cap_leader_discovery_versions();

	for (i = 0; i < ntopics; i++)
	{
		rd_kafka_resp_err_t err;

		/* same replication factor the mock uses for auto-created topics */
		err = rd_kafka_mock_topic_create(mcluster, topics[i].name,
										 topics[i].partitions,
										 broker_cnt < 3 ? broker_cnt : 3);
		if (err)
			fatal("could not create topic \"%s\": %s", topics[i].name,
				rd_kafka_err2str(err));
	}

	listen_fd = open_control_socket(&port);
	snprintf(portstr, sizeof(portstr), "%d", port);

	/* control file last: once it exists, everything is ready */
	if (bootstrap_file &&
		!write_file_atomically(bootstrap_file,
							   rd_kafka_mock_cluster_bootstraps(mcluster)))
		exit(1);
	if (control_file && !write_file_atomically(control_file, portstr))
		exit(1);

	fprintf(stderr, "mock_kafka: pid %d, %d broker(s), bootstrap %s, "
			"control port %d, max %ld s\n",
			(int) getpid(), broker_cnt,
			rd_kafka_mock_cluster_bootstraps(mcluster), port, max_seconds);

	deadline = now_seconds() + (double) max_seconds;

	while (!got_signal && !quit_requested)
	{
		struct pollfd pfds[MAX_CLIENTS + 1];
		int			rc;

		if (now_seconds() >= deadline)
		{
			fprintf(stderr, "mock_kafka: --max-seconds %ld reached, exiting\n",
					max_seconds);
			break;
		}

		pfds[0].fd = listen_fd;
		pfds[0].events = POLLIN;
		for (i = 0; i < nclients; i++)
		{
			pfds[i + 1].fd = clients[i].fd;
			pfds[i + 1].events = POLLIN;
		}

		rc = poll(pfds, (nfds_t) (nclients + 1), POLL_MS);
		if (rc < 0)
		{
			if (errno == EINTR)
				continue;
			fprintf(stderr, "mock_kafka: poll: %s\n", strerror(errno));
			exit_code = 1;
			break;
		}

		/* serve the dummy handle's queues (logs, internal events) */
		rd_kafka_poll(rk, 0);

		/* clients first, from the back, since close_client reorders */
		for (i = nclients - 1; i >= 0; i--)
		{
			if (pfds[i + 1].revents == 0)
				continue;
			if (!service_client(&clients[i]))
				close_client(i);
			if (quit_requested)
				break;
		}

		if (!quit_requested && (pfds[0].revents & POLLIN))
		{
			int			fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);

			if (fd >= 0)
			{
				if (nclients == MAX_CLIENTS)
				{
					send_reply(fd, "err too many control connections");
					close(fd);
				}
				else
				{
					clients[nclients].fd = fd;
					clients[nclients].len = 0;
					clients[nclients].discarding = false;
					nclients++;
				}
			}
		}
	}

	if (got_signal)
		fprintf(stderr, "mock_kafka: got signal %d, exiting\n",
				(int) got_signal);

	while (nclients > 0)
		close_client(nclients - 1);
	close(listen_fd);

	/* stale files would make the next test read a dead port */
	if (control_file)
		unlink(control_file);
	if (bootstrap_file)
		unlink(bootstrap_file);

	rd_kafka_mock_cluster_destroy(mcluster);
	rd_kafka_destroy(rk);
	for (i = 0; i < ntopics; i++)
		free(topics[i].name);

	return exit_code;
}
