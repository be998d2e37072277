/*-------------------------------------------------------------------------
 * qb_pub_amqp.c
 *	  The RabbitMQ publisher: librabbitmq-c 0.11, publisher confirms, one
 *	  connection and channel per destination, driven from the engine's
 *	  thread without blocking while messages are in flight.
 *
 * Wording: see qb_pub_amqp.h.  An outcome known outside perform() (a
 * connection found closed while starting a publish) waits in the done list
 * for the next perform(), and counts as in flight until then.
 *
 * Outcomes: basic.ack is delivered, unless a basic.return for the message
 * (found by its message_id) came first: unroutable.  basic.nack, a
 * channel.close or connection.close, a failing socket, or no confirm within
 * QBA_CONFIRM_TIMEOUT_MS fail the attempt; a closed connection is opened
 * again by the next publish (README.md).
 *
 * Waiting: fd() is a private epoll set of every connection's socket;
 * timeout_ms() is 0 while librabbitmq holds buffered frames.  Connecting is
 * bounded and backs off after a failure; a connection.blocked connection
 * gets no publish.  No thread is created: librabbitmq has none.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <jansson.h>
#include <openssl/ssl.h>

#include "qb_clock.h"
#include "qb_extract.h"
#include "qb_pub_amqp.h"
#include "qb_pub_amqp_int.h"

#ifndef QB_VERSION
#define QB_VERSION "dev"
#endif

#define QBA_CHANNEL				1
#define QBA_FRAME_MAX			131072
#define QBA_CONFIRM_TIMEOUT_MS	30000
#define QBA_BLOCKED_WAIT_MS		5000	/* confirm wait once blocked */
#define QBA_POLL_MS				100
#define QBA_CLOSE_TIMEOUT_MS	1000
#define QBA_BACKOFF_MIN_MS		200
#define QBA_BACKOFF_MAX_MS		10000
#define QBA_SHORTSTR_MAX		255

/* ---- the headers table --------------------------------------------------- */

void
qb_amqp_headers_free(QbAmqpHeaders *h)
{
	for (int i = 0; i < h->table.num_entries; i++)
	{
		free(h->table.entries[i].key.bytes);
		free(h->table.entries[i].value.value.bytes.bytes);
	}
	free(h->table.entries);
	memset(h, 0, sizeof(*h));
}

/* qbpa_header_add: one kept row header into the table (the rule's callback) */
static bool
qbpa_header_add(void *arg, const char *name, const char *value)
{
	QbAmqpHeaders *h = arg;
	amqp_table_entry_t *e = &h->table.entries[h->table.num_entries];
	char	   *k = strdup(name);
	char	   *v = strdup(value);

	if (k == NULL || v == NULL)
	{
		free(k);
		free(v);
		return false;
	}
	e->key = amqp_cstring_bytes(k);
	e->value.kind = AMQP_FIELD_KIND_UTF8;
	e->value.value.bytes = amqp_cstring_bytes(v);
	h->table.num_entries++;
	if (h->correlation_id == NULL && strcasecmp(name, "X-Correlation-Id") == 0 &&
		strlen(v) <= QBA_SHORTSTR_MAX)
		h->correlation_id = v;
	return true;
}

/* qb_amqp_headers_build: see qb_pub_amqp_int.h. */
QbHdrResult
qb_amqp_headers_build(const json_t *row_headers, QbAmqpHeaders *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	if (row_headers == NULL || json_object_size(row_headers) == 0)
		return QB_HDR_OK;
	out->table.entries = calloc(json_object_size(row_headers), sizeof(amqp_table_entry_t));
	if (out->table.entries == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return QB_HDR_FAILED;
	}
	return qb_hdr_each(QB_HDR_AMQP, NULL, row_headers, qbpa_header_add, out, err, errlen);
}

/* ---- the publisher -------------------------------------------------------- */

typedef struct QbaPending
{
	int			tag;			/* the engine's tag (row index) */
	uint64_t	dtag;			/* the channel's delivery tag */
	char	   *message_id;
	char	   *returned;		/* why the broker returned it, or NULL */
	long		deadline_ms;	/* no confirm by then: failed */
	struct QbaPending *next;
} QbaPending;

typedef struct QbaDone
{
	int			tag;
	QbPubOutcome out;
	struct QbaDone *next;
} QbaDone;

typedef struct QbaConn
{
	char	   *name;			/* the destination's name ... */
	char	   *url;			/* ... and url: the key */
	QbAmqpUrl	u;
	char		where[320];		/* "rabbitmq host:port vhost /", for messages */

	amqp_connection_state_t amqp;	/* NULL: not connected */
	int			fd;				/* the socket in the epoll set, or -1 */
	uint64_t	next_dtag;

	QbaPending *head;			/* unconfirmed, in delivery tag order */
	QbaPending *tail;
	int			npending;

	/* a basic.return in progress: its header and body frames follow */
	int			ret_state;		/* 0 none, 1 header expected, 2 body */
	uint64_t	ret_left;
	char		ret_why[QB_ERRLEN];

	bool		blocked;		/* connection.blocked until unblocked */
	char		blocked_why[QB_ERRLEN];

	/* after a failed connect: publishes fail at once until retry_at_ms */
	long		retry_at_ms;
	long		backoff_ms;
	char		down_why[QB_ERRLEN];

	struct QbaConn *next;
} QbaConn;

typedef struct QbAmqp
{
	int			epfd;
	QbaConn    *conns;
	QbaDone    *done_head;
	QbaDone    *done_tail;
	int			ndone;
} QbAmqp;


/* qbpa_report queues an outcome for the next perform. */
static void
qbpa_report(QbAmqp *a, int tag, bool ok, const char *why)
{
	QbaDone    *d = calloc(1, sizeof(QbaDone));

	if (d == NULL)
		return;					/* the lease will bring the row back */
	d->tag = tag;
	d->out = (QbPubOutcome) QB_PUB_OUTCOME_INIT;
	d->out.ok = ok;
	if (why != NULL)
		snprintf(d->out.error, sizeof(d->out.error), "%s", why);
	if (a->done_tail)
		a->done_tail->next = d;
	else
		a->done_head = d;
	a->done_tail = d;
	a->ndone++;
}

static void
qbpa_pending_free(QbaPending *m)
{
	free(m->message_id);
	free(m->returned);
	free(m);
}

/* qbpa_settle_head takes the first unconfirmed message off and reports it. */
static void
qbpa_settle_head(QbAmqp *a, QbaConn *c, bool ok, const char *why)
{
	QbaPending *m = c->head;

	c->head = m->next;
	if (c->head == NULL)
		c->tail = NULL;
	c->npending--;
	if (ok && m->returned != NULL)
		qbpa_report(a, m->tag, false, m->returned);
	else
		qbpa_report(a, m->tag, ok, why);
	qbpa_pending_free(m);
}

/* qbpa_fail_all: every unconfirmed message of c is a failed attempt. */
static void
qbpa_fail_all(QbAmqp *a, QbaConn *c, const char *why)
{
	while (c->head != NULL)
		qbpa_settle_head(a, c, false, why);
	c->ret_state = 0;
}

/* qbpa_drop_all: forget every unconfirmed message of c (a stop). */
static void
qbpa_drop_all(QbaConn *c)
{
	while (c->head != NULL)
	{
		QbaPending *m = c->head;

		c->head = m->next;
		qbpa_pending_free(m);
	}
	c->tail = NULL;
	c->npending = 0;
	c->ret_state = 0;
}

/*
 * qbpa_disconnect closes c's connection.  graceful: say connection.close and
 * wait (bounded) for close-ok, for a connection that is still sound; else
 * just drop the socket.  Unconfirmed messages must be settled before.
 */
static void
qbpa_disconnect(QbAmqp *a, QbaConn *c, bool graceful)
{
	if (c->amqp == NULL)
		return;
	if (c->fd >= 0)
		epoll_ctl(a->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	c->fd = -1;
	if (graceful)
	{
		struct timeval tv;

		qb_amqp_tv(&tv, QBA_CLOSE_TIMEOUT_MS);
		amqp_set_rpc_timeout(c->amqp, &tv);
		amqp_connection_close(c->amqp, AMQP_REPLY_SUCCESS);
	}
	amqp_destroy_connection(c->amqp);
	c->amqp = NULL;
	c->blocked = false;
	c->ret_state = 0;
}

/* qbpa_lost: the connection is unusable: fail what is unconfirmed, close it. */
static void
qbpa_lost(QbAmqp *a, QbaConn *c, const char *why, bool graceful)
{
	qbpa_fail_all(a, c, why);
	qbpa_disconnect(a, c, graceful);
}

static void
qbpa_conn_free(QbAmqp *a, QbaConn *c)
{
	qbpa_drop_all(c);
	qbpa_disconnect(a, c, true);
	qb_amqp_url_free(&c->u);
	free(c->name);
	free(c->url);
	free(c);
}

static void *
qbpa_create(char *err, size_t errlen)
{
	QbAmqp	   *a = calloc(1, sizeof(QbAmqp));

	if (a == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if ((a->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
	{
		snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
		free(a);
		return NULL;
	}
	return a;
}

static void
qbpa_done_clear(QbAmqp *a)
{
	while (a->done_head != NULL)
	{
		QbaDone    *d = a->done_head;

		a->done_head = d->next;
		free(d);
	}
	a->done_tail = NULL;
	a->ndone = 0;
}

static void
qbpa_destroy(void *p)
{
	QbAmqp	   *a = p;

	if (a == NULL)
		return;
	while (a->conns != NULL)
	{
		QbaConn    *c = a->conns;

		a->conns = c->next;
		qbpa_conn_free(a, c);
	}
	qbpa_done_clear(a);
	close(a->epfd);
	free(a);
}

/* qbpa_prune closes the connections of destinations gone from cfg. */
static void
qbpa_prune(void *p, const QbConfig *cfg)
{
	QbAmqp	   *a = p;
	QbaConn   **pp = &a->conns;
	QbaConn    *c;

	while ((c = *pp) != NULL)
	{
		const QbDestination *d = qb_pubset_dest(cfg, QB_DEST_RABBITMQ, c->name);

		if (c->npending == 0 && (d == NULL || strcmp(c->url, d->broker_url) != 0))
		{
			*pp = c->next;
			qbpa_conn_free(a, c);
			continue;
		}
		pp = &c->next;
	}
}

/*
 * qbpa_conn_for finds the destination's connection, or makes an unconnected
 * one.  A connection of the same destination name with another url (the
 * configuration changed) is closed once it has nothing unconfirmed.
 */
static QbaConn *
qbpa_conn_for(QbAmqp *a, const QbDestination *dest, char *err, size_t errlen)
{
	QbaConn   **pp = &a->conns;
	QbaConn    *c;
	char		uerr[QB_ERRLEN];

	while ((c = *pp) != NULL)
	{
		if (strcmp(c->name, dest->name) == 0)
		{
			if (strcmp(c->url, dest->broker_url) == 0)
				return c;
			if (c->npending == 0)
			{
				*pp = c->next;
				qbpa_conn_free(a, c);
				continue;
			}
		}
		pp = &c->next;
	}
	c = calloc(1, sizeof(QbaConn));
	if (c == NULL || (c->name = strdup(dest->name)) == NULL ||
		(c->url = strdup(dest->broker_url)) == NULL)
	{
		if (c)
			free(c->name);
		free(c);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->fd = -1;
	uerr[0] = '\0';
	if (!qb_amqp_url_parse(dest->broker_url, &c->u, uerr, sizeof(uerr)))
	{
		snprintf(err, errlen, "destination \"%s\": bad url: %s", dest->name, uerr);
		qb_amqp_url_free(&c->u);
		free(c->name);
		free(c->url);
		free(c);
		return NULL;
	}
	c->u.egress = qb_egress_copy(dest->egress);
	c->u.host_egress = dest->host_egress;
	snprintf(c->where, sizeof(c->where), "rabbitmq %s%s%s:%d vhost %s",
			 strchr(c->u.host, ':') ? "[" : "", c->u.host,
			 strchr(c->u.host, ':') ? "]" : "", c->u.port, c->u.vhost);
	c->next = a->conns;
	a->conns = c;
	return c;
}

/* qbpa_connect opens c: socket, login, channel 1, confirm.select. */
static bool
qbpa_connect(QbAmqp *a, QbaConn *c, char *err, size_t errlen)
{
	amqp_rpc_reply_t r;
	char		cname[300];
	struct epoll_event ev = {.events = EPOLLIN};

	snprintf(cname, sizeof(cname), "queuebox " QB_VERSION " outbox, destination %s", c->name);
	if ((c->amqp = qb_amqp_login(&c->u, c->where, cname, true, QBA_FRAME_MAX, err, errlen)) == NULL)
		goto fail;
	amqp_channel_open(c->amqp, QBA_CHANNEL);
	r = amqp_get_rpc_reply(c->amqp);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		qb_amqp_rpc_error(c->where, r, "channel.open", err, errlen);
		goto fail;
	}
	amqp_confirm_select(c->amqp, QBA_CHANNEL);
	r = amqp_get_rpc_reply(c->amqp);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		qb_amqp_rpc_error(c->where, r, "confirm.select", err, errlen);
		goto fail;
	}
	c->fd = amqp_get_sockfd(c->amqp);
	ev.data.ptr = c;
	if (c->fd < 0 || epoll_ctl(a->epfd, EPOLL_CTL_ADD, c->fd, &ev) != 0)
	{
		snprintf(err, errlen, "%s: epoll_ctl: %s", c->where, strerror(errno));
		c->fd = -1;
		goto fail;
	}
	c->next_dtag = 1;
	c->blocked = false;
	c->ret_state = 0;
	c->backoff_ms = 0;
	c->retry_at_ms = 0;
	return true;

fail:
	amqp_destroy_connection(c->amqp);
	c->amqp = NULL;
	c->fd = -1;
	c->backoff_ms = c->backoff_ms == 0 ? QBA_BACKOFF_MIN_MS :
		(c->backoff_ms * 2 > QBA_BACKOFF_MAX_MS ? QBA_BACKOFF_MAX_MS : c->backoff_ms * 2);
	c->retry_at_ms = qb_now_ms() + c->backoff_ms;
	snprintf(c->down_why, sizeof(c->down_why), "%s", err);
	return false;
}

/* qbpa_pending_by_mid: the first unconfirmed, unreturned message with the id. */
static QbaPending *
qbpa_pending_by_mid(QbaConn *c, const char *mid, size_t len)
{
	for (QbaPending *m = c->head; m != NULL; m = m->next)
		if (m->returned == NULL && strlen(m->message_id) == len &&
			memcmp(m->message_id, mid, len) == 0)
			return m;
	return NULL;
}

/* qbpa_confirm settles what a basic.ack or basic.nack names. */
static void
qbpa_confirm(QbAmqp *a, QbaConn *c, uint64_t dtag, bool multiple, bool ack)
{
	static const char nack[] =
		"the broker refused the message (basic.nack): a queue it was routed to rejected it (e.g. x-overflow reject-publish on a full queue) or the broker could not store it";
	char		why[QB_ERRLEN];

	snprintf(why, sizeof(why), "%s: %s", c->where, nack);
	if (multiple)
	{
		while (c->head != NULL && c->head->dtag <= dtag)
			qbpa_settle_head(a, c, ack, ack ? NULL : why);
		return;
	}
	if (c->head != NULL && c->head->dtag == dtag)
	{
		qbpa_settle_head(a, c, ack, ack ? NULL : why);
		return;
	}
	/* out of order (RabbitMQ does not do that, but the protocol allows it) */
	for (QbaPending *prev = c->head; prev != NULL && prev->next != NULL; prev = prev->next)
		if (prev->next->dtag == dtag)
		{
			QbaPending *m = prev->next;

			prev->next = m->next;
			if (c->tail == m)
				c->tail = prev;
			c->npending--;
			if (ack && m->returned != NULL)
				qbpa_report(a, m->tag, false, m->returned);
			else
				qbpa_report(a, m->tag, ack, ack ? NULL : why);
			qbpa_pending_free(m);
			return;
		}
}

/*
 * qbpa_return_content: a header or body frame of the basic.return in
 * progress: the header's message_id names the returned message.
 */
static void
qbpa_return_content(QbaConn *c, const amqp_frame_t *f)
{
	if (f->channel != QBA_CHANNEL)
		return;
	if (f->frame_type == AMQP_FRAME_HEADER && c->ret_state == 1)
	{
		amqp_basic_properties_t *pr = f->payload.properties.decoded;
		QbaPending *m = NULL;

		if (pr != NULL && (pr->_flags & AMQP_BASIC_MESSAGE_ID_FLAG))
			m = qbpa_pending_by_mid(c, pr->message_id.bytes, pr->message_id.len);
		if (m != NULL)
			m->returned = strdup(c->ret_why);
		c->ret_left = f->payload.properties.body_size;
		c->ret_state = c->ret_left > 0 ? 2 : 0;
	}
	else if (f->frame_type == AMQP_FRAME_BODY && c->ret_state == 2)
	{
		size_t		len = f->payload.body_fragment.len;

		c->ret_left = len >= c->ret_left ? 0 : c->ret_left - len;
		if (c->ret_left == 0)
			c->ret_state = 0;
	}
}

/* qbpa_returned: a basic.return: why, kept for the content frames that follow */
static void
qbpa_returned(QbaConn *c, const amqp_basic_return_t *m)
{
	if (m->exchange.len == 0)
		snprintf(c->ret_why, sizeof(c->ret_why),
				 "%s: unroutable: no queue is named \"%.*s\" for the default exchange (the broker returned the mandatory message: %u %.*s)",
				 c->where, (int) m->routing_key.len, (char *) m->routing_key.bytes,
				 m->reply_code, (int) m->reply_text.len, (char *) m->reply_text.bytes);
	else
		snprintf(c->ret_why, sizeof(c->ret_why),
				 "%s: unroutable: no queue is bound to exchange \"%.*s\" with routing key \"%.*s\" (the broker returned the mandatory message: %u %.*s)",
				 c->where, (int) m->exchange.len, (char *) m->exchange.bytes,
				 (int) m->routing_key.len, (char *) m->routing_key.bytes,
				 m->reply_code, (int) m->reply_text.len, (char *) m->reply_text.bytes);
	c->ret_state = 1;
}

/*
 * qbpa_closed: the broker closed the channel or the connection: answer
 * close-ok, fail every unconfirmed message; the next publish opens a new
 * connection.
 */
static void
qbpa_closed(QbAmqp *a, QbaConn *c, const amqp_frame_t *f)
{
	char		why[QB_ERRLEN];

	if (f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD)
	{
		amqp_channel_close_t *m = f->payload.method.decoded;
		amqp_channel_close_ok_t ok = {0};

		snprintf(why, sizeof(why), "%s: the broker closed the channel: %u %.*s%s",
				 c->where, m->reply_code, (int) m->reply_text.len,
				 (char *) m->reply_text.bytes,
				 m->reply_code == 404 ? " (declare it, or fix the destination)" : "");
		amqp_send_method(c->amqp, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
		qbpa_lost(a, c, why, true);
	}
	else
	{
		amqp_connection_close_t *m = f->payload.method.decoded;
		amqp_connection_close_ok_t ok = {0};

		snprintf(why, sizeof(why), "%s: the broker closed the connection: %u %.*s",
				 c->where, m->reply_code, (int) m->reply_text.len,
				 (char *) m->reply_text.bytes);
		amqp_send_method(c->amqp, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
		qbpa_lost(a, c, why, false);
	}
}

/* qbpa_blocked: connection.blocked: no publish until unblocked */
static void
qbpa_blocked(QbaConn *c, const amqp_connection_blocked_t *m)
{
	long		soon = qb_now_ms() + QBA_BLOCKED_WAIT_MS;

	c->blocked = true;
	snprintf(c->blocked_why, sizeof(c->blocked_why), "%.*s",
			 (int) m->reason.len, (char *) m->reason.bytes);
	/* the broker reads nothing more: do not hold the batch long */
	for (QbaPending *p = c->head; p != NULL; p = p->next)
		if (p->deadline_ms > soon)
			p->deadline_ms = soon;
}

/*
 * qbpa_frame handles one frame.  Returns false when the connection was
 * closed (by the broker, or because it broke).
 */
static bool
qbpa_frame(QbAmqp *a, QbaConn *c, const amqp_frame_t *f)
{
	if (f->frame_type == AMQP_FRAME_HEADER || f->frame_type == AMQP_FRAME_BODY)
	{
		qbpa_return_content(c, f);
		return true;
	}
	if (f->frame_type != AMQP_FRAME_METHOD)
		return true;

	switch (f->payload.method.id)
	{
		case AMQP_BASIC_ACK_METHOD:
			{
				amqp_basic_ack_t *m = f->payload.method.decoded;

				qbpa_confirm(a, c, m->delivery_tag, m->multiple != 0, true);
				return true;
			}
		case AMQP_BASIC_NACK_METHOD:
			{
				amqp_basic_nack_t *m = f->payload.method.decoded;

				qbpa_confirm(a, c, m->delivery_tag, m->multiple != 0, false);
				return true;
			}
		case AMQP_BASIC_RETURN_METHOD:
			qbpa_returned(c, f->payload.method.decoded);
			return true;
		case AMQP_CHANNEL_CLOSE_METHOD:
		case AMQP_CONNECTION_CLOSE_METHOD:
			qbpa_closed(a, c, f);
			return false;
		case AMQP_CONNECTION_BLOCKED_METHOD:
			qbpa_blocked(c, f->payload.method.decoded);
			return true;
		case AMQP_CONNECTION_UNBLOCKED_METHOD:
			c->blocked = false;
			return true;
		default:
			return true;
	}
}

/*
 * qbpa_drain reads every frame that has arrived on c, without waiting.
 * Returns false when the connection is gone afterwards.
 */
static bool
qbpa_drain(QbAmqp *a, QbaConn *c)
{
	char		why[QB_ERRLEN];

	while (c->amqp != NULL)
	{
		amqp_frame_t f;
		struct timeval tv = {0, 0};
		int			rc;

		rc = amqp_simple_wait_frame_noblock(c->amqp, &f, &tv);
		if (rc == AMQP_STATUS_TIMEOUT)
		{
			if (amqp_frames_enqueued(c->amqp) || amqp_data_in_buffer(c->amqp))
				continue;
			amqp_maybe_release_buffers(c->amqp);
			return true;
		}
		if (rc != AMQP_STATUS_OK)
		{
			snprintf(why, sizeof(why), "%s: connection lost: %s", c->where,
					 amqp_error_string2(rc));
			qbpa_lost(a, c, why, false);
			return false;
		}
		if (!qbpa_frame(a, c, &f))
			return false;
		amqp_maybe_release_buffers(c->amqp);
	}
	return false;
}

/*
 * qbpa_routing_key: the destination's routingKey rendered for the row into
 * *rkey (malloc'd); QB_PUB_ROW_INVALID when it is over AMQP's 255 bytes.
 */
static QbPubStart
qbpa_routing_key(const QbDestination *dest, const QbMessage *msg, char **rkey,
				char *err, size_t errlen)
{
	const char *tmpl = dest->routing_key ? dest->routing_key : "{{ topic }}";
	const char *vals[3] = {msg->topic, msg->key, NULL};

	*rkey = qb_template_render(tmpl, qb_amqp_routing_key_names, vals);
	if (*rkey == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return QB_PUB_NOT_STARTED;
	}
	if (strlen(*rkey) > QBA_SHORTSTR_MAX)
	{
		snprintf(err, errlen,
				 "the routing key rendered from \"%.100s\" is %zu bytes; AMQP allows 255: shorten the row's topic or key, or change the destination's routingKey, then replay the row",
				 tmpl, strlen(*rkey));
		return QB_PUB_ROW_INVALID;
	}
	return QB_PUB_STARTED;
}

/*
 * qbpa_conn_ready: the destination's connection, open and not blocked, or
 * NULL with err (a failed connect waits for its backoff).
 */
static QbaConn *
qbpa_conn_ready(QbAmqp *a, const QbDestination *dest, char *err, size_t errlen)
{
	QbaConn    *c;

	if ((c = qbpa_conn_for(a, dest, err, errlen)) == NULL)
		return NULL;
	if (c->amqp != NULL)
		qbpa_drain(a, c);		/* notice a close that came while idle */
	if (c->amqp == NULL)
	{
		long		now = qb_now_ms();

		if (c->retry_at_ms > now)
		{
			snprintf(err, errlen, "%s (the next connection attempt is in %ld ms)",
					 c->down_why, c->retry_at_ms - now);
			return NULL;
		}
		if (!qbpa_connect(a, c, err, errlen))
			return NULL;
	}
	if (c->blocked)
	{
		snprintf(err, errlen,
				 "%s: the broker blocks publishing on this connection (connection.blocked: %s); a resource alarm (memory or disk) is raised on the broker",
				 c->where, c->blocked_why);
		return NULL;
	}
	return c;
}

/* qbpa_props: the message's properties (they point into msg and hdrs) */
static void
qbpa_props(amqp_basic_properties_t *props, const QbDestination *dest, const QbMessage *msg,
		  const QbAmqpHeaders *hdrs)
{
	memset(props, 0, sizeof(*props));
	props->_flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG |
		AMQP_BASIC_MESSAGE_ID_FLAG;
	props->content_type = amqp_cstring_bytes("application/json");
	props->delivery_mode = dest->persistent ? AMQP_DELIVERY_PERSISTENT : AMQP_DELIVERY_NONPERSISTENT;
	props->message_id = amqp_cstring_bytes(msg->message_id);
	if (hdrs->correlation_id != NULL)
	{
		props->_flags |= AMQP_BASIC_CORRELATION_ID_FLAG;
		props->correlation_id = amqp_cstring_bytes(hdrs->correlation_id);
	}
	if (hdrs->table.num_entries > 0)
	{
		props->_flags |= AMQP_BASIC_HEADERS_FLAG;
		props->headers = hdrs->table;
	}
}

/*
 * qbpa_publish: basic.publish on c, and the message unconfirmed until the
 * broker answers.  A failed write loses the connection.
 */
static QbPubStart
qbpa_publish(QbAmqp *a, QbaConn *c, const QbDestination *dest, const QbMessage *msg,
			const char *rkey, const amqp_basic_properties_t *props, int tag,
			char *err, size_t errlen)
{
	QbaPending *m;
	amqp_bytes_t body = {.len = msg->body_len, .bytes = (void *) msg->body};
	int			rc;

	if ((m = calloc(1, sizeof(QbaPending))) == NULL ||
		(m->message_id = strdup(msg->message_id)) == NULL)
	{
		free(m);
		snprintf(err, errlen, "out of memory");
		return QB_PUB_NOT_STARTED;
	}
	rc = amqp_basic_publish(c->amqp, QBA_CHANNEL, amqp_cstring_bytes(dest->target ? dest->target : ""),
							amqp_cstring_bytes(rkey), dest->mandatory ? 1 : 0, 0, props, body);
	if (rc != AMQP_STATUS_OK)
	{
		qbpa_pending_free(m);
		if (rc == AMQP_STATUS_TABLE_TOO_BIG)
		{
			/* nothing was written: the connection is still sound */
			snprintf(err, errlen, "the row's headers do not fit in an AMQP header frame (%s)",
					 amqp_error_string2(rc));
			return QB_PUB_ROW_INVALID;
		}
		snprintf(err, errlen, "%s: publish failed, connection lost: %s", c->where,
				 amqp_error_string2(rc));
		qbpa_lost(a, c, err, false);
		return QB_PUB_NOT_STARTED;
	}
	m->tag = tag;
	m->dtag = c->next_dtag++;
	m->deadline_ms = qb_now_ms() + QBA_CONFIRM_TIMEOUT_MS;
	if (c->tail)
		c->tail->next = m;
	else
		c->head = m;
	c->tail = m;
	c->npending++;
	return QB_PUB_STARTED;
}

/*
 * qbpa_start: what the row becomes (refused for good when it can never be
 * sent), then the connection, then the publish.
 */
static QbPubStart
qbpa_start(void *p, const QbDestination *dest, const QbMessage *msg, int tag,
		  char *err, size_t errlen)
{
	QbAmqp	   *a = p;
	QbaConn    *c;
	char	   *rkey = NULL;
	QbAmqpHeaders hdrs;
	amqp_basic_properties_t props;
	QbPubStart	result;

	memset(&hdrs, 0, sizeof(hdrs));
	if ((result = qbpa_routing_key(dest, msg, &rkey, err, errlen)) != QB_PUB_STARTED)
		goto out;
	if ((result = qb_hdr_start(qb_amqp_headers_build(msg->headers, &hdrs, err, errlen))) !=
		QB_PUB_STARTED)
		goto out;
	if (strlen(msg->message_id) > QBA_SHORTSTR_MAX)
	{
		snprintf(err, errlen, "the message id is longer than 255 bytes");
		result = QB_PUB_ROW_INVALID;
		goto out;
	}
	if ((c = qbpa_conn_ready(a, dest, err, errlen)) == NULL)
	{
		result = QB_PUB_NOT_STARTED;
		goto out;
	}
	qbpa_props(&props, dest, msg, &hdrs);
	result = qbpa_publish(a, c, dest, msg, rkey, &props, tag, err, errlen);

out:
	qb_amqp_headers_free(&hdrs);
	free(rkey);
	return result;
}

static int
qbpa_in_flight(void *p)
{
	QbAmqp	   *a = p;
	int			n = a->ndone;

	for (QbaConn *c = a->conns; c != NULL; c = c->next)
		n += c->npending;
	return n;
}

static int
qbpa_fd(void *p)
{
	return ((QbAmqp *) p)->epfd;
}

static long
qbpa_timeout_ms(void *p)
{
	QbAmqp	   *a = p;
	long		now = qb_now_ms();
	long		best = -1;

	if (a->ndone > 0)
		return 0;
	for (QbaConn *c = a->conns; c != NULL; c = c->next)
	{
		long		ms;

		if (c->amqp == NULL || c->npending == 0)
			continue;
		if (amqp_frames_enqueued(c->amqp) || amqp_data_in_buffer(c->amqp))
			return 0;
		ms = c->head->deadline_ms - now;
		if (ms < 0)
			ms = 0;
		if (ms > QBA_POLL_MS)
			ms = QBA_POLL_MS;
		if (best < 0 || ms < best)
			best = ms;
	}
	return best;
}

static void
qbpa_perform(void *p, QbPubDone done, void *arg)
{
	QbAmqp	   *a = p;
	long		now;
	QbaDone    *list;

	for (QbaConn *c = a->conns; c != NULL; c = c->next)
		if (c->amqp != NULL)
			qbpa_drain(a, c);
	now = qb_now_ms();
	for (QbaConn *c = a->conns; c != NULL; c = c->next)
	{
		char		why[QB_ERRLEN + 512];	/* c->where, a blocked_why, and words */

		if (c->head == NULL || c->head->deadline_ms > now)
			continue;
		if (c->blocked)
		{
			/*
			 * Keep the connection: a new one would be blocked too, and this
			 * one tells us when the alarm clears.  A late ack finds no
			 * message (tags are never reused) and is ignored.
			 */
			snprintf(why, sizeof(why),
					 "%s: no publisher confirm: the broker blocks publishing on this connection (connection.blocked: %s); a resource alarm (memory or disk) is raised on the broker",
					 c->where, c->blocked_why);
			qbpa_fail_all(a, c, why);
		}
		else
		{
			snprintf(why, sizeof(why), "%s: no publisher confirm within %d ms; the connection is reopened",
					 c->where, QBA_CONFIRM_TIMEOUT_MS);
			qbpa_lost(a, c, why, false);
		}
	}

	/* report: detach the list first, done() may lead to new publishes */
	list = a->done_head;
	a->done_head = a->done_tail = NULL;
	a->ndone = 0;
	while (list != NULL)
	{
		QbaDone    *d = list;

		list = d->next;
		done(arg, d->tag, &d->out);
		free(d);
	}
}

/*
 * qbpa_abort_all: a stop.  Unconfirmed messages are forgotten and their
 * connections dropped, so a late ack can never be taken for another one.
 */
static void
qbpa_abort_all(void *p)
{
	QbAmqp	   *a = p;

	for (QbaConn *c = a->conns; c != NULL; c = c->next)
		if (c->npending > 0)
		{
			qbpa_drop_all(c);
			qbpa_disconnect(a, c, false);
		}
	qbpa_done_clear(a);
}

const QbPublisherOps qb_amqp_publisher = {
	.type = QB_DEST_RABBITMQ,
	.create = qbpa_create,
	.destroy = qbpa_destroy,
	.start = qbpa_start,
	.in_flight = qbpa_in_flight,
	.fd = qbpa_fd,
	.timeout_ms = qbpa_timeout_ms,
	.perform = qbpa_perform,
	.abort_all = qbpa_abort_all,
	.prune = qbpa_prune,
};
