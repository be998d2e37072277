/*-------------------------------------------------------------------------
 * qb_engines.c
 *	  The engine registry (qb_engines.h): one row per engine, read by both
 *	  hosts.  The stop lines are the ones the hosts logged before the table
 *	  existed, word for word: the TAP tests grep them.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>

#include "qb_engines.h"
#include "qb_ops.h"
#include "qb_publish.h"
#include "qb_source.h"

/* ---- run: each engine's entry, in one signature ----------------------- */

static int
qben_outbox_run(const QbHost *host, const QbStore *store, int index,
			   QbEngineStats *stats, char *err, size_t errlen)
{
	return qb_outbox_run(host, store, index, &stats->outbox, err, errlen);
}

static int
qben_relay_run(const QbHost *host, const QbStore *store, int index,
			  QbEngineStats *stats, char *err, size_t errlen)
{
	(void) index;
	return qb_relay_run(host, store, &stats->relay, err, errlen);
}

/* the ingress counts its answers into the host's shared metrics */
static int
qben_ingress_run(const QbHost *host, const QbStore *store, int index,
				QbEngineStats *stats, char *err, size_t errlen)
{
	(void) index;
	return qb_ingress_run(host, store, host->metrics, &stats->ingress, err, errlen);
}

static int
qben_consumer_run(const QbHost *host, const QbStore *store, int index,
				 QbEngineStats *stats, char *err, size_t errlen)
{
	return qb_consume_run(host, store, index, &stats->consume, err, errlen);
}

/* ---- stats: the stop lines -------------------------------------------- */

static void
qben_outbox_stats(const QbEngineStats *stats, char *line, size_t linelen,
				 char *detail, size_t detaillen)
{
	const QbOutboxStats *s = &stats->outbox;

	snprintf(line, linelen,
			 "%ld claims, %ld sent, %ld retried, %ld dead, %ld released, %ld held, %ld parked",
			 s->batches, s->sent, s->retried, s->dead, s->released, s->held, s->parked);
	snprintf(detail, detaillen,
			 "Time spent: claim %ld ms (cycles that claimed, with their settles), waiting %ld ms, settle %ld ms (cycles that only settled).",
			 s->claim_ms, s->publish_ms, s->settle_ms);
}

static void
qben_relay_stats(const QbEngineStats *stats, char *line, size_t linelen,
				char *detail, size_t detaillen)
{
	const QbRelayStats *s = &stats->relay;

	snprintf(line, linelen, "%ld batches, %ld forwarded, %ld dead, %ld taken over",
			 s->batches, s->forwarded, s->dead, s->taken_over);
	snprintf(detail, detaillen, "%s", "");
}

static void
qben_ingress_stats(const QbEngineStats *stats, char *line, size_t linelen,
				  char *detail, size_t detaillen)
{
	const QbIngressStats *s = &stats->ingress;

	snprintf(line, linelen,
			 "%ld accepted, %ld duplicates, %ld refused, %ld unavailable in %ld store calls",
			 s->accepted, s->duplicates, s->refused, s->unavailable, s->batches);
	snprintf(detail, detaillen, "%s", "");
}

static void
qben_consumer_stats(const QbEngineStats *stats, char *line, size_t linelen,
				   char *detail, size_t detaillen)
{
	const QbConsumeStats *s = &stats->consume;

	snprintf(line, linelen,
			 "%ld batches, %ld stored, %ld stored dead, %ld duplicates, %ld batches given back",
			 s->batches, s->stored, s->dead, s->duplicates, s->store_failures);
	snprintf(detail, detaillen, "%s", "");
}

/* ---- wanted: how many of each the settings ask for -------------------- */

static int
qben_outbox_wanted(const QbEngineWant *want)
{
	return want->outbox_workers;
}

static int
qben_relay_wanted(const QbEngineWant *want)
{
	return want->relay ? 1 : 0;
}

static int
qben_ingress_wanted(const QbEngineWant *want)
{
	return want->ingress ? 1 : 0;
}

/*
 * One consumer per broker source, up to the cap.  While the count is not
 * known (the extension's launcher, before a worker loaded the document)
 * one consumer runs to load it.
 */
static int
qben_consumer_wanted(const QbEngineWant *want)
{
	int			n = want->broker_sources < 0 ? 1 : want->broker_sources;

	return n < want->max_consumers ? n : want->max_consumers;
}

/* ---- the table -------------------------------------------------------- */

static const QbEngine qb_engines[QB_ENGINE_NKINDS] = {
	[QB_ENGINE_OUTBOX] = {QB_ENGINE_OUTBOX, "outbox", true,
	qben_outbox_run, qben_outbox_stats, qben_outbox_wanted},
	[QB_ENGINE_RELAY] = {QB_ENGINE_RELAY, "relay", false,
	qben_relay_run, qben_relay_stats, qben_relay_wanted},
	[QB_ENGINE_INGRESS] = {QB_ENGINE_INGRESS, "ingress", false,
	qben_ingress_run, qben_ingress_stats, qben_ingress_wanted},
	[QB_ENGINE_CONSUMER] = {QB_ENGINE_CONSUMER, "consumer", true,
	qben_consumer_run, qben_consumer_stats, qben_consumer_wanted},
};

/* qb_engine: see qb_engines.h. */
const QbEngine *
qb_engine(QbEngineKind kind)
{
	return &qb_engines[kind];
}

QB_OPS_LISTED(QbEngine, 3, QB_ENGINE_OPS, QB_OPS_NONE);
QB_OPS_LISTED(QbStore, 1, QB_STORE_OPS, QB_STORE_OPS_OPTIONAL);
QB_OPS_LISTED(QbHost, 8, QB_HOST_OPS, QB_HOST_OPS_OPTIONAL);
QB_OPS_LISTED(QbIngressRoutes, 0, QB_INGRESS_ROUTES_OPS, QB_OPS_NONE);

/* qb_engines_check_table: see qb_engines.h. */
int
qb_engines_check_table(const QbEngine *table, int n, char *err, size_t errlen)
{
	static const QbOpsField fields[] = {QB_ENGINE_OPS(QB_OPS_FIELD, QbEngine)};

	for (int k = 0; k < n; k++)
	{
		const QbEngine *e = &table[k];

		if (e->name == NULL || (int) e->kind != k)
		{
			snprintf(err, errlen, "engine entry %d (%s) has %s", k, e->name ? e->name : "unnamed",
					 e->name == NULL ? "no name" : "a kind that is not its index");
			return -1;
		}
		if (qb_ops_check("engine", e->name, e, fields, sizeof(fields) / sizeof(fields[0]),
						 err, errlen) != 0)
			return -1;
	}
	return 0;
}

/* qb_engines_check: see qb_engines.h. */
int
qb_engines_check(char *err, size_t errlen)
{
	if (qb_engines_check_table(qb_engines, QB_ENGINE_NKINDS, err, errlen) != 0 ||
		qb_publishers_check(err, errlen) != 0 || qb_consumers_check(err, errlen) != 0)
		return -1;
	return 0;
}

/* qb_engine_tables_check: see qb_engines.h. */
int
qb_engine_tables_check(const QbHost *host, const QbStore *store, const char *who,
					   char *err, size_t errlen)
{
	static const QbOpsField host_fields[] = {QB_HOST_OPS(QB_OPS_FIELD, QbHost)};
	static const QbOpsField store_fields[] = {QB_STORE_OPS(QB_OPS_FIELD, QbStore)};

	static const QbOpsField routes_fields[] = {QB_INGRESS_ROUTES_OPS(QB_OPS_FIELD, QbIngressRoutes)};

	if (qb_ops_check("host ops of", who, host, host_fields,
					 sizeof(host_fields) / sizeof(host_fields[0]), err, errlen) != 0 ||
		qb_ops_check("store ops of", who, store, store_fields,
					 sizeof(store_fields) / sizeof(store_fields[0]), err, errlen) != 0 ||
		(host->routes != NULL &&
		 qb_ops_check("ingress routes of", who, host->routes, routes_fields,
					  sizeof(routes_fields) / sizeof(routes_fields[0]), err, errlen) != 0))
		return -1;
	return 0;
}

/* qb_engine_name: see qb_engines.h. */
void
qb_engine_name(QbEngineKind kind, int index, char *buf, size_t len)
{
	const QbEngine *e = qb_engine(kind);

	if (e->numbered)
		snprintf(buf, len, "%s %d", e->name, index);
	else
		snprintf(buf, len, "%s", e->name);
}
