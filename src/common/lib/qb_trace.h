/*-------------------------------------------------------------------------
 * qb_trace.h
 *	  W3C Trace Context (https://www.w3.org/TR/trace-context/): the
 *	  traceparent and tracestate a row carries, and the child context each
 *	  publish of it carries (docs/observability.md, "Trace context").
 *
 * Vocabulary:
 *	- traceparent: "00-<trace-id 32 hex>-<parent-id 16 hex>-<flags 2 hex>",
 *	  lower case; a trace-id or parent-id of all zeros is invalid, version
 *	  ff is invalid, a later version is read by its first four fields.
 *	- the row's context: the traceparent stored in its headers (taken at
 *	  insert from the row, SET LOCAL queuebox.traceparent, or a
 *	  sqlcommenter comment of the inserting statement).
 *	- a child: the same trace-id and flags, a new random span-id: one per
 *	  publish attempt, so each attempt is a span of its own.
 *-------------------------------------------------------------------------
 */
#ifndef QB_TRACE_H
#define QB_TRACE_H

#include <stdbool.h>
#include <stddef.h>

/* jansson's object, named without its header: PostgreSQL's own headers
 * declare a json_object() of their own (the extension includes this file) */
struct json_t;

#define QB_TRACEPARENT_LEN 55	/* version 00's length */
#define QB_TRACESTATE_MAX 512	/* the spec's limit a vendor must accept */

typedef struct QbTraceContext
{
	unsigned char trace_id[16];
	unsigned char span_id[8];	/* the parent-id field */
	unsigned char flags;
} QbTraceContext;

/* Parse a traceparent value; false when the spec says to ignore it. */
extern bool qb_trace_parse(const char *s, QbTraceContext *out);

/* The version 00 traceparent of c, in out (at least QB_TRACEPARENT_LEN + 1). */
extern void qb_trace_format(const QbTraceContext *c, char *out);

/* A child of parent: a new random span-id (OpenSSL); false if none could be drawn. */
extern bool qb_trace_child(const QbTraceContext *parent, QbTraceContext *child);

/*
 * Is s a tracestate to carry on: at most QB_TRACESTATE_MAX bytes of
 * printable ASCII (0x20 to 0x7e) without '"' or '\\' (so it needs no
 * escaping in JSON or a header)?  The members' syntax is left to its
 * vendors.
 */
extern bool qb_tracestate_ok(const char *s);

/*
 * The traceparent (and tracestate) of a sqlcommenter comment in a
 * statement's text: a comment holding traceparent='00-...' and maybe
 * tracestate='...', values URL-encoded, as sqlcommenter writes them.  tp
 * gets the traceparent (QB_TRACEPARENT_LEN + 1 bytes; a later version is
 * cut to its version 00 form), ts the decoded tracestate or "" (at least
 * QB_TRACESTATE_MAX + 1 bytes).  false when no valid one is there.
 */
extern bool qb_trace_from_sql(const char *sql, char *tp, char *ts);

/*
 * The headers of one publish: the row's traceparent (its name in any case)
 * replaced by a child, under the name "traceparent".  An invalid one is
 * dropped with its tracestate (the spec: restart the trace, carry nothing
 * broken on).  Returns true with *parent and *child set when the row has a
 * context; false when it has none (headers unchanged) or it was dropped.
 */
extern bool qb_trace_publish(struct json_t *headers, QbTraceContext *parent, QbTraceContext *child);

/*
 * The tracestate of a publish's headers (its name in any case), valid
 * while headers is, or NULL: none, or not a string qb_tracestate_ok
 * accepts.
 */
extern const char *qb_trace_state(struct json_t *headers);

#endif							/* QB_TRACE_H */
