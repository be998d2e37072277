/*-------------------------------------------------------------------------
 * qb_store.c
 *	  What qb_store.h declares besides the store ops, shared by every store
 *	  and engine: claim tokens and claimer ids, freeing what a claim or a
 *	  cycle returns, the circuit and settle names, what a failed query
 *	  means, matching an insert's answer to its rows, and a cycle's claim
 *	  after its promotion.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/rand.h>

#include "qb_host.h"
#include "qb_store.h"

/*
 * qb_uuid_v4 writes a random UUID.  Claim tokens must be unguessable by
 * another claimer, so they come from OpenSSL's CSPRNG, not from rand().
 */
bool
qb_uuid_v4(char out[QB_UUID_LEN + 1])
{
	unsigned char b[16];

	if (RAND_bytes(b, sizeof(b)) != 1)
		return false;
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	snprintf(out, QB_UUID_LEN + 1,
			 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
			 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	return true;
}

/*
 * qb_claimer_id: a claimer's id, the key of its session lock.  Random, so
 * the workers and replicas of one database need not agree on anything;
 * two that drew the same id would find the lock taken and draw again.
 */
int64_t
qb_claimer_id(void)
{
	uint64_t	v = 0;

	if (RAND_bytes((unsigned char *) &v, sizeof(v)) != 1)
		return 0;
	v &= INT64_MAX;
	return v != 0 ? (int64_t) v : 1;
}

void
qb_store_takeover(const QbHost *host, const QbStore *store, bool on)
{
	char		err[QB_ERRLEN];

	if (store->claimer != NULL && store->claimer(store->ctx, on, err, sizeof(err)) != 0)
		qb_log(host, QB_LOG_WARNING,
			   "could not register for takeover: %s; this worker's claims are taken over by lease only until it can",
			   err);
}

/* qb_outbox_rows_free_one frees what one row owns (not the row itself). */
void
qb_outbox_rows_free_one(QbOutboxRow *row)
{
	free(row->topic);
	free(row->key);
	free(row->payload);
	free(row->headers);
	free(row->destination);
	memset(row, 0, sizeof(*row));
}

/* qb_outbox_rows_free frees the rows a store's outbox_cycle returned. */
void
qb_outbox_rows_free(QbOutboxRow *rows, int n)
{
	if (rows == NULL)
		return;
	for (int i = 0; i < n; i++)
		qb_outbox_rows_free_one(&rows[i]);
	free(rows);
}

/* qb_cycle_out_free frees all a store's outbox_cycle returned. */
void
qb_cycle_out_free(QbCycleOut *out)
{
	for (int i = 0; i < out->nchanges; i++)
		free(out->changes[i].destination);
	for (int i = 0; i < out->nstates; i++)
		free(out->states[i].destination);
	free(out->changes);
	free(out->states);
	qb_outbox_rows_free(out->rows, out->nrows);
	memset(out, 0, sizeof(*out));
}

static const char *const qb_circuit_names[] = {"closed", "open", "half-open", "disabled"};

const char *
qb_circuit_name(QbCircuit c)
{
	return qb_circuit_names[c];
}

QbCircuit
qb_circuit_parse(const char *name)
{
	for (int i = 0; i < 4; i++)
		if (name != NULL && strcmp(name, qb_circuit_names[i]) == 0)
			return (QbCircuit) i;
	return QB_CIRCUIT_CLOSED;
}

bool
qb_settles_fanout(const QbSettle *st, int n)
{
	for (int i = 0; i < n; i++)
		if (st[i].fanout)
			return true;
	return false;
}

const char *
qb_settle_kind_name(QbSettleKind k)
{
	switch (k)
	{
		case QB_SETTLE_SENT:
			return "sent";
		case QB_SETTLE_RETRY:
			return "retry";
		case QB_SETTLE_DEAD:
			return "dead";
		case QB_SETTLE_RELEASE:
			return "release";
		case QB_SETTLE_ROUTE:
			return "route";
		case QB_SETTLE_HOLD:
			return "hold";
		case QB_SETTLE_DEAD_HOLD:
			return "dead-hold";
	}
	return "release";
}

/* qb_relay_rows_free frees what a store's relay_claim returned. */
void
qb_relay_rows_free(QbRelayRow *rows, int n)
{
	if (rows == NULL)
		return;
	for (int i = 0; i < n; i++)
	{
		free(rows[i].source);
		free(rows[i].event_type);
		free(rows[i].traceparent);
	}
	free(rows);
}

int
qb_query_failure(const char *sqlstate)
{
	if (sqlstate == NULL || strlen(sqlstate) != 5)
		return -1;
	if (strcmp(sqlstate, "P0002") == 0)
		return QB_QUERY_NOT_FOUND;
	if (strncmp(sqlstate, "22", 2) == 0 || strncmp(sqlstate, "23", 2) == 0)
		return QB_QUERY_BAD_INPUT;
	return -1;
}

int
qb_inbox_match(const QbInboxRow *rows, int n, int64_t *ids, int64_t id,
			   const char *source, const char *key)
{
	for (int i = 0; i < n; i++)
		if (ids[i] == 0 && strcmp(rows[i].source, source) == 0 &&
			strcmp(rows[i].idempotency_key, key) == 0)
		{
			ids[i] = id;
			return i;
		}
	return -1;
}

void
qb_claim_left(const QbClaimReq *claim, const QbOutboxRow *rows, int nrows,
			  QbClaimReq *req, int *limits)
{
	*req = *claim;
	memcpy(limits, claim->limits, sizeof(int) * claim->ndests);
	req->limits = limits;
	for (int i = 0; i < nrows; i++)
	{
		const QbOutboxRow *r = &rows[i];
		int			j = 0;

		if (!r->claimed)
			continue;
		if (r->destination == NULL)
		{
			req->batch_size--;
			continue;
		}
		while (j < claim->ndests && strcmp(claim->dests[j], r->destination) != 0)
			j++;
		if (j < claim->ndests && limits[j] > 0)
			limits[j]--;
	}
	if (req->batch_size < 0)
		req->batch_size = 0;
}

/*
 * qb_limit_take_answer: what a store's take answered for destination dest
 * (the tokens and places it got, in how many ms a token comes) into the
 * take of that name.  More than was asked cannot be: taken as none.
 */
bool
qb_limit_take_answer(QbLimitTake *takes, int n, const char *dest, long long got, long wait_ms)
{
	for (int i = 0; i < n; i++)
		if (strcmp(takes[i].destination, dest) == 0)
		{
			takes[i].got = got < 0 || got > takes[i].want ? 0 : (int) got;
			takes[i].wait_ms = wait_ms;
			return true;
		}
	return false;
}
