/*-------------------------------------------------------------------------
 * qb_pub_http.c
 *	  The HTTP publisher: qb_http.c's libcurl client behind QbPublisherOps.
 *
 * qb_http.c does the requests (curl multi, epoll, signing, Retry-After);
 * this file only adapts its calls and outcomes to the publisher ops, as
 * qb_pub_amqp.c, qb_pub_kafka.c and qb_pub_nats.c do for theirs.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>

#include "qb_http.h"
#include "qb_pub_http.h"

typedef struct QbpHttpCall
{
	QbPubDone	done;
	void	   *arg;
} QbpHttpCall;

static void *
qbph_create(char *err, size_t errlen)
{
	return qb_http_new(err, errlen);
}

static void
qbph_destroy(void *p)
{
	qb_http_free(p);
}

static QbPubStart
qbph_start(void *p, const QbDestination *dest, const QbMessage *m, int tag,
			   char *err, size_t errlen)
{
	switch (qb_http_post(p, dest, m->message_id, m->headers, m->body, m->body_len, tag,
						 err, errlen))
	{
		case QB_HTTP_STARTED:
			return QB_PUB_STARTED;
		case QB_HTTP_ROW_INVALID:
			return QB_PUB_ROW_INVALID;
		case QB_HTTP_NOT_STARTED:
			break;
	}
	return QB_PUB_NOT_STARTED;
}

static int
qbph_in_flight(void *p)
{
	return qb_http_in_flight(p);
}

static int
qbph_fd(void *p)
{
	return qb_http_fd(p);
}

static long
qbph_timeout_ms(void *p)
{
	return qb_http_timeout_ms(p);
}

static void
qbph_done(void *arg, int tag, const QbHttpOutcome *o)
{
	QbpHttpCall *call = arg;
	QbPubOutcome out = QB_PUB_OUTCOME_INIT;

	out.ok = o->ok;
	out.status = (int) o->status;
	out.gone = o->gone;
	out.retry_after_ms = o->retry_after_ms;
	snprintf(out.error, sizeof(out.error), "%s", o->error);
	call->done(call->arg, tag, &out);
}

static void
qbph_perform(void *p, QbPubDone done, void *arg)
{
	QbpHttpCall call = {done, arg};

	qb_http_perform(p, qbph_done, &call);
}

static void
qbph_abort_all(void *p)
{
	qb_http_abort_all(p);
}

/* no prune: the connections are curl's cache, which drops unused ones itself */
const QbPublisherOps qb_http_publisher = {
	.type = QB_DEST_HTTP,
	.create = qbph_create,
	.destroy = qbph_destroy,
	.start = qbph_start,
	.in_flight = qbph_in_flight,
	.fd = qbph_fd,
	.timeout_ms = qbph_timeout_ms,
	.perform = qbph_perform,
	.abort_all = qbph_abort_all,
	.prune = NULL,
};
