/*-------------------------------------------------------------------------
 * qb_pg.h
 *	  What the PostgreSQL host's files share: GUCs, the shared-memory state,
 *	  worker entry points, the SPI store.
 *
 * Shared memory (QbShared), who writes what:
 *	- config_generation: bumped (atomic add) by the commit callback of a
 *	  transaction that ran queuebox.configure(); workers compare it with the
 *	  generation they loaded.
 *	- broker_sources: how many broker sources the last configuration stored
 *	  or loaded has (QB_BROKER_SOURCES_UNKNOWN until one is); exchanged
 *	  (atomic) by the commit callback of a configure() and by any worker at a
 *	  load, which set the launcher's latch when it changed; the launcher
 *	  reads it to start as many consumer workers.
 *	- launcher_pid, launcher_latch: written by the launcher only.
 *	- outbox[i].pid, outbox[i].latch: written by outbox worker i only (set
 *	  after it connects, cleared in before_shmem_exit).  relay likewise, by
 *	  the one relay worker.  Any backend reads them without a lock: a stale
 *	  latch pointer still points into the PGPROC array, so the worst a race
 *	  can do is a spurious wake-up.
 *	- outbox[i].late_floor: lowered by the commit callback of any backend
 *	  whose transaction inserted outbox rows, taken by worker i.
 *	- outbox_wake_next: where a committer of a few rows starts looking for
 *	  an outbox worker to wake; any committer takes it (atomic add), so the
 *	  wakes go round the workers.
 *	- routes: written by any worker at a configuration load and by the
 *	  commit callback of a configure() in the served database, read by the
 *	  outbox_route trigger of any backend; a seqlock (outbox_route.c).
 *	- limits: the destinations' rateLimit buckets and maxConcurrent places,
 *	  under qb_limits.c's own locks (a spin lock per destination); each
 *	  outbox worker takes its holder by name at its start and gives back
 *	  its places at its exit (before_shmem_exit, engine_worker.c).  A
 *	  worker killed -9 makes the postmaster restart every backend and
 *	  initialise shared memory again: no place outlives it.
 *	No process-local pointer (a CURLM *, a heap address) is ever stored here.
 *-------------------------------------------------------------------------
 */
#ifndef QB_PG_H
#define QB_PG_H

#include "postgres.h"

#include "port/atomics.h"
#include "storage/latch.h"
#include "utils/array.h"
#include "utils/relcache.h"

#include "qb_host.h"
#include "qb_limits.h"
#include "qb_metrics.h"
#include "qb_pg_stmt.h"
#include "qb_store.h"

#define QB_MAX_OUTBOX_WORKERS 64
#define QB_MAX_CONSUMER_WORKERS 32

/* no configuration was stored or loaded since the server started */
#define QB_BROKER_SOURCES_UNKNOWN PG_UINT32_MAX

typedef struct QbWorkerSlot
{
	pid_t		pid;
	Latch	   *latch;
	/*
	 * Outbox workers: the lowest "ids above this may have committed late"
	 * reported by a committing inserter since the worker last took it
	 * (PG_UINT64_MAX: none).  Any backend lowers it (atomic compare and
	 * swap); the worker exchanges it (claim.md, the intake floor).
	 */
	pg_atomic_uint64 late_floor;
	/*
	 * Outbox workers: 1 while a commit's new rows could not be claimed before
	 * the worker's next poll (every destination holds its rows, or no
	 * configuration): committers that only inserted rows then leave it
	 * asleep (queuebox.c).  Written by the worker, read by committers.
	 */
	pg_atomic_uint32 rows_wake_off;
	/*
	 * 1 while the worker waits (for a wake, an answer or its poll), 0 while
	 * it runs its loop: a committer of a few rows sets the latch of a
	 * worker that runs rather than wake one that waits (queuebox.c).
	 */
	pg_atomic_uint32 waiting;
} QbWorkerSlot;

/* The routes new outbox rows are routed by (outbox_route.c). */
#define QB_ROUTES_MAX 256
#define QB_ROUTE_PATTERN_MAX 256
#define QB_ROUTE_DEST_MAX 128

typedef struct QbPublishedRoute
{
	char		pattern[QB_ROUTE_PATTERN_MAX];
	char		destination[QB_ROUTE_DEST_MAX];
} QbPublishedRoute;

typedef struct QbRouteTable
{
	pg_atomic_uint64 generation;	/* odd while a worker writes */
	Oid			database;		/* whose configuration */
	int			nroutes;		/* -1: none usable */
	QbPublishedRoute routes[QB_ROUTES_MAX];
} QbRouteTable;

typedef struct QbShared
{
	pg_atomic_uint32 config_generation;
	pg_atomic_uint32 broker_sources;	/* in the last configuration stored or
										 * loaded; QB_BROKER_SOURCES_UNKNOWN
										 * until then */
	pid_t		launcher_pid;
	Latch	   *launcher_latch;
	char		database[NAMEDATALEN];	/* the database the workers serve */
	QbWorkerSlot outbox[QB_MAX_OUTBOX_WORKERS];
	pg_atomic_uint32 outbox_wake_next;	/* where committers start looking */
	QbWorkerSlot relay;
	QbWorkerSlot ingress;
	QbWorkerSlot consumer[QB_MAX_CONSUMER_WORKERS];
	QbMetrics	metrics;		/* every worker adds; the ingress renders */
	QbLimits	limits;			/* the destinations' limits (qb_limits.h) */
	QbRouteTable routes;
} QbShared;

/* GUCs */
extern char *qb_database;
extern int	qb_outbox_workers;
extern bool qb_worker_async_commit;
extern bool qb_relay_worker;
extern bool qb_ingress_worker;
extern int	qb_max_consumer_workers;
extern char *qb_secret_file_dirs;
extern char *qb_config_file;	/* queuebox.config_file, "" when unset */
extern char *qb_traceparent;	/* queuebox.traceparent, "" when unset */
extern char *qb_tracestate;

extern QbShared *qb_shared;

/*
 * queuebox.c: this process's runtime (the span exporter, the transforms'
 * helper, queuebox.allowed_destinations's rules) and what its validators
 * allow (that egress policy, queuebox.secret_file_dirs, no daemon
 * sections): the same for a worker's engine and a backend's
 * configure()/check(), kept up to date by the GUCs' assign hooks.
 */
extern QbRuntime *qb_pg_runtime(void);
extern const QbConfigEnv *qb_pg_config_env(void);
extern void qb_arm_outbox_wake(void);
extern void qb_arm_outbox_wake_always(void);
extern void qb_note_outbox_first_id(int64 after);
extern void qb_note_outbox_row(bool parked);
extern uint64 qb_take_outbox_late_floor(QbWorkerSlot *slot);
extern void qb_arm_config_wake(int broker_sources);
extern void qb_arm_relay_wake(void);

/* outbox_route.c */
extern bool qb_publish_routes(const QbConfig *cfg);
extern void qb_stage_routes(const QbConfig *cfg, bool unknown);
extern void qb_publish_staged_routes(void);
extern void qb_clear_staged_routes(void);

/* outbox_park.c: the outbox's columns it reads (attribute numbers) */
typedef struct QbParkAtts
{
	int			id;
	int			key;
	int			state;
	int			hold;
	int			destination;
} QbParkAtts;

extern bool qb_park_at_insert(Relation heap, const QbParkAtts *atts, int64 id, Datum key,
							  const char *dest);
extern void qb_park_pre_commit(bool prepare);
extern void qb_park_forget_sub(SubTransactionId subid);
extern void qb_park_forget(void);

/* launcher.c */
extern PGDLLEXPORT void qb_launcher_main(Datum arg);

/* worker_host.c */
extern void qb_worker_host_start(const char *label, QbWorkerSlot *slot,
								 bool may_commit_async, QbHost *host);

/*
 * engine_worker.c: every dynamic worker, one engine of qb_engines.h; its
 * main argument is the engine's kind and index, packed by the launcher
 */
#define QB_WORKER_ARG(kind, index)	((int32) (kind) << 16 | (int32) (index))
#define QB_WORKER_ARG_KIND(arg)		((QbEngineKind) ((arg) >> 16))
#define QB_WORKER_ARG_INDEX(arg)	((int) ((arg) & 0xFFFF))
extern PGDLLEXPORT void qb_engine_worker_main(Datum arg);

/* config_file.c */
extern void qb_config_file_load(char **text);
extern void qb_config_table_loaded(const char *text);

/* spi_store.c */
extern void qb_spi_store_init(QbStore *store);
extern char *qb_spi_load_document(void);
extern uint64 qb_spi_relay_promote(Datum ids);
extern uint64 qb_spi_outbox_settle(Datum *args, const char *nulls, bool past,
								   const QbClaimReq *claim, QbCycleOut *out);
extern ArrayType *qb_int8_array(Datum *elems, int n);
extern ArrayType *qb_text_array(Datum *elems, int n);
extern int	qb_spi_stmt_types(QbPgStmtId id, Oid *types);

#endif							/* QB_PG_H */
