/*-------------------------------------------------------------------------
 * qb_otlp.h
 *	  Spans exported with OTLP over HTTP (JSON encoding) when
 *	  telemetry.otlp.endpoint is set (docs/observability.md, "Exporting
 *	  spans").
 *
 * Vocabulary:
 *	- A span is one delivery attempt, one inbox receipt or one relay
 *	  forward (QbSpan), made by an engine with the trace context of qb_trace.h.
 *	- The exporter is one per process: a bounded queue of spans, each
 *	  already rendered as OTLP JSON, and one thread that posts them in
 *	  batches to the receiver.  Its host keeps it (QbOtlpExporter, in
 *	  QbRuntime.otlp: qb_runtime.h) for the life of the process, since an
 *	  exit handler stops its thread, and names it at every call; NULL is an
 *	  exporter that never runs.
 *
 * Concurrency: qb_otlp_emit never blocks on the network: it renders the span,
 * takes the queue's mutex for a pointer copy and returns; a full queue drops
 * the span (counted).  The thread touches nothing but the queue, libcurl and
 * malloc, blocks every signal (in a PostgreSQL backend the signal handlers
 * must run on the main thread), and reports through the shared metrics'
 * atomic counters and qb_otlp_take_error.  qb_otlp_configure and
 * qb_otlp_shutdown are the main thread's.
 *-------------------------------------------------------------------------
 */
#ifndef QB_OTLP_H
#define QB_OTLP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qb_egress.h"
#include "qb_egress_policy.h"
#include "qb_metrics.h"
#include "qb_trace.h"

typedef struct QbOtlpHeader
{
	char	   *name;
	char	   *value;
} QbOtlpHeader;

/* telemetry.otlp: what the exporter posts where (docs/configuration.md) */
typedef struct QbOtlpOptions
{
	char	   *url;			/* the traces URL; NULL: no export */
	QbOtlpHeader *headers;		/* sent with every post (an API key) */
	int			nheaders;
	char	   *service_name;	/* the resource's service.name */
	long		timeout_ms;		/* one post */
	int			queue_size;		/* spans held before export; more are dropped */
	int			batch_size;		/* spans per post at most */
	long		flush_interval_ms;	/* a post at least this often while spans wait */
	const QbEgress *egress;		/* the document's rules, or NULL: the host's */
	const QbEgressPolicy *host_egress;	/* the host's, or NULL: none */
} QbOtlpOptions;

/* A process's exporter: none running (zeroed), or one (qb_otlp.c's). */
typedef struct QbOtlpExporter
{
	struct QbOtlp *running;		/* NULL: none */
	bool		exit_hooked;	/* its exit handler is registered */
	long		logged_ms;		/* the last failure logged (qb_otlp_log_errors) */
} QbOtlpExporter;

typedef enum QbSpanKind
{
	QB_SPAN_INTERNAL = 1,
	QB_SPAN_SERVER = 2,
	QB_SPAN_CLIENT = 3,
	QB_SPAN_PRODUCER = 4,
	QB_SPAN_CONSUMER = 5
} QbSpanKind;

#define QB_SPAN_MAX_ATTRS 10

typedef struct QbSpanAttr
{
	const char *key;
	const char *str;			/* NULL: num */
	long long	num;
} QbSpanAttr;

/* One finished span; its strings are the caller's until qb_otlp_emit returns. */
typedef struct QbSpan
{
	QbTraceContext ctx;			/* trace-id, this span's id, flags */
	unsigned char parent_id[8];
	bool		has_parent;
	/* the W3C tracestate of ctx: its parent's, carried on; NULL: none */
	const char *trace_state;
	const char *name;
	QbSpanKind	kind;
	int64_t		start_ns;		/* since the epoch */
	int64_t		end_ns;
	bool		error;			/* status ERROR; else OK */
	const char *message;		/* the status message (an error), or NULL */
	int			nattrs;
	QbSpanAttr	attrs[QB_SPAN_MAX_ATTRS];
} QbSpan;

/*
 * qb_otlp_configure: ex exports as o says (o NULL or o->url NULL: stop
 * exporting), counting into m; instance names this process in the
 * resource (service.instance.id).  Options equal to the running ones
 * change nothing; other ones replace the exporter (the spans queued for
 * the old one are dropped, counted).  false with err when the thread
 * cannot be started (then nothing is exported).
 */
extern bool qb_otlp_configure(QbOtlpExporter *ex, const QbOtlpOptions *o, QbMetrics *m,
							  const char *instance, char *err, size_t errlen);

/* Is an exporter running?  (An engine makes no span otherwise.) */
extern bool qb_otlp_on(const QbOtlpExporter *ex);

/*
 * qb_span_start: s begins now as a child of parent (NULL: the root of a
 * new trace), with a new span-id; false when no random id could be drawn
 * or the parent is not sampled (flags without 01: export nothing of it).
 */
extern bool qb_span_start(QbSpan *s, const char *name, QbSpanKind kind,
						  const QbTraceContext *parent);

/*
 * qb_span_start_tp: the same, the parent given as a traceparent's text
 * (NULL or not a valid one: the root of a new trace) and the tracestate
 * that goes with it (NULL: none), as a request, a broker message or an
 * inbox row carries them.
 */
extern bool qb_span_start_tp(QbSpan *s, const char *name, QbSpanKind kind,
							 const char *traceparent, const char *tracestate);

/*
 * qb_span_tracestate: s's context carries tracestate (exported as the
 * span's traceState; the caller's, as s's other strings), as a child
 * carries its parent's.  Nothing for a root span, NULL, "" or one
 * qb_tracestate_ok refuses.
 */
extern void qb_span_tracestate(QbSpan *s, const char *tracestate);

extern void qb_span_str(QbSpan *s, const char *key, const char *value);
extern void qb_span_int(QbSpan *s, const char *key, long long value);

/* qb_otlp_emit: s ends now (unless end_ns is set) and is queued; never blocks. */
extern void qb_otlp_emit(QbOtlpExporter *ex, QbSpan *s);

/* A message received: a webhook's or a broker message's, stored or refused. */
typedef struct QbReceipt
{
	const char *source;
	QbSpanKind	kind;			/* QB_SPAN_SERVER: a webhook */
	const char *traceparent;	/* what it came with, or NULL */
	const char *tracestate;
	int64_t		start_ns;		/* its arrival */
	QbReceiveResult result;
	const char *key;			/* its idempotency key, or NULL */
	int			http_status;	/* a webhook's answer (>= 500: an error), or 0 */
	int64_t		inbox_id;		/* the stored row, or 0 */
} QbReceipt;

/* qb_otlp_receipt: the span "receive <source>" of r, when spans are exported. */
extern void qb_otlp_receipt(QbOtlpExporter *ex, const QbReceipt *r);

/*
 * qb_otlp_take_error: the last export failure not taken yet, in buf
 * (false when none): for the main thread to log.
 */
extern bool qb_otlp_take_error(QbOtlpExporter *ex, char *buf, size_t len);

/* qb_otlp_shutdown: post what is queued for up to flush_ms, then stop. */
extern void qb_otlp_shutdown(QbOtlpExporter *ex, long flush_ms);

/* the wall clock in ns since the epoch */
extern int64_t qb_otlp_now_ns(void);

#endif							/* QB_OTLP_H */
