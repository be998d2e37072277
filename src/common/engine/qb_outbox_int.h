/*-------------------------------------------------------------------------
 * qb_outbox_int.h
 *	  The outbox engine's state, shared by its files: qb_outbox.c (slots,
 *	  publishing, cycles, the loop) and qb_outbox_housekeeping.c (reclaim,
 *	  unpark, the sweep, retention).  qb_outbox.h is the engine's face;
 *	  nothing else includes this header.
 *
 * The wording is qb_outbox.c's.  One engine, one thread: nothing here is
 * locked.
 *-------------------------------------------------------------------------
 */
#ifndef QB_OUTBOX_INT_H
#define QB_OUTBOX_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "qb_otlp.h"
#include "qb_outbox.h"
#include "qb_publish.h"

typedef enum QboSlotState
{
	QBO_FREE,
	QBO_QUEUED,
	QBO_SENDING,
	QBO_DONE
} QboSlotState;

typedef struct QboSlot
{
	QboSlotState st;
	QbOutboxRow row;			/* owned */
	char		token[QB_UUID_LEN + 1];
	int			dest;			/* index into cfg->destinations, -1: none */
	int			route;			/* index into cfg->routes, -1: none */
	QbSettle	settle;			/* when done */
	char	   *error;			/* owned text behind settle.error */
	long		done_at;
	/* what the attempt told the destination's breaker */
	bool		attempted;
	bool		attempt_ok;
	int64_t		sent_ns;		/* when its publish started (qb_now_ns) */
	bool		gone;
	long		retry_after_ms;
	/* the attempt's span (qb_otlp.h), exported once its settle is written */
	QbSpan		span;
	bool		spanned;
	char		span_name[96];
	char	   *trace_state;	/* owned text behind span.trace_state */
	int			status;			/* the HTTP status answered, 0: none */
	bool		limit_held;		/* sending with a maxConcurrent place (qb_outbox_limits.c) */
} QboSlot;

/* One destination of the configuration, as this engine sees it now. */
typedef struct QboDest
{
	int			sending;
	int			queued;
	QbCircuit	state;			/* from the last claim's states */
	int			failures;		/* counted: the last claim's states, then our tallies */
	bool		paused;
	bool		probe;			/* we won its half-open probe and not yet sent it */
	int64_t		floor;			/* its intake: ids above this only */
	double		unrouted_share; /* rows not routed yet it got, per claim, decaying */
	int			unrouted_now;	/* ... in the claim being dispatched */
	/* its limits (rateLimit, maxConcurrent), when it has any: qb_outbox_limits.c */
	int			reserved;		/* tokens and places taken, not used by a start yet */
	int			allowed;		/* what the limit gave the claim being made */
	bool		cut;			/* ... less than its room */
	int			claimed_now;	/* its rows the claim brought */
	bool		backlog;		/* its last claim used all the limit gave: rows wait */
	long		limit_at;		/* when its limit may give a claim rows again */
	/* ... and in the database, across replicas (QbStore.limits_take) */
	int			db_held;		/* the places the database counts as ours */
	int			db_out;			/* the tokens it counts as ours, taken and not spent */
	int			db_give;		/* tokens taken there and not used: given back next take */
} QboDest;

typedef struct QboEngine
{
	const QbHost *host;
	const QbStore *store;
	int			worker_index;
	QbConfig   *cfg;			/* NULL until a valid document is stored */
	QbPubSet   *pub;
	QboSlot    *slots;
	int			nslots;
	int			nactive;		/* slots not free */
	QboDest    *dests;			/* cfg->ndestinations */
	int64_t		floor;			/* the unrouted intake: ids above this only */
	long		next_full_scan;
	long		next_reclaim;
	long		next_unpark;
	long		next_retention;
	long		next_sweep;
	char	   *sweep_after;	/* the key the next sweep starts at, NULL: the first */
	long		sweep_gap;		/* before the next walk (qb_outbox_sweep_gap) */
	int			sweep_walk_released;	/* rows the walk under way released so far */
	long		next_cycle_try; /* after a failed cycle */
	long		last_claim;		/* when the last claim ran */
	long		states_at;		/* when a claim last read the circuits */
	bool		claim_idle;		/* the last claim brought nothing: wait */
	bool		reload_pending;
	bool		warned_no_config;
	QbOutboxStats *stats;
	struct QbLimits *limits;	/* the host's, or own_limits: shared limits */
	struct QbLimits *own_limits;	/* this worker's alone, when the host has none */
	int			limit_holder;	/* this worker in limits, -1: none */
	long		limits_sync_at; /* when a take gives back what the database
								 * counts and we do not use, 0: none due */
} QboEngine;

/* why destination d takes no rows now, or NULL when it does (qb_outbox.c) */
extern const char *qbo_hold_reason(const QboDest *d);

/* qb_outbox_housekeeping.c: the chores of each loop round that are due */
extern void qbo_housekeeping(QboEngine *e, long now);

/* qb_outbox_limits.c: the destinations' rateLimit and maxConcurrent */
extern bool qbo_limits_start(QboEngine *e);
extern void qbo_limits_end(QboEngine *e);
extern int	qbo_limit_allow(QboEngine *e, int i, int room, long now);
extern bool qbo_limit_want(const QboEngine *e, int i, long now);
extern bool qbo_limits_due(const QboEngine *e, long now, long *in_ms);
extern bool qbo_limit_take(QboEngine *e, QboSlot *s);
extern void qbo_limit_done(QboEngine *e, QboSlot *s);
extern void qbo_limits_after_claim(QboEngine *e, bool claimed);
extern void qbo_limits_give_unused(QboEngine *e);
extern void qbo_limits_give_now(QboEngine *e);
/* what a take of the database's limits asks (qbo_limits_take_shared) */
typedef enum QboTake
{
	QBO_TAKE_SYNC,				/* nothing: gives back what is not used */
	QBO_TAKE_CLAIM				/* the reservations a claim is about to ask rows for */
} QboTake;
extern void qbo_limits_take_shared(QboEngine *e, QboTake mode, long now);
extern long qbo_limits_sync_in(const QboEngine *e, long now);

#endif							/* QB_OUTBOX_INT_H */
