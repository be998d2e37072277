/*-------------------------------------------------------------------------
 * qb_src_kafka.c
 *	  The Kafka source: one librdkafka KafkaConsumer per source, in the
 *	  source's consumer group, feeding the consumer engine (qb_consume.h).
 *
 * Wording (see qb_consume.h for delivery, batch, ack, release):
 *	- A held message is one handed to the engine and not yet acked or
 *	  released: its topic, partition and offset.  A delivery's handle is its
 *	  index in the held table, which empties after every batch.
 *	- A position is "topic/partition/offset", the default idempotency key:
 *	  a message delivered again after a crash is a duplicate of its row.
 *
 * Rules:
 *	- Offsets are committed only by ack(), after the rows committed: offset
 *	  + 1 of each partition's highest message, synchronously (auto commit and
 *	  offset store are forced off).  release() seeks each partition of the
 *	  batch back to its lowest offset (README.md).
 *	- librdkafka's threads block every signal (qb_source.h) and never call
 *	  us: the main queue and the logs are forwarded to the consumer queue,
 *	  served by rd_kafka_consumer_poll on the engine's thread.
 *	- fd() is a pipe that gets a byte when the consumer queue becomes
 *	  non-empty; fetch() empties it and writes one back when it leaves
 *	  messages queued (librdkafka writes only on that edge).
 *-------------------------------------------------------------------------
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE				/* pipe2 */
#endif
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "qb_clock.h"
#include "qb_kafka.h"
#include "qb_src_kafka.h"
#include "qb_src_kafka_int.h"
#include "qb_utf8.h"

#define QBKS_MSGID_HEADER	"message-id"
#define QBKS_SEEK_TIMEOUT_MS 10000
#define QBKS_CLOSE_TIMEOUT_MS 10000

typedef struct QbksHeld
{
	char	   *topic;
	int32_t		partition;
	int64_t		offset;
	bool		done;			/* acked or released */
} QbksHeld;

typedef struct QbksConsumer
{
	char	   *source;			/* the source's name, for errors */
	rd_kafka_t *rk;
	rd_kafka_queue_t *queue;	/* the consumer queue, main queue forwarded */
	int			pipe_rd;
	int			pipe_wr;
	bool		fatal;			/* error_cb saw __FATAL */
	char		last_error[QB_ERRLEN];	/* the latest consumer error, for context */
	QbksHeld   *held;
	int			nheld;
	int			held_cap;
	int			outstanding;	/* held and not done */
} QbksConsumer;

static void qbks_close(void *arg);

/* qbks_error_cb: served by rd_kafka_consumer_poll on our thread; copy only. */
static void
qbks_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	QbksConsumer *c = opaque;

	snprintf(c->last_error, sizeof(c->last_error), "%s", reason);
	if (err == RD_KAFKA_RESP_ERR__FATAL)
		c->fatal = true;
}

/* qbks_poke: make fd() readable (a full pipe already is). */
static void
qbks_poke(QbksConsumer *c)
{
	if (write(c->pipe_wr, "1", 1) < 0)
		return;					/* EAGAIN: full, so readable already */
}

/* qbks_drain: empty the pipe before serving the queue. */
static void
qbks_drain(QbksConsumer *c)
{
	char		buf[256];

	while (read(c->pipe_rd, buf, sizeof(buf)) > 0)
		;
}

/*
 * qbks_conf: the consumer's configuration, its callbacks given c.  The
 * source's config: comes after QueueBox's defaults (it may change
 * auto.offset.reset) and before the properties QueueBox owns (it cannot
 * enable auto commit).  NULL with err.
 */
static rd_kafka_conf_t *
qbks_conf(const QbSource *src, QbksConsumer *c, char *err, size_t errlen)
{
	rd_kafka_conf_t *conf;
	char		group[512];

	if (src->group != NULL)
		snprintf(group, sizeof(group), "%s", src->group);
	else
		snprintf(group, sizeof(group), "queuebox-%s", src->name);
	if ((conf = rd_kafka_conf_new()) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	/* a new group starts at the beginning: messages sent before it are kept */
	if (!qb_kafka_set(conf, "auto.offset.reset", "earliest", err, errlen))
		goto fail;
	for (int i = 0; i < src->nprops; i++)
		if (!qb_kafka_set(conf, src->props[i].name, src->props[i].value, err, errlen))
			goto fail;
	if (!qb_kafka_set(conf, "bootstrap.servers", src->broker_url, err, errlen) ||
		!qb_kafka_set(conf, "group.id", group, err, errlen) ||
		!qb_kafka_set(conf, "enable.auto.commit", "false", err, errlen) ||
		!qb_kafka_set(conf, "enable.auto.offset.store", "false", err, errlen) ||
		!qb_kafka_set(conf, "log.queue", "true", err, errlen))
		goto fail;
	rd_kafka_conf_set_error_cb(conf, qbks_error_cb);
	rd_kafka_conf_set_log_cb(conf, qb_kafka_log_silent);
	rd_kafka_conf_set_opaque(conf, c);
	return conf;

fail:
	rd_kafka_conf_destroy(conf);
	return NULL;
}

/*
 * qbks_subscribe: the consumer made of conf (taken, whatever happens) and
 * subscribed to the source's topics, its queue waking c->pipe_wr.
 * rd_kafka_new starts librdkafka's threads, and subscribing may start
 * more: they inherit the mask set here, so no process signal lands on
 * them.  -1 with err.
 */
static int
qbks_subscribe(QbksConsumer *c, const QbSource *src, rd_kafka_conf_t *conf,
			   char *err, size_t errlen)
{
	rd_kafka_topic_partition_list_t *topics;
	rd_kafka_resp_err_t rerr;
	sigset_t	all,
				old;
	char		why[QB_ERRLEN];

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	if ((c->rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, why, sizeof(why))) == NULL)
	{
		snprintf(err, errlen, "kafka source \"%s\": cannot create the consumer: %s",
				 src->name, why);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		rd_kafka_conf_destroy(conf);
		return -1;
	}
	/* rd_kafka_new owns conf now */
	rd_kafka_set_log_queue(c->rk, NULL);
	rd_kafka_poll_set_consumer(c->rk);
	c->queue = rd_kafka_queue_get_consumer(c->rk);
	rd_kafka_queue_io_event_enable(c->queue, c->pipe_wr, "1", 1);

	topics = rd_kafka_topic_partition_list_new(src->ntopics);
	for (int i = 0; i < src->ntopics; i++)
		rd_kafka_topic_partition_list_add(topics, src->topics[i], RD_KAFKA_PARTITION_UA);
	rerr = rd_kafka_subscribe(c->rk, topics);
	rd_kafka_topic_partition_list_destroy(topics);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rerr != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(err, errlen, "kafka source \"%s\": cannot subscribe: %s",
				 src->name, rd_kafka_err2str(rerr));
		return -1;
	}
	return 0;
}

/* qbks_open: create the consumer (qbks_conf) and subscribe (qbks_subscribe). */
static void *
qbks_open(const QbSource *src, char *err, size_t errlen)
{
	QbksConsumer *c = calloc(1, sizeof(QbksConsumer));
	rd_kafka_conf_t *conf;
	int			fds[2];

	if (c == NULL || (c->source = strdup(src->name)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		free(c);
		return NULL;
	}
	c->pipe_rd = c->pipe_wr = -1;
	if (src->ntopics <= 0)
	{
		snprintf(err, errlen, "kafka source \"%s\": no topics to subscribe to", src->name);
		goto err;
	}
	/* non-blocking: a full pipe already means "wake up", and drain stops */
	if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		goto err;
	}
	c->pipe_rd = fds[0];
	c->pipe_wr = fds[1];
	if ((conf = qbks_conf(src, c, err, errlen)) == NULL ||
		qbks_subscribe(c, src, conf, err, errlen) != 0)
		goto err;
	/* the first fetch serves the group join even if nothing woke us yet */
	qbks_poke(c);
	return c;

err:
	qbks_close(c);
	return NULL;
}

/* qbks_held_reset: nothing is held any more; indexes restart at 0. */
static void
qbks_held_reset(QbksConsumer *c)
{
	for (int i = 0; i < c->nheld; i++)
		free(c->held[i].topic);
	c->nheld = 0;
	c->outstanding = 0;
}

/*
 * qbks_close: leave the group (bounded: a cluster that is gone must not
 * hold the worker) and destroy the consumer.  Nothing is committed here:
 * what was not acked is delivered again to whoever gets the partition.
 */
static void
qbks_close(void *arg)
{
	QbksConsumer *c = arg;

	if (c == NULL)
		return;
	if (c->rk != NULL)
	{
		rd_kafka_queue_t *q = rd_kafka_queue_new(c->rk);
		rd_kafka_error_t *e;
		long		t0;

		if (c->queue != NULL)
		{
			rd_kafka_queue_io_event_enable(c->queue, -1, NULL, 0);
			rd_kafka_queue_destroy(c->queue);
			c->queue = NULL;
		}
		t0 = qb_now_ms();
		if ((e = rd_kafka_consumer_close_queue(c->rk, q)) != NULL)
			rd_kafka_error_destroy(e);
		else
		{
			while (!rd_kafka_consumer_closed(c->rk))
			{
				rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 100);

				/* with no rebalance_cb the revocation is ours to apply */
				if (ev != NULL && rd_kafka_event_type(ev) == RD_KAFKA_EVENT_REBALANCE)
					rd_kafka_assign(c->rk, NULL);
				if (ev != NULL)
					rd_kafka_event_destroy(ev);
				if (qb_now_ms() - t0 > QBKS_CLOSE_TIMEOUT_MS)
					break;
			}
		}
		rd_kafka_queue_destroy(q);
		rd_kafka_destroy_flags(c->rk, RD_KAFKA_DESTROY_F_NO_CONSUMER_CLOSE);
	}
	if (c->pipe_rd >= 0)
		close(c->pipe_rd);
	if (c->pipe_wr >= 0)
		close(c->pipe_wr);
	qbks_held_reset(c);
	free(c->held);
	free(c->source);
	free(c);
}

static int
qbks_fd(void *arg)
{
	return ((QbksConsumer *) arg)->pipe_rd;
}

/* qbks_headers_json: see qb_src_kafka_int.h. */
char *
qbks_headers_json(const rd_kafka_headers_t *hdrs, char **message_id)
{
	json_t	   *o;
	const char *name;
	const void *val;
	size_t		len;
	char	   *text;

	*message_id = NULL;
	if (hdrs == NULL || rd_kafka_header_cnt(hdrs) == 0)
		return NULL;
	/*
	 * json_pack, not json_object(): inside the server that name is
	 * PostgreSQL's SQL function json_object, which the dynamic linker
	 * finds first.
	 */
	if ((o = json_pack("{}")) == NULL)
		return NULL;
	for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &len) == RD_KAFKA_RESP_ERR_NO_ERROR; i++)
	{
		/*
		 * A header without a value is null; one that is not UTF-8 cannot be
		 * a JSON string, and one holding a NUL a string PostgreSQL's jsonb
		 * takes: both are left out.  A repeated name keeps the last.
		 */
		json_t	   *v = val == NULL ? json_null() :
			qb_utf8_invalid_at(val, len) >= 0 ? NULL : json_stringn(val, len);

		if (v == NULL)
			continue;
		json_object_set_new(o, name, v);
		if (strcmp(name, QBKS_MSGID_HEADER) == 0 && val != NULL && len > 0 &&
			memchr(val, '\0', len) == NULL)
		{
			free(*message_id);
			*message_id = strndup(val, len);
		}
	}
	text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return text;
}

/* qbks_headers: the message's headers as a JSON object, or NULL if none. */
static char *
qbks_headers(const rd_kafka_message_t *m, char **message_id)
{
	rd_kafka_headers_t *hdrs = NULL;

	*message_id = NULL;
	if (rd_kafka_message_headers(m, &hdrs) != RD_KAFKA_RESP_ERR_NO_ERROR)
		return NULL;
	return qbks_headers_json(hdrs, message_id);
}

/*
 * qbks_take: copy one message into a delivery and hold it; false when out
 * of memory (the delivery is then cleared).
 */
static bool
qbks_take(QbksConsumer *c, const rd_kafka_message_t *m, QbDelivery *d)
{
	const char *topic = rd_kafka_topic_name(m->rkt);
	QbksHeld   *h;
	char		pos[512];

	memset(d, 0, sizeof(*d));
	if (c->nheld == c->held_cap)
	{
		int			cap = c->held_cap ? c->held_cap * 2 : 128;
		QbksHeld   *n = realloc(c->held, cap * sizeof(QbksHeld));

		if (n == NULL)
			return false;
		c->held = n;
		c->held_cap = cap;
	}
	if ((d->body = malloc(m->len + 1)) == NULL)
		return false;
	if (m->len > 0)
		memcpy(d->body, m->payload, m->len);
	d->body[m->len] = '\0';
	d->len = m->len;
	d->headers = qbks_headers(m, &d->message_id);
	snprintf(pos, sizeof(pos), "%s/%" PRId32 "/%" PRId64, topic, m->partition, m->offset);
	h = &c->held[c->nheld];
	if ((d->position = strdup(pos)) == NULL || (h->topic = strdup(topic)) == NULL)
	{
		qb_deliveries_clear(d, 1);
		memset(d, 0, sizeof(*d));
		return false;
	}
	h->partition = m->partition;
	h->offset = m->offset;
	h->done = false;
	d->handle = (uint64_t) c->nheld;
	c->nheld++;
	c->outstanding++;
	return true;
}

/*
 * qbks_fetch: up to max messages that are already here, without waiting.
 * A consumer error that is not fatal (a broker down, a topic not there
 * yet) is remembered and librdkafka goes on trying; a fatal one ends the
 * consumer: -1, and the engine opens a new one.
 */
static int
qbks_fetch(void *arg, QbDelivery *out, int max, char *err, size_t errlen)
{
	QbksConsumer *c = arg;
	int			n = 0;

	qbks_drain(c);
	while (n < max && !c->fatal)
	{
		rd_kafka_message_t *m = rd_kafka_consumer_poll(c->rk, 0);

		if (m == NULL)
			break;
		if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR)
		{
			if (!qbks_take(c, m, &out[n]))
			{
				rd_kafka_message_destroy(m);
				qb_deliveries_clear(out, n);
				snprintf(err, errlen, "kafka source \"%s\": out of memory", c->source);
				return -1;
			}
			n++;
		}
		else if (m->err == RD_KAFKA_RESP_ERR__FATAL)
			c->fatal = true;
		else if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
			snprintf(c->last_error, sizeof(c->last_error), "%s",
					 rd_kafka_message_errstr(m));
		rd_kafka_message_destroy(m);
	}
	if (c->fatal)
	{
		char		why[QB_ERRLEN];

		if (rd_kafka_fatal_error(c->rk, why, sizeof(why)) == RD_KAFKA_RESP_ERR_NO_ERROR)
			snprintf(why, sizeof(why), "%s", c->last_error);
		qb_deliveries_clear(out, n);
		snprintf(err, errlen, "kafka source \"%s\": fatal consumer error: %s", c->source, why);
		return -1;
	}
	/* librdkafka wakes us only on the empty to non-empty edge */
	if (n == max || rd_kafka_queue_length(c->queue) > 0)
		qbks_poke(c);
	return n;
}

/*
 * qbks_partitions: the partitions of n held deliveries, each with the
 * highest offset + 1 (for a commit) or the lowest offset (for a seek);
 * the deliveries are done.
 */
static rd_kafka_topic_partition_list_t *
qbks_partitions(QbksConsumer *c, const QbDelivery *d, int n, bool commit)
{
	rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(8);

	for (int i = 0; i < n; i++)
	{
		QbksHeld   *h;
		rd_kafka_topic_partition_t *p;
		int64_t		off;

		if (d[i].handle >= (uint64_t) c->nheld || c->held[d[i].handle].done)
			continue;
		h = &c->held[d[i].handle];
		off = commit ? h->offset + 1 : h->offset;
		p = rd_kafka_topic_partition_list_find(list, h->topic, h->partition);
		if (p == NULL)
			rd_kafka_topic_partition_list_add(list, h->topic, h->partition)->offset = off;
		else if (commit ? off > p->offset : off < p->offset)
			p->offset = off;
		h->done = true;
		c->outstanding--;
	}
	if (c->outstanding == 0)
		qbks_held_reset(c);
	return list;
}

/*
 * qbks_ack: commit the batch's offsets, synchronously: when it returns 0
 * the group has them, and a new consumer starts after them.
 */
static int
qbks_ack(void *arg, const QbDelivery *d, int n, char *err, size_t errlen)
{
	QbksConsumer *c = arg;
	rd_kafka_topic_partition_list_t *list = qbks_partitions(c, d, n, true);
	rd_kafka_resp_err_t rerr = RD_KAFKA_RESP_ERR_NO_ERROR;

	if (list->cnt > 0)
		rerr = rd_kafka_commit(c->rk, list, 0);
	for (int i = 0; rerr == RD_KAFKA_RESP_ERR_NO_ERROR && i < list->cnt; i++)
		rerr = list->elems[i].err;
	rd_kafka_topic_partition_list_destroy(list);
	if (rerr != RD_KAFKA_RESP_ERR_NO_ERROR)
	{
		snprintf(err, errlen, "kafka source \"%s\": offset commit failed: %s",
				 c->source, rd_kafka_err2str(rerr));
		return -1;
	}
	return 0;
}

/*
 * qbks_release: seek each partition back to the batch's lowest offset
 * there, so the next fetches deliver the batch again.  A partition that
 * was taken away meanwhile cannot be sought: its next owner starts at the
 * committed offset, which is before the batch too.
 */
static void
qbks_release(void *arg, const QbDelivery *d, int n, long delay_ms)
{
	QbksConsumer *c = arg;
	rd_kafka_topic_partition_list_t *list = qbks_partitions(c, d, n, false);

	if (list->cnt > 0)
	{
		rd_kafka_error_t *e = rd_kafka_seek_partitions(c->rk, list, QBKS_SEEK_TIMEOUT_MS);

		if (e != NULL)
		{
			snprintf(c->last_error, sizeof(c->last_error), "seek: %s", rd_kafka_error_string(e));
			rd_kafka_error_destroy(e);
		}
	}
	rd_kafka_topic_partition_list_destroy(list);
}

const QbConsumerOps qb_kafka_consumer = {
	.type = QB_SOURCE_KAFKA,
	.open = qbks_open,
	.close = qbks_close,
	.fd = qbks_fd,
	.fetch = qbks_fetch,
	.ack = qbks_ack,
	.release = qbks_release,
};
