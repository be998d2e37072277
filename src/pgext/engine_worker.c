/*-------------------------------------------------------------------------
 * engine_worker.c
 *	  Every dynamic worker's entry point: one engine of the core's registry
 *	  (qb_engines.h) in a background worker, with the SPI store and the
 *	  host of worker_host.c.
 *
 * The launcher packs the engine's kind and index into the main argument
 * (QB_WORKER_ARG).  Each worker owns its slot of qb_shared: outbox[i] for
 * outbox worker i (worker 0 also runs retention), relay, ingress, and
 * consumer[i] for the i-th broker source of the stored configuration.
 *
 * Transactions: only the outbox may commit its claims and settles
 * asynchronously (queuebox.worker_async_commit): a settle lost in a crash
 * only delivers a row again.  The relay's forward, the ingress's 202 and a
 * consumer's broker acknowledgement each promise a durable row, so they
 * commit synchronously.  On SIGTERM the engine gives back what it holds
 * (the outbox releases a batch in flight) and the worker logs its stop line.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include <unistd.h>

#include "postmaster/bgworker.h"
#include "storage/ipc.h"

#include "qb_engines.h"
#include "qb_otlp.h"
#include "qb_pg.h"

/* the worker's slot in qb_shared */
static QbWorkerSlot *
qbw_slot(QbEngineKind kind, int index)
{
	switch (kind)
	{
		case QB_ENGINE_OUTBOX:
			return &qb_shared->outbox[index];
		case QB_ENGINE_RELAY:
			return &qb_shared->relay;
		case QB_ENGINE_INGRESS:
			return &qb_shared->ingress;
		case QB_ENGINE_CONSUMER:
		case QB_ENGINE_NKINDS:
			break;
	}
	return &qb_shared->consumer[index];
}

/* qbw_limits_end: the worker's maxConcurrent places back (its requests end with it) */
static void
qbw_limits_end(int code, Datum arg)
{
	qb_limits_holder_end(&qb_shared->limits, DatumGetInt32(arg));
}

/*
 * qbw_limits: the destinations' limits every worker shares, and this
 * worker's holder in them (taking it gives back what a predecessor of the
 * same name held: one that ended by an ERROR exits without a crash
 * restart).
 */
static void
qbw_limits(QbHost *host, const char *name)
{
	host->limits = &qb_shared->limits;
	host->limit_holder = qb_limits_holder(host->limits, name, (int) getpid());
	if (host->limit_holder >= 0)
		before_shmem_exit(qbw_limits_end, Int32GetDatum(host->limit_holder));
}

void
qb_engine_worker_main(Datum arg)
{
	QbEngineKind kind = QB_WORKER_ARG_KIND(DatumGetInt32(arg));
	int			index = QB_WORKER_ARG_INDEX(DatumGetInt32(arg));
	const QbEngine *engine = qb_engine(kind);
	QbHost		host;
	QbStore		store;
	QbEngineStats stats;
	char		name[BGW_MAXLEN];
	char		label[BGW_MAXLEN];
	char		line[256];
	char		detail[256];
	char		err[QB_ERRLEN];

	memset(&stats, 0, sizeof(stats));
	qb_engine_name(kind, index, name, sizeof(name));
	snprintf(label, sizeof(label), "queuebox %s", name);
	qb_worker_host_start(label, qbw_slot(kind, index), kind == QB_ENGINE_OUTBOX, &host);
	host.worker = qb_metrics_worker(host.metrics, name, (int) getpid());
	qbw_limits(&host, name);
	qb_spi_store_init(&store);

	if (qb_engine_tables_check(&host, &store, name, err, sizeof(err)) != 0 ||
		engine->run(&host, &store, index, &stats, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("%s could not start: %s", label, err)));

	/* the spans of the last attempts, for up to 2 s (qb_otlp.h) */
	qb_otlp_shutdown(&qb_pg_runtime()->otlp, 2000);
	qb_worker_set(host.worker, QB_W_STOPPED);
	engine->stats(&stats, line, sizeof(line), detail, sizeof(detail));
	ereport(LOG,
			(errmsg("%s stopped: %s", label, line),
			 detail[0] ? errdetail("%s", detail) : 0));
	proc_exit(0);
}
