/*-------------------------------------------------------------------------
 * qb_limits.h
 *	  The destinations' limits every worker of one server shares: the token
 *	  bucket of a rateLimit and the count of a maxConcurrent, in a block of
 *	  shared memory with no pointer in it (the extension's QbShared, the
 *	  daemon's MAP_SHARED block).
 *
 * Wording:
 *	- A limit slot holds one destination's state, found by its name: taken
 *	  at the first use of a limit and kept while the name is used; one idle
 *	  for a minute (no take, nothing in use) may be taken by another name.
 *	- A holder is one worker (by its name: "outbox 0", "outbox 1"), taken
 *	  when it starts.  A worker that takes its name again (restarted after
 *	  a crash) gives back first everything its name held: its predecessor
 *	  is gone, and so are its requests.
 *	- To reserve is to take, in one step, up to n tokens and as many of
 *	  the maxConcurrent places: what a claim may bring.  A token is then
 *	  out until its publish starts (qb_limits_spent): the bucket refills
 *	  only up to burst less the tokens out (qb_ratelimit.h says why).  A
 *	  place is held until the publish that used it ends
 *	  (qb_limits_release).  What was reserved and not used is given back
 *	  (qb_limits_give).  A holder's tokens out are counted by holder, so
 *	  that a dead worker's stop being out (spent at its end: its requests
 *	  may have gone).
 *	- The limit in force is the one the caller passes: each call carries
 *	  its destination's rateLimit and maxConcurrent, so a reload changes it
 *	  at the next call (tokens above a lowered burst are dropped; places in
 *	  use above a lowered maxConcurrent stay until they end, none is taken
 *	  meanwhile).  A destination that is removed keeps its slot, idle.
 *
 * Locking protocol: every slot has its own spin lock, a word holding the
 * pid of the process in it (0: free), taken by compare-and-swap around a
 * few dozen instructions.  A process that finds the lock held for more
 * than a millisecond checks that its holder lives (kill 0): a daemon role
 * killed -9 inside it leaves it held, and a waiter takes it over.  What it
 * was changing stays usable: a place is counted in held[] alone (one store
 * per change), in_use is counted again from it at every change.  The
 * table of holders and the naming of slots take the block's lock the same
 * way.  Counters read for display are read without a lock (relaxed).
 *-------------------------------------------------------------------------
 */
#ifndef QB_LIMITS_H
#define QB_LIMITS_H

#include <stdbool.h>
#include <stdint.h>

#include "qb_ratelimit.h"

#define QB_LIMITS_SLOTS		64
#define QB_LIMITS_HOLDERS	128
#define QB_LIMITS_NAMELEN	64

typedef struct QbLimitSlot
{
	uint32_t	lock;			/* pid in it, 0: free */
	uint32_t	state;			/* QbSlotState (qb_metrics.h) */
	char		name[QB_LIMITS_NAMELEN];
	QbRateBucket bucket;
	int32_t		in_use;			/* sum of held[], for readers without a lock */
	int64_t		used_ns;		/* the last take */
	int32_t		held[QB_LIMITS_HOLDERS];	/* places held, by holder */
	int32_t		out[QB_LIMITS_HOLDERS]; /* tokens out, by holder */
} QbLimitSlot;

typedef struct QbLimitHolder
{
	uint32_t	state;			/* QbSlotState */
	int32_t		pid;
	char		name[QB_LIMITS_NAMELEN];
} QbLimitHolder;

typedef struct QbLimits
{
	uint32_t	lock;			/* the holders' table, the slots' naming */
	QbLimitHolder holders[QB_LIMITS_HOLDERS];
	QbLimitSlot slots[QB_LIMITS_SLOTS];
} QbLimits;

/* Zero a block (a fresh shared-memory segment, a daemon's). */
extern void qb_limits_init(QbLimits *l);

/*
 * The holder of the worker called name, now run by pid: everything the
 * name held is given back first.  -1 when l is NULL or the table is full
 * (that worker's limited destinations then take no rows: see qb_limits.c).
 */
extern int	qb_limits_holder(QbLimits *l, const char *name, int pid);

/* Give back every place holder holds (its worker ends). */
extern void qb_limits_holder_end(QbLimits *l, int holder);

/* The same for the holder run by pid (the daemon's supervisor, at a role's death). */
extern void qb_limits_pid_end(QbLimits *l, int pid);

/* Is any limit set in spec? */
static inline bool
qb_limits_set(const QbLimitSpec *spec)
{
	return spec->rate.per_sec > 0 || spec->max_concurrent > 0;
}

/*
 * Reserve up to want tokens and places of destination name under spec, at
 * now_ns; returns how many.  When fewer than want, *wait_ms says in how
 * many ms a token comes (-1: it waits for a place to be given back, or no
 * slot or holder could be had).
 */
extern int	qb_limits_reserve(QbLimits *l, int holder, const char *name,
							  const QbLimitSpec *spec, int want, int64_t now_ns,
							  long *wait_ms);

/* n reserved tokens were spent at now_ns: their publishes started. */
extern void qb_limits_spent(QbLimits *l, int holder, const char *name,
							const QbLimitSpec *spec, int n, int64_t now_ns);

/* Give back n reserved and unused at now_ns: n tokens and n places. */
extern void qb_limits_give(QbLimits *l, int holder, const char *name,
						   const QbLimitSpec *spec, int n, int64_t now_ns);

/* A publish that held a place ended: its place is given back. */
extern void qb_limits_release(QbLimits *l, int holder, const char *name);

/* The places of name in use now (0: none or no slot), for display. */
extern int	qb_limits_in_use(const QbLimits *l, const char *name);

#endif							/* QB_LIMITS_H */
