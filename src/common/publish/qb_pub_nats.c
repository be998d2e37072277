/*-------------------------------------------------------------------------
 * qb_pub_nats.c
 *	  The NATS publisher (cnats): JetStream publishes with acknowledgements,
 *	  or core NATS publishes confirmed by a flush.
 *
 * Wording:
 *	- A link is one destination's connection (plus its JetStream context
 *	  when jetstream is on), keyed by destination name, url and mode, kept
 *	  across batches; cnats reconnects it by itself.
 *	- A ticket is one publish in flight: the row's tag, the natsMsg pointer
 *	  cnats hands back to the ack handler (an identity, never dereferenced
 *	  after the publish), and a deadline.
 *	- A JetStream publish is answered by its ack handler (an ack, a server
 *	  error, cnats's MaxWait timeout); a core publish by the flush perform()
 *	  runs once per batch.
 *
 * Threads: the ack handler runs on cnats's threads and only writes the
 * outcome into the ticket under the mutex and a byte into the pipe that is
 * fd().  Every cnats call that may start a thread runs with every signal
 * blocked (qb_nats.h).  Failures: no stream captures the subject: retry
 * (createStream may make it, README.md); over max_payload: dead; else retry.
 *-------------------------------------------------------------------------
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE				/* pipe2 */
#endif
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <nats/nats.h>

#include "qb_clock.h"
#include "qb_extract.h"
#include "qb_nats.h"
#include "qb_pub_nats.h"
#include "qb_pub_nats_int.h"

#define QBN_ACK_WAIT_MS		5000	/* cnats's MaxWait for one async ack */
#define QBN_GRACE_MS		5000	/* then our own deadline: a lost callback */
#define QBN_FLUSH_MS		2000	/* the per-batch flush of core publishes */
#define QBN_RETRY_CONNECT_MS 1000	/* a failed connect is not retried sooner */

typedef struct QbNats QbNats;

typedef struct QbnLink
{
	char	   *name;
	char	   *url;
	bool		jetstream;
	natsConnection *nc;			/* NULL until a connect succeeds */
	jsCtx	   *js;
	bool		async_started;	/* cnats's pub-ack thread exists */
	int			core_pending;	/* core publishes not yet flushed */
	long		retry_at;		/* after a failed connect */
	char		error[QB_ERRLEN];		/* why the last connect failed */
	QbEgress   *egress;			/* the destination's rules (a copy), or NULL */
	const QbEgressPolicy *host_egress;	/* the host's, or NULL: none */
	/* createStream; under owner->mu, as qbn_ack reads them */
	char	   *stream;			/* the stream to make; NULL: none */
	char	   *stream_subject;
	bool		stream_wanted;	/* make it before the next publish */
	long		stream_retry_at;	/* after a failed or refused attempt */
	char		stream_error[QB_ERRLEN];	/* why the last attempt failed; "" */
	char		stream_note[300];	/* what the last refusal means; "" */
	QbNats	   *owner;
	struct QbnLink *next;
} QbnLink;

typedef struct QbnTicket
{
	const natsMsg *msg;			/* identity for the ack handler; NULL: core */
	QbnLink    *link;
	int			tag;
	long		deadline;
	bool		live;			/* in flight, not yet reported */
	bool		answered;		/* out holds the outcome */
	QbPubOutcome out;
} QbnTicket;

struct QbNats
{
	pthread_mutex_t mu;			/* tickets, nt, in_flight, pipe_w */
	int			pipe_r;
	int			pipe_w;
	QbnTicket  *tickets;
	int			nt;
	int			cap;
	int			in_flight;
	QbnLink    *links;
	struct QbNats *retired_next;	/* qbn_retired's chain */
};

/*
 * Destroyed instances, kept allocated (qbn_destroy) and reachable from
 * here, so a leak checker at exit does not count them.
 */
static QbNats *qbn_retired = NULL;
static pthread_mutex_t qbn_retired_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the ack handler: runs on a cnats thread ------------------------- */

/*
 * qbn_ack records one JetStream outcome in its ticket and wakes the engine.
 * It calls nothing of PostgreSQL's and never blocks beyond the mutex.
 */
static void
qbn_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure)
{
	QbnLink    *l = closure;
	QbNats	   *n = l->owner;
	const char *subj = natsMsg_GetSubject(msg);

	pthread_mutex_lock(&n->mu);
	for (int i = 0; i < n->nt; i++)
	{
		QbnTicket  *t = &n->tickets[i];

		if (!t->live || t->answered || t->msg != msg)
			continue;
		t->answered = true;
		t->out.ok = pae == NULL;
		t->out.permanent = false;
		if (pae == NULL)
			t->out.error[0] = '\0';
		else if (pae->Err == NATS_NO_RESPONDERS && l->stream != NULL)
		{
			l->stream_wanted = true;
			snprintf(t->out.error, sizeof(t->out.error),
					 "no JetStream stream captures subject %s; createStream: stream %s (subjects %s) is made before the next attempt%s%s",
					 subj, l->stream, l->stream_subject, l->stream_note[0] ? "; " : "", l->stream_note);
		}
		else if (pae->Err == NATS_NO_RESPONDERS)
			snprintf(t->out.error, sizeof(t->out.error),
					 "no JetStream stream captures subject %s; set createStream: true on the destination, or create a stream for it with a NATS client or a $JS.API.STREAM.CREATE request (docs/delivery.md, \"Creating the stream\"), or set jetstream: false (just after a server restart this also means JetStream is not up yet: the row is retried)",
					 subj);
		else if (pae->Err == NATS_TIMEOUT)
			snprintf(t->out.error, sizeof(t->out.error),
					 "no acknowledgement from JetStream for subject %s within %d ms",
					 subj, QBN_ACK_WAIT_MS);
		else
		{
			/* 10054: over the stream's maximum message size, for good */
			t->out.permanent = pae->ErrCode == 10054;
			snprintf(t->out.error, sizeof(t->out.error),
					 "JetStream refused the message on subject %s: %s (status %s, err_code %d)",
					 subj, pae->ErrText ? pae->ErrText : "",
					 natsStatus_GetText(pae->Err), (int) pae->ErrCode);
		}
		break;
	}
	if (n->pipe_w >= 0)
		(void) !write(n->pipe_w, "x", 1);	/* full pipe: already readable */
	pthread_mutex_unlock(&n->mu);
	natsMsg_Destroy(msg);		/* the handler owns it */
}

/* ---- links ------------------------------------------------------------ */

/*
 * qbn_connect opens a link's connection (and JetStream context) with every
 * signal blocked.  Reconnects go on forever, a few times a second: a
 * restarted server gets its publishes back without an engine round.  For
 * JetStream the reconnect buffer is (as good as) off: a publish during a
 * reconnect fails at once and is retried with backoff, instead of waiting
 * in a buffer for an ack that times out.
 */
static bool
qbn_connect(QbnLink *l)
{
	natsOptions *o = NULL;
	natsStatus	s;
	sigset_t	old;
	jsOptions	jo;
	char		url[256];
	char		why[QB_ERRLEN];

	/* cnats shows no one the address it connects to: judge them first */
	if (!qb_egress_resolve_ok(qb_egress_in_force(l->egress, l->host_egress), l->url, why, sizeof(why)))
	{
		qb_nats_redact(l->url, url, sizeof(url));
		snprintf(l->error, sizeof(l->error), "cannot connect to NATS at %.200s: %.250s", url, why);
		l->retry_at = qb_now_ms() + QBN_RETRY_CONNECT_MS;
		return false;
	}
	qb_nats_block_signals(&old);
	o = qb_nats_options(l->url, &s);
	if (s == NATS_OK && l->jetstream)
		s = natsOptions_SetReconnectBufSize(o, 1);
	if (s == NATS_OK)
		s = natsConnection_Connect(&l->nc, o);
	if (s == NATS_OK && l->jetstream)
	{
		jsOptions_Init(&jo);
		jo.PublishAsync.AckHandler = qbn_ack;
		jo.PublishAsync.AckHandlerClosure = l;
		s = natsConnection_JetStream(&l->js, l->nc, &jo);
	}
	qb_nats_restore_signals(&old);
	natsOptions_Destroy(o);
	if (s == NATS_OK)
		return true;

	qb_nats_status_text(s, why, sizeof(why));
	qb_nats_redact(l->url, url, sizeof(url));
	snprintf(l->error, sizeof(l->error), "cannot connect to NATS at %.200s: %.200s", url, why);
	if (l->nc != NULL)
	{
		natsConnection_Destroy(l->nc);
		l->nc = NULL;
	}
	l->retry_at = qb_now_ms() + QBN_RETRY_CONNECT_MS;
	return false;
}

/*
 * qbn_stream_settings gives the link the destination's createStream stream
 * (a changed one is wanted again); false when out of memory.
 */
static bool
qbn_stream_settings(QbNats *n, QbnLink *l, const QbDestination *d)
{
	const char *name = d->create_stream ? d->stream : NULL;
	char	   *stream = NULL;
	char	   *subject = NULL;

	if (name == NULL ? l->stream == NULL :
		l->stream != NULL && strcmp(l->stream, name) == 0 &&
		strcmp(l->stream_subject, d->stream_subject) == 0)
		return true;
	if (name != NULL &&
		((stream = strdup(name)) == NULL || (subject = strdup(d->stream_subject)) == NULL))
	{
		free(stream);
		return false;
	}
	pthread_mutex_lock(&n->mu);
	free(l->stream);
	free(l->stream_subject);
	l->stream = stream;
	l->stream_subject = subject;
	l->stream_wanted = stream != NULL;
	l->stream_retry_at = 0;
	l->stream_error[0] = l->stream_note[0] = '\0';
	pthread_mutex_unlock(&n->mu);
	return true;
}

/*
 * qbn_stream_ready makes the link's stream when it is wanted (see the
 * banner); false, with the reason in err, when the publish must wait.
 */
static bool
qbn_stream_ready(QbNats *n, QbnLink *l, char *err, size_t errlen)
{
	jsStreamConfig sc;
	jsStreamInfo *si = NULL;
	jsErrCode	jerr = 0;
	natsStatus	s;
	sigset_t	old;
	const char *subjects[1];
	char		desc[200];
	char		why[QB_ERRLEN];
	bool		wanted;

	pthread_mutex_lock(&n->mu);
	wanted = l->stream != NULL && l->stream_wanted;
	pthread_mutex_unlock(&n->mu);
	if (!wanted)
		return true;
	if (qb_now_ms() < l->stream_retry_at)
	{
		if (l->stream_error[0] == '\0')
			return true;		/* refused a moment ago: publish, the answer tells */
		snprintf(err, errlen, "%s", l->stream_error);
		return false;
	}

	jsStreamConfig_Init(&sc);
	subjects[0] = l->stream_subject;
	snprintf(desc, sizeof(desc), "made by QueueBox for destination %s (createStream: true)", l->name);
	sc.Name = l->stream;
	sc.Description = desc;
	sc.Subjects = subjects;
	sc.SubjectsLen = 1;
	sc.Retention = js_LimitsPolicy;
	sc.Storage = js_FileStorage;
	/* the request's reply subscription may start a cnats thread */
	qb_nats_block_signals(&old);
	s = js_AddStream(&si, l->js, &sc, NULL, &jerr);
	qb_nats_restore_signals(&old);
	jsStreamInfo_Destroy(si);

	pthread_mutex_lock(&n->mu);
	l->stream_error[0] = l->stream_note[0] = '\0';
	if (s == NATS_OK)
		l->stream_wanted = false;
	else if (jerr == JSStreamNameExistErr || jerr == JSStreamSubjectOverlapErr)
	{
		l->stream_wanted = false;
		l->stream_retry_at = qb_now_ms() + QBN_RETRY_CONNECT_MS;
		if (jerr == JSStreamNameExistErr)
			snprintf(l->stream_note, sizeof(l->stream_note),
					 "the last attempt found stream %s with other settings: add the subject to it, or delete it to have it made again",
					 l->stream);
		else
			snprintf(l->stream_note, sizeof(l->stream_note),
					 "the last attempt found another stream whose subjects overlap %s: add the subject to that stream",
					 l->stream_subject);
	}
	else
	{
		qb_nats_status_text(s, why, sizeof(why));
		l->stream_retry_at = qb_now_ms() + QBN_RETRY_CONNECT_MS;
		snprintf(l->stream_error, sizeof(l->stream_error),
				 "createStream: cannot make JetStream stream %s (subjects %s): %.200s (err_code %d); the row is retried",
				 l->stream, l->stream_subject, why, (int) jerr);
	}
	pthread_mutex_unlock(&n->mu);
	if (l->stream_error[0] == '\0')
		return true;
	snprintf(err, errlen, "%s", l->stream_error);
	return false;
}

/* qbn_link: the destination's connected link, or NULL with the reason. */
static QbnLink *
qbn_link(QbNats *n, const QbDestination *d, char *err, size_t errlen)
{
	QbnLink    *l;

	for (l = n->links; l != NULL; l = l->next)
		if (strcmp(l->name, d->name) == 0 && strcmp(l->url, d->broker_url) == 0 &&
			l->jetstream == d->jetstream)
			break;
	if (l == NULL)
	{
		if ((l = calloc(1, sizeof(QbnLink))) == NULL ||
			(l->name = strdup(d->name)) == NULL || (l->url = strdup(d->broker_url)) == NULL)
		{
			if (l != NULL)
				free(l->name);
			free(l);
			snprintf(err, errlen, "out of memory");
			return NULL;
		}
		l->jetstream = d->jetstream;
		l->owner = n;
		l->next = n->links;
		n->links = l;
	}
	/* the rules of the configuration in force (only this thread reads them) */
	if ((d->egress == NULL) != (l->egress == NULL) ||
		(d->egress != NULL && strcmp(d->egress->list, l->egress->list) != 0))
	{
		qb_egress_free(l->egress);
		l->egress = qb_egress_copy(d->egress);
	}
	l->host_egress = d->host_egress;
	if (!qbn_stream_settings(n, l, d))
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (l->nc != NULL)
		return l;
	if (qb_now_ms() >= l->retry_at && qbn_connect(l))
		return l;
	snprintf(err, errlen, "%s", l->error);
	return NULL;
}

/* ---- the message ------------------------------------------------------ */

/*
 * qbn_subject renders the destination's subject for a row (the row's topic
 * when none is set) and checks it is a literal NATS subject; NULL with the
 * reason otherwise.
 */
static char *
qbn_subject(const QbDestination *d, const QbMessage *m, bool *invalid, char *err, size_t errlen)
{
	static const char *const names[] = {"topic", "key", NULL};
	const char *values[] = {m->topic, m->key, NULL};
	char	   *s = d->target ? qb_template_render(d->target, names, values) : strdup(m->topic);
	const char *tok;

	*invalid = false;
	if (s == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	tok = s;
	for (const char *p = s;; p++)
	{
		if (*p == '.' || *p == '\0')
		{
			size_t		len = p - tok;

			if (len == 0 || (len == 1 && (*tok == '*' || *tok == '>')))
				break;
			if (*p == '\0')
				return s;
			tok = p + 1;
		}
		else if ((unsigned char) *p <= ' ' || *p == 0x7f)
			break;
	}
	snprintf(err, errlen,
			 "subject \"%.200s\" is not a valid NATS subject (non-empty dot-separated tokens, no spaces, no wildcards); check the destination's subject template and the row's topic and key",
			 s);
	*invalid = true;
	free(s);
	return NULL;
}

/* qbn_header_add: one kept row header into the message (the rule's callback) */
static bool
qbn_header_add(void *msg, const char *name, const char *value)
{
	return natsMsgHeader_Set(msg, name, value) == NATS_OK;
}

/* qbn_headers: see qb_pub_nats_int.h. */
QbHdrResult
qbn_headers(natsMsg *msg, const QbMessage *m, char *err, size_t errlen)
{
	QbHdrResult r = qb_hdr_each(QB_HDR_NATS, NULL, m->headers, qbn_header_add, msg, err, errlen);
	natsStatus	s;

	if (r != QB_HDR_OK)
		return r;
	if ((s = natsMsgHeader_Set(msg, QB_HDR_MESSAGE_ID_NATS, m->message_id)) != NATS_OK)
	{
		snprintf(err, errlen, "setting %s: %s", QB_HDR_MESSAGE_ID_NATS, natsStatus_GetText(s));
		return QB_HDR_FAILED;
	}
	return QB_HDR_OK;
}

/* qbn_ticket_add registers a publish before cnats can answer it; -1: no memory. */
static int
qbn_ticket_add(QbNats *n, QbnLink *l, const natsMsg *msg, int tag, long wait_ms)
{
	int			i = -1;

	pthread_mutex_lock(&n->mu);
	if (n->nt == n->cap)
	{
		int			cap = n->cap ? n->cap * 2 : 64;
		QbnTicket  *t = realloc(n->tickets, cap * sizeof(QbnTicket));

		if (t == NULL)
			goto out;
		n->tickets = t;
		n->cap = cap;
	}
	i = n->nt++;
	memset(&n->tickets[i], 0, sizeof(QbnTicket));
	n->tickets[i].out = (QbPubOutcome) QB_PUB_OUTCOME_INIT;
	n->tickets[i].msg = msg;
	n->tickets[i].link = l;
	n->tickets[i].tag = tag;
	n->tickets[i].deadline = qb_now_ms() + wait_ms;
	n->tickets[i].live = true;
	n->in_flight++;
out:
	pthread_mutex_unlock(&n->mu);
	return i;
}

static void
qbn_ticket_drop(QbNats *n, int i)
{
	pthread_mutex_lock(&n->mu);
	if (n->tickets[i].live)
	{
		n->tickets[i].live = false;
		n->in_flight--;
	}
	pthread_mutex_unlock(&n->mu);
}

/* ---- the ops ---------------------------------------------------------- */

static void *
qbn_create(char *err, size_t errlen)
{
	QbNats	   *n;
	int			fds[2];

	if (!qb_nats_open(err, errlen))
		return NULL;
	if ((n = calloc(1, sizeof(QbNats))) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "pipe2: %s", strerror(errno));
		free(n);
		return NULL;
	}
	pthread_mutex_init(&n->mu, NULL);
	n->pipe_r = fds[0];
	n->pipe_w = fds[1];
	return n;
}

/*
 * qbn_link_close closes a link's connection; the link itself stays (see
 * qbn_destroy) and connects again at its next publish.
 */
static void
qbn_link_close(QbnLink *l)
{
	if (l->nc != NULL)
		natsConnection_Close(l->nc);
	jsCtx_Destroy(l->js);
	l->js = NULL;
	natsConnection_Destroy(l->nc);
	l->nc = NULL;
	l->async_started = false;
	l->core_pending = 0;
}

/*
 * qbn_destroy closes every connection.  The QbNats and its links stay
 * allocated: a cnats thread may still be inside qbn_ack with a link as its
 * closure, and this runs only as the worker exits.  Closing the pipe under
 * the mutex keeps a late handler from writing to a reused fd.
 */
static void
qbn_destroy(void *p)
{
	QbNats	   *n = p;

	for (QbnLink *l = n->links; l != NULL; l = l->next)
		qbn_link_close(l);
	pthread_mutex_lock(&n->mu);
	n->nt = 0;
	n->in_flight = 0;
	close(n->pipe_r);
	close(n->pipe_w);
	n->pipe_r = n->pipe_w = -1;
	pthread_mutex_unlock(&n->mu);
	pthread_mutex_lock(&qbn_retired_mu);
	n->retired_next = qbn_retired;
	qbn_retired = n;
	pthread_mutex_unlock(&qbn_retired_mu);
}

/* qbn_message: the row as a message on subject, with its headers */
static QbPubStart
qbn_message(const char *subject, const QbMessage *m, natsMsg **msg, char *err, size_t errlen)
{
	natsStatus	s;

	if ((s = natsMsg_Create(msg, subject, NULL, m->body, (int) m->body_len)) != NATS_OK)
	{
		snprintf(err, errlen, "natsMsg_Create: %s", natsStatus_GetText(s));
		return QB_PUB_NOT_STARTED;
	}
	return qb_hdr_start(qbn_headers(*msg, m, err, errlen));
}

/*
 * qbn_send hands *msg to cnats under a ticket for tag: a JetStream publish
 * its ack handler answers, or a core publish the next flush answers.  *ti
 * is the ticket, -1 (with NATS_NO_MEMORY) when none could be made.
 */
static natsStatus
qbn_send(QbNats *n, QbnLink *l, natsMsg **msg, int tag, int *ti)
{
	natsStatus	s;

	if (l->jetstream)
	{
		jsPubOptions po;
		sigset_t	old;

		if ((*ti = qbn_ticket_add(n, l, *msg, tag, QBN_ACK_WAIT_MS + QBN_GRACE_MS)) < 0)
			return NATS_NO_MEMORY;
		jsPubOptions_Init(&po);
		po.MaxWait = QBN_ACK_WAIT_MS;
		/* the first async publish starts cnats's pub-ack thread */
		if (!l->async_started)
			qb_nats_block_signals(&old);
		s = js_PublishMsgAsync(l->js, msg, &po);	/* clears *msg when it takes it */
		if (!l->async_started)
		{
			qb_nats_restore_signals(&old);
			l->async_started = s == NATS_OK;
		}
		return s;
	}
	if ((*ti = qbn_ticket_add(n, l, NULL, tag, QBN_FLUSH_MS + QBN_GRACE_MS)) < 0)
		return NATS_NO_MEMORY;
	if ((s = natsConnection_PublishMsg(l->nc, *msg)) == NATS_OK)
		l->core_pending++;
	return s;
}

/* qbn_refused: cnats did not take the publish of ticket ti: why, and dead or retried */
static QbPubStart
qbn_refused(QbNats *n, QbnLink *l, int ti, natsStatus s, const char *subject,
			const QbMessage *m, char *err, size_t errlen)
{
	char		why[QB_ERRLEN];

	qbn_ticket_drop(n, ti);
	qb_nats_status_text(s, why, sizeof(why));
	if (s == NATS_MAX_PAYLOAD)
	{
		snprintf(err, errlen, "the message (%zu bytes) is over the NATS server's max_payload: %s",
				 m->body_len, why);
		return QB_PUB_ROW_INVALID;
	}
	snprintf(err, errlen, "publishing to NATS subject %s failed: %s%s", subject, why,
			 natsConnection_Status(l->nc) == NATS_CONN_STATUS_RECONNECTING ?
			 " (the connection to the server is down; cnats is reconnecting)" : "");
	return QB_PUB_NOT_STARTED;
}

/*
 * qbn_start: what the row becomes (subject, message, headers: refused for
 * good when it can never be sent), then the link, then the publish.
 */
static QbPubStart
qbn_start(void *p, const QbDestination *dest, const QbMessage *m, int tag,
		  char *err, size_t errlen)
{
	QbNats	   *n = p;
	QbnLink    *l;
	natsMsg    *msg = NULL;
	char	   *subject;
	bool		invalid;
	natsStatus	s;
	QbPubStart	rc;
	int			ti;

	if ((subject = qbn_subject(dest, m, &invalid, err, errlen)) == NULL)
		return invalid ? QB_PUB_ROW_INVALID : QB_PUB_NOT_STARTED;
	if ((rc = qbn_message(subject, m, &msg, err, errlen)) != QB_PUB_STARTED)
		goto done;
	if ((l = qbn_link(n, dest, err, errlen)) == NULL ||
		(l->jetstream && !qbn_stream_ready(n, l, err, errlen)))
	{
		rc = QB_PUB_NOT_STARTED;
		goto done;
	}
	if ((s = qbn_send(n, l, &msg, tag, &ti)) == NATS_OK)
		rc = QB_PUB_STARTED;
	else if (ti < 0)
	{
		snprintf(err, errlen, "out of memory");
		rc = QB_PUB_NOT_STARTED;
	}
	else
		rc = qbn_refused(n, l, ti, s, subject, m, err, errlen);

done:
	natsMsg_Destroy(msg);		/* no-op once cnats took it */
	free(subject);
	return rc;
}

static int
qbn_in_flight(void *p)
{
	QbNats	   *n = p;
	int			k;

	pthread_mutex_lock(&n->mu);
	k = n->in_flight;
	pthread_mutex_unlock(&n->mu);
	return k;
}

static int
qbn_fd(void *p)
{
	return ((QbNats *) p)->pipe_r;
}

static long
qbn_timeout_ms(void *p)
{
	QbNats	   *n = p;
	long		now = qb_now_ms();
	long		best = -1;

	for (QbnLink *l = n->links; l != NULL; l = l->next)
		if (l->core_pending > 0)
			return 0;			/* perform flushes them */
	pthread_mutex_lock(&n->mu);
	for (int i = 0; i < n->nt; i++)
		if (n->tickets[i].live)
		{
			long		ms = n->tickets[i].deadline - now;

			if (ms < 0)
				ms = 0;
			if (best < 0 || ms < best)
				best = ms;
		}
	pthread_mutex_unlock(&n->mu);
	return best;
}

/*
 * qbn_flush confirms a link's core publishes with one bounded flush; the
 * only wait on the engine's thread, at most QBN_FLUSH_MS per link and batch.
 */
static void
qbn_flush(QbNats *n, QbnLink *l)
{
	natsStatus	s = natsConnection_FlushTimeout(l->nc, QBN_FLUSH_MS);
	char		why[QB_ERRLEN];
	char		url[256];

	qb_nats_status_text(s, why, sizeof(why));
	qb_nats_redact(l->url, url, sizeof(url));
	l->core_pending = 0;
	pthread_mutex_lock(&n->mu);
	for (int i = 0; i < n->nt; i++)
	{
		QbnTicket  *t = &n->tickets[i];

		if (!t->live || t->answered || t->link != l || t->msg != NULL)
			continue;
		t->answered = true;
		t->out.ok = s == NATS_OK;
		if (s != NATS_OK)
			snprintf(t->out.error, sizeof(t->out.error),
					 "NATS server at %.200s did not confirm the publish within %d ms: %.150s",
					 url, QBN_FLUSH_MS, why);
	}
	pthread_mutex_unlock(&n->mu);
}

static void
qbn_perform(void *p, QbPubDone done, void *arg)
{
	QbNats	   *n = p;
	char		buf[256];
	long		now;
	int			nready = 0;
	int		   *tags = NULL;
	QbPubOutcome *outs = NULL;

	while (read(n->pipe_r, buf, sizeof(buf)) > 0)
		;
	for (QbnLink *l = n->links; l != NULL; l = l->next)
		if (l->core_pending > 0)
			qbn_flush(n, l);

	now = qb_now_ms();
	pthread_mutex_lock(&n->mu);
	if (n->in_flight > 0)
	{
		tags = malloc(n->nt * sizeof(int));
		outs = malloc(n->nt * sizeof(QbPubOutcome));
	}
	if (tags != NULL && outs != NULL)
		for (int i = 0; i < n->nt; i++)
		{
			QbnTicket  *t = &n->tickets[i];

			if (!t->live)
				continue;
			if (!t->answered && now >= t->deadline)
			{
				/* cnats never called back: count the attempt as failed */
				t->out.ok = false;
				t->out.permanent = false;
				snprintf(t->out.error, sizeof(t->out.error),
						 "no answer from NATS within %d ms", QBN_ACK_WAIT_MS + QBN_GRACE_MS);
				t->answered = true;
			}
			if (!t->answered)
				continue;
			t->live = false;
			n->in_flight--;
			tags[nready] = t->tag;
			outs[nready++] = t->out;
		}
	if (n->in_flight == 0)
		n->nt = 0;
	pthread_mutex_unlock(&n->mu);

	/* report outside the mutex: done() belongs to the engine */
	for (int i = 0; i < nready; i++)
		done(arg, tags[i], &outs[i]);
	free(tags);
	free(outs);
}

/*
 * qbn_abort_all forgets every publish in flight; their late acks find no
 * ticket and are dropped, and a message that did land is deduplicated when
 * the row is published again.
 */
static void
qbn_abort_all(void *p)
{
	QbNats	   *n = p;

	for (QbnLink *l = n->links; l != NULL; l = l->next)
		l->core_pending = 0;
	pthread_mutex_lock(&n->mu);
	n->nt = 0;
	n->in_flight = 0;
	pthread_mutex_unlock(&n->mu);
}

/*
 * qbn_prune closes the connections of destinations gone from cfg (or whose
 * url or jetstream changed).  The link stays allocated, as in qbn_destroy,
 * and connects again if a destination like it comes back.
 */
static void
qbn_prune(void *p, const QbConfig *cfg)
{
	QbNats	   *n = p;

	for (QbnLink *l = n->links; l != NULL; l = l->next)
	{
		const QbDestination *d = qb_pubset_dest(cfg, QB_DEST_NATS, l->name);
		bool		busy = false;

		if (l->nc == NULL ||
			(d != NULL && strcmp(d->broker_url, l->url) == 0 && d->jetstream == l->jetstream))
			continue;
		pthread_mutex_lock(&n->mu);
		for (int i = 0; i < n->nt; i++)
			busy |= n->tickets[i].live && n->tickets[i].link == l;
		pthread_mutex_unlock(&n->mu);
		if (!busy)
			qbn_link_close(l);
	}
}

const QbPublisherOps qb_nats_publisher = {
	.type = QB_DEST_NATS,
	.create = qbn_create,
	.destroy = qbn_destroy,
	.start = qbn_start,
	.in_flight = qbn_in_flight,
	.fd = qbn_fd,
	.timeout_ms = qbn_timeout_ms,
	.perform = qbn_perform,
	.abort_all = qbn_abort_all,
	.prune = qbn_prune,
};
