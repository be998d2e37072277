# QueueBox: the PostgreSQL extension (PGXS), the daemon queuebox-mssqld, and
# the tests of both.
#
#   make && make install     build and install queuebox.so and its SQL, and
#                            the daemon (DAEMON_PREFIX, /usr/local)
#   make installcheck        pg_regress, isolation specs and TAP on temp clusters
#   make unit                cmocka tests of src/common (no PostgreSQL header) and
#                            of the daemon's pieces that need no server
#   make unit SANITIZE=1     the same under ASan + UBSan
#   make fuzz                the libFuzzer harnesses of test/fuzz (clang)
#   make fuzz-run FUZZ_SECONDS=N   run each for N seconds (FUZZ_RUNS=N: N inputs)
#   make deb                 the Debian packages into build/deb/ (debian/,
#                            docs/getting-started.md)
#
EXTENSION   = queuebox
EXTVERSION  = 0.3.8
MODULE_big  = queuebox

# The core (src/common), by folder, lowest first: each includes only its own
# folder and those before it, publish/ and source/ not each other, and none
# a host's (src/pgext, src/daemon); scripts/check-includes.sh checks it, and
# scripts/test.sh runs the check before it builds.
#   lib/      helpers on plain values: topic patterns, backoff, egress rules,
#             extraction, webhook verification and outbound signing, crypto,
#             UTF-8, the monotonic clock, trace context, the ops-table check
#             (qb_ops.h)
#   runtime/  the process's running parts: the shared metrics block (and the
#             workers' slots in it), the OTLP exporter's thread, the
#             transforms' jq child, the host's egress policy; each host
#             keeps them (QbRuntime) and passes them down (QbHost.runtime)
#   broker/   the broker links (url, connect, login) that publish/ and
#             source/ share, and that config/ checks urls with
#   config/   the configuration's model and validator (qb_config_*)
#   publish/  the destinations' publishers     source/  the broker consumers
#   pgsql/    the PostgreSQL statements (one copy for both PostgreSQL hosts),
#             their descriptors and array literals
#   engine/   the engine loops (the ingress: webhooks) and their host and
#             store contracts
#   admin/    the admin routes, their authentication, rate limit, CSRF and
#             cookies, and the console; the ingress's listener serves them
#             through QbHost.routes
# The -I list below is in that order (no header name is in two folders).
COMMON_DIRS = lib runtime broker config publish source pgsql engine admin
COMMON_INC  = $(addprefix -Isrc/common/,$(COMMON_DIRS))
COMMON_SRCS = $(sort $(wildcard $(addsuffix /*.c,$(addprefix src/common/,$(COMMON_DIRS)))))
COMMON_HDRS = $(wildcard $(addsuffix /*.h,$(addprefix src/common/,$(COMMON_DIRS))))
PGEXT_SRCS  = $(sort $(wildcard src/pgext/*.c))
OBJS        = $(PGEXT_SRCS:.c=.o)
# The extension's scripts (docs/design/schema.md).  Up to 0.3.0 they are
# committed as they shipped, in sql/history/, and never edited.  The rest
# the Makefile makes into build/sql/: the install script of the current
# version from the schema's parts (sql/pgext/head.sql, sql/schema/tables.sql,
# sql/pgext/host.sql, sql/schema/functions.sql; the daemon's PostgreSQL
# schema is made of the same with sql/daemon/head.sql and host.sql), and an
# upgrade script for each sql/schema/upgrade/<old>--<new>.sql, the DDL
# written once for both hosts.  PGXS installs DATA and DATA_built alike.
DATA        = $(sort $(wildcard sql/history/queuebox--*.sql))
SCHEMA_PARTS = sql/schema/tables.sql sql/schema/functions.sql
UPGRADES_PG = $(sort $(wildcard sql/schema/upgrade/*--*.sql))
UPGRADES_MSSQL = $(sort $(wildcard sql/sqlserver/upgrade/*--*.sql))
DATA_built  = build/sql/queuebox--$(EXTVERSION).sql $(patsubst sql/schema/upgrade/%,build/sql/queuebox--%,$(UPGRADES_PG))

WARN        = -Wall -Wextra -Werror -Wno-unused-parameter \
              -Wno-sign-compare -Wno-declaration-after-statement
PG_CPPFLAGS = $(COMMON_INC) -DQB_VERSION=\"$(EXTVERSION)\"
PG_CFLAGS   = -std=gnu11 $(WARN) $(QB_EXTRA_CFLAGS)
SHLIB_LINK  = $(CORE_LIB) -lrabbitmq -lrdkafka -lnats -ljq -lmicrohttpd -lcurl -ljansson -lyaml -lssl -lcrypto $(QB_EXTRA_LDFLAGS)

# pg_regress: test/sql/<name>.sql against test/expected/<name>.out (results/
# and regression.diffs land in the top folder, as output_iso/ does).
REGRESS      = outbox_schema outbox_cycle dead_hold configure stats inbox_pull operations relay relay_ops transforms breaker console_ops roles
REGRESS_OPTS = --inputdir=test --temp-config=test/queuebox.conf --temp-instance=./tmp_check
ISOLATION      = $(basename $(notdir $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --temp-config=test/queuebox.conf --temp-instance=./tmp_check_iso
TAP_TESTS   = 1
# TAP: test/t/<group>/NNN_name.pl (test/README.md: the groups, and the map
# of every feature's tests); NNN is the file's id, unique across groups,
# and the run goes in its order, as before the groups
TAP_FILES   = $(wildcard test/t/*/*.pl)
PROVE_TESTS = $(foreach n,$(sort $(notdir $(TAP_FILES))),$(filter %/$(n),$(TAP_FILES)))

EXTRA_CLEAN = build clients/c/build clients/c/lib clients/c/queuebox-inbox.pc clients/c/test/test_worker clients/c/test/test_enqueue clients/c/test/qbi_test_worker queuebox-mssqld tmp_check tmp_check_iso results output_iso test/unit/bin test/unit/bin-san test/sink/qb_sink \
              test/store/conformance \
              test/brokers/nats_tool \
              test/brokers/kafka_mock \
              test/brokers/amqp_tool \
              test/brokers/nats_fetch_check

# ---- the core: one static library, plain cc, no PostgreSQL header --------
# The extension links it (-fPIC), and so do the daemon and the unit tests.
# SANITIZE=1 builds it apart, with ASan + UBSan, for the unit tests;
# QB_EXTRA_CFLAGS (scripts/test.sh's UBSan build of the extension) applies
# to the core the extension links.
CORE_CC      ?= cc
CORE_CFLAGS   = -std=gnu11 -g -O2 -fPIC $(WARN) $(COMMON_INC) -DQB_VERSION=\"$(EXTVERSION)\"
ifeq ($(SANITIZE),1)
CORE_CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else
CORE_CFLAGS  += $(QB_EXTRA_CFLAGS)
endif
CORE_DIR      = build/core$(if $(filter 1,$(SANITIZE)),-san)
CORE_OBJS     = $(patsubst src/common/%.c,$(CORE_DIR)/%.o,$(COMMON_SRCS)) $(CORE_DIR)/console_assets.o
CORE_LIB      = $(CORE_DIR)/libqbcore.a

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

build/sql/queuebox--$(EXTVERSION).sql: sql/pgext/head.sql sql/schema/tables.sql sql/pgext/host.sql sql/schema/functions.sql sql/schema/roles.sql
	@mkdir -p $(dir $@)
	cat $^ | sed 's/@SCHEMA_VERSION@/$(EXTVERSION)/g' > $@
# an upgrade script: refuses psql, then the shared DDL, then the
# extension's own part of the step when it has one (sql/pgext/upgrade/),
# then the roles' grants (sql/schema/roles.sql: every step ends with them)
build/sql/queuebox--%.sql: sql/schema/upgrade/%.sql $(wildcard sql/pgext/upgrade/*.sql) sql/schema/roles.sql
	@mkdir -p $(dir $@)
	{ echo '-- made by the Makefile from $(strip $< $(wildcard sql/pgext/upgrade/$*.sql)) sql/schema/roles.sql: do not edit'; \
	  printf '%s\n' '\echo Use "ALTER EXTENSION queuebox UPDATE" to load this file. \quit'; \
	  cat $< $(wildcard sql/pgext/upgrade/$*.sql) sql/schema/roles.sql; } > $@

# PGXS tracks no header dependencies: a struct that grows in a header must
# rebuild every object, or two objects disagree on its layout.  The
# Makefile too: QB_VERSION comes from it, and a library built before a
# version bump would refuse the schema it installs.
$(OBJS): $(COMMON_HDRS) $(wildcard src/pgext/*.h) Makefile
$(shlib): $(CORE_LIB)

$(CORE_DIR)/%.o: src/common/%.c $(COMMON_HDRS) Makefile
	@mkdir -p $(dir $@)
	$(CORE_CC) $(CORE_CFLAGS) -c -o $@ $<
$(CORE_LIB): $(CORE_OBJS)
	rm -f $@
	ar rcs $@ $^

# The console's static files (src/common/admin/console/) as C, in the core
# (scripts/embed-console.sh; docs/console.md): no build tool, no network.
CONSOLE_FILES = $(sort $(wildcard src/common/admin/console/*))
build/console/qb_console_assets.c: $(CONSOLE_FILES) scripts/embed-console.sh
	@mkdir -p $(dir $@)
	scripts/embed-console.sh $(CONSOLE_FILES) > $@.tmp
	mv $@.tmp $@
$(CORE_DIR)/console_assets.o: build/console/qb_console_assets.c src/common/admin/qb_console.h Makefile
	@mkdir -p $(dir $@)
	$(CORE_CC) $(CORE_CFLAGS) -c -o $@ $<

# after the include: Makefile.global resets PROVE_FLAGS
PG_PROVE_FLAGS += -I $(srcdir)/test/perl

# ---- the core's unit tests: no PostgreSQL include path, plain cc ----------
UNIT_CC      ?= cc
UNIT_CFLAGS   = -std=gnu11 -g -O1 $(WARN) $(COMMON_INC) -DQB_VERSION=\"$(EXTVERSION)\"
UNIT_LIBS     = -lcmocka -lrabbitmq -lrdkafka -lnats -ljq -lmicrohttpd -lcurl -ljansson -lyaml -lssl -lcrypto -lm -lpthread
ifeq ($(SANITIZE),1)
UNIT_CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
endif
UNIT_TESTS    = $(basename $(notdir $(wildcard test/unit/test_*.c)))
# sanitizer builds live apart, so flags never mix in one binary
UNIT_BIN_DIR  = test/unit/bin$(if $(filter 1,$(SANITIZE)),-san)
UNIT_BINS     = $(addprefix $(UNIT_BIN_DIR)/,$(UNIT_TESTS))

# the consumer engine's test puts its fake consumer behind qb_consumer_ops
UNIT_LDFLAGS_test_consume_engine = -Wl,--wrap=qb_consumer_ops
# the HTTP publisher's test counts its epoll_ctl and pthread_sigmask calls
UNIT_LDFLAGS_test_http = -Wl,--wrap=epoll_ctl -Wl,--wrap=pthread_sigmask -ldl

$(UNIT_BIN_DIR)/%: test/unit/%.c $(CORE_LIB) $(COMMON_HDRS) $(wildcard test/unit/*.h)
	@mkdir -p $(UNIT_BIN_DIR)
	$(UNIT_CC) $(UNIT_CFLAGS) -o $@ $< $(CORE_LIB) $(UNIT_LIBS) $(UNIT_LDFLAGS_$*)

.PHONY: unit-valgrind unit sink brokers-tools
unit: $(UNIT_BINS) test/sink/qb_sink
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

# The same under valgrind memcheck: a definite leak or an invalid access
# fails (issue 13; ASan runs them with SANITIZE=1, this one needs no rebuild)
# (the transform helper's children are silent: they end by _exit or SIGKILL
# by design, with jq's memory in hand)
VALGRIND = valgrind --quiet --leak-check=full --errors-for-leak-kinds=definite --error-exitcode=97 \
           --child-silent-after-fork=yes
unit-valgrind: $(UNIT_BINS)
	@set -e; for t in $(UNIT_BINS); do echo "== valgrind $$t"; $(VALGRIND) $$t; done

# ---- fuzz harnesses (test/fuzz, libFuzzer; test/fuzz/README.md) ---------
# The core again, with clang and coverage for libFuzzer plus ASan + UBSan, in
# a directory of its own; each test/fuzz/fuzz_*.c links it into
# build/fuzz/<name>.  fuzz-run runs each on a copy of its seed corpus
# (test/fuzz/corpus/<name>), so nothing is written into the tree.
FUZZ_CC        ?= clang
FUZZ_SAN        = -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_CFLAGS     = -std=gnu11 -g -O1 $(WARN) $(COMMON_INC) -DQB_VERSION=\"$(EXTVERSION)\" $(FUZZ_SAN)
FUZZ_CORE_DIR   = build/core-fuzz
FUZZ_CORE_OBJS  = $(patsubst src/common/%.c,$(FUZZ_CORE_DIR)/%.o,$(COMMON_SRCS)) $(FUZZ_CORE_DIR)/console_assets.o
FUZZ_CORE_LIB   = $(FUZZ_CORE_DIR)/libqbcore.a
FUZZ_DIR        = build/fuzz
FUZZ_NAMES      = $(basename $(notdir $(wildcard test/fuzz/fuzz_*.c)))
FUZZ_BINS       = $(addprefix $(FUZZ_DIR)/,$(FUZZ_NAMES))
FUZZ_LIBS       = -lrabbitmq -lrdkafka -lnats -ljq -lmicrohttpd -lcurl -ljansson -lyaml -lssl -lcrypto -lm -lpthread
FUZZ_SECONDS   ?= 10
FUZZ_RUNS      ?=

$(FUZZ_CORE_DIR)/%.o: src/common/%.c $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
$(FUZZ_CORE_DIR)/console_assets.o: build/console/qb_console_assets.c src/common/admin/qb_console.h
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<
$(FUZZ_CORE_LIB): $(FUZZ_CORE_OBJS)
	rm -f $@
	ar rcs $@ $^

# the SQL Server URL parser of the daemon (src/daemon/backend/sqlserver/odbc_url.c) for fuzz_url
$(FUZZ_DIR)/obj/odbc_url.o: src/daemon/backend/sqlserver/odbc_url.c src/daemon/backend/sqlserver/odbc_store.h $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -D_GNU_SOURCE $(DAEMON_INC) -c -o $@ $<
$(FUZZ_DIR)/fuzz_url: $(FUZZ_DIR)/obj/odbc_url.o
$(FUZZ_DIR)/fuzz_url: FUZZ_EXTRA = $(FUZZ_DIR)/obj/odbc_url.o $(DAEMON_INC)

$(FUZZ_DIR)/%: test/fuzz/%.c $(wildcard test/fuzz/*.h) $(FUZZ_CORE_LIB) $(COMMON_HDRS)
	@mkdir -p $(FUZZ_DIR)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -Itest/fuzz -o $@ $< $(FUZZ_EXTRA) $(FUZZ_CORE_LIB) $(FUZZ_LIBS)

.PHONY: fuzz fuzz-run
fuzz: $(FUZZ_BINS)
fuzz-run: fuzz
	scripts/fuzz-run.sh "$(FUZZ_SECONDS)" "$(FUZZ_RUNS)" $(FUZZ_BINS)

# The loopback HTTP sink used by the TAP tests, the demo and the benchmarks;
# the broker tests' helpers come with it (scripts/test.sh runs make sink).
sink: test/sink/qb_sink brokers-tools
test/sink/qb_sink: test/sink/qb_sink.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lmicrohttpd -ljansson

brokers-tools: test/brokers/amqp_tool test/brokers/nats_tool test/brokers/kafka_mock \
               test/brokers/nats_fetch_check

# A small AMQP client for TAP 010: declare, bind, count and fetch messages.
test/brokers/amqp_tool: test/brokers/amqp_tool.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lrabbitmq -ljansson

# The NATS TAP test's client: create streams, read them back (no nats CLI).
test/brokers/nats_tool: test/brokers/nats_tool.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lnats -ljansson

# TAP 015's check of a NATS fetch that starts with messages waiting: the
# source's own consumer from the core
test/brokers/nats_fetch_check: test/brokers/nats_fetch_check.c $(CORE_LIB) $(COMMON_HDRS)
	$(UNIT_CC) $(UNIT_CFLAGS) -o $@ $< $(CORE_LIB) $(UNIT_LIBS) $(QB_EXTRA_LDFLAGS)

# The Kafka cluster of TAP 011: librdkafka's mock cluster in a helper process.
test/brokers/kafka_mock: test/brokers/kafka_mock.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lrdkafka -ljansson

# ---- the daemon: queuebox-mssqld (src/daemon/, docs/daemon.md) -----------
# The same core, with the daemon's process (src/daemon/process/: main,
# supervisor, roles, host) over one backend per database
# (src/daemon/backend/postgresql/: the libpq store and migrations;
# src/daemon/backend/sqlserver/: the ODBC store and migrations); plain cc,
# libpq's header only (no server header): the core has no libpq.  Its
# PostgreSQL schema is the extension's tables and shared SQL functions
# (sql/schema/) around sql/daemon/head.sql and host.sql, embedded as a C string.
PQ_INCDIR     := $(shell $(PG_CONFIG) --includedir)
DAEMON_DIR     = build/daemon$(if $(filter 1,$(SANITIZE)),-san)
DAEMON_DIRS    = process backend backend/postgresql backend/sqlserver
DAEMON_INC     = $(addprefix -Isrc/daemon/,$(DAEMON_DIRS)) -I$(PQ_INCDIR)
DAEMON_CFLAGS  = $(CORE_CFLAGS) -D_GNU_SOURCE $(DAEMON_INC)
DAEMON_HDRS    = $(wildcard $(addsuffix /*.h,$(addprefix src/daemon/,$(DAEMON_DIRS))))
DAEMON_SRCS    = $(filter-out src/daemon/process/main.c,$(sort $(wildcard $(addsuffix /*.c,$(addprefix src/daemon/,$(DAEMON_DIRS))))))
DAEMON_OBJS    = $(patsubst src/daemon/%.c,$(DAEMON_DIR)/%.o,$(DAEMON_SRCS)) $(DAEMON_DIR)/schema_pg.o \
                 $(DAEMON_DIR)/schema_mssql.o
DAEMON_LIB     = $(DAEMON_DIR)/libqbd.a
DAEMON_LIBS    = -lpq -lodbc -lrabbitmq -lrdkafka -lnats -ljq -lmicrohttpd -lcurl -ljansson -lyaml -lssl -lcrypto -lm -lpthread
DAEMON_SCHEMA  = sql/daemon/head.sql sql/schema/tables.sql sql/daemon/host.sql sql/schema/functions.sql sql/schema/roles.sql
# SQL Server's schema (docs/sqlserver.md): T-SQL batches ending at GO lines
DAEMON_MSSQL   = sql/sqlserver/tables.sql sql/sqlserver/topics.sql sql/sqlserver/engine.sql sql/sqlserver/operations.sql \
                 sql/sqlserver/roles.sql
DAEMON_PREFIX ?= /usr/local

$(DAEMON_DIR)/%.o: src/daemon/%.c $(COMMON_HDRS) $(DAEMON_HDRS) Makefile
	@mkdir -p $(dir $@)
	$(CORE_CC) $(DAEMON_CFLAGS) -c -o $@ $<

# the schema and its upgrade steps as C (scripts/embed-schema.sh)
$(DAEMON_DIR)/schema_pg.c: $(DAEMON_SCHEMA) $(UPGRADES_PG) $(wildcard sql/daemon/upgrade/*.sql) scripts/embed-schema.sh Makefile
	@mkdir -p $(dir $@)
	{ echo 'const char qbd_schema_version[] = "$(EXTVERSION)";'; \
	  QBD_STEP_DIR=sql/daemon/upgrade QBD_STEP_TAIL=sql/schema/roles.sql \
	    scripts/embed-schema.sh pg $(EXTVERSION) sql/schema/upgrade $(DAEMON_SCHEMA); } > $@
$(DAEMON_DIR)/schema_pg.o: $(DAEMON_DIR)/schema_pg.c
	$(CORE_CC) $(DAEMON_CFLAGS) -c -o $@ $<
$(DAEMON_DIR)/schema_mssql.c: $(DAEMON_MSSQL) $(UPGRADES_MSSQL) scripts/embed-schema.sh Makefile
	@mkdir -p $(dir $@)
	QBD_STEP_TAIL=sql/sqlserver/roles.sql scripts/embed-schema.sh mssql $(EXTVERSION) sql/sqlserver/upgrade $(DAEMON_MSSQL) > $@
$(DAEMON_DIR)/schema_mssql.o: $(DAEMON_DIR)/schema_mssql.c
	$(CORE_CC) $(DAEMON_CFLAGS) -c -o $@ $<

$(DAEMON_LIB): $(DAEMON_OBJS)
	rm -f $@
	ar rcs $@ $^

queuebox-mssqld: $(DAEMON_DIR)/process/main.o $(DAEMON_LIB) $(CORE_LIB)
	$(CORE_CC) $(CORE_CFLAGS) -o $@ $^ $(DAEMON_LIBS)

all: queuebox-mssqld

.PHONY: install-daemon
install: install-daemon
# queuebox-daemon: the same binary under a name that does not say SQL Server
# (it serves PostgreSQL too); docs/*.md where the unit's Documentation= points
DAEMON_DOCDIR ?= $(DAEMON_PREFIX)/share/doc/queuebox
install-daemon: queuebox-mssqld
	install -d $(DESTDIR)$(DAEMON_PREFIX)/bin $(DESTDIR)$(DAEMON_PREFIX)/lib/systemd/system $(DESTDIR)$(DAEMON_DOCDIR)
	install -m 755 queuebox-mssqld $(DESTDIR)$(DAEMON_PREFIX)/bin/queuebox-mssqld
	ln -sf queuebox-mssqld $(DESTDIR)$(DAEMON_PREFIX)/bin/queuebox-daemon
	install -d $(DESTDIR)$(DAEMON_DOCDIR)/design
	install -m 644 docs/*.md $(DESTDIR)$(DAEMON_DOCDIR)/
	install -m 644 docs/design/*.md $(DESTDIR)$(DAEMON_DOCDIR)/design/
	sed -e 's|@BINDIR@|$(DAEMON_PREFIX)/bin|' -e 's|@DOCDIR@|$(DAEMON_DOCDIR)|' packaging/queuebox-mssqld.service > $(DESTDIR)$(DAEMON_PREFIX)/lib/systemd/system/queuebox-mssqld.service

# the daemon's unit tests link its library and libpq as well
$(UNIT_BIN_DIR)/test_daemon: test/unit/test_daemon.c $(DAEMON_LIB) $(CORE_LIB) $(COMMON_HDRS) $(DAEMON_HDRS)
	@mkdir -p $(UNIT_BIN_DIR)
	$(UNIT_CC) $(UNIT_CFLAGS) -D_GNU_SOURCE $(DAEMON_INC) -o $@ $< $(DAEMON_LIB) $(CORE_LIB) $(UNIT_LIBS) -lpq -lodbc

# clients/c: libqueuebox-inbox, its scenarios and its enqueue tests (TAP 032 and 064 run them; `make sink` builds them)
.PHONY: clients-c
sink: clients-c
clients-c:
	$(MAKE) -C clients/c all test/test_worker test/test_enqueue test/qbi_test_worker QB_EXTRA_CFLAGS="$(QB_EXTRA_CFLAGS)" QB_EXTRA_LDFLAGS="$(QB_EXTRA_LDFLAGS)"

# the SQL Server pieces that need no server (the ODBC store's helpers, the schema's batches)
$(UNIT_BIN_DIR)/test_odbc: test/unit/test_odbc.c $(DAEMON_LIB) $(CORE_LIB) $(COMMON_HDRS) $(DAEMON_HDRS)
	@mkdir -p $(UNIT_BIN_DIR)
	$(UNIT_CC) $(UNIT_CFLAGS) -D_GNU_SOURCE $(DAEMON_INC) -o $@ $< $(DAEMON_LIB) $(CORE_LIB) $(UNIT_LIBS) -lpq -lodbc

# The store conformance suite: the same scenarios against the libpq store
# and the extension's SQL-callable wrappers (TAP 027 runs it; `make sink`,
# which scripts/test.sh runs before the cluster tests, builds it).
.PHONY: store-conformance
store-conformance: test/store/conformance
test/store/conformance: test/store/conformance.c $(DAEMON_LIB) $(CORE_LIB) $(COMMON_HDRS) $(DAEMON_HDRS)
	$(UNIT_CC) $(UNIT_CFLAGS) $(DAEMON_INC) -o $@ $< $(DAEMON_LIB) $(CORE_LIB) -lpq -lodbc $(UNIT_LIBS) $(QB_EXTRA_LDFLAGS)
sink: store-conformance

# ---- Debian packages (debian/; docs/getting-started.md) -------------------
# postgresql-NN-queuebox (pg_buildext, for each major with a server-dev
# package here) and queuebox-daemon into build/deb/, built from a copy of
# the repository's files, then lintian (packaging/make-deb.sh)
.PHONY: deb
deb:
	packaging/make-deb.sh $(EXTVERSION)

# Every T-SQL text QueueBox sends to SQL Server through Microsoft's parser
# (tools/tsql-check, ScriptDom's TSql150Parser): the schema and its steps,
# the pull statements, the clients' statements, and the ODBC store's, read
# after the preprocessor (its macros build statements) from build/tsql/*.i
.PHONY: tsql-check
TSQL_ODBC_SRCS = $(sort $(wildcard src/daemon/backend/sqlserver/*.c))
build/tsql/%.i: src/daemon/backend/sqlserver/%.c $(COMMON_HDRS) $(DAEMON_HDRS) Makefile
	@mkdir -p $(dir $@)
	$(CORE_CC) $(DAEMON_CFLAGS) -E -o $@ $<
tsql-check: $(patsubst src/daemon/backend/sqlserver/%.c,build/tsql/%.i,$(TSQL_ODBC_SRCS))
	tools/tsql-check/run.sh
