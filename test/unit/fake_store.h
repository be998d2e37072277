/*-------------------------------------------------------------------------
 * fake_store.h
 *	  The fake store (QbStore) of the engine unit tests: outbox and inbox
 *	  rows in memory, under the rules of the SQL an engine relies on.
 *
 * The rules (the SQL behind the same calls: pg_regress, isolation specs):
 *	- A claim marks rows processing under its token; a settle or a forward
 *	  changes only rows still holding it (the others: stale_settles).
 *	- The outbox claim takes due pending rows in id order, unrouted ones
 *	  within the batch size, routed ones within their destination's limit
 *	  (a row with after waits for that row to be sent); each is recorded.
 *	  A fan-out row (fanout) comes back not_due while it is unrouted, for
 *	  the engine to route it; its settles are counted by their mark.
 *	- The breaker's count, by destination: a success resets it, else the
 *	  failures add; a claim returns the state of each destination with
 *	  failures counted.  A destination's circuit is open from opened_us
 *	  (open_on_settle: the cycle settling that row opens it first, as
 *	  another worker would while the row was in flight); a claim shows it
 *	  half-open and its first row as the probe, and a success closes it only
 *	  when sent at or after opened_us (the tally's send age from the cycle's
 *	  start, as the SQL takes it from now()); the cycle returns its move.
 *	- The relay claim takes pending rows, and processing ones whose lease
 *	  ran out on the host's clock (th), in id order up to the batch size.
 *	- An inbox insert stores each (source, idempotency key) once, with the
 *	  next id (dead with its dead_error); a duplicate gets 0.
 *	- fail_claims, fail_forwards, fail_inserts: the next this many calls
 *	  of that kind fail (-1) and change nothing.
 *
 * Header-only, as test_host.h; a test takes fake_store_ops() and may
 * replace some.  Threads: a call that reads or changes rows holds lock; a
 * test whose engine runs in a second thread takes it too.
 *-------------------------------------------------------------------------
 */
#ifndef FAKE_STORE_H
#define FAKE_STORE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "qb_store.h"
#include "test_host.h"

#define FAKE_MAX_ROWS 320		/* one claim past the engine's first 256 slots */
#define FAKE_MAX_CLAIMS 256		/* recorded; later claims overwrite the last */
#define FAKE_MAX_DESTS 8

typedef enum FakeRowState
{
	ROW_PENDING,
	ROW_PROCESSING,
	ROW_SENT,					/* outbox */
	ROW_PROCESSED,				/* inbox, relayed */
	ROW_DEAD,
	ROW_TAKEN					/* inbox: another relay claimed and settled it */
} FakeRowState;

typedef struct FakeOutRow
{
	int64_t		id;
	char		topic[64];
	char		payload[256];
	char		headers[128];	/* "" : {} */
	char		destination[64];	/* "" : unrouted */
	FakeRowState state;
	int			attempt;
	char		token[QB_UUID_LEN + 1];
	long		due_ms;
	int64_t		after;			/* claimable once this row is sent (0: any time) */
	char		key[32];		/* "" : none (after is what orders rows) */
	bool		fanout;			/* a fan-out row: claimed not_due while unrouted */
	int			settles;		/* settles that applied */
	int			fanout_settles; /* ... of them marked QbSettle.fanout */
	char		copies[64];		/* the copies a settle carried ("" : none) */
	QbSettleKind last_kind;
	long		last_delay;
	char		last_error[512];
} FakeOutRow;

/* An outbox claim's request. */
typedef struct FakeOutClaim
{
	int			batch_size;
	int			ndests;
	char		dests[FAKE_MAX_DESTS][64];
	int			limits[FAKE_MAX_DESTS];
	int64_t		floors[FAKE_MAX_DESTS];
	bool		read_states;	/* the claim was asked to read the circuits */
	bool		promoted_only;	/* ... to claim only what the promotion releases */
	long		at_ms;			/* when it ran (test_now_ms) */
} FakeOutClaim;

typedef struct FakeInRow
{
	int64_t		id;
	char		source[32];
	char		key[64];
	char		event_type[64];	/* "" : none */
	char		payload[256];
	char		headers[512];
	char		dead_error[512];	/* "" : stored pending */
	FakeRowState state;
	char		token[QB_UUID_LEN + 1];
	long		lease_end;		/* on the host's clock */
	char		topic[96];		/* what the forward wrote */
	int			forwards;		/* forwards that settled it */
	bool		held;			/* dead and holding its aggregate (holds[i]) */
} FakeInRow;

/* A relay claim call, failed ones too. */
typedef struct FakeInClaim
{
	int			batch_size;
	long		lease_ms;
	int			nrows;
	int			waits_before;	/* the host's waits before this claim */
} FakeInClaim;

typedef struct FakeStore
{
	pthread_mutex_t lock;
	TestHost   *th;				/* its clock and waits, or NULL: the real clock */
	char		config[2048];
	bool		no_config;		/* config_load finds none */
	/* the outbox */
	FakeOutRow	out[FAKE_MAX_ROWS];
	int			nout;
	FakeOutClaim out_claims[FAKE_MAX_CLAIMS];
	int			nout_claims;
	int64_t		msg_base;		/* message ids: msg_base + id (the sink counts per id) */
	int			stale_settles;	/* settles and forwards whose token did not match */
	int			followers_left; /* rows a settle without a claim made claimable */
	int			fanout_cycles;	/* cycles qb_settles_fanout says ended a fan-out row */
	/* the breaker, by fake_tally_index */
	char		tally_names[FAKE_MAX_DESTS][64];
	int			ntally_names;
	int			tally_failed[FAKE_MAX_DESTS];	/* failures the tallies reported */
	int			failures[FAKE_MAX_DESTS];	/* the count, as its SQL keeps it */
	int			most_failures[FAKE_MAX_DESTS];	/* the highest it reached */
	const char *open_dest;		/* every claim reports this one's circuit open */
	int64_t		opened_us[FAKE_MAX_DESTS];	/* its circuit opened then, 0: closed */
	int			late_ok[FAKE_MAX_DESTS];	/* successes sent before it opened: not counted */
	int64_t		open_on_settle; /* the cycle settling this row opens its circuit first */
	int			probes;			/* rows a claim gave as probes */
	/* the sweep of parked rows: each call's start key, the keys it answers in turn */
	char		sweep_after[8][16];
	int			nsweeps;
	const char *sweep_next[8];	/* NULL: the walk reached the last key */
	int			sweep_released;	/* rows each sweep says it released */
	/* retention: each batch's floor, the rows and highest id it answers in turn */
	int64_t		ret_after[8];
	int			nretentions;
	int			ret_deleted[8];
	int64_t		ret_walked[8];	/* 0: the floor as it came */
	/* the inbox */
	FakeInRow	in[FAKE_MAX_ROWS];
	int			nin;
	int64_t		next_in_id;
	int			ninserts;		/* inbox_insert calls, failed ones too */
	long		insert_timeout_ms;	/* as the last one passed it */
	long		insert_delay_ms;	/* each insert takes this long */
	int			max_batch;		/* the most rows one insert was given */
	int			fail_inserts;
	FakeInClaim in_claims[FAKE_MAX_CLAIMS];
	int			nin_claims;
	int			empty_claims;
	int			fail_claims;
	int			nforwards;		/* relay_forward calls, failed ones too */
	int			fail_forwards;
	int			steal;			/* the next forward finds this many rows taken over */
	int			max_attempts;	/* as the last forward passed it */
} FakeStore;

/* fake_store_init: an empty store whose config_load finds config (NULL: none). */
static inline void
fake_store_init(FakeStore *fs, const char *config)
{
	memset(fs, 0, sizeof(*fs));
	pthread_mutex_init(&fs->lock, NULL);
	fs->no_config = config == NULL;
	snprintf(fs->config, sizeof(fs->config), "%s", config ? config : "");
	fs->next_in_id = 1;
}

static inline void
fake_store_destroy(FakeStore *fs)
{
	pthread_mutex_destroy(&fs->lock);
}

/* fake_store_new: fake_store_init's store, malloc'd; fake_store_free ends it. */
static inline FakeStore *
fake_store_new(const char *config)
{
	FakeStore  *fs = malloc(sizeof(FakeStore));

	fake_store_init(fs, config);
	return fs;
}

static inline void
fake_store_free(FakeStore *fs)
{
	fake_store_destroy(fs);
	free(fs);
}

/* fake_store_set_config: what config_load finds from now on (NULL: none). */
static inline void
fake_store_set_config(FakeStore *fs, const char *config)
{
	pthread_mutex_lock(&fs->lock);
	fs->no_config = config == NULL;
	snprintf(fs->config, sizeof(fs->config), "%s", config ? config : "");
	pthread_mutex_unlock(&fs->lock);
}

static long
fake_clock_ms(const FakeStore *fs)
{
	return fs->th ? fs->th->clock_ms : test_now_ms();
}

static int
fake_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	FakeStore  *fs = ctx;

	pthread_mutex_lock(&fs->lock);
	*text = fs->no_config ? NULL : strdup(fs->config);
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

/* ---- the outbox -------------------------------------------------------- */

/* fake_outbox_add: a pending row (destination NULL: unrouted), ids from 1. */
static inline FakeOutRow *
fake_outbox_add(FakeStore *fs, const char *topic, const char *destination, const char *payload)
{
	FakeOutRow *r = &fs->out[fs->nout];

	if (fs->nout == FAKE_MAX_ROWS)
		return NULL;
	r->id = ++fs->nout;
	snprintf(r->topic, sizeof(r->topic), "%s", topic);
	snprintf(r->destination, sizeof(r->destination), "%s", destination ? destination : "");
	snprintf(r->payload, sizeof(r->payload), "%s", payload ? payload : "{\"n\": 1}");
	return r;
}

static FakeOutRow *
fake_outbox_row(FakeStore *fs, int64_t id)
{
	for (int i = 0; i < fs->nout; i++)
		if (fs->out[i].id == id)
			return &fs->out[i];
	return NULL;
}

/* fake_outbox_final: no outbox row pending or processing. */
static inline bool
fake_outbox_final(FakeStore *fs)
{
	for (int i = 0; i < fs->nout; i++)
		if (fs->out[i].state == ROW_PENDING || fs->out[i].state == ROW_PROCESSING)
			return false;
	return true;
}

/* fake_tally_index: the breaker's slot of a destination, made on first use. */
static int
fake_tally_index(FakeStore *fs, const char *name)
{
	for (int i = 0; i < fs->ntally_names; i++)
		if (strcmp(fs->tally_names[i], name) == 0)
			return i;
	snprintf(fs->tally_names[fs->ntally_names], 64, "%s", name);
	return fs->ntally_names++;
}

/* fake_settled_sent: the cycle settles row id as sent */
static bool
fake_settled_sent(const QbSettle *settles, int nsettles, int64_t id)
{
	for (int i = 0; i < nsettles; i++)
		if (settles[i].id == id && settles[i].kind == QB_SETTLE_SENT)
			return true;
	return false;
}

/* fake_probe_of: the state whose probe a row of dest is, not yet taken; or -1. */
static int
fake_probe_of(const QbCycleOut *out, const char *dest, const bool *probed)
{
	for (int k = 0; k < out->nstates && k < FAKE_MAX_DESTS; k++)
		if (out->states[k].probe && !probed[k] && strcmp(out->states[k].destination, dest) == 0)
			return k;
	return -1;
}

/*
 * The claim: due pending rows in id order, within the batch or their
 * limit; promoted_only: only the rows whose earlier row the cycle settled
 * as sent (what the SQL's promotion claims).  The first row of a
 * destination the states show half-open is its probe, listed or not.
 */
static void
fake_outbox_claim(FakeStore *fs, const QbClaimReq *c, const QbSettle *settles, int nsettles,
				  QbCycleOut *out)
{
	FakeOutClaim *rec = &fs->out_claims[fs->nout_claims < FAKE_MAX_CLAIMS ?
										fs->nout_claims++ : FAKE_MAX_CLAIMS - 1];
	int			left[FAKE_MAX_DESTS];
	int			unrouted = c->batch_size;
	long		now = test_now_ms();
	bool		probed[FAKE_MAX_DESTS] = {false};

	memset(rec, 0, sizeof(*rec));
	rec->batch_size = c->batch_size;
	rec->ndests = c->ndests;
	rec->read_states = c->read_states;
	rec->promoted_only = c->promoted_only;
	rec->at_ms = now;
	for (int i = 0; i < c->ndests && i < FAKE_MAX_DESTS; i++)
	{
		snprintf(rec->dests[i], 64, "%s", c->dests[i]);
		rec->limits[i] = left[i] = c->limits[i];
		rec->floors[i] = c->floors ? c->floors[i] : 0;
	}
	out->rows = calloc(FAKE_MAX_ROWS, sizeof(QbOutboxRow));
	for (int i = 0; i < fs->nout; i++)
	{
		FakeOutRow *r = &fs->out[i];
		QbOutboxRow *o;
		int			d = -1;
		int			probe = -1;

		if (r->state != ROW_PENDING || r->due_ms > now)
			continue;
		if (r->after > 0 && fake_outbox_row(fs, r->after)->state != ROW_SENT)
			continue;
		if (c->promoted_only && !(r->after > 0 && fake_settled_sent(settles, nsettles, r->after)))
			continue;
		if (r->destination[0] == '\0')
		{
			if (unrouted <= 0)
				continue;
			unrouted--;
		}
		else if ((probe = fake_probe_of(out, r->destination, probed)) >= 0)
			probed[probe] = true;	/* a half-open destination's: listed or not */
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
				 (long long) (fs->msg_base + r->id));
		o->topic = strdup(r->topic);
		o->payload = strdup(r->payload);
		o->payload_len = strlen(r->payload);
		o->headers = strdup(r->headers[0] ? r->headers : "{}");
		o->attempt = r->attempt;
		o->max_attempts = 2;
		o->claimed = true;
		o->destination = r->destination[0] ? strdup(r->destination) : NULL;
		o->key = r->key[0] ? strdup(r->key) : NULL;
		o->in_intake = r->attempt == 0;
		/* a fan-out row not copied yet comes back to be routed, as the SQL's */
		o->not_due = r->fanout && r->destination[0] == '\0';
		o->probe = probe >= 0;
		fs->probes += o->probe;
	}
}

static int64_t
fake_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* fake_open_on_settle: the cycle settles row open_on_settle: its circuit opens now. */
static void
fake_open_on_settle(FakeStore *fs, const QbSettle *settles, int nsettles, int64_t now_us)
{
	for (int i = 0; i < nsettles; i++)
		if (fs->open_on_settle != 0 && settles[i].id == fs->open_on_settle &&
			settles[i].destination != NULL)
		{
			int			t = fake_tally_index(fs, settles[i].destination);

			if (fs->opened_us[t] == 0)
				fs->opened_us[t] = now_us;
		}
}

/* fake_change: the breaker's answer for a destination whose circuit was or is open. */
static void
fake_change(QbCycleOut *out, const char *destination, bool was_open, bool is_open)
{
	QbDestChange *c;

	if (out->changes == NULL)
		out->changes = calloc(FAKE_MAX_DESTS, sizeof(QbDestChange));
	c = &out->changes[out->nchanges++];
	c->destination = strdup(destination);
	c->old_state = was_open ? QB_CIRCUIT_OPEN : QB_CIRCUIT_CLOSED;
	c->new_state = is_open ? QB_CIRCUIT_OPEN : QB_CIRCUIT_CLOSED;
}

/*
 * The breaker statement's rule: a success resets the count and closes the
 * circuit, one sent before the circuit opened neither; else failures add.
 */
static void
fake_outbox_tallies(FakeStore *fs, const QbDestTally *tallies, int ntallies, int64_t now_us,
					QbCycleOut *out)
{
	for (int i = 0; i < ntallies; i++)
	{
		int			t = fake_tally_index(fs, tallies[i].destination);
		bool		was_open = fs->opened_us[t] != 0;
		bool		ok = tallies[i].ok > 0 &&
			(!was_open || now_us - tallies[i].ok_sent_ago_us >= fs->opened_us[t]);

		fs->tally_failed[t] += tallies[i].failed;
		if (tallies[i].ok > 0 && !ok)
			fs->late_ok[t]++;
		if (ok && !tallies[i].gone)
		{
			fs->failures[t] = 0;
			fs->opened_us[t] = 0;
		}
		else
			fs->failures[t] += tallies[i].failed;
		if (fs->failures[t] > fs->most_failures[t])
			fs->most_failures[t] = fs->failures[t];
		if (was_open)
			fake_change(out, tallies[i].destination, was_open, fs->opened_us[t] != 0);
	}
}

static void
fake_outbox_settle(FakeStore *fs, const QbSettle *s, QbCycleOut *out)
{
	FakeOutRow *r = fake_outbox_row(fs, s->id);

	if (r == NULL || r->state != ROW_PROCESSING || strcmp(r->token, s->token) != 0)
	{
		fs->stale_settles++;
		return;
	}
	out->nsettled++;
	r->settles++;
	r->fanout_settles += s->fanout;
	if (s->copies != NULL)
		snprintf(r->copies, sizeof(r->copies), "%s", s->copies);
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

static int
fake_outbox_cycle(void *ctx, const QbDestTally *tallies, int ntallies,
				  const QbSettle *settles, int nsettles, const QbClaimReq *claim,
				  QbCycleOut *out, char *err, size_t errlen)
{
	FakeStore  *fs = ctx;
	int64_t		now_us = fake_now_us(); /* the transaction's start */

	pthread_mutex_lock(&fs->lock);
	memset(out, 0, sizeof(*out));
	fake_open_on_settle(fs, settles, nsettles, now_us);
	fake_outbox_tallies(fs, tallies, ntallies, now_us, out);
	fs->fanout_cycles += qb_settles_fanout(settles, nsettles);
	for (int i = 0; i < nsettles; i++)
	{
		fake_outbox_settle(fs, &settles[i], out);
		/* the SQL's promotion claims the next row only when the cycle claims */
		for (int j = 0; claim == NULL && settles[i].kind == QB_SETTLE_SENT && j < fs->nout; j++)
			if (fs->out[j].after == settles[i].id && fs->out[j].state == ROW_PENDING)
				fs->followers_left++;
	}
	/* the states, when the claim asks for them */
	if (claim != NULL && claim->read_states && !claim->promoted_only)
	{
		out->states = calloc(FAKE_MAX_DESTS, sizeof(QbDestState));
		for (int t = 0; t < fs->ntally_names; t++)
			if (fs->failures[t] > 0 || fs->opened_us[t] != 0)
			{
				QbDestState *st = &out->states[out->nstates++];

				st->destination = strdup(fs->tally_names[t]);
				st->state = fs->opened_us[t] != 0 ? QB_CIRCUIT_HALF_OPEN : QB_CIRCUIT_CLOSED;
				st->failures = fs->failures[t];
				st->probe = fs->opened_us[t] != 0;
			}
		if (fs->open_dest != NULL)
		{
			QbDestState *st = &out->states[out->nstates++];

			st->destination = strdup(fs->open_dest);
			st->state = QB_CIRCUIT_OPEN;
			st->failures = 1;
		}
	}
	if (claim != NULL)
		fake_outbox_claim(fs, claim, settles, nsettles, out);
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

/* Housekeeping finds nothing to do: nothing parked, expired or old. */
static int
fake_outbox_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved,
				   char *err, size_t errlen)
{
	*nmoved = 0;
	return 0;
}

static int
fake_outbox_unroute(void *ctx, const char *const *dests, int n, int *nmoved, char *err,
					size_t errlen)
{
	*nmoved = 0;
	return 0;
}

static int
fake_outbox_reclaim(void *ctx, int limit, int *n, char *err, size_t errlen)
{
	*n = 0;
	return 0;
}

/*
 * Retention records the floor each batch started after and answers
 * ret_deleted and ret_walked in turn (0 rows and the floor as it came
 * past them).
 */
static int
fake_outbox_retention(void *ctx, long sec, int limit, int64_t *after, int *n, char *err,
					  size_t errlen)
{
	FakeStore  *fs = ctx;
	int			i;

	pthread_mutex_lock(&fs->lock);
	i = fs->nretentions < 8 ? fs->nretentions : 7;
	fs->ret_after[i] = *after;
	*n = fs->nretentions < 8 ? fs->ret_deleted[i] : 0;
	if (fs->nretentions < 8 && fs->ret_walked[i] != 0)
		*after = fs->ret_walked[i];
	fs->nretentions++;
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

/* The sweep records where each call started and answers sweep_next in turn. */
static int
fake_outbox_sweep(void *ctx, const char *after, int limit, int *nreleased, char **next,
				  char *err, size_t errlen)
{
	FakeStore  *fs = ctx;
	int			i;

	pthread_mutex_lock(&fs->lock);
	i = fs->nsweeps < 8 ? fs->nsweeps : 7;
	snprintf(fs->sweep_after[i], sizeof(fs->sweep_after[i]), "%s", after);
	*next = fs->sweep_next[i] ? strdup(fs->sweep_next[i]) : NULL;
	*nreleased = fs->sweep_released;
	fs->nsweeps++;
	pthread_mutex_unlock(&fs->lock);
	return 0;
}

/* ---- the inbox --------------------------------------------------------- */

/* fake_inbox_add: a pending push row (event_type NULL: none), the next id. */
static inline FakeInRow *
fake_inbox_add(FakeStore *fs, const char *source, const char *event_type)
{
	FakeInRow  *r = &fs->in[fs->nin];

	if (fs->nin == FAKE_MAX_ROWS)
		return NULL;
	fs->nin++;
	r->id = fs->next_in_id++;
	snprintf(r->source, sizeof(r->source), "%s", source);
	snprintf(r->event_type, sizeof(r->event_type), "%s", event_type ? event_type : "");
	return r;
}

static FakeInRow *
fake_inbox_row(FakeStore *fs, int64_t id)
{
	for (int i = 0; i < fs->nin; i++)
		if (fs->in[i].id == id)
			return &fs->in[i];
	return NULL;
}

/* fake_inbox_find: the row of (source, key), or NULL. */
static FakeInRow *
fake_inbox_find(FakeStore *fs, const char *source, const char *key)
{
	for (int i = 0; i < fs->nin; i++)
		if (strcmp(fs->in[i].source, source) == 0 && strcmp(fs->in[i].key, key) == 0)
			return &fs->in[i];
	return NULL;
}

static int
fake_inbox_insert(void *ctx, const QbInboxRow *rows, int n, long timeout_ms, int64_t *ids,
				  char *err, size_t errlen)
{
	FakeStore  *fs = ctx;
	int			rc = 0;

	pthread_mutex_lock(&fs->lock);
	fs->ninserts++;
	fs->insert_timeout_ms = timeout_ms;
	if (n > fs->max_batch)
		fs->max_batch = n;
	if (fs->insert_delay_ms > 0)
		usleep(fs->insert_delay_ms * 1000);
	if (fs->fail_inserts > 0)
	{
		fs->fail_inserts--;
		snprintf(err, errlen, "the fake's insert failed");
		rc = -1;
		goto done;
	}
	for (int i = 0; i < n; i++)
	{
		FakeInRow  *r;

		ids[i] = 0;
		if (fake_inbox_find(fs, rows[i].source, rows[i].idempotency_key) != NULL ||
			fs->nin == FAKE_MAX_ROWS)
			continue;
		r = &fs->in[fs->nin++];
		r->id = ids[i] = fs->next_in_id++;
		r->state = rows[i].dead_error ? ROW_DEAD : ROW_PENDING;
		snprintf(r->source, sizeof(r->source), "%s", rows[i].source);
		snprintf(r->key, sizeof(r->key), "%s", rows[i].idempotency_key);
		snprintf(r->event_type, sizeof(r->event_type), "%s",
				 rows[i].event_type ? rows[i].event_type : "");
		snprintf(r->payload, sizeof(r->payload), "%s", rows[i].payload);
		snprintf(r->headers, sizeof(r->headers), "%s", rows[i].headers ? rows[i].headers : "");
		snprintf(r->dead_error, sizeof(r->dead_error), "%s",
				 rows[i].dead_error ? rows[i].dead_error : "");
	}
done:
	pthread_mutex_unlock(&fs->lock);
	return rc;
}

static int
fake_relay_claim(void *ctx, int batch_size, long lease_ms, const char *token,
				 QbRelayRow **rows, int *nrows, char *err, size_t errlen)
{
	FakeStore  *fs = ctx;
	FakeInClaim *c;
	long		now = fake_clock_ms(fs);
	int			rc = 0;

	pthread_mutex_lock(&fs->lock);
	c = &fs->in_claims[fs->nin_claims < FAKE_MAX_CLAIMS ? fs->nin_claims++ : FAKE_MAX_CLAIMS - 1];
	*rows = NULL;
	*nrows = 0;
	memset(c, 0, sizeof(*c));
	c->batch_size = batch_size;
	c->lease_ms = lease_ms;
	c->waits_before = fs->th ? fs->th->nwaits : 0;
	if (fs->fail_claims > 0)
	{
		fs->fail_claims--;
		snprintf(err, errlen, "the fake's claim failed");
		rc = -1;
		goto done;
	}
	*rows = calloc(batch_size, sizeof(QbRelayRow));
	for (int i = 0; i < fs->nin && *nrows < batch_size; i++)
	{
		FakeInRow  *r = &fs->in[i];
		QbRelayRow *o;

		if (r->state != ROW_PENDING && !(r->state == ROW_PROCESSING && r->lease_end <= now))
			continue;
		r->state = ROW_PROCESSING;
		snprintf(r->token, sizeof(r->token), "%s", token);
		r->lease_end = now + lease_ms;
		o = &(*rows)[(*nrows)++];
		o->id = r->id;
		o->source = strdup(r->source);
		o->event_type = r->event_type[0] ? strdup(r->event_type) : NULL;
	}
	c->nrows = *nrows;
	if (*nrows == 0)
		fs->empty_claims++;
done:
	pthread_mutex_unlock(&fs->lock);
	return rc;
}

static int
fake_relay_forward(void *ctx, const char *token, const int64_t *ids, const char *const *topics,
				   const bool *holds, int n, int max_attempts, int *nsettled, int *ninserted, char *err,
				   size_t errlen)
{
	FakeStore  *fs = ctx;
	int			rc = 0;

	pthread_mutex_lock(&fs->lock);
	fs->nforwards++;
	*nsettled = *ninserted = 0;
	if (fs->fail_forwards > 0)
	{
		fs->fail_forwards--;
		snprintf(err, errlen, "the fake's forward failed");
		rc = -1;
		goto done;
	}
	fs->max_attempts = max_attempts;
	for (int i = 0; i < n && fs->steal > 0; i++, fs->steal--)
	{
		FakeInRow  *r = fake_inbox_row(fs, ids[i]);

		r->state = ROW_TAKEN;
		r->token[0] = '\0';
	}
	for (int i = 0; i < n; i++)
	{
		FakeInRow  *r = fake_inbox_row(fs, ids[i]);

		if (r == NULL || r->state != ROW_PROCESSING || strcmp(r->token, token) != 0)
		{
			fs->stale_settles++;
			continue;
		}
		(*nsettled)++;
		r->forwards++;
		r->token[0] = '\0';
		snprintf(r->topic, sizeof(r->topic), "%s", topics[i]);
		if (topics[i][0] == '\0')
		{
			r->state = ROW_DEAD;
			r->held = holds != NULL && holds[i];
		}
		else
		{
			r->state = ROW_PROCESSED;
			(*ninserted)++;
		}
	}
done:
	pthread_mutex_unlock(&fs->lock);
	return rc;
}

/* fake_store_ops: every op of the fake, its ctx fs. */
static inline QbStore
fake_store_ops(FakeStore *fs)
{
	QbStore		store = {
		.ctx = fs,
		.config_load = fake_config_load,
		.outbox_cycle = fake_outbox_cycle,
		.outbox_unpark = fake_outbox_unpark,
		.outbox_unroute = fake_outbox_unroute,
		.outbox_reclaim = fake_outbox_reclaim,
		.outbox_retention = fake_outbox_retention,
		.outbox_sweep = fake_outbox_sweep,
		.inbox_insert = fake_inbox_insert,
		.relay_claim = fake_relay_claim,
		.relay_forward = fake_relay_forward,
	};

	return store;
}

#endif							/* FAKE_STORE_H */
