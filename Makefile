# outbox: PGXS build
EXTENSION = outbox
MODULE_big = outbox
OBJS = src/outbox.o src/emit.o src/kafka.o src/operator.o src/stats.o src/worker.o src/inbox_worker.o src/inbox_sql.o
DATA = sql/outbox--0.1.0.sql
PGFILEDESC = "outbox - transactional outbox published to Kafka"

PG_CPPFLAGS = -Wall -Wmissing-prototypes
SHLIB_LINK = -lrdkafka

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

.PHONY: tools clean-tools test demo
tools:
	$(MAKE) -C test/tools

all: tools

clean: clean-tools
clean-tools:
	$(MAKE) -C test/tools clean

# Every suite, on throwaway clusters; needs `make install` first.
test: all
	test/run_tests.sh

# A local PostgreSQL and a mock Kafka: events emitted and read back.
demo: all
	test/demo.sh

# Every suite with outbox.so and the test tools built with
# -fsanitize=address,undefined, against a private copy of PostgreSQL in
# /tmp/outbox-asan (the system install is not touched).
.PHONY: sanitize
sanitize:
	test/sanitize.sh
