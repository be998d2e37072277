# QueueBox: the PostgreSQL extension (PGXS) plus the core's unit tests.
#
#   make && make install     build and install queuebox.so and its SQL
#   make installcheck        pg_regress, isolation specs and TAP on temp clusters
#   make unit                cmocka tests of src/common, built with no PostgreSQL header
#   make unit SANITIZE=1     the same under ASan + UBSan
#
EXTENSION   = queuebox
EXTVERSION  = 0.3.0
MODULE_big  = queuebox

# The core (src/common), by folder: engine/ (the engine loops and their host
# and store contracts), publish/ (destinations), source/ (webhook and broker
# sources), broker/ (the broker links both use), config/ (the
# configuration's model and validator, the qb_config_* family), lib/
# (routing, transforms and other helpers), store/ (the stores' SQL).
COMMON_DIRS = engine publish source broker config lib store
COMMON_INC  = $(addprefix -Isrc/common/,$(COMMON_DIRS))
COMMON_SRCS = $(sort $(wildcard $(addsuffix /*.c,$(addprefix src/common/,$(COMMON_DIRS)))))
COMMON_HDRS = $(wildcard $(addsuffix /*.h,$(addprefix src/common/,$(COMMON_DIRS))))
PGEXT_SRCS  = $(sort $(wildcard src/pgext/*.c))
OBJS        = $(PGEXT_SRCS:.c=.o)
DATA        = sql/queuebox--0.1.0.sql sql/queuebox--0.1.0--0.2.0.sql sql/queuebox--0.2.0--0.3.0.sql

WARN        = -Wall -Wextra -Werror -Wno-unused-parameter \
              -Wno-sign-compare -Wno-declaration-after-statement
PG_CPPFLAGS = $(COMMON_INC) -DQB_VERSION=\"$(EXTVERSION)\"
PG_CFLAGS   = -std=gnu11 $(WARN) $(QB_EXTRA_CFLAGS)
SHLIB_LINK  = $(CORE_LIB) -lrabbitmq -lrdkafka -lnats -ljq -lmicrohttpd -lcurl -ljansson -lyaml -lssl -lcrypto $(QB_EXTRA_LDFLAGS)

# pg_regress: sql/*.sql minus the extension script, outputs in expected/.
REGRESS      = outbox_schema outbox_cycle configure stats inbox_pull operations relay relay_ops transforms breaker
REGRESS_OPTS = --inputdir=. --temp-config=test/queuebox.conf --temp-instance=./tmp_check
ISOLATION      = $(basename $(notdir $(wildcard test/isolation/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test/isolation --temp-config=test/queuebox.conf --temp-instance=./tmp_check_iso
TAP_TESTS   = 1
PROVE_TESTS = $(sort $(wildcard test/t/*.pl))

EXTRA_CLEAN = build tmp_check tmp_check_iso results output_iso test/unit/bin test/unit/bin-san test/sink/qb_sink \
              test/brokers/nats_tool \
              test/brokers/kafka_mock \
              test/brokers/amqp_tool

# ---- the core: one static library, plain cc, no PostgreSQL header --------
# The extension links it (-fPIC), and so do the unit tests (and the daemon
# to come).  SANITIZE=1 builds it apart, with ASan + UBSan, for the unit
# tests; QB_EXTRA_CFLAGS (scripts/test.sh's UBSan build of the extension)
# applies to the core the extension links.
CORE_CC      ?= cc
CORE_CFLAGS   = -std=gnu11 -g -O2 -fPIC $(WARN) $(COMMON_INC) -DQB_VERSION=\"$(EXTVERSION)\"
ifeq ($(SANITIZE),1)
CORE_CFLAGS  += -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
else
CORE_CFLAGS  += $(QB_EXTRA_CFLAGS)
endif
CORE_DIR      = build/core$(if $(filter 1,$(SANITIZE)),-san)
CORE_OBJS     = $(patsubst src/common/%.c,$(CORE_DIR)/%.o,$(COMMON_SRCS))
CORE_LIB      = $(CORE_DIR)/libqbcore.a

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXS tracks no header dependencies: a struct that grows in a header must
# rebuild every object, or two objects disagree on its layout.
$(OBJS): $(COMMON_HDRS) $(wildcard src/pgext/*.h)
$(shlib): $(CORE_LIB)

$(CORE_DIR)/%.o: src/common/%.c $(COMMON_HDRS)
	@mkdir -p $(dir $@)
	$(CORE_CC) $(CORE_CFLAGS) -c -o $@ $<
$(CORE_LIB): $(CORE_OBJS)
	rm -f $@
	ar rcs $@ $^

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

$(UNIT_BIN_DIR)/%: test/unit/%.c $(CORE_LIB) $(COMMON_HDRS)
	@mkdir -p $(UNIT_BIN_DIR)
	$(UNIT_CC) $(UNIT_CFLAGS) -o $@ $< $(CORE_LIB) $(UNIT_LIBS)

.PHONY: unit sink brokers-tools
unit: $(UNIT_BINS) test/sink/qb_sink
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

# The loopback HTTP sink used by the TAP tests, the demo and the benchmarks;
# the broker tests' helpers come with it (scripts/test.sh runs make sink).
sink: test/sink/qb_sink brokers-tools
test/sink/qb_sink: test/sink/qb_sink.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lmicrohttpd -ljansson

brokers-tools: test/brokers/amqp_tool test/brokers/nats_tool test/brokers/kafka_mock

# A small AMQP client for TAP 010: declare, bind, count and fetch messages.
test/brokers/amqp_tool: test/brokers/amqp_tool.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lrabbitmq -ljansson

# The NATS TAP test's client: create streams, read them back (no nats CLI).
test/brokers/nats_tool: test/brokers/nats_tool.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lnats -ljansson

# The Kafka cluster of TAP 011: librdkafka's mock cluster in a helper process.
test/brokers/kafka_mock: test/brokers/kafka_mock.c
	$(UNIT_CC) -std=gnu11 -O2 $(WARN) -o $@ $< -lrdkafka -ljansson
