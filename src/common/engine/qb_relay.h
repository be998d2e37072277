/*-------------------------------------------------------------------------
 * qb_relay.h
 *	  The relay engine: push inbox rows into the outbox.
 *
 * Exactly one relay runs per server.  It claims push rows (one per
 * aggregate in flight, across every push source), renders each row's topic
 * from its source's template, and forwards the batch in one transaction.
 * See qb_relay.c for the loop.
 *-------------------------------------------------------------------------
 */
#ifndef QB_RELAY_H
#define QB_RELAY_H

#include <stdbool.h>

#include "qb_config.h"
#include "qb_host.h"
#include "qb_store.h"

/* The template of a source no longer in the configuration (an http source's default). */
#define QB_RELAY_DEFAULT_TOPIC "{{ eventType }}"

typedef struct QbRelayStats
{
	long		batches;
	long		forwarded;		/* inbox rows that became outbox rows */
	long		dead;			/* inbox rows whose topic rendered empty */
	long		taken_over;		/* claimed rows whose lease expired before the forward */
} QbRelayStats;

/*
 * Render the outbox topic of an inbox row of source (with event_type, NULL
 * when it has none) from the current configuration: the source's topic
 * template, or QB_RELAY_DEFAULT_TOPIC when the source is not configured any
 * more (*known is then false).  malloc'd, possibly empty; NULL when out of
 * memory.
 */
extern char *qb_relay_topic(const QbConfig *cfg, const char *source,
							const char *event_type, bool *known);

/*
 * Run the engine until the host says stop.  Returns 0 after a clean stop,
 * -1 when it could not start (err says why).
 */
extern int	qb_relay_run(const QbHost *host, const QbStore *store,
						 QbRelayStats *stats, char *err, size_t errlen);

#endif							/* QB_RELAY_H */
