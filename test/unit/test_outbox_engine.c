/*-------------------------------------------------------------------------
 * test_outbox_engine.c
 *	  The outbox engine loop (qb_outbox_run) against a fake store and a fake
 *	  host, publishing over real HTTP to the project's loopback sink
 *	  (test/sink/qb_sink, built by `make sink`).
 *
 * The fake store keeps rows in memory: a claim takes due pending rows in id
 * order (unrouted rows within the batch size, routed ones within their
 * destination's limit), marks them processing with the claim's token, and a
 * settle applies only with that token.  So these tests pin down what the
 * engine asks of any store and what it settles: every claimed row settled
 * once with its token, retries with a delay and the attempt counted, dead
 * rows with their reason, per-destination limits and intake floors in the
 * claims, the breaker's tallies.  The SQL behind the same calls is tested
 * by pg_regress and the isolation specs.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "qb_config.h"
#include "qb_outbox.h"
#include "test_host.h"
#include "test_sink.h"

#define MAX_ROWS 64
#define MAX_CLAIMS 256

static char sink_base[128];

/* ---- the fake store ---------------------------------------------------- */

typedef enum
{
	ROW_PENDING,
	ROW_PROCESSING,
	ROW_SENT,
	ROW_DEAD
} RowState;

typedef struct FakeRow
{
	int64_t		id;
	char		topic[64];
	char		payload[256];
	char		headers[128];	/* "" : {} */
	char		destination[64];	/* "" : unrouted */
	RowState	state;
	int			attempt;
	char		token[QB_UUID_LEN + 1];
	long		due_ms;
	int64_t		after;			/* claimable once this row is sent (0: any time) */
	int			settles;		/* settles that applied */
	QbSettleKind last_kind;
	long		last_delay;
	char		last_error[512];
} FakeRow;

typedef struct FakeClaim
{
	int			batch_size;
	int			ndests;
	char		dests[8][64];
	int			limits[8];
	int64_t		floors[8];
} FakeClaim;

typedef struct Fake
{
	char		config[2048];
	FakeRow		rows[MAX_ROWS];
	int			nrows;
	FakeClaim	claims[MAX_CLAIMS];
	int			nclaims;
	int			stale_settles;	/* settles whose token did not match */
	int			tally_failed[8];	/* per destination index of the config */
	char		tally_names[8][64];
	int			ntally_names;
	int			failures[8];	/* the breaker's count, by tally_index, as its SQL keeps it */
	int			most_failures[8];	/* the highest count it reached */
	int64_t		msg_base;		/* message ids: msg_base + id (the sink counts per id) */
} Fake;

static int
fake_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	*text = strdup(((Fake *) ctx)->config);
	return 0;
}

static int
tally_index(Fake *f, const char *name)
{
	for (int i = 0; i < f->ntally_names; i++)
		if (strcmp(f->tally_names[i], name) == 0)
			return i;
	snprintf(f->tally_names[f->ntally_names], 64, "%s", name);
	return f->ntally_names++;
}

static FakeRow *
fake_row(Fake *f, int64_t id)
{
	for (int i = 0; i < f->nrows; i++)
		if (f->rows[i].id == id)
			return &f->rows[i];
	return NULL;
}

/* The claim: due pending rows in id order, within the batch or their limit. */
static void
fake_claim(Fake *f, const QbClaimReq *c, QbCycleOut *out)
{
	FakeClaim  *rec = &f->claims[f->nclaims < MAX_CLAIMS ? f->nclaims++ : MAX_CLAIMS - 1];
	int			left[8];
	int			unrouted = c->batch_size;
	long		now = test_now_ms();

	memset(rec, 0, sizeof(*rec));
	rec->batch_size = c->batch_size;
	rec->ndests = c->ndests;
	for (int i = 0; i < c->ndests && i < 8; i++)
	{
		snprintf(rec->dests[i], 64, "%s", c->dests[i]);
		rec->limits[i] = left[i] = c->limits[i];
		rec->floors[i] = c->floors ? c->floors[i] : 0;
	}
	out->rows = calloc(MAX_ROWS, sizeof(QbOutboxRow));
	for (int i = 0; i < f->nrows; i++)
	{
		FakeRow    *r = &f->rows[i];
		QbOutboxRow *o;
		int			d = -1;

		if (r->state != ROW_PENDING || r->due_ms > now)
			continue;
		if (r->after > 0 && fake_row(f, r->after)->state != ROW_SENT)
			continue;
		if (r->destination[0] == '\0')
		{
			if (unrouted <= 0)
				continue;
			unrouted--;
		}
		else
		{
			for (int j = 0; j < c->ndests; j++)
				if (strcmp(c->dests[j], r->destination) == 0)
					d = j;
			if (d < 0 || left[d] <= 0)
				continue;
			left[d]--;
		}
		r->state = ROW_PROCESSING;
		snprintf(r->token, sizeof(r->token), "%s", c->token);
		o = &out->rows[out->nrows++];
		o->id = r->id;
		snprintf(o->message_id, sizeof(o->message_id), "00000000-0000-4000-8000-%012lld",
				 (long long) (f->msg_base + r->id));
		o->topic = strdup(r->topic);
		o->payload = strdup(r->payload);
		o->payload_len = strlen(r->payload);
		o->headers = strdup(r->headers[0] ? r->headers : "{}");
		o->attempt = r->attempt;
		o->max_attempts = 2;
		o->claimed = true;
		o->destination = r->destination[0] ? strdup(r->destination) : NULL;
		o->in_intake = r->attempt == 0;
	}
}

static int
fake_cycle(void *ctx, const QbDestTally *tallies, int ntallies,
		   const QbSettle *settles, int nsettles, const QbClaimReq *claim,
		   QbCycleOut *out, char *err, size_t errlen)
{
	Fake	   *f = ctx;

	memset(out, 0, sizeof(*out));
	/* the breaker statement's rule: a success resets the count, else failures add */
	for (int i = 0; i < ntallies; i++)
	{
		int			t = tally_index(f, tallies[i].destination);

		f->tally_failed[t] += tallies[i].failed;
		if (tallies[i].ok > 0 && !tallies[i].gone)
			f->failures[t] = 0;
		else
			f->failures[t] += tallies[i].failed;
		if (f->failures[t] > f->most_failures[t])
			f->most_failures[t] = f->failures[t];
	}
	for (int i = 0; i < nsettles; i++)
	{
		const QbSettle *s = &settles[i];
		FakeRow    *r = fake_row(f, s->id);

		if (r == NULL || r->state != ROW_PROCESSING || strcmp(r->token, s->token) != 0)
		{
			f->stale_settles++;
			continue;
		}
		out->nsettled++;
		r->settles++;
		r->last_kind = s->kind;
		r->last_delay = s->delay_ms;
		snprintf(r->last_error, sizeof(r->last_error), "%s", s->error ? s->error : "");
		r->attempt = s->attempt;
		r->token[0] = '\0';
		if (s->destination)
			snprintf(r->destination, sizeof(r->destination), "%s", s->destination);
		switch (s->kind)
		{
			case QB_SETTLE_SENT:
				r->state = ROW_SENT;
				break;
			case QB_SETTLE_DEAD:
				r->state = ROW_DEAD;
				break;
			case QB_SETTLE_RETRY:
				r->state = ROW_PENDING;
				r->due_ms = test_now_ms() + s->delay_ms;
				break;
			default:
				r->state = ROW_PENDING;
				break;
		}
	}
	if (claim != NULL)
	{
		out->states = calloc(8, sizeof(QbDestState));
		for (int t = 0; t < f->ntally_names; t++)
			if (f->failures[t] > 0)
			{
				QbDestState *st = &out->states[out->nstates++];

				st->destination = strdup(f->tally_names[t]);
				st->state = QB_CIRCUIT_CLOSED;
				st->failures = f->failures[t];
			}
		fake_claim(f, claim, out);
	}
	return 0;
}

static int
fake_zero(Fake *f, int *n)
{
	*n = 0;
	return 0;
}

static int
fake_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved,
			char *err, size_t errlen)
{
	return fake_zero(ctx, nmoved);
}

static int
fake_unroute(void *ctx, const char *const *dests, int n, int *nmoved, char *err, size_t errlen)
{
	return fake_zero(ctx, nmoved);
}

static int
fake_reclaim(void *ctx, int limit, int *n, char *err, size_t errlen)
{
	return fake_zero(ctx, n);
}

static int
fake_retention(void *ctx, long sec, int limit, int *n, char *err, size_t errlen)
{
	return fake_zero(ctx, n);
}

/* ---- the fake host (test_host.h): stop once every row is final ------ */

static bool
fake_done(void *arg)
{
	Fake	   *f = arg;

	for (int i = 0; i < f->nrows; i++)
		if (f->rows[i].state == ROW_PENDING || f->rows[i].state == ROW_PROCESSING)
			return false;
	return true;
}

static void
run(Fake *f, QbOutboxStats *stats)
{
	QbStore		store = {
		.ctx = f,
		.config_load = fake_config_load,
		.outbox_cycle = fake_cycle,
		.outbox_unpark = fake_unpark,
		.outbox_unroute = fake_unroute,
		.outbox_reclaim = fake_reclaim,
		.outbox_retention = fake_retention,
	};
	TestHost	th;
	char		err[256] = "";

	test_host_init(&th, fake_done, f, 20000, 20);
	th.host.polled = NULL;
	th.host.config_loaded = NULL;
	assert_int_equal(qb_outbox_run(&th.host, &store, 0, stats, err, sizeof(err)), 0);
	assert_false(th.timed_out);
}

static Fake *
fake_new(void)
{
	Fake	   *f = calloc(1, sizeof(Fake));

	snprintf(f->config, sizeof(f->config),
			 "outbox: { batchSize: 10, maxAttempts: 2, backoff: { initialMs: 20, maxMs: 40 } }\n"
			 "destinations:\n"
			 "  web: { type: http, baseUrl: \"%s\", path: /web, maxInFlight: 4 }\n"
			 "  other: { type: http, baseUrl: \"%s\", path: /other }\n"
			 "routes:\n"
			 "  - { topicPattern: \"web.**\", destination: web }\n"
			 "  - { topicPattern: \"other.**\", destination: other }\n",
			 sink_base, sink_base);
	return f;
}

static FakeRow *
add_row(Fake *f, const char *topic, const char *destination, const char *payload)
{
	FakeRow    *r = &f->rows[f->nrows];

	assert_true(f->nrows < MAX_ROWS);
	r->id = ++f->nrows;
	snprintf(r->topic, sizeof(r->topic), "%s", topic);
	snprintf(r->destination, sizeof(r->destination), "%s", destination ? destination : "");
	snprintf(r->payload, sizeof(r->payload), "%s", payload ? payload : "{\"n\": 1}");
	return r;
}

/* ---- the tests --------------------------------------------------------- */

/*
 * Rows unrouted and routed at insert are all sent once, each settle with
 * its claim's token; a destination is never asked for more than its room
 * (2 x maxInFlight, at most a batch); its floor follows its intake rows.
 */
static void
test_delivers_every_row_once(void **state)
{
	Fake	   *f = fake_new();
	QbOutboxStats stats = {0};
	int64_t		last_web = 0;

	for (int i = 0; i < 6; i++)
		add_row(f, "web.created", NULL, NULL);
	for (int i = 0; i < 12; i++)
		last_web = add_row(f, "web.created", "web", NULL)->id;
	for (int i = 0; i < 3; i++)
		add_row(f, "other.x", "other", NULL);
	run(f, &stats);
	for (int i = 0; i < f->nrows; i++)
	{
		assert_int_equal(f->rows[i].state, ROW_SENT);
		assert_int_equal(f->rows[i].settles, 1);
		assert_int_equal(f->rows[i].attempt, 1);
	}
	assert_int_equal(f->stale_settles, 0);
	assert_int_equal(stats.sent, f->nrows);
	assert_true(f->nclaims >= 1);
	for (int c = 0; c < f->nclaims; c++)
		for (int d = 0; d < f->claims[c].ndests; d++)
		{
			if (strcmp(f->claims[c].dests[d], "web") == 0)
				assert_in_range(f->claims[c].limits[d], 1, 8);	/* 2 x maxInFlight 4 */
			assert_in_range(f->claims[c].limits[d], 1, 10);	/* at most a batch */
		}
	/* a claim after web's intake was read starts above it */
	{
		bool		floor_seen = false;

		for (int c = 1; c < f->nclaims; c++)
			for (int d = 0; d < f->claims[c].ndests; d++)
				if (strcmp(f->claims[c].dests[d], "web") == 0 && f->claims[c].floors[d] > 6)
					floor_seen = true;
		assert_true(floor_seen || f->nclaims == 1);
		assert_true(last_web > 6);
	}
	free(f);
}

/*
 * Rows not routed yet (the daemon's new rows) all for one busy destination:
 * after the first claims, a claim asks for about what that destination can
 * take (its room and a tenth of a batch), not for the room of an idle one,
 * so few rows are claimed only to be written back routed.
 */
static void
test_unrouted_claims_follow_their_destinations(void **state)
{
	Fake	   *f = fake_new();
	QbOutboxStats stats = {0};
	int			big = 0;
	int			writebacks = 0;

	snprintf(f->config, sizeof(f->config),
			 "outbox: { batchSize: 40, maxAttempts: 2, backoff: { initialMs: 20, maxMs: 40 } }\n"
			 "destinations:\n"
			 "  web: { type: http, baseUrl: \"%s\", path: /web, maxInFlight: 2 }\n"
			 "  other: { type: http, baseUrl: \"%s\", path: /other }\n"
			 "routes:\n"
			 "  - { topicPattern: \"web.**\", destination: web }\n"
			 "  - { topicPattern: \"other.**\", destination: other }\n",
			 sink_base, sink_base);
	for (int i = 0; i < MAX_ROWS - 4; i++)
		add_row(f, "web.created", NULL, NULL);
	run(f, &stats);
	for (int i = 0; i < f->nrows; i++)
	{
		assert_int_equal(f->rows[i].state, ROW_SENT);
		writebacks += f->rows[i].settles - 1;
	}
	/* web's room is at most 2 x maxInFlight = 4, plus 40 / 10 + 1 for other */
	for (int c = 3; c < f->nclaims; c++)
		big += f->claims[c].batch_size > 9;
	assert_int_equal(big, 0);
	assert_true(writebacks < f->nrows);
	free(f);
}

/*
 * A failing destination: the first attempt is settled as a retry with a
 * delay and the attempt counted, the last one as dead with its reason; the
 * failures reach the breaker's tallies.  A topic without a route goes dead
 * without a request.
 */
static void
test_retry_then_dead_and_no_route(void **state)
{
	Fake	   *f = fake_new();
	QbOutboxStats stats = {0};
	FakeRow    *failing = add_row(f, "other.x", NULL, "{\"_sink\": {\"status\": 500}}");
	FakeRow    *lost = add_row(f, "nowhere.x", NULL, NULL);
	FakeRow    *fine = add_row(f, "web.ok", NULL, NULL);
	int			t;

	run(f, &stats);
	assert_int_equal(failing->state, ROW_DEAD);
	assert_int_equal(failing->attempt, 2);
	assert_int_equal(failing->settles, 2);
	assert_non_null(strstr(failing->last_error, "attempt 2 of 2 failed, none remain"));
	assert_non_null(strstr(failing->last_error, "500"));
	assert_int_equal(lost->state, ROW_DEAD);
	assert_int_equal(lost->attempt, 0);
	assert_non_null(strstr(lost->last_error, "no route matches topic \"nowhere.x\""));
	assert_int_equal(fine->state, ROW_SENT);
	assert_int_equal(stats.retried, 1);
	assert_int_equal(stats.dead, 2);
	t = tally_index(f, "other");
	assert_int_equal(f->tally_failed[t], 2);
	assert_int_equal(f->stale_settles, 0);
	free(f);
}

/*
 * A success resets the breaker's count: an endpoint whose messages each
 * fail once and then succeed, one message at a time, never has more than
 * one failure counted.  (The engine once skipped a success's tally while
 * the circuit was closed, so the count grew 1, 2, ... across successes
 * until the circuit opened on a healthy endpoint.)
 */
static void
test_success_resets_breaker_count(void **state)
{
	Fake	   *f = fake_new();
	QbOutboxStats stats = {0};
	FakeRow    *rows[8];
	int			t;

	f->msg_base = 1000;
	for (int i = 0; i < 8; i++)
	{
		rows[i] = add_row(f, "web.flaky", NULL, "{\"_sink\": {\"fail\": 1}}");
		rows[i]->after = i > 0 ? rows[i - 1]->id : 0;
	}
	run(f, &stats);
	for (int i = 0; i < 8; i++)
	{
		assert_int_equal(rows[i]->state, ROW_SENT);
		assert_int_equal(rows[i]->attempt, 2);
	}
	t = tally_index(f, "web");
	assert_int_equal(f->tally_failed[t], 8);
	assert_int_equal(f->most_failures[t], 1);
	assert_int_equal(f->failures[t], 0);
	free(f);
}

/*
 * The row's headers are parsed once, by the engine, for every publisher:
 * headers that are not a JSON object make the row dead at once, no
 * attempt counted and no request made; the row's headers reach the
 * destination.
 */
static void
test_row_headers_parsed_once(void **state)
{
	Fake	   *f = fake_new();
	QbOutboxStats stats = {0};
	FakeRow    *bad = add_row(f, "web.bad", NULL, NULL);
	FakeRow    *good = add_row(f, "web.good", NULL, NULL);

	snprintf(bad->headers, sizeof(bad->headers), "[1, 2]");
	snprintf(good->headers, sizeof(good->headers), "{\"X-Tenant\": \"acme\"}");
	run(f, &stats);
	assert_int_equal(bad->state, ROW_DEAD);
	assert_int_equal(bad->attempt, 0);
	assert_non_null(strstr(bad->last_error, "the row's headers are not a JSON object"));
	assert_int_equal(good->state, ROW_SENT);
	assert_int_equal(stats.dead, 1);
	assert_int_equal(stats.sent, 1);
	free(f);
}

/* ---- the sink ---------------------------------------------------------- */

static TestSink sink;

static int
start_sink(void **state)
{
	if (test_sink_start(&sink, "test-engine", false) != 0)
		return -1;
	snprintf(sink_base, sizeof(sink_base), "%s", sink.base);
	return 0;
}

static int
stop_sink(void **state)
{
	return test_sink_stop(&sink);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_delivers_every_row_once),
		cmocka_unit_test(test_retry_then_dead_and_no_route),
		cmocka_unit_test(test_row_headers_parsed_once),
		cmocka_unit_test(test_success_resets_breaker_count),
		cmocka_unit_test(test_unrouted_claims_follow_their_destinations),
	};

	return cmocka_run_group_tests(tests, start_sink, stop_sink);
}
