/*-------------------------------------------------------------------------
 * outbox_worker.c
 *	  The outbox worker: the core's outbox engine in a dynamic background
 *	  worker (the host is worker_host.c).
 *
 * The launcher starts queuebox.outbox_workers of them, each with its index
 * as the main argument; index i owns qb_shared->outbox[i].  On SIGTERM the
 * engine releases the rows of a batch in flight (back to pending) before
 * the process exits, within a second even when the endpoint is slow.
 * Claims and settles may commit asynchronously (queuebox.worker_async_commit).
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "postmaster/bgworker.h"
#include "storage/ipc.h"

#include "qb_outbox.h"
#include "qb_pg.h"

void
qb_outbox_worker_main(Datum arg)
{
	int			index = DatumGetInt32(arg);
	QbHost		host;
	QbStore		store;
	QbOutboxStats stats = {0};
	char		label[BGW_MAXLEN];
	char		err[QB_ERRLEN];

	snprintf(label, sizeof(label), "queuebox outbox %d", index);
	qb_worker_host_start(label, &qb_shared->outbox[index], true, &host);
	qb_spi_store_init(&store);

	if (qb_outbox_run(&host, &store, index, &stats, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("queuebox outbox %d could not start: %s", index, err)));

	ereport(LOG,
			(errmsg("queuebox outbox %d stopped: %ld claims, %ld sent, %ld retried, %ld dead, %ld released, %ld held, %ld parked",
					index, stats.batches, stats.sent, stats.retried, stats.dead,
					stats.released, stats.held, stats.parked),
			 errdetail("Time spent: claim %ld ms (cycles that claimed, with their settles), waiting %ld ms, settle %ld ms (cycles that only settled).",
					   stats.claim_ms, stats.publish_ms, stats.settle_ms)));
	proc_exit(0);
}
