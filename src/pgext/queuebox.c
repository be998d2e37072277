/*-------------------------------------------------------------------------
 * queuebox.c
 *	  Module load: GUCs, shared memory, the launcher, and wake on commit.
 *
 * Wake on commit: statement-level AFTER INSERT triggers on queuebox.outbox
 * and queuebox.inbox (and queuebox.configure()) only set backend-local
 * flags.  The transaction callback, registered once here so every backend
 * inherits it, turns them into SetLatch at XACT_EVENT_COMMIT (outbox rows:
 * one outbox worker for a few rows, every one for many, none when every
 * row was parked at insert; inbox rows: the relay worker; a configuration:
 * all of them): by then the commit is visible, so the worker's next
 * snapshot sees the rows.  Abort and PREPARE clear the flags; a prepared
 * transaction's rows are found by the fallback poll (outbox.pollIntervalMs,
 * inbox.relay.pollIntervalMs).  Nothing at COMMIT can raise an error: the
 * transaction has already committed.  At PRE_COMMIT (and PRE_PREPARE) the
 * rows parked at insert are made safe (outbox_park.c): that may raise, and
 * then the transaction aborts.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "access/xact.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"

#include "qb_engines.h"
#include "qb_pg.h"
#include "qb_trace.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

char	   *qb_database = NULL;
int			qb_outbox_workers = 2;
bool		qb_worker_async_commit = true;
bool		qb_relay_worker = true;
bool		qb_ingress_worker = true;
int			qb_max_consumer_workers = 8;
char	   *qb_secret_file_dirs = NULL;
char	   *qb_config_file = NULL;
static char *qb_allowed_destinations = NULL;
char	   *qb_traceparent = NULL;
char	   *qb_tracestate = NULL;

QbShared   *qb_shared = NULL;

/* this process's (qb_pg.h); the GUCs' assign hooks keep them current */
static QbRuntime qb_runtime;
static QbConfigEnv qb_config_env = {
	.egress = &qb_runtime.egress,
	.file_dirs = "",
	.file_setting = "queuebox.secret_file_dirs",
	/* database: and daemon: are the daemon's: a shared file's ${NAME}s there are not ours */
	.daemon_sections_unread = true,
};

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static bool qb_outbox_wake_armed = false;
static bool qb_outbox_wake_always = false;	/* an operation, not only inserts */
static int64 qb_outbox_first_id = -1;	/* qb_note_outbox_first_id; -1: none */
static int64 qb_outbox_rows_parked = 0;	/* qb_note_outbox_row */
static int64 qb_outbox_rows_unparked = 0;
static bool qb_relay_wake_armed = false;
static bool qb_config_wake_armed = false;
static int	qb_armed_broker_sources = 0;	/* of the configuration armed; -1:
												 * not known */
static SubTransactionId qb_config_armed_subid = InvalidSubTransactionId;

static bool qb_secret_file_dirs_check(char **newval, void **extra, GucSource source);
static void qb_secret_file_dirs_assign(const char *newval, void *extra);
static bool qb_config_file_check(char **newval, void **extra, GucSource source);
static bool qb_allowed_destinations_check(char **newval, void **extra, GucSource source);
static void qb_allowed_destinations_assign(const char *newval, void *extra);
static bool qb_traceparent_check(char **newval, void **extra, GucSource source);
static bool qb_tracestate_check(char **newval, void **extra, GucSource source);
static void qb_shmem_request(void);
static void qb_shmem_startup(void);
static void qb_xact_callback(XactEvent event, void *arg);
static void qb_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								SubTransactionId parentSubid, void *arg);

/* qb_guc_workers: the GUCs of the workers: which database, how many of each, how they commit. */
static void
qb_guc_workers(void)
{
	DefineCustomStringVariable("queuebox.database",
							   "Database whose queuebox tables the workers serve.",
							   "The extension must be created there (CREATE EXTENSION queuebox).",
							   &qb_database, "postgres",
							   PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("queuebox.outbox_workers",
							"Number of outbox worker processes.",
							"Each claims its own batches; 0 disables delivery.",
							&qb_outbox_workers, 2, 0, QB_MAX_OUTBOX_WORKERS,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("queuebox.worker_async_commit",
							 "Commit the workers' claim and settle transactions asynchronously.",
							 "Safe for delivery: a claim or settle lost in a crash only makes a row be delivered again.",
							 &qb_worker_async_commit, true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("queuebox.relay_worker",
							 "Run the relay worker, which forwards push inbox rows into the outbox.",
							 "Off: push rows stay pending (as with inbox.relay.enabled: false, but for every database of the server).",
							 &qb_relay_worker, true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("queuebox.max_consumer_workers",
							"Most consumer worker processes for broker sources.",
							"One runs per rabbitmq, kafka or nats source of the configuration, up to this many; 0 consumes none.",
							&qb_max_consumer_workers, 8, 0, QB_MAX_CONSUMER_WORKERS,
							PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable("queuebox.ingress_worker",
							 "Run the ingress worker, which serves http.listen (webhooks, health, metrics, admin).",
							 "It listens only when the stored configuration sets http.listen.",
							 &qb_ingress_worker, true,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
}

/* qb_guc_config: the GUCs that bound the configuration: its file, its secret files, the destinations' hosts. */
static void
qb_guc_config(void)
{
	DefineCustomStringVariable("queuebox.secret_file_dirs",
							   "Directories from which a configuration's ${file:PATH} references may read.",
							   "A comma-separated list of absolute directories; empty (the default) allows none. "
							   "The files are read by the server's processes when the configuration is loaded.",
							   &qb_secret_file_dirs, "",
							   PGC_SIGHUP, 0, qb_secret_file_dirs_check, qb_secret_file_dirs_assign, NULL);
	DefineCustomStringVariable("queuebox.config_file",
							   "YAML file the workers read their configuration from, instead of queuebox.configure().",
							   "An absolute path, read by the server's processes at start and at every reload "
							   "(SELECT pg_reload_conf()); while it is set, queuebox.configure() refuses. Empty (the default): "
							   "the document queuebox.configure() stores.",
							   &qb_config_file, "",
							   PGC_SIGHUP, 0, qb_config_file_check, NULL, NULL);
	DefineCustomStringVariable("queuebox.allowed_destinations",
							   "CIDRs and host names the destinations may connect to.",
							   "Comma-separated, e.g. '10.0.0.0/8, hooks.example.com, *.example.net'. Empty (the default): "
							   "any address but link-local and cloud metadata ones (169.254.0.0/16, fe80::/10, "
							   "fd00:ec2::254, 100.100.100.200), which are refused unless listed.",
							   &qb_allowed_destinations, "",
							   PGC_SIGHUP, 0, qb_allowed_destinations_check, qb_allowed_destinations_assign, NULL);
}

/* qb_guc_tracing: the session's trace context for the rows it inserts. */
static void
qb_guc_tracing(void)
{
	DefineCustomStringVariable("queuebox.traceparent",
							   "The W3C traceparent the rows this session inserts carry (SET LOCAL in a traced transaction).",
							   "A row's own traceparent header wins; empty: the inserting statement's sqlcommenter comment, if any.",
							   &qb_traceparent, "",
							   PGC_USERSET, 0, qb_traceparent_check, NULL, NULL);
	DefineCustomStringVariable("queuebox.tracestate",
							   "The W3C tracestate carried with queuebox.traceparent.",
							   NULL,
							   &qb_tracestate, "",
							   PGC_USERSET, 0, qb_tracestate_check, NULL, NULL);
}

/* qb_launcher_register: the static background worker that starts the others (launcher.c). */
static void
qb_launcher_register(void)
{
	BackgroundWorker worker;

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "queuebox");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "qb_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "queuebox launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "queuebox launcher");
	RegisterBackgroundWorker(&worker);
}

void
_PG_init(void)
{
	char		err[QB_ERRLEN];

	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("queuebox must be loaded via shared_preload_libraries"),
				 errhint("Add queuebox to shared_preload_libraries in postgresql.conf and restart the server.")));
	/* an engine, publisher or consumer table with a hole is this build's fault: say which */
	if (qb_engines_check(err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("queuebox: %s", err),
				 errhint("This build of queuebox is broken; rebuild it from a released source.")));

	qb_guc_workers();
	qb_guc_config();
	qb_guc_tracing();
	MarkGUCPrefixReserved("queuebox");

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = qb_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = qb_shmem_startup;

	RegisterXactCallback(qb_xact_callback, NULL);
	RegisterSubXactCallback(qb_subxact_callback, NULL);

	qb_launcher_register();
}

/*
 * queuebox.secret_file_dirs: a superuser's setting (postgresql.conf or ALTER
 * SYSTEM), since configure() may be granted to roles that must not read the
 * server's files.  Every entry must be an absolute directory name.
 */
static bool
qb_secret_file_dirs_check(char **newval, void **extra, GucSource source)
{
	if (qb_config_file_dirs_valid(*newval ? *newval : ""))
		return true;
	GUC_check_errdetail("Each entry of queuebox.secret_file_dirs must be an absolute directory, e.g. '/run/secrets'.");
	return false;
}

/*
 * queuebox.config_file: a superuser's setting, as the file is read by the
 * server's processes.  Absolute, so it does not depend on the data
 * directory a process happens to run in.
 */
static bool
qb_config_file_check(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || (*newval)[0] == '\0' || (*newval)[0] == '/')
		return true;
	GUC_check_errdetail("queuebox.config_file must be an absolute path, e.g. '/etc/queuebox/queuebox.yaml', or empty.");
	return false;
}

/*
 * queuebox.allowed_destinations: a superuser's setting (postgresql.conf or
 * ALTER SYSTEM; PGC_SIGHUP, so no session may SET it), since configure()
 * may be granted to roles that must not widen where the server connects.
 * configure() checks each destination's hosts against it, and every
 * connection the workers open checks the address it connects to.
 */
static bool
qb_allowed_destinations_check(char **newval, void **extra, GucSource source)
{
	QbEgress   *e;
	char		err[QB_ERRLEN];

	if (qb_egress_parse(*newval, "queuebox.allowed_destinations", &e, err, sizeof(err)))
	{
		qb_egress_free(e);
		return true;
	}
	GUC_check_errdetail("%s", err);
	return false;
}

static void
qb_allowed_destinations_assign(const char *newval, void *extra)
{
	char		err[QB_ERRLEN];

	/* the check hook parsed the same text: only memory can fail here */
	if (!qb_egress_policy_set(&qb_runtime.egress, newval, "queuebox.allowed_destinations",
							  err, sizeof(err)))
		elog(LOG, "queuebox.allowed_destinations not applied: %s", err);
}

/* queuebox.traceparent: empty, or a traceparent the spec accepts */
static bool
qb_traceparent_check(char **newval, void **extra, GucSource source)
{
	QbTraceContext c;

	if (*newval == NULL || (*newval)[0] == '\0' || qb_trace_parse(*newval, &c))
		return true;
	GUC_check_errdetail("A traceparent is 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>, lower case, ids not all zero.");
	GUC_check_errhint("Set what your tracer's propagator writes, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.");
	return false;
}

/* queuebox.tracestate: what a header can carry */
static bool
qb_tracestate_check(char **newval, void **extra, GucSource source)
{
	if (*newval == NULL || qb_tracestate_ok(*newval))
		return true;
	GUC_check_errdetail("A tracestate is at most 512 printable ASCII characters, without '\"' or '\\'.");
	return false;
}

/* every parse of this process reads the list (qb_pg_config_env) */
static void
qb_secret_file_dirs_assign(const char *newval, void *extra)
{
	qb_config_env.file_dirs = newval ? newval : "";
}

/* qb_pg_runtime: see qb_pg.h. */
QbRuntime *
qb_pg_runtime(void)
{
	return &qb_runtime;
}

/* qb_pg_config_env: see qb_pg.h. */
const QbConfigEnv *
qb_pg_config_env(void)
{
	return &qb_config_env;
}

static void
qb_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(QbShared)));
}

static void
qb_shmem_startup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	qb_shared = ShmemInitStruct("queuebox", sizeof(QbShared), &found);
	if (!found)
	{
		memset(qb_shared, 0, sizeof(QbShared));
		pg_atomic_init_u32(&qb_shared->config_generation, 1);
		pg_atomic_init_u32(&qb_shared->broker_sources, QB_BROKER_SOURCES_UNKNOWN);
		for (int i = 0; i < QB_MAX_OUTBOX_WORKERS; i++)
		{
			pg_atomic_init_u64(&qb_shared->outbox[i].late_floor, PG_UINT64_MAX);
			pg_atomic_init_u32(&qb_shared->outbox[i].rows_wake_off, 0);
			pg_atomic_init_u32(&qb_shared->outbox[i].waiting, 0);
		}
		pg_atomic_init_u32(&qb_shared->outbox_wake_next, 0);
		qb_metrics_init(&qb_shared->metrics);
		qb_limits_init(&qb_shared->limits);
		pg_atomic_init_u64(&qb_shared->routes.generation, 0);
		qb_shared->routes.nroutes = -1;
	}
	LWLockRelease(AddinShmemInitLock);
}

/*
 * qb_note_outbox_row: the outbox_route trigger saw a new row, parked at
 * insert or not.  A commit whose new rows were all parked wakes no worker
 * (nothing it inserted can be claimed before an earlier row's end, whose
 * settle promotes it); one of a few rows wakes one worker.
 */
void
qb_note_outbox_row(bool parked)
{
	if (parked)
		qb_outbox_rows_parked++;
	else
		qb_outbox_rows_unparked++;
}

/* qb_arm_outbox_wake: the current transaction inserted outbox rows. */
void
qb_arm_outbox_wake(void)
{
	qb_outbox_wake_armed = true;
}

/*
 * qb_arm_outbox_wake_always: the current transaction made rows due by an
 * operation (a requeue, a resume): wake every outbox worker at commit, even
 * one whose destinations all hold their rows, since the operation may be
 * what ends the hold.
 */
void
qb_arm_outbox_wake_always(void)
{
	qb_outbox_wake_armed = true;
	qb_outbox_wake_always = true;
}

/*
 * qb_note_outbox_first_id: the current transaction inserts intake rows
 * (claimable from their insert, found above a worker's floor) with ids above
 * `after`: the route trigger gives each such row's id less one.  At commit
 * every outbox worker learns the lowest, so a row that commits after a
 * claim passed its id is still claimed (claim.md, the intake floor).  -1:
 * not known; the workers look from the start.  A parked row needs no report:
 * its promotion finds it by its key.
 */
void
qb_note_outbox_first_id(int64 after)
{
	if (after < 0)
		after = 0;
	if (qb_outbox_first_id < 0 || after < qb_outbox_first_id)
		qb_outbox_first_id = after;
}

/* qb_take_outbox_late_floor: what committers reported since the last call. */
uint64
qb_take_outbox_late_floor(QbWorkerSlot *slot)
{
	return pg_atomic_exchange_u64(&slot->late_floor, PG_UINT64_MAX);
}

/* qb_lower_late_floors tells every outbox worker slot of a late commit. */
static void
qb_lower_late_floors(uint64 after)
{
	for (int i = 0; i < QB_MAX_OUTBOX_WORKERS; i++)
	{
		pg_atomic_uint64 *f = &qb_shared->outbox[i].late_floor;
		uint64		cur = pg_atomic_read_u64(f);

		while (after < cur && !pg_atomic_compare_exchange_u64(f, &cur, after))
			;
	}
}

/* qb_arm_relay_wake: the current transaction inserted inbox rows. */
void
qb_arm_relay_wake(void)
{
	qb_relay_wake_armed = true;
}

/*
 * qb_arm_config_wake: the current transaction stored a configuration with
 * this many broker sources.  At commit the count goes to shared memory for
 * the launcher: no worker may be running to load the document and publish
 * it (outbox workers 0, relay and ingress off).
 */
void
qb_arm_config_wake(int broker_sources)
{
	qb_config_wake_armed = true;
	qb_armed_broker_sources = broker_sources;
	qb_config_armed_subid = GetCurrentSubTransactionId();
}

/*
 * qb_subxact_callback: a savepoint rolled back over a configure() leaves the
 * stored document unknown here (an earlier one of this transaction may be
 * what commits): the launcher is told "not known" and a consumer loads it.
 */
static void
qb_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					SubTransactionId parentSubid, void *arg)
{
	if (event != SUBXACT_EVENT_ABORT_SUB)
		return;
	qb_park_forget_sub(mySubid);
	if (qb_config_wake_armed && qb_config_armed_subid >= mySubid)
	{
		qb_armed_broker_sources = -1;
		qb_stage_routes(NULL, true);
	}
}

static void
qb_wake_slot(QbWorkerSlot *slot)
{
	Latch	   *latch = slot->latch;

	if (latch != NULL)
		SetLatch(latch);
}

/*
 * qb_wake_outbox_workers: set each outbox worker's latch; for_rows (a
 * commit that only inserted rows) skips a worker that said they could not
 * be claimed before its next poll (rows_wake_off): waking it would only
 * cost it a loop, and the committer a signal, per commit.  Wakes coalesce
 * for a commit of rows:
 *	- rows that were all parked at insert wake nobody;
 *	- fewer than QB_WAKE_ALL_ROWS rows wake one worker: one that runs its
 *	  loop if there is one (setting its latch costs no signal, and it
 *	  claims again after its cycle, with the rows of every commit since),
 *	  else one that waits, taken in turn;
 *	- more, or rows the route trigger did not count, wake every worker.
 */
#define QB_WAKE_ALL_ROWS 100

static void
qb_wake_outbox_workers(bool for_rows)
{
	int			pick = -1;
	uint32		start;

	if (for_rows && qb_outbox_rows_parked > 0 && qb_outbox_rows_unparked == 0)
		return;
	if (for_rows && qb_outbox_rows_unparked > 0 && qb_outbox_rows_unparked < QB_WAKE_ALL_ROWS)
	{
		start = pg_atomic_fetch_add_u32(&qb_shared->outbox_wake_next, 1);
		for (int j = 0; j < QB_MAX_OUTBOX_WORKERS; j++)
		{
			int			i = (start + j) % QB_MAX_OUTBOX_WORKERS;
			QbWorkerSlot *slot = &qb_shared->outbox[i];

			if (slot->latch == NULL || pg_atomic_read_u32(&slot->rows_wake_off) != 0)
				continue;
			if (pg_atomic_read_u32(&slot->waiting) == 0)
			{
				pick = i;
				break;
			}
			if (pick < 0)
				pick = i;
		}
		if (pick >= 0)
			qb_wake_slot(&qb_shared->outbox[pick]);
		return;
	}
	for (int i = 0; i < QB_MAX_OUTBOX_WORKERS; i++)
	{
		QbWorkerSlot *slot = &qb_shared->outbox[i];
		Latch	   *latch = slot->latch;

		if (latch != NULL && !(for_rows && pg_atomic_read_u32(&slot->rows_wake_off) != 0))
			SetLatch(latch);
	}
}

/* qb_clear_wakes: the transaction ended; nothing is armed any more. */
static void
qb_clear_wakes(void)
{
	qb_outbox_wake_armed = false;
	qb_outbox_wake_always = false;
	qb_relay_wake_armed = false;
	qb_config_wake_armed = false;
	qb_outbox_first_id = -1;
	qb_outbox_rows_parked = qb_outbox_rows_unparked = 0;
	qb_clear_staged_routes();
}

static void
qb_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			qb_park_pre_commit(false);
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
			qb_park_forget();
			if (qb_shared != NULL)
			{
				if (qb_config_wake_armed)
				{
					uint32		n = qb_armed_broker_sources < 0 ?
						QB_BROKER_SOURCES_UNKNOWN : (uint32) qb_armed_broker_sources;

					qb_publish_staged_routes();
					pg_atomic_fetch_add_u32(&qb_shared->config_generation, 1);
					if (pg_atomic_exchange_u32(&qb_shared->broker_sources, n) != n &&
						qb_shared->launcher_latch != NULL)
						SetLatch(qb_shared->launcher_latch);
				}
				if (qb_outbox_first_id >= 0)
					qb_lower_late_floors((uint64) qb_outbox_first_id);
				if (qb_config_wake_armed || qb_outbox_wake_armed)
					qb_wake_outbox_workers(!qb_config_wake_armed && !qb_outbox_wake_always);
				if (qb_config_wake_armed || qb_relay_wake_armed)
					qb_wake_slot(&qb_shared->relay);
				if (qb_config_wake_armed)
				{
					qb_wake_slot(&qb_shared->ingress);
					for (int i = 0; i < QB_MAX_CONSUMER_WORKERS; i++)
						qb_wake_slot(&qb_shared->consumer[i]);
				}
			}
			qb_clear_wakes();
			break;
		case XACT_EVENT_PRE_PREPARE:
			qb_park_pre_commit(true);
			/* COMMIT PREPARED runs no callback of ours: the workers would never hear */
			if (qb_config_wake_armed)
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that ran queuebox.configure()"),
						 errdetail("The workers learn of a new configuration when its transaction commits, and a prepared transaction commits where QueueBox cannot see it."),
						 errhint("Run queuebox.configure() in a transaction of its own.")));
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			qb_park_forget();
			qb_clear_wakes();
			break;
		default:
			break;
	}
}
