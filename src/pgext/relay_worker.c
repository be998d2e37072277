/*-------------------------------------------------------------------------
 * relay_worker.c
 *	  The relay worker: the core's relay engine in a dynamic background
 *	  worker (the host is worker_host.c).
 *
 * Exactly one runs (the launcher's relay role, when queuebox.relay_worker
 * is on); it owns qb_shared->relay.  Backends set its latch at the commit
 * of a transaction that inserted inbox rows or stored a configuration.
 *
 * Its forward always commits synchronously, whatever
 * queuebox.worker_async_commit says: it is the one transaction that marks
 * an inbox row processed and writes its outbox row.  On SIGTERM the engine
 * finishes the batch in hand (a database statement, no network) and stops.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "postmaster/bgworker.h"
#include "storage/ipc.h"

#include "qb_pg.h"
#include "qb_relay.h"

void
qb_relay_worker_main(Datum arg)
{
	QbHost		host;
	QbStore		store;
	QbRelayStats stats = {0};
	char		err[QB_ERRLEN];

	qb_worker_host_start("queuebox relay", &qb_shared->relay, false, &host);
	qb_spi_store_init(&store);

	if (qb_relay_run(&host, &store, &stats, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("queuebox relay could not start: %s", err)));

	ereport(LOG,
			(errmsg("queuebox relay stopped: %ld batches, %ld forwarded, %ld dead, %ld taken over",
					stats.batches, stats.forwarded, stats.dead, stats.taken_over)));
	proc_exit(0);
}
