/*-------------------------------------------------------------------------
 * worker_host.c
 *	  The PostgreSQL host of the core's engines, shared by every dynamic
 *	  worker (outbox, relay, ingress, consumer: engine_worker.c).
 *
 * Wording:
 *	- The host is the QbHost this file fills in: elog for logging, a
 *	  WaitEventSet (latch + postmaster death + an engine's fd) for waiting,
 *	  a SIGTERM flag for stopping, the shared config generation for reloads.
 *	- A slot is the worker's QbWorkerSlot in shared memory (pid, latch),
 *	  which backends use to wake it at commit.
 *
 * Signals: SIGTERM only sets a flag and the latch, so an engine can finish
 * or release the rows of a batch in flight.  SIGHUP reloads GUCs, and the
 * configuration when it is read from files: queuebox.config_file, or its
 * ${file:PATH} secrets (qbwh_interrupts).  Every wait
 * ends with CHECK_FOR_INTERRUPTS(), which serves ProcSignalBarriers (DROP
 * DATABASE) promptly.
 *
 * Memory: the engines malloc their own state; SPI results are copied out of
 * the transaction before commit (spi_store.c).  Between transactions the
 * current context is a loop context reset at every wait.  One process runs
 * one worker, so the state below is per process.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "qb_admin_gate.h"
#include "qb_pg.h"

static volatile sig_atomic_t qbwh_got_sigterm = false;
static MemoryContext qbwh_loop_cxt = NULL;
static QbWorkerSlot *qbwh_slot = NULL;
static char qbwh_label[BGW_MAXLEN];
static bool qbwh_may_commit_async = false;
static uint32 qbwh_config_generation = 0;
static bool qbwh_reads_files = false;	/* the document in force has ${file:PATH} */
static bool qbwh_hup_reload = false;	/* a SIGHUP: load the document again */
static char qbwh_config_file_seen[MAXPGPATH];	/* queuebox.config_file at the last SIGHUP */

/* Two wait sets: latch only, and latch plus an engine's fd. */
static WaitEventSet *qbwh_wes_latch = NULL;
static WaitEventSet *qbwh_wes_fd = NULL;
static int	qbwh_wes_fd_fd = -1;

static void
qbwh_sigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	qbwh_got_sigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

static void
qbwh_on_exit(int code, Datum arg)
{
	if (qbwh_slot != NULL)
	{
		qbwh_slot->latch = NULL;
		qbwh_slot->pid = 0;
	}
}

static void
qbwh_log(void *ctx, QbLogLevel level, const char *msg)
{
	int			elevel = level == QB_LOG_DEBUG ? DEBUG1 :
		level == QB_LOG_INFO ? LOG : WARNING;

	ereport(elevel, (errmsg("%s: %s", qbwh_label, msg)));
}

static WaitEventSet *
qbwh_wait_set(int fd)
{
	if (fd < 0)
	{
		if (qbwh_wes_latch == NULL)
		{
			qbwh_wes_latch = qb_CreateWaitEventSet(2);
			AddWaitEventToSet(qbwh_wes_latch, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
			AddWaitEventToSet(qbwh_wes_latch, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		}
		return qbwh_wes_latch;
	}
	if (qbwh_wes_fd == NULL || qbwh_wes_fd_fd != fd)
	{
		/* no major (15 to 18) can remove an fd from a set: build a new one */
		if (qbwh_wes_fd != NULL)
			FreeWaitEventSet(qbwh_wes_fd);
		qbwh_wes_fd = qb_CreateWaitEventSet(3);
		AddWaitEventToSet(qbwh_wes_fd, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(qbwh_wes_fd, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		AddWaitEventToSet(qbwh_wes_fd, WL_SOCKET_READABLE, fd, NULL, NULL);
		qbwh_wes_fd_fd = fd;
	}
	return qbwh_wes_fd;
}

/*
 * qbwh_apply_gucs: settings that act through this backend's own GUCs.
 *
 * synchronous_commit: the outbox's claims and settles may commit
 * asynchronously (queuebox.worker_async_commit): one lost in a crash only
 * makes a row be delivered again.  The relay's forward never does: it
 * settles an inbox row and writes its outbox row, and its commit must be as
 * durable as the insert that stored the message.
 *
 * The planner settings are the daemon's too (qb_pg_session_settings says
 * why each).
 */
static void
qbwh_apply_gucs(void)
{
	SetConfigOption("synchronous_commit",
					qbwh_may_commit_async && qb_worker_async_commit ? "off" : "on",
					PGC_SUSET, PGC_S_OVERRIDE);
	for (int i = 0; i < QB_PG_NSETTINGS; i++)
		SetConfigOption(qb_pg_session_settings[i].name, qb_pg_session_settings[i].value,
						PGC_SUSET, PGC_S_OVERRIDE);
}

static void
qbwh_interrupts(void)
{
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		qbwh_apply_gucs();
		/*
		 * A reload is how queuebox.config_file is read again (and how it is
		 * set or reset); the document's ${file:PATH} secrets may have
		 * changed too.  Any other document is not loaded again (a consumer
		 * would reconnect to its broker).
		 */
		qbwh_hup_reload = qbwh_reads_files || qb_config_file[0] != '\0' ||
			strcmp(qbwh_config_file_seen, qb_config_file) != 0;
		strlcpy(qbwh_config_file_seen, qb_config_file, sizeof(qbwh_config_file_seen));
	}
}

static int
qbwh_wait(void *ctx, int fd, long timeout_ms)
{
	WaitEvent	ev[3];
	int			n;
	int			result = QB_WAIT_TIMEOUT;

	if (qbwh_got_sigterm)
		return QB_WAIT_WOKEN;
	/* between transactions nothing lives in the loop context: start afresh */
	MemoryContextReset(qbwh_loop_cxt);
	pg_atomic_write_u32(&qbwh_slot->waiting, 1);
	n = WaitEventSetWait(qbwh_wait_set(fd), timeout_ms, ev, lengthof(ev), PG_WAIT_EXTENSION);
	pg_atomic_write_u32(&qbwh_slot->waiting, 0);
	for (int i = 0; i < n; i++)
	{
		if (ev[i].events & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			result |= QB_WAIT_WOKEN;
		}
		if (ev[i].events & WL_SOCKET_READABLE)
			result |= QB_WAIT_FD;
	}
	qbwh_interrupts();
	return result;
}

/*
 * qbwh_should_stop: SIGTERM, or the launcher that started us is gone (a new
 * launcher starts a fresh set; two workers must never share a slot).
 */
static bool
qbwh_should_stop(void *ctx)
{
	qbwh_interrupts();
	return qbwh_got_sigterm ||
		qb_shared->launcher_pid != MyBgworkerEntry->bgw_notify_pid;
}

static bool
qbwh_config_changed(void *ctx)
{
	uint32		gen = pg_atomic_read_u32(&qb_shared->config_generation);

	if (gen == qbwh_config_generation && !qbwh_hup_reload)
		return false;
	qbwh_config_generation = gen;
	qbwh_hup_reload = false;
	return true;
}

/*
 * qbwh_config_loaded publishes how many broker sources the configuration
 * has (the launcher, which reads no table, starts one consumer worker per
 * source from it) and its routes (the outbox_route trigger routes new rows
 * by them).  Every worker publishes the same for the same document, so the
 * last writer is as good as any.
 */
static void
qbwh_config_loaded(void *ctx, const QbConfig *cfg)
{
	uint32		n = (uint32) qb_config_broker_sources(cfg);
	static bool warned = false;

	qbwh_reads_files = cfg != NULL && cfg->reads_files;
	if (!qb_publish_routes(cfg) && !warned)
	{
		warned = true;
		ereport(LOG,
				(errmsg("queuebox: the configuration's routes do not fit in shared memory; new outbox rows are routed at their first claim"),
				 errdetail("At most %d routes, topic patterns under %d bytes and destination names under %d bytes are routed at insert.",
						   QB_ROUTES_MAX, QB_ROUTE_PATTERN_MAX, QB_ROUTE_DEST_MAX)));
	}

	if (pg_atomic_exchange_u32(&qb_shared->broker_sources, n) != n &&
		qb_shared->launcher_latch != NULL)
		SetLatch(qb_shared->launcher_latch);
}

/* qbwh_rows_wake: whether committers of new rows should wake this worker */
static void
qbwh_rows_wake(void *ctx, bool want)
{
	pg_atomic_write_u32(&qbwh_slot->rows_wake_off, want ? 0 : 1);
}

/* qbwh_late_floor: the outbox worker's late-commit report (claim.md). */
static int64_t
qbwh_late_floor(void *ctx)
{
	uint64		f = qb_take_outbox_late_floor(qbwh_slot);

	return f >= (uint64) PG_INT64_MAX ? -1 : (int64_t) f;
}

/*
 * qb_worker_host_start turns this dynamic worker into an engine's host:
 * signals, the database connection (bgw_extra names it), GUCs, the loop
 * context, the shared slot.  label prefixes every log line ("queuebox
 * outbox 0"); may_commit_async lets queuebox.worker_async_commit apply.
 */
void
qb_worker_host_start(const char *label, QbWorkerSlot *slot, bool may_commit_async,
					 QbHost *host)
{
	strlcpy(qbwh_label, label, sizeof(qbwh_label));
	strlcpy(qbwh_config_file_seen, qb_config_file, sizeof(qbwh_config_file_seen));
	qbwh_may_commit_async = may_commit_async;

	pqsignal(SIGTERM, qbwh_sigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(MyBgworkerEntry->bgw_extra, NULL, 0);
	pgstat_report_appname(MyBgworkerEntry->bgw_type);

	qbwh_apply_gucs();

	/*
	 * Whatever PostgreSQL allocates outside a transaction on our behalf (error
	 * copies, GUC reloads) goes to a context reset at every wait.
	 */
	qbwh_loop_cxt = AllocSetContextCreate(TopMemoryContext, "queuebox worker loop",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(qbwh_loop_cxt);

	qbwh_slot = slot;
	slot->pid = MyProcPid;
	/* wanted until the engine says otherwise: a slot may keep its last worker's no */
	pg_atomic_write_u32(&slot->rows_wake_off, 0);
	pg_atomic_write_u32(&slot->waiting, 0);
	slot->latch = MyLatch;
	before_shmem_exit(qbwh_on_exit, 0);

	ereport(LOG,
			(errmsg("%s started in database \"%s\"", label, MyBgworkerEntry->bgw_extra)));

	memset(host, 0, sizeof(QbHost));
	host->log = qbwh_log;
	host->wait = qbwh_wait;
	host->should_stop = qbwh_should_stop;
	host->config_changed = qbwh_config_changed;
	host->metrics = &qb_shared->metrics;
	host->routes = &qb_admin_routes;
	host->runtime = qb_pg_runtime();
	host->config_env = qb_pg_config_env();
	host->config_loaded = qbwh_config_loaded;
	host->late_floor = qbwh_late_floor;
	host->polled = NULL;		/* woken at commit: polls need no stretching */
	host->rows_wake = qbwh_rows_wake;
}
