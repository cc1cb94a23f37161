-- The Kafka settings are validated when they are set (ALTER SYSTEM runs the
-- same check hooks as a reload), with the whole producer configuration,
-- and no error repeats a property value.
SET search_path = ob, public;

-- outbox.brokers must be a host:port list.
ALTER SYSTEM SET outbox.brokers = 'junk;;;';
ALTER SYSTEM SET outbox.brokers = '';
ALTER SYSTEM SET outbox.brokers = ' , ';
ALTER SYSTEM SET outbox.brokers = 'kafka-1:0';
ALTER SYSTEM SET outbox.brokers = 'kafka-1:9092x';
ALTER SYSTEM SET outbox.brokers = 'kafka-1:9092,kafka 2:9092';
ALTER SYSTEM SET outbox.brokers = '[::1:9092';
ALTER SYSTEM SET outbox.brokers = 'kafka-1:9092, kafka-2, SASL_SSL://kafka-3:9093, [::1]:9092';
ALTER SYSTEM RESET outbox.brokers;

-- What ordering depends on cannot be changed, with or without "topic.".
ALTER SYSTEM SET outbox.kafka_properties = 'topic.message.timeout.ms=5000';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.acks=1';
ALTER SYSTEM SET outbox.kafka_properties = 'ACKS=1';
ALTER SYSTEM SET outbox.kafka_properties = 'request.required.acks=all';
ALTER SYSTEM SET outbox.kafka_properties = 'retries=0';
ALTER SYSTEM SET outbox.kafka_properties = 'message.send.max.retries=10';
ALTER SYSTEM SET outbox.kafka_properties = 'queuing.strategy=lifo';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.queuing.strategy=fifo';
ALTER SYSTEM SET outbox.kafka_properties = 'delivery.timeout.ms=1000';
ALTER SYSTEM SET outbox.kafka_properties = 'transactional.id=x';
ALTER SYSTEM SET outbox.kafka_properties = 'log.queue=false';
-- A partitioner must keep each key on one partition.
ALTER SYSTEM SET outbox.kafka_properties = 'partitioner=random';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.partitioner=random';
-- librdkafka checks combinations only when a producer is created: the
-- check creates one (without brokers).
ALTER SYSTEM SET outbox.kafka_properties = 'max.in.flight.requests.per.connection=10';
ALTER SYSTEM SET outbox.kafka_properties = 'max.in.flight=6';
ALTER SYSTEM SET outbox.kafka_properties = 'security.protocol=sasl_plaintext;sasl.mechanism=SCRAM-SHA-256';
-- Files librdkafka would open only when connecting.
ALTER SYSTEM SET outbox.kafka_properties = 'security.protocol=ssl;ssl.ca.location=/nonexistent/ca.pem';
-- Values are never repeated in errors.
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=notanumber';
ALTER SYSTEM SET outbox.kafka_properties = 'message.max.bytes=17';
ALTER SYSTEM SET outbox.kafka_properties = 'compression.codec=marker-value';
ALTER SYSTEM SET outbox.kafka_properties = 'linger.ms=5;marker-value';
-- Secrets are refused here: they belong in the credentials file.
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.mechanism=PLAIN;sasl.password=marker-secret';
ALTER SYSTEM SET outbox.kafka_properties = 'SASL.PASSWORD=marker-secret';
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.username=u';
ALTER SYSTEM SET outbox.kafka_properties = 'ssl.key.password=marker-secret';
ALTER SYSTEM SET outbox.kafka_properties = 'ssl.keystore.password=marker-secret';
ALTER SYSTEM SET outbox.kafka_properties = 'ssl.key.pem=marker-secret';
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.oauthbearer.client.secret=marker-secret';
ALTER SYSTEM SET outbox.kafka_properties = 'sasl.oauthbearer.config=principal=marker-secret';
-- Accepted: ordering-safe values.
ALTER SYSTEM SET outbox.kafka_properties = 'partitioner=consistent;max.in.flight=5;linger.ms=5;compression.codec=lz4';
ALTER SYSTEM SET outbox.kafka_properties = 'topic.partitioner=fnv1a_random;security.protocol=plaintext';
ALTER SYSTEM RESET outbox.kafka_properties;

-- The credentials file: a path (relative to the data directory), checked
-- like ssl_key_file.  Its content is tested in test/t/010_kafka_settings.pl
-- (files written from SQL are world-readable, so refused here).
CREATE FUNCTION pg_temp.write_file(name text, content text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE format('COPY (SELECT %L) TO %L', content,
				   current_setting('data_directory') || '/' || name);
END
$$;
ALTER SYSTEM SET outbox.kafka_credentials_file = 'no_such_credentials';
ALTER SYSTEM SET outbox.kafka_credentials_file = '.';
SELECT pg_temp.write_file('outbox_creds_readable', 'sasl.password=marker-secret');
ALTER SYSTEM SET outbox.kafka_credentials_file = 'outbox_creds_readable';

-- Nothing was left in postgresql.auto.conf.
SELECT count(*) AS outbox_settings_left FROM pg_file_settings
 WHERE name LIKE 'outbox.%' AND sourcefile LIKE '%postgresql.auto.conf';

-- Where no publisher serves the database, outbox_status says so and why
-- (this cluster runs with outbox.workers = 0).
SELECT publisher, publisher_detail FROM outbox_status;
SELECT * FROM outbox_publisher();
