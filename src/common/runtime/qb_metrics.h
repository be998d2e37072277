/*-------------------------------------------------------------------------
 * qb_metrics.h
 *	  The block of shared memory every worker of the process group writes
 *	  to: counters and their Prometheus text rendering, the record of the
 *	  configuration's loads, and the workers' slots (what each is doing).
 *
 * Wording:
 *	- A QbMetrics block is plain memory with no pointer in it, shared by
 *	  every worker: PostgreSQL's shared memory, or the daemon's MAP_SHARED
 *	  block (shared.c) that the supervisor shares with its roles.
 *	- A slot's life is a QbSlotState: free, being named, in use.
 *	- A slot counts for one name (a destination or a source), taken on
 *	  first use and never given back; when all are taken, counts go to the
 *	  slot named "_other".
 *	- Gauges (pending rows, oldest pending age) are read from the database
 *	  at scrape time by the caller and passed to qb_metrics_render, with the
 *	  configured names: each is rendered, at 0 until its first event; a slot
 *	  whose name is no longer configured is not (its counts stay);
 *	  QueueBox's own buckets (_unrouted, _other, _none) from their first event.
 *
 *	- A worker slot says what one worker (a bgworker of the extension, a
 *	  role of the daemon) is doing: its name ("outbox 0", "relay",
 *	  "ingress", "consumer 1"), pid, activity and since when, its last
 *	  cycle.  Taken by name when the worker starts (a restarted worker
 *	  takes its old slot again), written only by that worker, read by the
 *	  console's overview (docs/http-api.md, "workers").
 *
 * Concurrency: every add is one relaxed atomic add; a slot is taken with a
 * compare-and-swap, then its name is written, then it is published.  Two
 * processes taking a slot for the same name at once end with two slots of
 * that name; the renderer sums slots by name, so nothing counts twice.  A
 * worker slot's fields are relaxed atomic stores by its one writer: a reader
 * may see an activity with the previous one's since, never a torn value.
 *-------------------------------------------------------------------------
 */
#ifndef QB_METRICS_H
#define QB_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qb_ratelimit.h"

#define QB_METRICS_SLOTS	64
#define QB_METRICS_NAMELEN	64
/* delivery latency buckets, seconds (upper bounds); +Inf is implicit */
#define QB_METRICS_NBUCKETS 14

typedef enum QbDeliveryOutcome
{
	QB_DELIVERED,				/* sent: the destination acknowledged it */
	QB_FAILED,					/* an attempt failed; a retry is scheduled */
	QB_DEAD,					/* moved to dead */
	QB_LIMITED,					/* rows waited for its limit (rateLimit, maxConcurrent) */
	QB_NOUTCOMES
} QbDeliveryOutcome;

typedef enum QbReceiveResult
{
	QB_RX_ACCEPTED,				/* 202 */
	QB_RX_DUPLICATE,			/* 200 */
	QB_RX_BAD_REQUEST,			/* 400 */
	QB_RX_UNAUTHORIZED,			/* 401 */
	QB_RX_TOO_LARGE,			/* 413 */
	QB_RX_UNPROCESSABLE,		/* 422 */
	QB_RX_UNAVAILABLE,			/* 503 */
	QB_NRESULTS
} QbReceiveResult;

/*
 * A slot's life (QbMetricSlot.state, QbActivitySlot.state, a uint32_t for
 * the atomics): free, then being named by the one process whose
 * compare-and-swap took it, then in use for good.
 */
typedef enum QbSlotState
{
	QB_SLOT_FREE = 0,
	QB_SLOT_NAMING = 1,
	QB_SLOT_IN_USE = 2
} QbSlotState;

typedef struct QbMetricSlot
{
	uint32_t	state;			/* QbSlotState */
	char		name[QB_METRICS_NAMELEN];
	uint64_t	count[QB_NRESULTS]; /* by QbDeliveryOutcome or QbReceiveResult */
	uint64_t	bucket[QB_METRICS_NBUCKETS + 1];	/* latency histogram, last = +Inf */
	uint64_t	latency_sum_us;
} QbMetricSlot;

#define QB_METRICS_WORKERS	40
#define QB_METRICS_WORKERLEN 32

/* What a worker is doing: QbActivitySlot.activity (qb_worker_activity_name). */
typedef enum QbWorkerActivity
{
	QB_W_STARTING,				/* started, no configuration loaded yet */
	QB_W_IDLE,					/* waiting for work: a wake, a poll, a request */
	QB_W_CLAIMING,				/* in the database: a claim, its settles, a forward */
	QB_W_DELIVERING,			/* rows in flight, waiting for destinations' answers */
	QB_W_STORING,				/* storing messages from a broker (consumer) */
	QB_W_SERVING,				/* answering requests (ingress): webhooks, admin */
	QB_W_BACKING_OFF,			/* a database, broker or source failed: waiting to retry */
	QB_W_STOPPED,				/* stopped cleanly */
	QB_W_NACTIVITIES
} QbWorkerActivity;

typedef struct QbActivitySlot
{
	uint32_t	state;			/* QbSlotState */
	char		name[QB_METRICS_WORKERLEN];
	int32_t		pid;
	uint32_t	activity;		/* QbWorkerActivity */
	int64_t		since_ms;		/* when the activity began, ms since the epoch */
	int64_t		last_cycle_ms;	/* the last cycle's end, ms since the epoch; 0: none */
	uint64_t	cycles;			/* since the worker started */
} QbActivitySlot;

/*
 * Where the configuration in force came from and when it was loaded: the
 * last load each host made (the extension's workers, the daemon's
 * supervisor).  Written by qb_config_load_note under its own spin lock
 * (loads are rare: at start, at a configure, at a SIGHUP) and read whole
 * by qb_config_load_read, so no reader sees half of a load.  A failure is
 * one per failed document: every worker of the extension reads the file
 * at a reload, and the same document failing again for the same reason
 * (another worker, another reload of an unchanged file) is not a new one.
 */
typedef enum QbConfigSource
{
	QB_CONFIG_SOURCE_NONE,		/* nothing loaded yet */
	QB_CONFIG_SOURCE_TABLE,		/* queuebox.config, stored by configure() */
	QB_CONFIG_SOURCE_FILE		/* a YAML file: queuebox.config_file, the daemon's --config */
} QbConfigSource;

#define QB_CONFIG_PATHLEN	256
#define QB_CONFIG_ERRLEN	512

typedef struct QbConfigLoad
{
	uint32_t	lock;			/* 1 while a writer or reader copies */
	uint32_t	source;			/* QbConfigSource of the document in force */
	uint32_t	last_failed;	/* the last load failed (the previous one stays) */
	char		path[QB_CONFIG_PATHLEN];	/* the file's, "" for the table */
	char		sha256[65];		/* of the document in force, hex */
	int64_t		loaded_at_ms;	/* its load, ms since the epoch; 0: none */
	uint64_t	loads;			/* successful loads, failed ones */
	uint64_t	failures;
	int64_t		failed_at_ms;	/* the last failed load; 0: none */
	char		error[QB_CONFIG_ERRLEN];	/* its reason, key path included */
	char		failed_sha256[65];	/* of the failed document ("" unread) */
} QbConfigLoad;

typedef struct QbMetrics
{
	QbMetricSlot destinations[QB_METRICS_SLOTS];
	QbMetricSlot sources[QB_METRICS_SLOTS];
	uint64_t	relay_forwarded;
	uint64_t	relay_dead;
	uint64_t	http_not_found; /* 404 and 405 answers, any path */
	uint64_t	http_no_request;	/* connections closed before a request reached the
									 * ingress: idle, closed at once, or refused by the
									 * HTTP parser (a malformed line, 414, 431) */
	uint64_t	http_incomplete;	/* requests begun and never whole: the peer closed
									 * or went idle mid-request */
	uint64_t	admin_unauthorized; /* 401 on /admin/ */
	uint64_t	otlp_exported;	/* spans the OTLP receiver took (qb_otlp.h) */
	uint64_t	otlp_dropped;	/* spans dropped: queue full, a failed post */
	QbActivitySlot workers[QB_METRICS_WORKERS];
	QbConfigLoad config;
} QbMetrics;

/*
 * What the caller knows for this scrape: the gauges it read from the
 * database (-1 = unknown) and the configured names.
 */
typedef struct QbGauges
{
	double		outbox_pending;
	double		outbox_processing;
	double		outbox_oldest_pending_sec;
	double		inbox_pending;
	double		inbox_processing;
	double		inbox_oldest_pending_sec;
	bool		database_up;
	/* the configured destinations; NULL names: render every slot */
	int			ndests;
	const char *const *dest_names;
	/* each one's circuit (QbCircuit: 0 closed .. 3 disabled); NULL: unknown */
	int		   *dest_circuits;
	/* each one's limits (rateLimit, maxConcurrent); NULL: unknown */
	const QbLimitSpec *const *dest_limits;
	/* the places in use now (qb_limits.h), or NULL: not shown */
	const struct QbLimits *limits;
	/* the configured sources; NULL names: render every slot */
	int			nsources;
	const char *const *source_names;
} QbGauges;

/* Zero a block (a fresh shared-memory segment or a daemon's). */
extern void qb_metrics_init(QbMetrics *m);

/* One delivery outcome for a destination; latency_sec < 0: not observed. */
extern void qb_metrics_delivery(QbMetrics *m, const char *destination,
								QbDeliveryOutcome outcome, double latency_sec);

/* One answer of the ingress for a source. */
extern void qb_metrics_received(QbMetrics *m, const char *source, QbReceiveResult result);

extern void qb_metrics_add(uint64_t *counter, uint64_t n);

/*
 * The counters of one destination (sources false) or source, summed over
 * its slots, into count (by QbDeliveryOutcome or QbReceiveResult); zero
 * when it has none yet.  The console's overview reads them.
 */
extern void qb_metrics_counts(const QbMetrics *m, bool sources, const char *name,
							  uint64_t count[QB_NRESULTS]);

/*
 * The worker slot of name (taken when none has it yet) for a worker that
 * starts as pid: activity starting, no cycle yet.  NULL when m is NULL or
 * every slot is taken.
 */
extern QbActivitySlot *qb_metrics_worker(QbMetrics *m, const char *name, int pid);

/* The worker's activity now (w NULL: nothing); since changes with it. */
extern void qb_worker_set(QbActivitySlot *w, QbWorkerActivity a);

/* A cycle (a claim and its settles, a batch stored) ended now. */
extern void qb_worker_cycle(QbActivitySlot *w);

/* "idle", "claiming", ..., as the overview shows them */
extern const char *qb_worker_activity_name(QbWorkerActivity a);

/*
 * qb_config_load_note: a load of the configuration from source (path: the
 * file's, or NULL).  ok: text (len bytes) is now in force; else error says
 * why not (the document in force stays what it was), and text is the
 * document that failed (NULL: it could not be read), which with error
 * tells a new failure from one already counted.  m NULL: nothing.
 */
extern void qb_config_load_note(QbMetrics *m, QbConfigSource source, const char *path,
								bool ok, const char *text, size_t len, const char *error);

/* qb_config_load_read: a consistent copy of m's record (zeroed: m NULL). */
extern void qb_config_load_read(const QbMetrics *m, QbConfigLoad *out);

/* "accepted", "duplicate", ..., as /metrics and the spans name a QbReceiveResult */
extern const char *qb_receive_result_name(QbReceiveResult r);

/* "none", "table", "file" */
extern const char *qb_config_source_name(QbConfigSource s);

/*
 * The Prometheus text exposition (version 0.0.4), malloc'd; NULL when out of
 * memory.  m NULL renders every counter 0 (a host that keeps none); g NULL
 * renders no gauge and every slot's counters.
 */
extern char *qb_metrics_render(const QbMetrics *m, const QbGauges *g);

#endif							/* QB_METRICS_H */
