/*-------------------------------------------------------------------------
 * outbox_worker.c
 *	  The outbox worker: the PostgreSQL host around the core's outbox engine.
 *
 * Wording:
 *	- The host is the QbHost this file gives the engine: elog for logging,
 *	  a WaitEventSet (latch + postmaster death + the publisher's epoll fd)
 *	  for waiting, a SIGTERM flag for stopping.
 *
 * Signals: SIGTERM only sets a flag and the latch, so the engine can release
 * the rows of a batch in flight (back to pending) before the process exits,
 * within a second even when the endpoint is slow.  SIGHUP reloads GUCs.
 * Every wait ends with CHECK_FOR_INTERRUPTS(), which serves
 * ProcSignalBarriers (DROP DATABASE) promptly.
 *
 * Memory: the engine mallocs its own state; SPI results are copied out of
 * the transaction before commit (spi_store.c).  Between transactions the
 * current context is a loop context reset at every wait.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

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

#include "qb_outbox.h"
#include "qb_pg.h"

static volatile sig_atomic_t qbw_got_sigterm = false;
static MemoryContext qbw_loop_cxt = NULL;
static int	qbw_index = -1;
static uint32 qbw_config_generation = 0;

/* Two wait sets: latch only, and latch plus the publisher's fd. */
static WaitEventSet *qbw_wes_latch = NULL;
static WaitEventSet *qbw_wes_fd = NULL;
static int	qbw_wes_fd_fd = -1;

static void
qbw_sigterm(SIGNAL_ARGS)
{
	int			save_errno = errno;

	qbw_got_sigterm = true;
	SetLatch(MyLatch);
	errno = save_errno;
}

static void
qbw_on_exit(int code, Datum arg)
{
	if (qb_shared && qbw_index >= 0)
	{
		qb_shared->outbox[qbw_index].latch = NULL;
		qb_shared->outbox[qbw_index].pid = 0;
	}
}

static void
qbw_log(void *ctx, QbLogLevel level, const char *msg)
{
	int			elevel = level == QB_LOG_DEBUG ? DEBUG1 :
		level == QB_LOG_INFO ? LOG : WARNING;

	ereport(elevel, (errmsg("queuebox outbox %d: %s", qbw_index, msg)));
}

static WaitEventSet *
qbw_wait_set(int fd)
{
	if (fd < 0)
	{
		if (qbw_wes_latch == NULL)
		{
			qbw_wes_latch = CreateWaitEventSet(TopMemoryContext, 2);
			AddWaitEventToSet(qbw_wes_latch, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
			AddWaitEventToSet(qbw_wes_latch, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		}
		return qbw_wes_latch;
	}
	if (qbw_wes_fd == NULL || qbw_wes_fd_fd != fd)
	{
		/* PG 15 cannot remove an fd from a set: build a new one */
		if (qbw_wes_fd != NULL)
			FreeWaitEventSet(qbw_wes_fd);
		qbw_wes_fd = CreateWaitEventSet(TopMemoryContext, 3);
		AddWaitEventToSet(qbw_wes_fd, WL_LATCH_SET, PGINVALID_SOCKET, MyLatch, NULL);
		AddWaitEventToSet(qbw_wes_fd, WL_EXIT_ON_PM_DEATH, PGINVALID_SOCKET, NULL, NULL);
		AddWaitEventToSet(qbw_wes_fd, WL_SOCKET_READABLE, fd, NULL, NULL);
		qbw_wes_fd_fd = fd;
	}
	return qbw_wes_fd;
}

/*
 * qbw_apply_gucs: settings that act through this backend's own GUCs.
 *
 * The claim must walk the due index in order and stop after batch_size
 * claimable rows.  Without statistics (a freshly filled outbox, before
 * autoanalyze) the planner instead bitmap-scans every due row, checks the
 * per-key predicate on each and sorts: 50-150 ms a claim at 20k rows, and a
 * plan kept from an empty table seq-scans.  This backend runs only our
 * statements, each meant to be an index walk or a primary-key lookup, so
 * it turns the alternatives off rather than trusting estimates.
 */
static void
qbw_apply_gucs(void)
{
	SetConfigOption("synchronous_commit", qb_worker_async_commit ? "off" : "on",
					PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_seqscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_bitmapscan", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_sort", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("enable_hashjoin", "off", PGC_SUSET, PGC_S_OVERRIDE);
	SetConfigOption("jit", "off", PGC_SUSET, PGC_S_OVERRIDE);
}

static void
qbw_interrupts(void)
{
	CHECK_FOR_INTERRUPTS();
	if (ConfigReloadPending)
	{
		ConfigReloadPending = false;
		ProcessConfigFile(PGC_SIGHUP);
		qbw_apply_gucs();
	}
}

static int
qbw_wait(void *ctx, int fd, long timeout_ms)
{
	WaitEvent	ev[3];
	int			n;
	int			result = QB_WAIT_TIMEOUT;

	if (qbw_got_sigterm)
		return QB_WAIT_WOKEN;
	/* between transactions nothing lives in the loop context: start afresh */
	MemoryContextReset(qbw_loop_cxt);
	n = WaitEventSetWait(qbw_wait_set(fd), timeout_ms, ev, lengthof(ev), PG_WAIT_EXTENSION);
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
	qbw_interrupts();
	return result;
}

/*
 * qbw_should_stop: SIGTERM, or the launcher that started us is gone (a new
 * launcher starts a fresh set; two workers must never share a slot).
 */
static bool
qbw_should_stop(void *ctx)
{
	qbw_interrupts();
	return qbw_got_sigterm ||
		qb_shared->launcher_pid != MyBgworkerEntry->bgw_notify_pid;
}

static bool
qbw_config_changed(void *ctx)
{
	uint32		gen = pg_atomic_read_u32(&qb_shared->config_generation);

	if (gen == qbw_config_generation)
		return false;
	qbw_config_generation = gen;
	return true;
}

void
qb_outbox_worker_main(Datum arg)
{
	QbHost		host = {0};
	QbStore		store = {0};
	QbOutboxStats stats = {0};
	char		err[QB_ERRLEN];

	qbw_index = DatumGetInt32(arg);
	pqsignal(SIGTERM, qbw_sigterm);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(MyBgworkerEntry->bgw_extra, NULL, 0);
	pgstat_report_appname("queuebox outbox");

	qbw_apply_gucs();

	/*
	 * Whatever PostgreSQL allocates outside a transaction on our behalf (error
	 * copies, GUC reloads) goes to a context reset at every wait.
	 */
	qbw_loop_cxt = AllocSetContextCreate(TopMemoryContext, "queuebox outbox loop",
										 ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(qbw_loop_cxt);

	qb_shared->outbox[qbw_index].pid = MyProcPid;
	qb_shared->outbox[qbw_index].latch = MyLatch;
	before_shmem_exit(qbw_on_exit, 0);

	ereport(LOG,
			(errmsg("queuebox outbox %d started in database \"%s\"",
					qbw_index, MyBgworkerEntry->bgw_extra)));

	host.log = qbw_log;
	host.wait = qbw_wait;
	host.should_stop = qbw_should_stop;
	host.config_changed = qbw_config_changed;
	qb_spi_store_init(&store);

	if (qb_outbox_run(&host, &store, qbw_index, &stats, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("queuebox outbox %d could not start: %s", qbw_index, err)));

	ereport(LOG,
			(errmsg("queuebox outbox %d stopped: %ld batches, %ld sent, %ld retried, %ld dead, %ld released",
					qbw_index, stats.batches, stats.sent, stats.retried, stats.dead,
					stats.released),
			 errdetail("Time spent: claim %ld ms, publish %ld ms, settle %ld ms.",
					   stats.claim_ms, stats.publish_ms, stats.settle_ms)));
	proc_exit(0);
}
