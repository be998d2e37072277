/*-------------------------------------------------------------------------
 * queuebox_inbox.h
 *	  libqueuebox-inbox: a pull worker for the QueueBox inbox over libpq.
 *
 * The library holds the claim, the lease renewal, the completion, the retry
 * and the dead letter (docs/pull.md, "The five statements"); the
 * application writes only the handler.
 *
 * Wording:
 *	- A claim takes up to batch_size messages of one source, each with its
 *	  own claim token and a lease, in a transaction of its own, committed
 *	  before any handler starts.
 *	- The handler gets a message and the connection of an open transaction:
 *	  it writes its business rows through that connection and neither
 *	  commits nor rolls back.  On return 0 the library completes the
 *	  message in that transaction and commits; a completion that changes no
 *	  row (another worker owns the message) rolls the whole transaction back.
 *	- Renewal: a second connection renews every held message's lease every
 *	  third of the lease.  A renewal that changes no row means the message
 *	  is lost: its cancellation flag is set (the handler should stop), and
 *	  whatever it wrote is rolled back.
 *	- On a handler failure the transaction is rolled back and the retry
 *	  policy decides: retry after a delay, or dead.  The default policy:
 *	  exponential backoff with jitter from 1 s, dead after five attempts.
 *	- Stop: no claim after qbi_worker_stop; a running handler keeps
 *	  shutdown_grace_ms, past it its cancellation flag is set and nothing is
 *	  completed and no attempt spent (the lease expires); messages claimed
 *	  but not started are left to their lease too.
 *
 * Threads: qbi_worker_run blocks in the caller's thread, which claims;
 * handlers run in max_concurrency threads of the library (default 1), each
 * with a connection of its own, so a handler must be safe to call from a
 * thread other than the caller's, and, with max_concurrency above 1,
 * beside another message's handler (never one of the same aggregate: the
 * claim gives one open message per aggregate).  The renewal runs in a
 * thread of its own.  qbi_worker_stop may be called from any thread or
 * from a signal handler.  Nothing is printed unless a logger is given.
 *-------------------------------------------------------------------------
 */
#ifndef QUEUEBOX_INBOX_H
#define QUEUEBOX_INBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <libpq-fe.h>

#define QBI_ERRLEN 512

typedef struct QbiMessage
{
	int64_t		id;
	const char *claim_token;
	const char *source;
	const char *idempotency_key;
	const char *event_type;		/* NULL when none */
	const char *aggregate_id;	/* NULL when none */
	const char *payload;		/* JSON text */
	const char *headers;		/* JSON object text */
	int			attempt;		/* attempts made before this one */
	const char *created_at;		/* timestamptz text */
	/*
	 * The W3C trace context the message arrived with (its traceparent and
	 * tracestate headers, any letter case), NULL when none or when the spec
	 * says to ignore it: start the handler's span as its child
	 * (span_start below; docs/observability.md).
	 */
	const char *traceparent;
	const char *tracestate;
} QbiMessage;

/*
 * The handler: 0 when the work is done (the library completes and commits),
 * else non-zero with err saying why (the library rolls back and asks the
 * policy).  *cancelled becomes true when the lease is lost or the shutdown
 * grace runs out: stop early and return non-zero.
 */
typedef int (*QbiHandler) (void *arg, const QbiMessage *msg, PGconn *tx,
						   const volatile bool *cancelled, char *err, size_t errlen);

/* What the policy decides for a failed message. */
typedef struct QbiDecision
{
	bool		dead;			/* true: dead letter; false: retry after delay_ms */
	long		delay_ms;
} QbiDecision;

typedef QbiDecision (*QbiRetryPolicy) (void *arg, const QbiMessage *msg, const char *error);

/* A retry after delay_ms, or a dead letter (for a custom policy). */
extern QbiDecision qbi_retry_after(long delay_ms);
extern QbiDecision qbi_dead_letter(void);

/*
 * The default policy: dead once msg->attempt + 1 reaches 5, else
 * 1000 * 2^attempt ms (at most 5 minutes) with +-20 % jitter.
 */
extern QbiDecision qbi_default_policy(void *arg, const QbiMessage *msg, const char *error);

typedef enum QbiLogLevel
{
	QBI_LOG_DEBUG,
	QBI_LOG_INFO,
	QBI_LOG_WARNING,
	QBI_LOG_ERROR
} QbiLogLevel;

typedef void (*QbiLogger) (void *arg, QbiLogLevel level, const char *message);

typedef struct QbiCounters
{
	long		claimed;
	long		completed;
	long		retried;
	long		dead;
	long		lease_lost;
} QbiCounters;

typedef struct QbiOptions
{
	const char *conninfo;		/* libpq connection string or URI */
	const char *source;			/* the pull source */
	int			batch_size;		/* default 10 */
	int			max_concurrency;	/* handlers at once, default 1: never two of one aggregate */
	long		lease_ms;		/* default 30000 */
	long		shutdown_grace_ms;	/* default 30000 */
	long		idle_ms;		/* wait after a claim that found nothing, default 500 */
	QbiRetryPolicy policy;		/* NULL: qbi_default_policy */
	void	   *policy_arg;
	QbiLogger	logger;			/* NULL: nothing is logged */
	void	   *logger_arg;
	/*
	 * Tracing hooks, both or neither: span_start before each handler (in its
	 * thread; its result is the span), span_end after it with the handler's
	 * return code and error ("" on success).  The library needs no tracing
	 * package: start the span as the child of msg->traceparent.
	 */
	void	   *(*span_start) (void *arg, const QbiMessage *msg);
	void		(*span_end) (void *arg, void *span, int rc, const char *error);
	void	   *span_arg;
} QbiOptions;

typedef struct QbiWorker QbiWorker;

/* Copies the options; connects nothing yet.  NULL with err when an option is wrong. */
extern QbiWorker *qbi_worker_new(const QbiOptions *opt, char *err, size_t errlen);

/*
 * Claim and handle messages until qbi_worker_stop.  0 after a stop; -1
 * with err when the database could not be reached at start.
 */
extern int	qbi_worker_run(QbiWorker *w, QbiHandler handler, void *arg, char *err, size_t errlen);

/* Ask the worker to stop; async-signal-safe. */
extern void qbi_worker_stop(QbiWorker *w);

extern void qbi_worker_counters(const QbiWorker *w, QbiCounters *out);
extern void qbi_worker_free(QbiWorker *w);

/*
 * The outbox: enqueue in the application's transaction (src/qbi_outbox.c,
 * docs/enqueue.md).
 *
 * Wording:
 *	- A QbiOutboxMessage is one row of queuebox.outbox.  payload_json is JSON
 *	  text (from your JSON library); the server parses it and refuses text
 *	  that is not JSON.  Headers are name/value pairs.
 *	- The transaction is the caller's: qbi_enqueue runs on conn, which is
 *	  between BEGIN and COMMIT, and neither commits nor rolls back, so the
 *	  rows commit and roll back with the business writes.
 *	- The trace rule: a message whose headers carry no traceparent (any
 *	  letter case) gets the current span's, from the hook qbi_set_trace_hook
 *	  set (none: no header); a traceparent the caller set is kept, and
 *	  refused, naming the format, when it is malformed.
 *	- A batch is one statement (up to 65535 bound values, a larger batch one
 *	  per 65535), its rows in the order given: rows of one key are delivered
 *	  in it.
 */
#define QBI_TRACEPARENT_LEN 55

typedef struct QbiOutboxMessage
{
	const char *topic;			/* routed by the configuration's routes */
	const char *key;			/* the ordering key; NULL: none */
	const char *payload_json;	/* JSON text */
	const char *const *header_names;	/* nheaders names and values, or NULL */
	const char *const *header_values;
	int			nheaders;
	time_t		scheduled_at;	/* not delivered before it; 0: now */
	int			max_attempts;	/* 0: the configuration's outbox.maxAttempts */
} QbiOutboxMessage;

/*
 * The tracing hook: writes the current span's traceparent (and its
 * tracestate, "" for none) and returns true, or returns false when no span
 * is current.  Called by qbi_enqueue in the caller's thread.
 */
typedef bool (*QbiTraceHook) (void *arg, char traceparent[QBI_TRACEPARENT_LEN + 1],
							  char *tracestate, size_t tracestate_len);

/* Sets the process's tracing hook (NULL: none); set it before threads enqueue. */
extern void qbi_set_trace_hook(QbiTraceHook hook, void *arg);

/* Whether text is a traceparent the W3C spec lets a receiver use. */
extern bool qbi_traceparent_valid(const char *text);

/*
 * Writes the n messages into queuebox.outbox on conn, in its open
 * transaction (a connection in none, or in an aborted one, is refused);
 * their ids into ids (n of them, in the order given; NULL: not wanted).
 * 0, or -1 with err: nothing written by this call.  A call of more than one
 * statement (65535 bound values each) runs them under a savepoint it rolls
 * back to on a failure, the transaction still usable; a single statement
 * the server refuses aborts the transaction: roll it back.
 */
extern int	qbi_enqueue(PGconn *conn, const QbiOutboxMessage *msgs, int n, int64_t *ids,
						char *err, size_t errlen);

#endif							/* QUEUEBOX_INBOX_H */
