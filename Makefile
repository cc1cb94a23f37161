# outbox: PGXS build
EXTENSION = outbox
MODULE_big = outbox
OBJS = src/init.o src/shmem.o src/util.o src/emit.o src/emit_check.o src/kafka.o src/operator.o src/stats.o src/worker.o \
	src/publish_read.o src/publish_heap.o src/publish_delta.o src/publish_progress.o src/publish_stream.o src/publish_durable.o src/publish_produce.o src/publish_poison.o \
	src/publish_settle.o src/publish_extension.o src/publish_shares.o src/publish_state.o src/retention.o src/launcher.o src/inbox_worker.o src/inbox_apply.o src/inbox_store.o src/inbox_state.o src/inbox_consumer.o src/inbox_sql.o
DATA = sql/outbox--0.1.0.sql sql/outbox--0.2.0.sql sql/outbox--0.1.0--0.2.0.sql
PGFILEDESC = "outbox - transactional outbox published to Kafka"

PG_CPPFLAGS = -Wall -Wmissing-prototypes
SHLIB_LINK = -lrdkafka

# make installcheck: the regression and isolation suites, each on a
# temporary instance that preloads the library (test/outbox_regress.conf),
# then the TAP tests (test/t, helpers in test/perl).  The extension must be
# installed; PostgreSQL refuses to run as root (see outbox-preflight).
# The temporary instances are UTF8 with the C locale whatever the caller's
# environment (no LANG in a container gives SQL_ASCII and other widths).
PINNED_LOCALE = --encoding=UTF8 --no-locale
REGRESS = $(patsubst test/sql/%.sql,%,$(sort $(wildcard test/sql/*.sql)))
REGRESS_OPTS = --inputdir=test --temp-config=test/outbox_regress.conf \
	--temp-instance=./tmp_check $(PINNED_LOCALE)
ISOLATION = $(patsubst test/isolation/specs/%.spec,%,$(sort $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --temp-config=test/outbox_regress.conf \
	--temp-instance=./tmp_check_iso $(PINNED_LOCALE)
TAP_TESTS = 1
REGRESS_PREP = outbox-preflight

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies: a struct changed in a header (say the
# shared-memory layout) left stale objects that disagreed on its offsets.
$(OBJS): $(wildcard src/*.h)

# A build in another directory (make -f SRCDIR/Makefile VPATH=SRCDIR, as
# pg_buildext does) needs its own src/ for the objects.
$(OBJS): | $(CURDIR)/src
$(CURDIR)/src:
	$(MKDIR_P) $@

# The TAP tests' own modules (MockKafka, OutboxTest, FaultTest); not in
# PROVE_FLAGS, which is the user's (make ... PROVE_FLAGS=--verbose).
PG_PROVE_FLAGS += -I ./test/perl

# PGXS looks for t/*.pl; ours are in test/t.  The data and logs are in
# tmp_check and tmp_check/log on every version (17 reads TESTDATADIR and
# TESTLOGDIR; 15 puts them there itself).  One file:
#   make prove_installcheck PROVE_TESTS=test/t/101_brokers_down.pl
define prove_installcheck
rm -rf '$(CURDIR)'/tmp_check
$(MKDIR_P) '$(CURDIR)'/tmp_check
cd $(srcdir) && TESTDIR='$(CURDIR)' PATH="$(bindir):$$PATH" PGPORT='6$(DEF_PGPORT)' \
	TESTDATADIR='$(CURDIR)/tmp_check' TESTLOGDIR='$(CURDIR)/tmp_check/log' \
	PG_REGRESS='$(top_builddir)/src/test/regress/pg_regress' \
	$(PROVE) $(PG_PROVE_FLAGS) $(PROVE_FLAGS) $(if $(PROVE_TESTS),$(PROVE_TESTS),test/t/*.pl)
endef

.PHONY: prove_installcheck outbox-preflight
prove_installcheck: REGRESS = 
prove_installcheck: ISOLATION =
prove_installcheck: outbox-preflight
	$(prove_installcheck)

# Stop at once, naming what is missing (a tool, the installed extension,
# a non-root user), rather than failing half-way through a suite.
outbox-preflight:
	@PG_CONFIG='$(PG_CONFIG)' PROVE_TESTS='$(PROVE_TESTS)' test/preflight.sh --not-root $(if $(REGRESS),regress) $(if $(ISOLATION),isolation) \
		$(if $(TAP_TESTS),tap)

# PGXN: the release archive outbox-VERSION.zip (VERSION from META.json) of
# the committed HEAD, every file under outbox-VERSION/.  test/pgxn.sh
# checks META.json and the archive.
DIST_VERSION = $(shell perl -MJSON::PP -0777 -e 'print decode_json(<>)->{version}' META.json)
.PHONY: dist
dist:
	git archive --format=zip --prefix=$(EXTENSION)-$(DIST_VERSION)/ -o $(EXTENSION)-$(DIST_VERSION).zip HEAD

.PHONY: tools clean-tools test demo
tools:
	$(MAKE) -C test/tools

# The test tools are built beside the sources only: a build in another
# directory (pg_buildext's build-NN for the Debian package) builds the
# extension alone.
ifneq ($(wildcard test/tools/Makefile),)
all: tools
clean: clean-tools
endif
clean-tools:
	$(MAKE) -C test/tools clean

# Every suite (regress, isolation, pgTAP, the test tools, TAP) on throwaway
# clusters, as the postgres user when run as root; needs `make install` first.
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
