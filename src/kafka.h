/*-------------------------------------------------------------------------
 *
 * kafka.h
 *	  The publisher's Kafka producer.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_KAFKA_H
#define OUTBOX_KAFKA_H

#include <librdkafka/rdkafka.h>

#include "datatype/timestamp.h"
#include "lib/stringinfo.h"

/* One message's fate, filled in by the delivery report callback. */
typedef struct DeliveryResult
{
	bool		done;
	rd_kafka_resp_err_t err;
	rd_kafka_msg_status_t status;
	int32		partition;
	int64		offset;
	TimestampTz acked_at;
} DeliveryResult;

/*
 * Where delivery reports go: the message opaque carries a generation (one
 * per batch produced) and an index in it; the worker looks the pair up.
 * Both callbacks run inside rd_kafka_poll() and must not ereport.
 */
typedef struct DeliveryTracker
{
	/* The result slot of message (generation, index), or NULL if unknown. */
	DeliveryResult *(*result_slot) (uint32 generation, int index);
	/* Called once that slot was filled in. */
	void		(*delivered) (uint32 generation, int index);
	int64		stale_reports;	/* reports of messages no longer tracked */
} DeliveryTracker;

/* Settings (defined by outbox_kafka_init) */
extern char *outbox_brokers;
extern char *outbox_kafka_properties;
extern char *outbox_kafka_credentials_file;

/* Called per key=value; returns NULL or a palloc'd message without the value. */
typedef char *(*outbox_property_fn) (const char *key, const char *value, void *arg);

extern void outbox_kafka_init(void);
extern char *outbox_for_each_property(const char *properties,
									  outbox_property_fn fn, void *arg);
extern char *outbox_kafka_config_check(const char *properties,
									   const char *credentials_file);
extern char *outbox_brokers_check(const char *brokers);
extern uint32 outbox_kafka_config_fingerprint(void);
extern char *outbox_kafka_shared_property_error(const char *key, const char *value,
												bool from_file, const char *file_setting);
extern char *outbox_kafka_read_credentials(const char *path,
										   outbox_property_fn fn, void *arg);
extern void outbox_kafka_log_to_server(rd_kafka_conf_t *conf);
extern bool outbox_kafka_check_failed(const char *name, char *err);
extern rd_kafka_conf_t *outbox_kafka_conf_finish(rd_kafka_conf_t *conf, const char *err,
												 StringInfo fp, uint32 *fingerprint);

/* The hint of a credentials file's errors (the publisher's and the inbox's). */
#define OUTBOX_CREDENTIALS_FILE_HINT \
	"The file holds one librdkafka property per line as key=value, " \
	"is owned by the database user (mode 0600) or by root (mode 0640), " \
	"and is named relative to the data directory or by an absolute path; " \
	"fix it and reload."
extern rd_kafka_t *outbox_producer_create(DeliveryTracker *tracker);
extern void outbox_producer_destroy(rd_kafka_t *rk);
extern bool outbox_kafka_error_is_permanent(rd_kafka_resp_err_t err);
extern bool outbox_producer_fatal_pending(void);
extern void *outbox_delivery_opaque(uint32 generation, int index);
extern int	outbox_kafka_message_max_bytes;
extern int	outbox_properties_message_max_bytes(const char *properties);
extern const char *outbox_kafka_condition(TimestampTz *since);
extern void outbox_producer_probe(rd_kafka_t *rk);

#endif							/* OUTBOX_KAFKA_H */
