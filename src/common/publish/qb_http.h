/*-------------------------------------------------------------------------
 * qb_http.h
 *	  The HTTP publisher: many concurrent POSTs on one thread (libcurl multi).
 *
 * Wording:
 *	- A post is one delivery attempt of one row; the caller tags it with the
 *	  row's index in its batch and gets that tag back with the outcome.
 *	- The publisher's fd is a private epoll set holding every socket libcurl
 *	  uses; the host waits on it beside its own wake-ups, so the worker keeps
 *	  answering signals while requests are in flight.
 *
 * Connections are kept alive across batches (the multi handle owns the
 * connection cache), and their sockets stay in the epoll set while they
 * idle, so a request on a kept connection changes nothing in the set.
 * Every signal is blocked before libcurl starts a resolve (which may start
 * the threaded resolver's thread), so a resolver thread never takes a
 * signal meant for the worker.
 *-------------------------------------------------------------------------
 */
#ifndef QB_HTTP_H
#define QB_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "qb_config.h"

typedef struct QbHttp QbHttp;

typedef struct QbHttpOutcome
{
	bool		ok;				/* a 2xx answer */
	long		status;			/* HTTP status, 0 when no answer */
	bool		gone;			/* 410 Gone: the receiver asks us to stop */
	long		retry_after_ms; /* 429 or 503 with a Retry-After: its delay; -1 none */
	char		error[QB_ERRLEN];		/* why it failed, for last_error */
} QbHttpOutcome;

typedef void (*QbHttpDone) (void *arg, int tag, const QbHttpOutcome *outcome);

extern QbHttp *qb_http_new(char *err, size_t errlen);
extern void qb_http_free(QbHttp *h);

/* The fd to wait on for readability; constant for the publisher's life. */
extern int	qb_http_fd(const QbHttp *h);

typedef enum QbHttpStart
{
	QB_HTTP_STARTED,			/* in flight; the outcome comes via perform */
	QB_HTTP_ROW_INVALID,		/* the row can never be sent as it is */
	QB_HTTP_NOT_STARTED			/* a local failure (memory, libcurl): retry */
} QbHttpStart;

/*
 * Start one POST of body to dest->url with the row's headers (a parsed JSON
 * object, qb_message_headers; may be NULL), the destination's static headers, Content-Type,
 * X-Message-Id, User-Agent and, with signing:, the signature headers over
 * body (qb_sign.h; the timestamp is the time of this call).  When it does
 * not start, err says why: QB_HTTP_ROW_INVALID for a row header that is not
 * a valid HTTP header (retrying will not help), QB_HTTP_NOT_STARTED for a
 * local failure.
 */
extern QbHttpStart qb_http_post(QbHttp *h, const QbDestination *dest,
						 const char *message_id, const json_t *row_headers,
						 const char *body, size_t body_len, int tag,
						 char *err, size_t errlen);

/*
 * qb_http_retry_after_ms: the delay a Retry-After value asks for, in ms
 * (delta-seconds or an HTTP-date, read as libcurl reads it, against now in
 * Unix seconds; a date in the past is 0); -1 for NULL or a value that is
 * neither.
 */
extern long qb_http_retry_after_ms(const char *value, long long now);

/* Posts started and not yet reported. */
extern int	qb_http_in_flight(const QbHttp *h);

/* How long the host may wait before qb_http_perform must run (ms, >= 0). */
extern long qb_http_timeout_ms(QbHttp *h);

/* Drive I/O without blocking; report every finished post through done. */
extern void qb_http_perform(QbHttp *h, QbHttpDone done, void *arg);

/* Abandon every post in flight; they are not reported. */
extern void qb_http_abort_all(QbHttp *h);

#endif							/* QB_HTTP_H */
