/*-------------------------------------------------------------------------
 * qb_src_nats.c
 *	  The NATS source consumer (cnats): a JetStream durable pull consumer on
 *	  the source's stream, filtered by its subject, whose messages the
 *	  consumer engine (qb_consume.c) stores in the inbox.
 *
 * Wording:
 *	- The durable is the JetStream consumer the source names (default
 *	  "queuebox-<source>"): open() creates it with explicit acks, or binds
 *	  to it (qbns_durable); it outlives the worker, so a restarted worker
 *	  resumes where the acks stop.
 *	- A held message is a natsMsg handed to the engine as a delivery, kept
 *	  until ack() or release(); its handle is its index in the held array.
 *	- A delivery's body is the message data, its headers the NATS headers
 *	  as a JSON object (repeats joined by ", "), its message_id the
 *	  Nats-Msg-Id header, its position "stream/stream_sequence".
 *
 * Rules: fetch() takes one message per natsSubscription_Fetch, never a
 * batch (cnats 3.4.1 overflows, README.md); it polls (a pull subscription
 * has no fd) and fd() is a pipe it writes when messages came.  The last
 * ack of a batch is synchronous; release() naks with the engine's delay.
 * No callback of ours runs on a cnats thread, and cnats's threads start
 * with every signal blocked (qb_nats.h).
 *-------------------------------------------------------------------------
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE				/* pipe2 */
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <nats/nats.h>

#include "qb_clock.h"
#include "qb_nats.h"
#include "qb_src_nats.h"
#include "qb_src_nats_int.h"
#include "qb_utf8.h"

#define QBNS_FETCH_MS		5		/* one poll of the pull consumer */
#define QBNS_LOOK_US		200		/* how often a poll looks for arrivals */
#define QBNS_API_WAIT_MS	5000	/* JetStream API requests (subscribe) */
#define QBNS_ACK_WAIT_MS	2000	/* the synchronous last ack of a batch */
#define QBNS_MIN_ACK_PENDING 1000	/* the server's default MaxAckPending */

typedef struct QbnsConsumer
{
	natsConnection *nc;
	jsCtx	   *js;
	natsSubscription *sub;
	natsMsg   **held;			/* by handle; NULL once acked or released */
	int			nheld;
	int			cap;
	int			live;			/* non-NULL entries of held */
	int			pipe_r;			/* fd(): readable after a full fetch */
	int			pipe_w;
	char		url[256];		/* redacted, for messages */
	char	   *what;			/* "stream S, subject X, durable D" */
	char	   *next_subj;		/* $JS.API.CONSUMER.MSG.NEXT.<stream>.<durable> */
	const char *inbox;			/* the subscription's subject (cnats owns it) */
} QbnsConsumer;

static void qbns_close(void *p);

/* ---- deliveries -------------------------------------------------------- */

/* qbns_headers: see qb_src_nats_int.h. */
char *
qbns_headers(natsMsg *m, bool *oom)
{
	const char **keys = NULL;
	int			nkeys = 0;
	json_t	   *o;
	char	   *text = NULL;

	*oom = false;
	if (natsMsgHeader_Keys(m, &keys, &nkeys) != NATS_OK || nkeys == 0)
		return NULL;			/* NATS_NOT_FOUND: no header */
	/* json_pack: the postgres executable exports a json_object of its own */
	if ((o = json_pack("{}")) == NULL)
		goto oom;
	for (int i = 0; i < nkeys; i++)
	{
		const char **vals = NULL;
		int			nvals = 0;
		char	   *joined;
		size_t		len = 1;

		if (natsMsgHeader_Values(m, keys[i], &vals, &nvals) != NATS_OK)
			continue;
		for (int j = 0; j < nvals; j++)
			len += strlen(vals[j]) + 2;
		if ((joined = malloc(len)) == NULL)
		{
			free((void *) vals);
			goto oom;
		}
		joined[0] = '\0';
		for (int j = 0; j < nvals; j++)
		{
			if (j > 0)
				strcat(joined, ", ");
			strcat(joined, vals[j]);
		}
		free((void *) vals);
		/* a name or value that is not UTF-8 cannot be JSON: left out */
		if (qb_utf8_invalid_at(keys[i], strlen(keys[i])) >= 0 ||
			qb_utf8_invalid_at(joined, strlen(joined)) >= 0)
		{
			free(joined);
			continue;
		}
		if (json_object_set_new(o, keys[i], json_string(joined)) != 0)
		{
			free(joined);
			goto oom;
		}
		free(joined);
	}
	text = json_dumps(o, JSON_COMPACT);
	if (text == NULL)
		goto oom;
	json_decref(o);
	free((void *) keys);
	return text;

oom:
	json_decref(o);
	free((void *) keys);
	*oom = true;
	return NULL;
}

/* qbns_fill copies one message into a delivery; false: out of memory. */
static bool
qbns_fill(natsMsg *m, QbDelivery *d)
{
	jsMsgMetaData *md = NULL;
	const char *mid = NULL;
	int			len = natsMsg_GetDataLength(m);
	bool		oom;

	memset(d, 0, sizeof(*d));
	if ((d->body = malloc(len + 1)) == NULL)
		goto oom;
	if (len > 0)
		memcpy(d->body, natsMsg_GetData(m), len);
	d->body[len] = '\0';
	d->len = len;
	d->headers = qbns_headers(m, &oom);
	if (oom)
		goto oom;
	if (natsMsgHeader_Get(m, "Nats-Msg-Id", &mid) == NATS_OK && mid != NULL && *mid &&
		(d->message_id = strdup(mid)) == NULL)
		goto oom;
	if (natsMsg_GetMetaData(&md, m) == NATS_OK)
	{
		size_t		plen = strlen(md->Stream) + 24;

		if ((d->position = malloc(plen)) == NULL)
			goto oom;
		snprintf(d->position, plen, "%s/%" PRIu64, md->Stream, md->Sequence.Stream);
		jsMsgMetaData_Destroy(md);
	}
	return true;

oom:
	jsMsgMetaData_Destroy(md);
	qb_deliveries_clear(d, 1);
	return false;
}

/* qbns_take: the held message of a handle, now ours to finish; or NULL. */
static natsMsg *
qbns_take(QbnsConsumer *c, uint64_t handle)
{
	natsMsg    *m;

	if (handle >= (uint64_t) c->nheld || (m = c->held[handle]) == NULL)
		return NULL;
	c->held[handle] = NULL;
	if (--c->live == 0)
		c->nheld = 0;			/* every handle answered: start over */
	return m;
}

/* qbns_inbox, qbns_waiting: see qb_src_nats_int.h. */
const char *
qbns_inbox(void *consumer)
{
	return ((QbnsConsumer *) consumer)->inbox;
}

int
qbns_waiting(void *consumer)
{
	int			n = 0;

	if (natsSubscription_GetPending(((QbnsConsumer *) consumer)->sub, &n, NULL) != NATS_OK)
		return 0;
	return n;
}

/* ---- the ops ----------------------------------------------------------- */

/*
 * qbns_durable looks the durable up.  *exists says whether it does; one
 * whose MaxAckPending is below want is updated to want (the server changes
 * it in place, nothing is redelivered).  One without explicit acks cannot
 * hold a message until its row commits: *refused, and why in err.
 */
static natsStatus
qbns_durable(QbnsConsumer *c, const QbSource *src, const char *durable, int64_t want,
			 bool *exists, bool *refused, jsErrCode *jerr, char *err, size_t errlen)
{
	jsConsumerInfo *ci = NULL;
	natsStatus	s;

	*exists = false;
	s = js_GetConsumerInfo(&ci, c->js, src->stream, durable, NULL, jerr);
	if (s == NATS_NOT_FOUND && *jerr != JSStreamNotFoundErr)
	{
		*jerr = 0;
		return NATS_OK;
	}
	if (s != NATS_OK)
		return s;
	*exists = true;
	if (ci->Config->AckPolicy != js_AckExplicit)
	{
		snprintf(err, errlen,
				 "the durable %s of stream %s does not use explicit acks, so a message could be acknowledged before its row is stored; delete it, or name another durable: (QueueBox creates it)",
				 durable, src->stream);
		*refused = true;
		s = NATS_INVALID_ARG;
	}
	else if (ci->Config->MaxAckPending > 0 && ci->Config->MaxAckPending < want)
	{
		jsConsumerConfig cc = *ci->Config;
		jsConsumerInfo *up = NULL;

		cc.MaxAckPending = want;
		s = js_UpdateConsumer(&up, c->js, src->stream, &cc, NULL, jerr);
		jsConsumerInfo_Destroy(up);
	}
	jsConsumerInfo_Destroy(ci);
	return s;
}

/*
 * qbns_names: what the consumer is called: its durable name (into
 * durable), the redacted URL and "stream S, subject X, durable D" for
 * messages, the subject its pull requests go to.  -1 with err.
 */
static int
qbns_names(QbnsConsumer *c, const QbSource *src, char *durable, size_t durlen,
		   char *err, size_t errlen)
{
	if (src->durable != NULL && *src->durable)
		snprintf(durable, durlen, "%s", src->durable);
	else
		snprintf(durable, durlen, "queuebox-%s", src->name);
	qb_nats_redact(src->broker_url, c->url, sizeof(c->url));
	if (asprintf(&c->what, "stream %s, subject %s, durable %s",
				 src->stream, src->subject, durable) < 0)
	{
		c->what = NULL;
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	if (asprintf(&c->next_subj, "$JS.API.CONSUMER.MSG.NEXT.%s.%s", src->stream, durable) < 0)
	{
		c->next_subj = NULL;
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* qbns_connect: the connection to the source's server.  -1 with err. */
static int
qbns_connect(QbnsConsumer *c, const QbSource *src, char *err, size_t errlen)
{
	natsStatus	s;
	natsOptions *o = qb_nats_options(src->broker_url, &s);
	char		why[QB_ERRLEN];

	if (s == NATS_OK)
		s = natsConnection_Connect(&c->nc, o);
	/* the connection keeps a copy of its options */
	natsOptions_Destroy(o);
	if (s != NATS_OK)
	{
		qb_nats_status_text(s, why, sizeof(why));
		snprintf(err, errlen, "cannot connect to NATS at %s: %s", c->url, why);
		return -1;
	}
	return 0;
}

/*
 * qbns_bind: JetStream, the durable consumer made or checked
 * (qbns_durable), and the pull subscription bound to it.  -1 with err.
 */
static int
qbns_bind(QbnsConsumer *c, const QbSource *src, const char *durable, char *err, size_t errlen)
{
	jsOptions	jo;
	jsSubOptions so;
	jsErrCode	jerr = 0;
	natsStatus	s;
	char		why[QB_ERRLEN];
	int64_t		want = src->batch_size > QBNS_MIN_ACK_PENDING ? src->batch_size : QBNS_MIN_ACK_PENDING;
	bool		exists = false;
	bool		refused = false;

	jsOptions_Init(&jo);
	jo.Wait = QBNS_API_WAIT_MS;
	s = natsConnection_JetStream(&c->js, c->nc, &jo);
	if (s == NATS_OK)
		s = qbns_durable(c, src, durable, want, &exists, &refused, &jerr, err, errlen);
	if (s == NATS_OK)
	{
		jsSubOptions_Init(&so);
		so.Stream = src->stream;
		so.Config.AckPolicy = js_AckExplicit;
		/* cnats refuses to bind when a requested value differs from the stored one */
		so.Config.MaxAckPending = exists ? 0 : want;
		s = js_PullSubscribe(&c->sub, c->js, src->subject, durable, NULL, &so, &jerr);
	}
	if (s == NATS_OK && (c->inbox = natsSubscription_GetSubject(c->sub)) == NULL)
		s = NATS_ERR;
	if (refused)
		return -1;				/* qbns_durable's words are in err */
	if (s != NATS_OK)
	{
		qb_nats_status_text(s, why, sizeof(why));
		snprintf(err, errlen, "cannot consume from NATS at %s (%s): %s%s",
				 c->url, c->what, why,
				 jerr == JSStreamNotFoundErr ?
				 "; the stream does not exist: create it, with a subject that captures the source's subject, through a NATS client or a $JS.API.STREAM.CREATE request (docs/delivery.md, \"Creating the stream\")" :
				 s == NATS_NO_RESPONDERS ? "; is JetStream enabled on the server (nats-server -js)?" : "");
		return -1;
	}
	return 0;
}

static void *
qbns_open(const QbSource *src, char *err, size_t errlen)
{
	QbnsConsumer *c;
	sigset_t	old;
	int			fds[2];
	char		durable[256];
	int			rc;

	if (!qb_nats_open(err, errlen))
		return NULL;
	if ((c = calloc(1, sizeof(QbnsConsumer))) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->pipe_r = c->pipe_w = -1;
	if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "pipe2: %s", strerror(errno));
		goto err;
	}
	c->pipe_r = fds[0];
	c->pipe_w = fds[1];
	if (qbns_names(c, src, durable, sizeof(durable), err, errlen) != 0)
		goto err;
	/* the connection's threads start here: with every signal blocked */
	qb_nats_block_signals(&old);
	rc = qbns_connect(c, src, err, errlen) == 0 ? qbns_bind(c, src, durable, err, errlen) : -1;
	qb_nats_restore_signals(&old);
	if (rc == 0)
		return c;

err:
	qbns_close(c);
	return NULL;
}

/*
 * qbns_close naks what is still held (so it comes back before AckWait),
 * then drops the subscription without deleting the durable, and the
 * connection.
 */
static void
qbns_close(void *p)
{
	QbnsConsumer *c = p;

	if (c == NULL)
		return;
	for (int i = 0; i < c->nheld; i++)
		if (c->held[i] != NULL)
		{
			(void) natsMsg_Nak(c->held[i], NULL);
			natsMsg_Destroy(c->held[i]);
		}
	free(c->held);
	natsSubscription_Destroy(c->sub);	/* keeps the durable (not Unsubscribe) */
	jsCtx_Destroy(c->js);
	if (c->nc != NULL)
		natsConnection_Close(c->nc);
	natsConnection_Destroy(c->nc);
	if (c->pipe_r >= 0)
		close(c->pipe_r);
	if (c->pipe_w >= 0)
		close(c->pipe_w);
	free(c->what);
	free(c->next_subj);
	free(c);
}

static int
qbns_fd(void *p)
{
	return ((QbnsConsumer *) p)->pipe_r;
}

/*
 * qbns_take_one: one message of the subscription, called when something
 * waits there.  Never more than one per Fetch: cnats 3.4.1 writes past its
 * array when a Fetch(n) starts with more than n/2 messages waiting
 * (nats.c #749; README.md).  *m is NULL when what waited was only a status (408, 404: a
 * request ended), which is no failure.
 */
static natsStatus
qbns_take_one(QbnsConsumer *c, natsMsg **m, jsErrCode *jerr)
{
	natsMsgList list = {0};
	natsStatus	s = natsSubscription_Fetch(&list, c->sub, 1, 1, jerr);

	*m = NULL;
	if (s == NATS_OK && list.Count == 1)
	{
		*m = list.Msgs[0];
		list.Msgs[0] = NULL;	/* ours now, not the list's */
	}
	natsMsgList_Destroy(&list);
	return s == NATS_TIMEOUT || s == NATS_NOT_FOUND ? NATS_OK : s;
}

/*
 * qbns_ready: before a fetch, the pipe drained, the connection up, and
 * room to hold max more messages.  1 to fetch, 0 while cnats reconnects
 * by itself, -1 with err.
 */
static int
qbns_ready(QbnsConsumer *c, int max, char *err, size_t errlen)
{
	natsConnStatus st;
	char		buf[64];

	while (read(c->pipe_r, buf, sizeof(buf)) > 0)
		;
	st = natsConnection_Status(c->nc);
	if (st == NATS_CONN_STATUS_CLOSED)
	{
		snprintf(err, errlen, "the connection to NATS at %s is closed", c->url);
		return -1;
	}
	if (st != NATS_CONN_STATUS_CONNECTED)
		return 0;				/* cnats is reconnecting by itself */
	if (c->nheld + max > c->cap)
	{
		int			cap = c->nheld + max;
		natsMsg   **h = realloc(c->held, cap * sizeof(natsMsg *));

		if (h == NULL)
		{
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		c->held = h;
		c->cap = cap;
	}
	return 1;
}

/* qbns_request: one pull request for what is not already waiting here, expiring after QBNS_FETCH_MS. */
static natsStatus
qbns_request(QbnsConsumer *c, int max)
{
	int			waiting = qbns_waiting(c);
	char		req[64];
	int			len;

	if (waiting >= max)
		return NATS_OK;
	len = snprintf(req, sizeof(req), "{\"batch\":%d,\"expires\":%lld}",
				   max - waiting, (long long) QBNS_FETCH_MS * 1000000LL);
	return natsConnection_PublishRequest(c->nc, c->next_subj, c->inbox, req, len);
}

/*
 * qbns_collect: up to max messages into out (held under their handles),
 * for QBNS_FETCH_MS at most, while *s is NATS_OK; a failure is left in *s
 * and *jerr.  How many.
 */
static int
qbns_collect(QbnsConsumer *c, QbDelivery *out, int max, natsStatus *s, jsErrCode *jerr)
{
	long		deadline = qb_now_ms() + QBNS_FETCH_MS;
	int			waiting;
	int			k = 0;

	while (*s == NATS_OK && k < max)
	{
		natsMsg    *m = NULL;

		/*
		 * Take a message only when one waits; nothing here yet: look again
		 * shortly, not in a Fetch, which would send a request of its own each
		 * time (one message each, and a 408 for each that expires).
		 */
		if ((waiting = qbns_waiting(c)) > 0 && (*s = qbns_take_one(c, &m, jerr)) != NATS_OK)
			break;
		if (m == NULL)
		{
			if (qb_now_ms() >= deadline)
				break;
			if (waiting == 0)
				usleep(QBNS_LOOK_US);
			continue;
		}
		if (qbns_fill(m, &out[k]))
		{
			out[k].handle = c->nheld;
			c->held[c->nheld++] = m;
			c->live++;
			k++;
		}
		else
		{
			/* out of memory: give it back rather than drop it */
			(void) natsMsg_Nak(m, NULL);
			natsMsg_Destroy(m);
		}
	}
	return k;
}

static int
qbns_fetch(void *p, QbDelivery *out, int max, char *err, size_t errlen)
{
	QbnsConsumer *c = p;
	jsErrCode	jerr = 0;
	natsStatus	s;
	char		why[QB_ERRLEN];
	int			k;

	if ((k = qbns_ready(c, max, err, errlen)) <= 0)
		return k;
	s = qbns_request(c, max);
	k = qbns_collect(c, out, max, &s, &jerr);
	if (s != NATS_OK && k == 0)
	{
		if (natsConnection_Status(c->nc) == NATS_CONN_STATUS_RECONNECTING)
			return 0;
		qb_nats_status_text(s, why, sizeof(why));
		snprintf(err, errlen, "fetching from NATS at %s (%s) failed: %s (err_code %d)",
				 c->url, c->what, why, (int) jerr);
		return -1;
	}
	/*
	 * Messages came: more may wait, come back at once.  Not only when the
	 * fetch was full: one that ends at its 5 ms expiry a few messages short
	 * is common under load, and waiting 100 ms after it cut the rate tenfold.
	 * (A failure after some messages: they are handed over, and the next
	 * fetch meets the failure again.)
	 */
	if (k > 0)
		(void) !write(c->pipe_w, "x", 1);
	return k;
}

static int
qbns_ack(void *p, const QbDelivery *d, int n, char *err, size_t errlen)
{
	QbnsConsumer *c = p;
	jsOptions	jo;
	natsStatus	bad = NATS_OK;
	jsErrCode	jerr = 0;
	char		why[QB_ERRLEN];
	int			last = -1;

	jsOptions_Init(&jo);
	jo.Wait = QBNS_ACK_WAIT_MS;
	for (int i = 0; i < n; i++)
		if (d[i].handle < (uint64_t) c->nheld && c->held[d[i].handle] != NULL)
			last = i;
	for (int i = 0; i <= last; i++)
	{
		natsMsg    *m = qbns_take(c, d[i].handle);
		natsStatus	s;

		if (m == NULL)
			continue;
		/*
		 * Options with a Wait make cnats send every ack as a request and wait
		 * for its reply: a batch cost one round trip per message, and with
		 * the server gone the worker stalled Wait per message.  The others go
		 * without options, a plain publish (kept in cnats's reconnect buffer
		 * while it reconnects).
		 */
		s = i == last ? natsMsg_AckSync(m, &jo, &jerr) : natsMsg_Ack(m, NULL);
		if (s != NATS_OK && bad == NATS_OK)
		{
			bad = s;
			qb_nats_status_text(s, why, sizeof(why));
		}
		natsMsg_Destroy(m);
	}
	if (bad == NATS_OK)
		return 0;
	/* the rows are stored: a lost ack only brings the repeats back (the engine says so) */
	snprintf(err, errlen, "acknowledging to NATS at %s (%s) failed: %s",
			 c->url, c->what, why);
	return -1;
}

static void
qbns_release(void *p, const QbDelivery *d, int n, long delay_ms)
{
	QbnsConsumer *c = p;

	for (int i = 0; i < n; i++)
	{
		natsMsg    *m = qbns_take(c, d[i].handle);

		if (m == NULL)
			continue;
		/* a failed nak is redelivered after AckWait anyway */
		if (delay_ms > 0)
			(void) natsMsg_NakWithDelay(m, delay_ms, NULL);
		else
			(void) natsMsg_Nak(m, NULL);
		natsMsg_Destroy(m);
	}
}

const QbConsumerOps qb_nats_consumer = {
	.type = QB_SOURCE_NATS,
	.open = qbns_open,
	.close = qbns_close,
	.fd = qbns_fd,
	.fetch = qbns_fetch,
	.ack = qbns_ack,
	.release = qbns_release,
};
