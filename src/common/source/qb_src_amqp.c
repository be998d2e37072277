/*-------------------------------------------------------------------------
 * qb_src_amqp.c
 *	  The RabbitMQ source consumer (librabbitmq-c 0.11): one connection,
 *	  channel 1, basic.qos(prefetch) and basic.consume(queue, no_ack=false);
 *	  the consumer engine (qb_consume.c) stores the deliveries in the inbox.
 *
 * Wording:
 *	- A delivery's handle is its AMQP delivery tag; its body the content,
 *	  its headers the headers table as a JSON object of strings (a value
 *	  that is not a string: its text, e.g. 42 or true), its message_id and
 *	  type the properties of those names.
 *	- The queue is consumed, never declared: it must exist.
 *
 * Rules: fd() is the socket, and fetch() reads the frames librabbitmq
 * buffered without blocking.  ack() is one basic.ack multiple=true on the
 * batch's highest tag, after the rows committed; release() one basic.nack
 * multiple=true requeue=true.  An ack or nack that cannot be sent marks the
 * connection dead, and a channel.close or connection.close makes fetch()
 * return -1 with the broker's text; the engine then reopens (README.md).
 * No thread is created: librabbitmq has none.
 *-------------------------------------------------------------------------
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <jansson.h>

#include "qb_amqp.h"
#include "qb_src_amqp.h"
#include "qb_src_amqp_int.h"
#include "qb_utf8.h"

#ifndef QB_VERSION
#define QB_VERSION "dev"
#endif

#define QBSA_CHANNEL		1
#define QBSA_FRAME_MAX		131072
#define QBSA_CLOSE_TIMEOUT_MS 1000

typedef struct QbsaConsumer
{
	amqp_connection_state_t amqp;
	QbAmqpUrl	u;
	char		where[400];		/* "rabbitmq host:port vhost /, queue q" */
	bool		dead;			/* the connection or channel is gone */
} QbsaConsumer;

static void qbsa_close(void *p);

/* ---- deliveries -------------------------------------------------------- */

/* qbsa_strdup: a NUL-terminated copy of AMQP bytes; NULL when empty/oom. */
static char *
qbsa_bytes(amqp_bytes_t b)
{
	char	   *s;

	if (b.len == 0 || (s = malloc(b.len + 1)) == NULL)
		return NULL;
	memcpy(s, b.bytes, b.len);
	s[b.len] = '\0';
	return s;
}

/* qbsa_text: AMQP bytes that can be stored as a JSON string (UTF-8, no NUL)? */
static bool
qbsa_text(amqp_bytes_t b)
{
	return qb_utf8_invalid_at(b.bytes, b.len) < 0;
}

/*
 * qbsa_value: a field value as a JSON string (strings as they are); NULL for
 * one that is left out: a string that is not UTF-8 or holds a NUL (it
 * cannot be a JSON string PostgreSQL stores), and the kinds skipped below.
 */
static json_t *
qbsa_value(const amqp_field_value_t *v)
{
	char		buf[64];

	switch (v->kind)
	{
		case AMQP_FIELD_KIND_UTF8:
		case AMQP_FIELD_KIND_BYTES:
			if (!qbsa_text(v->value.bytes))
				return NULL;
			return json_stringn_nocheck(v->value.bytes.bytes, v->value.bytes.len);
		case AMQP_FIELD_KIND_BOOLEAN:
			return json_string(v->value.boolean ? "true" : "false");
		case AMQP_FIELD_KIND_I8:
			snprintf(buf, sizeof(buf), "%d", (int) v->value.i8);
			break;
		case AMQP_FIELD_KIND_U8:
			snprintf(buf, sizeof(buf), "%u", (unsigned) v->value.u8);
			break;
		case AMQP_FIELD_KIND_I16:
			snprintf(buf, sizeof(buf), "%d", (int) v->value.i16);
			break;
		case AMQP_FIELD_KIND_U16:
			snprintf(buf, sizeof(buf), "%u", (unsigned) v->value.u16);
			break;
		case AMQP_FIELD_KIND_I32:
			snprintf(buf, sizeof(buf), "%" PRId32, v->value.i32);
			break;
		case AMQP_FIELD_KIND_U32:
			snprintf(buf, sizeof(buf), "%" PRIu32, v->value.u32);
			break;
		case AMQP_FIELD_KIND_I64:
		case AMQP_FIELD_KIND_TIMESTAMP:
			snprintf(buf, sizeof(buf), "%" PRId64, v->value.i64);
			break;
		case AMQP_FIELD_KIND_U64:
			snprintf(buf, sizeof(buf), "%" PRIu64, v->value.u64);
			break;
		case AMQP_FIELD_KIND_F32:
			snprintf(buf, sizeof(buf), "%g", (double) v->value.f32);
			break;
		case AMQP_FIELD_KIND_F64:
			snprintf(buf, sizeof(buf), "%g", v->value.f64);
			break;
		default:
			return NULL;		/* void, decimal, table, array: skipped */
	}
	return json_string(buf);
}

/* qbsa_headers: see qb_src_amqp_int.h. */
char *
qbsa_headers(const amqp_basic_properties_t *p, bool *oom)
{
	json_t	   *o;
	char	   *text;

	*oom = false;
	if (!(p->_flags & AMQP_BASIC_HEADERS_FLAG) || p->headers.num_entries == 0)
		return NULL;
	/* json_pack: the postgres executable exports a json_object of its own */
	if ((o = json_pack("{}")) == NULL)
		goto oom;
	for (int i = 0; i < p->headers.num_entries; i++)
	{
		const amqp_table_entry_t *e = &p->headers.entries[i];
		char	   *key;
		json_t	   *v;

		/* a name that is not UTF-8 (or holds a NUL) cannot be a JSON key: left out */
		if (e->key.len == 0 || !qbsa_text(e->key))
			continue;
		if ((key = qbsa_bytes(e->key)) == NULL)
			goto oom;
		v = qbsa_value(&e->value);
		if (v != NULL && json_object_set_new(o, key, v) != 0)
		{
			free(key);
			goto oom;
		}
		free(key);
	}
	if ((text = json_dumps(o, JSON_COMPACT)) == NULL)
		goto oom;
	json_decref(o);
	return text;

oom:
	json_decref(o);
	*oom = true;
	return NULL;
}

/* qbsa_fill copies one envelope into a delivery; false: out of memory. */
static bool
qbsa_fill(const amqp_envelope_t *env, QbDelivery *d)
{
	const amqp_basic_properties_t *p = &env->message.properties;
	bool		oom;

	memset(d, 0, sizeof(*d));
	if ((d->body = malloc(env->message.body.len + 1)) == NULL)
		goto oom;
	if (env->message.body.len > 0)
		memcpy(d->body, env->message.body.bytes, env->message.body.len);
	d->body[env->message.body.len] = '\0';
	d->len = env->message.body.len;
	d->headers = qbsa_headers(p, &oom);
	if (oom)
		goto oom;
	if ((p->_flags & AMQP_BASIC_MESSAGE_ID_FLAG) && p->message_id.len > 0 &&
		(d->message_id = qbsa_bytes(p->message_id)) == NULL)
		goto oom;
	if ((p->_flags & AMQP_BASIC_TYPE_FLAG) && p->type.len > 0 &&
		(d->type = qbsa_bytes(p->type)) == NULL)
		goto oom;
	d->handle = env->delivery_tag;
	return true;

oom:
	qb_deliveries_clear(d, 1);
	return false;
}

/* ---- the ops ----------------------------------------------------------- */

static void *
qbsa_open(const QbSource *src, char *err, size_t errlen)
{
	QbsaConsumer *c;
	amqp_rpc_reply_t r;
	char		cname[300];

	if ((c = calloc(1, sizeof(QbsaConsumer))) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (!qb_amqp_url_parse(src->broker_url, &c->u, err, errlen))
		goto err;
	c->u.host_egress = src->host_egress;
	snprintf(c->where, sizeof(c->where), "rabbitmq %s:%d vhost %s, queue %s",
			 c->u.host, c->u.port, c->u.vhost, src->queue);
	snprintf(cname, sizeof(cname), "queuebox " QB_VERSION " inbox, source %s", src->name);
	if ((c->amqp = qb_amqp_login(&c->u, c->where, cname, false, QBSA_FRAME_MAX,
								 err, errlen)) == NULL)
		goto err;
	amqp_channel_open(c->amqp, QBSA_CHANNEL);
	r = amqp_get_rpc_reply(c->amqp);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		qb_amqp_rpc_error(c->where, r, "channel.open", err, errlen);
		goto err;
	}
	amqp_basic_qos(c->amqp, QBSA_CHANNEL, 0,
				   (uint16_t) (src->prefetch > 0 && src->prefetch <= 65535 ? src->prefetch : 100), 0);
	r = amqp_get_rpc_reply(c->amqp);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		qb_amqp_rpc_error(c->where, r, "basic.qos", err, errlen);
		goto err;
	}
	amqp_basic_consume(c->amqp, QBSA_CHANNEL, amqp_cstring_bytes(src->queue),
					   amqp_cstring_bytes(cname), 0, 0, 0, amqp_empty_table);
	r = amqp_get_rpc_reply(c->amqp);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		qb_amqp_rpc_error(c->where, r, "basic.consume", err, errlen);
		goto err;
	}
	return c;

err:
	c->dead = true;				/* a failed RPC may have closed it */
	qbsa_close(c);
	return NULL;
}

/*
 * qbsa_close closes the connection: the broker requeues what was delivered
 * and not acknowledged.
 */
static void
qbsa_close(void *p)
{
	QbsaConsumer *c = p;

	if (c == NULL)
		return;
	if (c->amqp != NULL)
	{
		if (!c->dead)
		{
			struct timeval tv;

			qb_amqp_tv(&tv, QBSA_CLOSE_TIMEOUT_MS);
			amqp_set_rpc_timeout(c->amqp, &tv);
			amqp_connection_close(c->amqp, AMQP_REPLY_SUCCESS);
		}
		amqp_destroy_connection(c->amqp);
	}
	qb_amqp_url_free(&c->u);
	free(c);
}

static int
qbsa_fd(void *p)
{
	QbsaConsumer *c = p;

	return c->amqp != NULL ? amqp_get_sockfd(c->amqp) : -1;
}

/* qbsa_closed: the broker closed the channel or the connection (frame f). */
static int
qbsa_closed(QbsaConsumer *c, const amqp_frame_t *f, char *err, size_t errlen)
{
	amqp_rpc_reply_t r = {0};

	r.reply_type = AMQP_RESPONSE_SERVER_EXCEPTION;
	r.reply = f->payload.method;
	qb_amqp_rpc_error(c->where, r, "consuming", err, errlen);
	if (f->payload.method.id == AMQP_CHANNEL_CLOSE_METHOD)
		amqp_send_method(c->amqp, f->channel, AMQP_CHANNEL_CLOSE_OK_METHOD,
						 &(amqp_channel_close_ok_t) {0});
	else
		amqp_send_method(c->amqp, 0, AMQP_CONNECTION_CLOSE_OK_METHOD,
						 &(amqp_connection_close_ok_t) {0});
	c->dead = true;
	return -1;
}

static int
qbsa_fetch(void *p, QbDelivery *out, int max, char *err, size_t errlen)
{
	QbsaConsumer *c = p;
	int			k = 0;

	if (c->dead)
	{
		snprintf(err, errlen, "%s: the connection is closed", c->where);
		return -1;
	}
	while (k < max)
	{
		struct timeval zero = {0, 0};
		amqp_envelope_t env;
		amqp_rpc_reply_t r;

		amqp_maybe_release_buffers(c->amqp);
		r = amqp_consume_message(c->amqp, &env, &zero, 0);
		if (r.reply_type == AMQP_RESPONSE_NORMAL)
		{
			if (qbsa_fill(&env, &out[k]))
				k++;
			else				/* out of memory: give it back rather than drop it */
				amqp_basic_nack(c->amqp, QBSA_CHANNEL, env.delivery_tag, 0, 1);
			amqp_destroy_envelope(&env);
			continue;
		}
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
			r.library_error == AMQP_STATUS_TIMEOUT)
			break;				/* nothing complete is waiting */
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
			r.library_error == AMQP_STATUS_UNEXPECTED_STATE)
		{
			/* a frame other than basic.deliver: a close, or one to skip */
			amqp_frame_t f;
			int			rc = amqp_simple_wait_frame_noblock(c->amqp, &f, &zero);

			if (rc == AMQP_STATUS_TIMEOUT)
				break;
			if (rc != AMQP_STATUS_OK)
			{
				snprintf(err, errlen, "%s: reading from the broker failed: %s",
						 c->where, amqp_error_string2(rc));
				c->dead = true;
				goto fail;
			}
			if (f.frame_type == AMQP_FRAME_METHOD &&
				(f.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD ||
				 f.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD))
			{
				qbsa_closed(c, &f, err, errlen);
				goto fail;
			}
			continue;			/* basic.cancel-ok, heartbeats ... */
		}
		if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION)
			snprintf(err, errlen, "%s: reading from the broker failed: %s",
					 c->where, amqp_error_string2(r.library_error));
		else
			qb_amqp_rpc_error(c->where, r, "consuming", err, errlen);
		c->dead = true;
		goto fail;
	}
	return k;

fail:
	/* the channel is gone: the broker requeues the unacknowledged */
	qb_deliveries_clear(out, k);
	return -1;
}

/* qbsa_last: the highest delivery tag of a batch, 0 for none. */
static uint64_t
qbsa_last(const QbDelivery *d, int n)
{
	uint64_t	last = 0;

	for (int i = 0; i < n; i++)
		if (d[i].handle > last)
			last = d[i].handle;
	return last;
}

static int
qbsa_ack(void *p, const QbDelivery *d, int n, char *err, size_t errlen)
{
	QbsaConsumer *c = p;
	uint64_t	last = qbsa_last(d, n);
	int			rc;

	if (last == 0)
		return 0;
	if (c->dead)
		rc = AMQP_STATUS_CONNECTION_CLOSED;
	else
		rc = amqp_basic_ack(c->amqp, QBSA_CHANNEL, last, 1);
	if (rc == AMQP_STATUS_OK)
		return 0;

	/*
	 * The socket is gone: deliveries still buffered could be stored, but not
	 * acknowledged; the next fetch() reconnects instead.
	 */
	c->dead = true;
	/* the rows are stored: a lost ack only brings the repeats back */
	snprintf(err, errlen,
			 "%s: basic.ack failed: %s; the broker will redeliver and the repeats are counted as duplicates",
			 c->where, amqp_error_string2(rc));
	return -1;
}

static void
qbsa_release(void *p, const QbDelivery *d, int n, long delay_ms)
{
	QbsaConsumer *c = p;
	uint64_t	last = qbsa_last(d, n);

	/* AMQP has no delay: the engine's backoff spaces the redeliveries */
	if (last != 0 && !c->dead &&
		amqp_basic_nack(c->amqp, QBSA_CHANNEL, last, 1, 1) != AMQP_STATUS_OK)
		c->dead = true;			/* the broker requeues them with the connection */
}

const QbConsumerOps qb_amqp_consumer = {
	.type = QB_SOURCE_RABBITMQ,
	.open = qbsa_open,
	.close = qbsa_close,
	.fd = qbsa_fd,
	.fetch = qbsa_fetch,
	.ack = qbsa_ack,
	.release = qbsa_release,
};
