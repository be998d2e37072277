/*-------------------------------------------------------------------------
 * qb_host.h
 *	  The host interface: what an engine needs from the process it runs in.
 *
 * Two hosts implement it: the PostgreSQL background worker (latch, wait event
 * set, elog) and the daemon (poll, a self-pipe, stderr).  The engines are
 * single-threaded state machines: every callback is made on the engine's own
 * thread, and none of them may longjmp.
 *-------------------------------------------------------------------------
 */
#ifndef QB_HOST_H
#define QB_HOST_H

#include <stdbool.h>
#include <stdint.h>
#include "qb_clock.h"			/* qb_now_ms: the engines and hosts use it */
#include "qb_config.h"
#include "qb_metrics.h"
#include "qb_runtime.h"

typedef enum QbLogLevel
{
	QB_LOG_DEBUG,
	QB_LOG_INFO,
	QB_LOG_WARNING,
	QB_LOG_ERROR
} QbLogLevel;

typedef enum QbWaitResult
{
	QB_WAIT_TIMEOUT = 0,
	QB_WAIT_FD = 1,				/* the fd given is readable */
	QB_WAIT_WOKEN = 2			/* woken: a commit, a config change, a signal */
} QbWaitResult;

typedef struct QbHost
{
	void	   *ctx;
	void		(*log) (void *ctx, QbLogLevel level, const char *msg);

	/*
	 * Block until fd (when >= 0) is readable, the host is woken, or
	 * timeout_ms passes (-1: no timeout).  Returns a QbWaitResult bitmask.
	 */
	int			(*wait) (void *ctx, int fd, long timeout_ms);

	/* True once the process was asked to stop (SIGTERM). */
	bool		(*should_stop) (void *ctx);

	/*
	 * True when the stored configuration changed since the last call (and at
	 * the first call).  The engine then reloads it through the store.
	 */
	bool		(*config_changed) (void *ctx);

	/* Where the engines count what they do (shared by every worker), or NULL. */
	QbMetrics  *metrics;

	/*
	 * This worker's slot in metrics (qb_metrics_worker), where its engine
	 * says what it is doing (qb_host_doing), or NULL.
	 */
	QbActivitySlot *worker;

	/*
	 * The routes the ingress's listener serves besides webhooks and health
	 * (the admin room's qb_admin_routes: the admin API and the console), or
	 * NULL: none.
	 */
	const struct QbIngressRoutes *routes;

	/*
	 * The process's running parts (qb_runtime.h: the span exporter, the
	 * transforms' helper, the host's egress policy), kept by the host for
	 * the life of the process, or NULL: no spans, no transform runs.
	 */
	QbRuntime  *runtime;

	/*
	 * What the host allows the documents its engines load (qb_config.h:
	 * its egress policy, the secret-file directories), or NULL: the
	 * defaults.  The same the host's other validators are given.
	 */
	const QbConfigEnv *config_env;

	/*
	 * Told of every configuration an engine loads (NULL: none stored), or
	 * NULL.  The PostgreSQL host publishes the number of broker sources, so
	 * the launcher starts one consumer worker per source.
	 */
	void		(*config_loaded) (void *ctx, const QbConfig *cfg);

	/*
	 * The outbox engine's intake floor (docs/design/claim.md): the lowest
	 * "rows above this id committed late" reported since the last call, or
	 * -1 when none was.  NULL: the host cannot know; the engine then reads
	 * intake from the start at every poll.
	 */
	int64_t		(*late_floor) (void *ctx);

	/*
	 * Told after each look for work (a claim) whether it found any, or
	 * NULL.  A host with no wake at commit stretches its idle polls with it
	 * (the daemon: daemon_host.c); the PostgreSQL host is woken at commit.
	 */
	void		(*polled) (void *ctx, bool found);

	/*
	 * Told before each wait whether rows a commit inserts now could be
	 * claimed before the next poll (false: no configuration, or every
	 * destination holds its rows), or NULL.  The PostgreSQL host then leaves
	 * the worker asleep at commits that only insert rows; the poll, a
	 * configuration and an operation (requeue, resume) still wake it.
	 */
	void		(*rows_wake) (void *ctx, bool want);

	/*
	 * The destinations' limits (rateLimit, maxConcurrent) every worker of
	 * this server shares (qb_limits.h), and this worker's holder in them
	 * (qb_limits_holder, taken by the host when the worker starts and given
	 * back when it ends); NULL: the outbox engine keeps limits of its own,
	 * for this worker alone.
	 */
	struct QbLimits *limits;
	int			limit_holder;
} QbHost;

/* QbHost's functions: the required, and those that may be NULL (qb_ops.h) */
#define QB_HOST_OPS(X, T) X(T, log) X(T, wait) X(T, should_stop) X(T, config_changed)
#define QB_HOST_OPS_OPTIONAL(X, T) X(T, config_loaded) X(T, late_floor) X(T, polled) X(T, rows_wake)

/*
 * Reload an engine's configuration from the store (qb_host.c); true when
 * *cfg was replaced.  what_waits names the rows that wait without one.
 */
struct QbStore;
extern bool qb_reload_config(const QbHost *host, const struct QbStore *store,
							 QbConfig **cfg, bool *warned_no_config,
							 const char *what_waits);

/*
 * Export spans as cfg's telemetry.otlp says (cfg NULL: none), for this
 * process; the failure to start is logged (qb_host.c).
 */
extern void qb_telemetry_apply(const QbHost *host, const QbConfig *cfg);

/* Log the span exporter's last failure, at most once a minute (qb_host.c). */
extern void qb_otlp_log_errors(const QbHost *host);

/* The process's span exporter (NULL: none, no spans) and transform helper. */
static inline QbOtlpExporter *
qb_host_otlp(const QbHost *host)
{
	return host->runtime != NULL ? &host->runtime->otlp : NULL;
}

static inline QbTransformHelper *
qb_host_jq(const QbHost *host)
{
	return host->runtime != NULL ? &host->runtime->jq : NULL;
}

/* What the engine is doing now, and a cycle's end, in its worker slot. */
static inline void
qb_host_doing(const QbHost *host, QbWorkerActivity a)
{
	qb_worker_set(host->worker, a);
}

static inline void
qb_host_cycle(const QbHost *host)
{
	qb_worker_cycle(host->worker);
}

extern void qb_log(const QbHost *host, QbLogLevel level, const char *fmt,...)
			__attribute__((format(printf, 3, 4)));

#endif							/* QB_HOST_H */
