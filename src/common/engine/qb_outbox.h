/*-------------------------------------------------------------------------
 * qb_outbox.h
 *	  The outbox engine: claim, route, publish, settle, circuit breakers,
 *	  reclaim, unpark, retention.
 *
 * One engine runs per outbox worker; several engines (in one server or in
 * several replicas) share one table, kept apart by SKIP LOCKED claims, claim
 * tokens and leases.  See qb_outbox.c for the loop.
 *-------------------------------------------------------------------------
 */
#ifndef QB_OUTBOX_H
#define QB_OUTBOX_H

#include "qb_host.h"
#include "qb_store.h"

typedef struct QbOutboxStats
{
	long		batches;
	long		sent;
	long		retried;
	long		dead;
	long		released;
	long		held;			/* rows held for their destination */
	long		parked;			/* rows a claim parked behind their key */
	long		reclaimed;
	long		deleted;
	/* wall time spent per phase, for the stop log line and benchmarks */
	long		claim_ms;
	long		publish_ms;
	long		settle_ms;
} QbOutboxStats;

/*
 * Run the engine until the host says stop.  worker_index 0 also runs
 * retention.  Returns 0 after a clean stop, -1 when it could not start
 * (err says why).
 */
extern int	qb_outbox_run(const QbHost *host, const QbStore *store,
						  int worker_index, QbOutboxStats *stats,
						  char *err, size_t errlen);
extern long qb_outbox_sweep_gap(long gap, int released, bool walk_done);

#endif							/* QB_OUTBOX_H */
