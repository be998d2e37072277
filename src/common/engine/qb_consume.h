/*-------------------------------------------------------------------------
 * qb_consume.h
 *	  The consumer engine: what the broker source consumers (qb_source.h,
 *	  one per source type) receive, stored in the inbox.
 *
 * Wording:
 *	- A delivery: see qb_source.h.
 *	- A batch is the deliveries of one fetch.  The engine stores a batch in
 *	  one transaction (each message a row; a body that is not JSON or that
 *	  the transform rejects becomes a dead row, spec), and only after the
 *	  commit acknowledges the whole batch.  A repeat is acknowledged and
 *	  counted, not stored twice.
 *	- When the store fails the batch is released (given back to the broker
 *	  or left unacknowledged): the broker keeps it, nothing is dropped.
 *
 * Threads: the consumers run on the engine's thread (qb_source.h).
 *-------------------------------------------------------------------------
 */
#ifndef QB_CONSUME_H
#define QB_CONSUME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qb_config.h"
#include "qb_host.h"
#include "qb_source.h"
#include "qb_store.h"

typedef struct QbConsumeStats
{
	long		batches;
	long		stored;			/* new pending rows */
	long		dead;			/* stored dead: not JSON, transform rejected */
	long		duplicates;
	long		store_failures;	/* batches released because the store failed */
} QbConsumeStats;

/*
 * Run consumer worker number slot until the host says stop: it serves the
 * slot-th broker source of the configuration (in document order), or idles
 * until a configuration has one.
 */
extern int	qb_consume_run(const QbHost *host, const QbStore *store, int slot,
						   QbConsumeStats *stats, char *err, size_t errlen);

#endif							/* QB_CONSUME_H */
