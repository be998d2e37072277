/*-------------------------------------------------------------------------
 * qb_engines.h
 *	  The engine registry: every engine a host runs (outbox, relay, ingress,
 *	  consumer), with its name, its run call, its stop line and how many of
 *	  it the settings want.  The extension's launcher and workers and the
 *	  daemon's supervisor and roles all read this one table.
 *
 * A host fills a QbEngineWant from its own settings (GUCs, or the daemon's
 * configuration file); the table turns it into a count per engine.  The
 * kinds are in start order, the consumers last: the launcher resizes them
 * in place when broker sources come and go.
 *-------------------------------------------------------------------------
 */
#ifndef QB_ENGINES_H
#define QB_ENGINES_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_consume.h"
#include "qb_host.h"
#include "qb_ingress.h"
#include "qb_outbox.h"
#include "qb_relay.h"
#include "qb_store.h"

typedef enum QbEngineKind
{
	QB_ENGINE_OUTBOX,
	QB_ENGINE_RELAY,
	QB_ENGINE_INGRESS,
	QB_ENGINE_CONSUMER,
	QB_ENGINE_NKINDS
} QbEngineKind;

/* what an engine counts while it runs, for its stop line */
typedef union QbEngineStats
{
	QbOutboxStats outbox;
	QbRelayStats relay;
	QbIngressStats ingress;
	QbConsumeStats consume;
} QbEngineStats;

/* what a host's settings say about how many engines to run */
typedef struct QbEngineWant
{
	int			outbox_workers; /* the configured outbox worker count */
	bool		relay;			/* the relay runs */
	bool		ingress;		/* the ingress runs */
	int			broker_sources; /* in the configuration; -1: not known yet */
	int			max_consumers;	/* at most this many consumers */
} QbEngineWant;

typedef struct QbEngine
{
	QbEngineKind kind;			/* its own index in the table */
	const char *name;			/* "outbox": role "outbox 3", bgworker "queuebox outbox 3" */
	bool		numbered;		/* several run, each with its index in its name */

	/*
	 * Run until the host says stop: 0 after a clean stop, -1 when it could
	 * not start (err says why).  index: the outbox worker, the consumer slot.
	 */
	int			(*run) (const QbHost *host, const QbStore *store, int index,
						QbEngineStats *stats, char *err, size_t errlen);

	/*
	 * The stop line after "<name> stopped: ", and a detail for the hosts
	 * that log one ("" when the engine has none).
	 */
	void		(*stats) (const QbEngineStats *stats, char *line, size_t linelen,
						  char *detail, size_t detaillen);

	/* how many of this engine the settings want */
	int			(*wanted) (const QbEngineWant *want);
} QbEngine;

/* QbEngine's functions: each must be set (qb_ops.h) */
#define QB_ENGINE_OPS(X, T) X(T, run) X(T, stats) X(T, wanted)

/* The table's entry for kind (kind < QB_ENGINE_NKINDS). */
extern const QbEngine *qb_engine(QbEngineKind kind);

/*
 * A host calls it once at start: the engine table and the publisher and
 * consumer tables the engines drive are complete.  0, or -1 with err
 * naming the table and the field left out ("engine 'relay' lacks 'run'").
 */
extern int	qb_engines_check(char *err, size_t errlen);
/* the same check of any table of n entries (the unit tests give it holes) */
extern int	qb_engines_check_table(const QbEngine *table, int n, char *err, size_t errlen);

/*
 * A host calls it before an engine's run: its host and store tables are
 * complete.  0, or -1 with err ("store ops of 'outbox 0' lacks
 * 'relay_claim'"); who is the engine's name.
 */
extern int	qb_engine_tables_check(const QbHost *host, const QbStore *store, const char *who,
								   char *err, size_t errlen);

/* "outbox 0", "relay", "ingress", "consumer 1" */
extern void qb_engine_name(QbEngineKind kind, int index, char *buf, size_t len);

#endif							/* QB_ENGINES_H */
