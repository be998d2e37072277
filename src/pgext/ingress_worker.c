/*-------------------------------------------------------------------------
 * ingress_worker.c
 *	  The ingress worker: the PostgreSQL host around the core's HTTP ingress
 *	  (qb_ingress.c).
 *
 * One ingress worker runs per server.  libmicrohttpd runs on this process's
 * only thread, in external epoll mode: its epoll fd sits in the worker's
 * WaitEventSet next to the latch, so SIGTERM, a configuration change and a
 * request all wake the same wait.  Every database call happens between
 * MHD_run passes, through the SPI store, never inside an MHD callback.
 *
 * Transactions: the ingress commits synchronously (unlike the outbox and
 * relay workers): its 202 promises the client that the row is durable.
 *
 * Metrics: the ingress counts its answers into the shared QbMetrics block
 * and renders /metrics from it, so one scrape sees every worker's counts.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "postmaster/bgworker.h"
#include "storage/ipc.h"

#include "qb_ingress.h"
#include "qb_pg.h"

void
qb_ingress_worker_main(Datum arg)
{
	QbHost		host;
	QbStore		store;
	QbIngressStats stats = {0};
	char		err[QB_ERRLEN];

	qb_worker_host_start("queuebox ingress", &qb_shared->ingress, false, &host);
	qb_spi_store_init(&store);

	if (qb_ingress_run(&host, &store, &qb_shared->metrics, &stats, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("queuebox ingress could not start: %s", err)));

	ereport(LOG,
			(errmsg("queuebox ingress stopped: %ld accepted, %ld duplicates, %ld refused, %ld unavailable in %ld store calls",
					stats.accepted, stats.duplicates, stats.refused, stats.unavailable,
					stats.batches)));
	proc_exit(0);
}
