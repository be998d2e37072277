/*-------------------------------------------------------------------------
 * consumer_worker.c
 *	  A consumer worker: the PostgreSQL host around the core's consumer
 *	  engine (qb_consume.c) for one broker source.
 *
 * queuebox.consumer_workers workers run; worker i serves the i-th broker
 * source (rabbitmq, kafka, nats) of the stored configuration, in document
 * order, and idles while there is none.  Each broker source therefore has a
 * process of its own: a slow broker never holds up another source.
 *
 * Transactions: the store commits synchronously, like the ingress: a broker
 * message is acknowledged right after its row commits, so the commit must
 * be durable before the broker forgets the message.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "postmaster/bgworker.h"
#include "storage/ipc.h"

#include "qb_consume.h"
#include "qb_pg.h"

void
qb_consumer_worker_main(Datum arg)
{
	int			slot = DatumGetInt32(arg);
	QbHost		host;
	QbStore		store;
	QbConsumeStats stats = {0};
	char		label[64];
	char		err[QB_ERRLEN];

	snprintf(label, sizeof(label), "queuebox consumer %d", slot);
	qb_worker_host_start(label, &qb_shared->consumer[slot], false, &host);
	qb_spi_store_init(&store);

	if (qb_consume_run(&host, &store, slot, &stats, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("%s could not start: %s", label, err)));

	ereport(LOG,
			(errmsg("%s stopped: %ld batches, %ld stored, %ld stored dead, %ld duplicates, %ld batches given back",
					label, stats.batches, stats.stored, stats.dead, stats.duplicates,
					stats.store_failures)));
	proc_exit(0);
}
