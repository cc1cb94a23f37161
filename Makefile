# outbox: PGXS build
EXTENSION = outbox
MODULE_big = outbox
OBJS = src/outbox.o src/emit.o src/kafka.o src/stats.o src/worker.o
DATA = sql/outbox--0.1.0.sql
PGFILEDESC = "outbox - transactional outbox published to Kafka"

PG_CPPFLAGS = -Wall -Wmissing-prototypes
SHLIB_LINK = -lrdkafka

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

.PHONY: tools test
tools:
	$(MAKE) -C test/tools

all: tools

test: all
	test/run_tests.sh
