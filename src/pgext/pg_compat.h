/*-------------------------------------------------------------------------
 * pg_compat.h
 *	  The PostgreSQL majors the extension builds on, and every difference
 *	  between them: nothing else in src/pgext tests PG_VERSION_NUM.
 *
 * Supported: 15, 16, 17 and 18 (docs/getting-started.md says which of them
 * scripts/test.sh runs on).  14 ended its life in November 2026 and is not
 * supported; a major after 18 is refused until it has been ported to.
 *
 * Every file of src/pgext includes this header right after postgres.h, so
 * an unsupported server stops the build at the #error below, before any
 * other message.  A call whose signature differs between majors goes
 * through a macro here named after it (qb_ + the call), with the major
 * that changed it and what the added argument is given.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PG_COMPAT_H
#define QB_PG_COMPAT_H

#if PG_VERSION_NUM < 150000
#error "QueueBox supports PostgreSQL 15, 16, 17 and 18; this server is older (PostgreSQL 14 ended its life in November 2026 and is not supported)"
#elif PG_VERSION_NUM >= 190000
#error "QueueBox supports PostgreSQL 15, 16, 17 and 18; this server is newer and QueueBox has not been ported to it"
#endif

/*
 * CreateWaitEventSet: 17 tracks a set with a ResourceOwner instead of a
 * memory context and allocates it in TopMemoryContext.  Ours live as long
 * as the worker and are freed by hand, so none (NULL) on 17 and later, and
 * TopMemoryContext before: the same lifetime on every major.
 */
#if PG_VERSION_NUM >= 170000
#define qb_CreateWaitEventSet(nevents) CreateWaitEventSet(NULL, (nevents))
#else
#define qb_CreateWaitEventSet(nevents) CreateWaitEventSet(TopMemoryContext, (nevents))
#endif

/*
 * index_beginscan: 18 adds an IndexScanInstrumentation * after the
 * snapshot, for EXPLAIN ANALYZE's index searches; none (NULL) here.
 */
#if PG_VERSION_NUM >= 180000
#define qb_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), NULL, (nkeys), (norderbys))
#else
#define qb_index_beginscan(heap, index, snapshot, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

#endif							/* QB_PG_COMPAT_H */
