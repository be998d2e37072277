/*-------------------------------------------------------------------------
 * launcher.c
 *	  The queuebox launcher: one static background worker that starts and
 *	  watches the dynamic workers (outbox workers, relay, ingress, consumers).
 *
 * Wording:
 *	- A kind is an engine of the core's registry (qb_engines.h), which
 *	  names its workers and says how many the GUCs ask for.  The set is
 *	  every worker of every kind, numbered kind by kind: outbox 0..N-1, the
 *	  relay, the ingress, then the consumers.
 *	- The launcher connects to no database (shared catalogs only), so a
 *	  missing queuebox.database is something it can notice and report, not a
 *	  FATAL at connect that the postmaster would turn into a crash loop.
 *	- Workers are dynamic background workers (never restarted by the
 *	  postmaster); the launcher restarts one that exits, after a short pause.
 *
 * SIGHUP re-reads the GUCs: a new queuebox.database, or a new count of
 * outbox, relay or ingress workers, stops the whole set and starts the new
 * one; the consumers are resized in place.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "utils/fmgroids.h"
#include "utils/snapmgr.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "qb_engines.h"
#include "qb_pg.h"

#define QBL_CHECK_MS		1000
#define QBL_NO_DB_RETRY_MS	5000

/*
 * The kinds are the engines of the core's registry (qb_engines.h), in its
 * order: the consumers last, so they can be resized in place.  The GUCs say
 * how many of each the registry wants (qbl_wanted).
 */
#define QBL_NKINDS			QB_ENGINE_NKINDS
StaticAssertDecl(QB_ENGINE_CONSUMER == QB_ENGINE_NKINDS - 1,
				 "the consumers are the last kind");
#define QBL_MAX_WORKERS		(QB_MAX_OUTBOX_WORKERS + 2 + QB_MAX_CONSUMER_WORKERS)

typedef struct QblWorker
{
	QbEngineKind kind;
	int			index;			/* within its kind */
	BackgroundWorkerHandle *handle;
	TimestampTz restart_after;	/* 0: start at once */
} QblWorker;

static QblWorker qbl_workers[QBL_MAX_WORKERS];
static int	qbl_nrunning = 0;	/* workers in the current set */
static int	qbl_counts[QBL_NKINDS]; /* per kind, in the current set */
static char qbl_database[NAMEDATALEN];

static bool qbl_database_exists(const char *name);
static void qbl_resize_consumers(int want);
static int	qbl_wanted(int *counts);
static bool qbl_start_worker(QblWorker *w);
static void qbl_stop_all(void);

static void
qbl_on_exit(int code, Datum arg)
{
	if (qb_shared)
	{
		qb_shared->launcher_latch = NULL;
		qb_shared->launcher_pid = 0;
	}
}

/*
 * qbl_reload: after a SIGHUP, the GUCs again; a new database or a new
 * count of any kind but the consumers (resized in place by the main loop)
 * stops the whole set, which the loop then starts anew.
 */
static void
qbl_reload(bool *warned_missing)
{
	int			want_counts[QBL_NKINDS];

	ConfigReloadPending = false;
	ProcessConfigFile(PGC_SIGHUP);
	(void) qbl_wanted(want_counts);
	if (qbl_nrunning > 0 &&
		(strcmp(qbl_database, qb_database) != 0 ||
		 memcmp(qbl_counts, want_counts, sizeof(int) * (QBL_NKINDS - 1)) != 0))
	{
		ereport(LOG,
				(errmsg("queuebox launcher: restarting the workers for database \"%s\" (%d outbox workers, relay %s)",
						qb_database, qb_outbox_workers, qb_relay_worker ? "on" : "off")));
		qbl_stop_all();
	}
	*warned_missing = false;
}

/*
 * qbl_new_set: the set of want workers (want_counts per kind) for
 * queuebox.database, none started yet, once that database exists; until
 * then it is said once and looked for every QBL_NO_DB_RETRY_MS (the wait
 * returned).
 */
static long
qbl_new_set(const int *want_counts, int want, bool *warned_missing)
{
	int			n = 0;

	if (!qbl_database_exists(qb_database))
	{
		if (!*warned_missing)
			ereport(LOG,
					(errcode(ERRCODE_UNDEFINED_DATABASE),
					 errmsg("queuebox: database \"%s\" does not exist; the workers wait for it",
							qb_database),
					 errhint("Create the database and run CREATE EXTENSION queuebox in it, or set queuebox.database and reload the configuration.")));
		*warned_missing = true;
		return QBL_NO_DB_RETRY_MS;
	}
	strlcpy(qbl_database, qb_database, NAMEDATALEN);
	strlcpy(qb_shared->database, qb_database, NAMEDATALEN);
	for (int r = 0; r < QBL_NKINDS; r++)
		for (int i = 0; i < want_counts[r]; i++, n++)
		{
			qbl_workers[n].kind = (QbEngineKind) r;
			qbl_workers[n].index = i;
			qbl_workers[n].handle = NULL;
			qbl_workers[n].restart_after = 0;
		}
	memcpy(qbl_counts, want_counts, sizeof(qbl_counts));
	qbl_nrunning = want;
	*warned_missing = false;
	return QBL_CHECK_MS;
}

/*
 * qbl_tend: a worker that stopped is restarted after a pause, unless its
 * database is gone (dropped WITH (FORCE)): then the set stops and the
 * launcher goes back to waiting for it, rather than starting workers that
 * would fail to connect every second.
 */
static void
qbl_tend(void)
{
	for (int i = 0; i < qbl_nrunning; i++)
	{
		pid_t		pid;

		if (qbl_workers[i].handle != NULL &&
			GetBackgroundWorkerPid(qbl_workers[i].handle, &pid) == BGWH_STOPPED &&
			!qbl_database_exists(qbl_database))
		{
			qbl_stop_all();
			break;
		}
	}

	/* start what is not running; notice what stopped */
	for (int i = 0; i < qbl_nrunning; i++)
	{
		QblWorker  *w = &qbl_workers[i];
		pid_t		pid;

		if (w->handle != NULL &&
			GetBackgroundWorkerPid(w->handle, &pid) == BGWH_STOPPED)
		{
			pfree(w->handle);
			w->handle = NULL;
			w->restart_after = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 1000);
		}
		if (w->handle == NULL && GetCurrentTimestamp() >= w->restart_after)
		{
			if (!qbl_start_worker(w))
				w->restart_after = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), 5000);
		}
	}
}

void
qb_launcher_main(Datum arg)
{
	bool		warned_missing = false;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("queuebox launcher");

	qb_shared->launcher_pid = MyProcPid;
	qb_shared->launcher_latch = MyLatch;
	before_shmem_exit(qbl_on_exit, 0);

	for (;;)
	{
		long		wait_ms = QBL_CHECK_MS;
		int			want_counts[QBL_NKINDS];
		int			want;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
			qbl_reload(&warned_missing);
		want = qbl_wanted(want_counts);
		if (qbl_nrunning == 0 && want > 0)
			wait_ms = qbl_new_set(want_counts, want, &warned_missing);
		if (qbl_nrunning > 0)
			qbl_resize_consumers(want_counts[QBL_NKINDS - 1]);
		qbl_tend();
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 wait_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}

/*
 * qbl_database_exists looks the name up in the shared catalog pg_database.
 * A heap scan, not get_database_oid(): with no database selected, opening
 * pg_database's name index needs pg_class, which fails on a new cluster
 * whose shared relcache init file does not exist yet.
 */
static bool
qbl_database_exists(const char *name)
{
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData key;
	bool		found;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_database_datname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum(name));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return found;
}

/*
 * qbl_wanted fills counts per kind from the GUCs; returns the total.  The
 * launcher reads no table: until a configure() commits or a worker loads
 * the document (QB_BROKER_SOURCES_UNKNOWN, after every start), the number
 * of broker sources is unknown, and the registry asks for one consumer to
 * load it; the count it publishes then sizes the kind.
 */
static int
qbl_wanted(int *counts)
{
	uint32		sources = pg_atomic_read_u32(&qb_shared->broker_sources);
	QbEngineWant want = {
		.outbox_workers = qb_outbox_workers,
		.relay = qb_relay_worker,
		.ingress = qb_ingress_worker,
		.broker_sources = sources == QB_BROKER_SOURCES_UNKNOWN ? -1 : (int) sources,
		.max_consumers = qb_max_consumer_workers,
	};
	int			total = 0;

	for (int r = 0; r < QBL_NKINDS; r++)
		total += counts[r] = qb_engine((QbEngineKind) r)->wanted(&want);
	Assert(total <= QBL_MAX_WORKERS);
	return total;
}

static bool
qbl_start_worker(QblWorker *w)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	char		name[BGW_MAXLEN];

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	worker.bgw_main_arg = Int32GetDatum(QB_WORKER_ARG(w->kind, w->index));
	worker.bgw_notify_pid = MyProcPid;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "queuebox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "qb_engine_worker_main");
	snprintf(worker.bgw_type, BGW_MAXLEN, "queuebox %s", qb_engine(w->kind)->name);
	qb_engine_name(w->kind, w->index, name, sizeof(name));
	snprintf(worker.bgw_name, BGW_MAXLEN, "queuebox %s", name);
	strlcpy(worker.bgw_extra, qbl_database, BGW_EXTRALEN);

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(WARNING,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("queuebox: could not start %s: out of background worker slots", worker.bgw_name),
				 errhint("Increase max_worker_processes (the launcher, each outbox worker and the relay take one).")));
		return false;
	}
	w->handle = handle;
	return true;
}

/*
 * qbl_resize_consumers: the consumer kind is the last of the set, so a
 * configuration that adds or removes broker sources appends or stops
 * consumers at the tail and leaves every other worker running.
 */
static void
qbl_resize_consumers(int want)
{
	int			have = qbl_counts[QBL_NKINDS - 1];

	if (want == have)
		return;
	ereport(LOG,
			(errmsg("queuebox launcher: %d consumer worker%s for the broker sources (was %d)",
					want, want == 1 ? "" : "s", have)));
	for (int i = have; i < want; i++)
	{
		QblWorker  *w = &qbl_workers[qbl_nrunning++];

		w->kind = QB_ENGINE_CONSUMER;
		w->index = i;
		w->handle = NULL;
		w->restart_after = 0;
	}
	for (int i = have; i > want; i--)
	{
		QblWorker  *w = &qbl_workers[--qbl_nrunning];

		if (w->handle != NULL)
		{
			TerminateBackgroundWorker(w->handle);
			(void) WaitForBackgroundWorkerShutdown(w->handle);
			pfree(w->handle);
			w->handle = NULL;
		}
	}
	qbl_counts[QBL_NKINDS - 1] = want;
}

/* qbl_stop_all terminates the current set and waits until it is gone. */
static void
qbl_stop_all(void)
{
	for (int i = 0; i < qbl_nrunning; i++)
	{
		if (qbl_workers[i].handle == NULL)
			continue;
		TerminateBackgroundWorker(qbl_workers[i].handle);
		(void) WaitForBackgroundWorkerShutdown(qbl_workers[i].handle);
		pfree(qbl_workers[i].handle);
		qbl_workers[i].handle = NULL;
	}
	qbl_nrunning = 0;
}
