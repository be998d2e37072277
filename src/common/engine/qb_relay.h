/*-------------------------------------------------------------------------
 * qb_relay.h
 *	  The relay engine: push inbox rows into the outbox.
 *
 * Exactly one relay runs per server.  It claims push rows (one per
 * aggregate in flight, across every push source), renders each row's topic
 * from its source's template, and forwards the batch in one transaction.
 * See qb_relay.c for the loop.  The inbox replay (qb_replay_*) renders
 * topics the same way and is declared here too.
 *-------------------------------------------------------------------------
 */
#ifndef QB_RELAY_H
#define QB_RELAY_H

#include <stdbool.h>
#include <stdint.h>

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
 * The replay of inbox rows into the outbox (queuebox.replay_inbox() and
 * every store's QB_Q_REPLAY_INBOX and QB_Q_REPLAY_INBOX_BULK): the rows
 * QB_PG_INBOX_REPLAY_SELECT read (or the ODBC store's equivalent), each
 * topic rendered from the CURRENT configuration exactly as the relay does
 * (qb_relay_topic), then inserted in that order (QB_PG_INBOX_REPLAY).  A
 * row whose topic renders empty is skipped: the single form fails on it,
 * the bulk form counts it.
 */
typedef struct QbReplay
{
	int			nrows;			/* rows selected */
	int			nskipped;		/* of which the topic rendered empty */
	int			skipped;		/* the index of the last one skipped, -1: none */
	int			n;				/* rows to insert: */
	int64_t    *ids;			/* ... their inbox ids */
	char	  **topics;			/* ... their rendered topics */
} QbReplay;

/*
 * Render the topics of nrows selected rows (ids, sources, event types NULL
 * when none) into r; malloc'd, free with qb_replay_free.  False when out of
 * memory (r is then empty).
 */
extern bool qb_replay_render(const QbConfig *cfg, const int64_t *ids,
							 const char *const *sources, const char *const *event_types,
							 int nrows, QbReplay *r);
extern void qb_replay_free(QbReplay *r);

/* The replay's messages, shared by the extension's ERRORs and the stores' err. */
#define QB_REPLAY_MISSING_FMT "inbox row %lld does not exist"
#define QB_REPLAY_EMPTY_FMT "the topic of inbox row %lld renders empty, so no route could take it"
#define QB_REPLAY_EMPTY_DETAIL_FMT \
	"The topic template of source \"%s\" reads a value the message does not carry (usually {{ eventType }})."
#define QB_REPLAY_EMPTY_HINT \
	"Set eventTypePath (or eventTypeHeader) on the source, or use {{ source }} in its topic template, then replay again."

/*
 * A daemon store's replay (QB_Q_REPLAY_INBOX, QB_Q_REPLAY_INBOX_BULK; the
 * extension has queuebox.replay_inbox()) in the store's two calls.  select
 * reads the rows of v (v[0] the single form's id, v[1..4] the bulk form's
 * filters, NULL where not given) into *ids, *sources, *types (*n rows,
 * the store's until qb_replay_run returns).  insert inserts r's rows, each
 * allowed max_attempts, and says how many (*nrows) and the first one's id
 * (*first_null: none).  Both return 0, or -1 with err set.
 */
typedef struct QbReplayCalls
{
	int			(*select) (void *ctx, const char *const *v, const int64_t **ids,
						   const char *const **sources, const char *const **types, int *n,
						   char *err, size_t errlen);
	int			(*insert) (void *ctx, const QbReplay *r, int max_attempts, long long *nrows,
						   bool *first_null, long long *first_id, char *err, size_t errlen);
	const char *oom;			/* err when out of memory */
} QbReplayCalls;

/*
 * Replay the inbox rows of params (the query's) with the configuration cfg
 * (NULL: none in force, an error).  *out = the malloc'd JSON answer, as
 * queuebox.replay_inbox() prints it.  Returns 0, -1, QB_QUERY_NOT_FOUND
 * (no such row) or QB_QUERY_BAD_INPUT (its topic renders empty), err set.
 */
extern int	qb_replay_run(const QbConfig *cfg, bool single, const char *const *params,
						  const QbReplayCalls *calls, void *ctx, char **out,
						  char *err, size_t errlen);

/*
 * Run the engine until the host says stop.  Returns 0 after a clean stop,
 * -1 when it could not start (err says why).
 */
extern int	qb_relay_run(const QbHost *host, const QbStore *store,
						 QbRelayStats *stats, char *err, size_t errlen);

#endif							/* QB_RELAY_H */
