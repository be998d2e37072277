/*-------------------------------------------------------------------------
 * qb_pub_kafka.c
 *	  The Kafka publisher: one idempotent librdkafka producer per destination.
 *
 * Wording (see qb_publish.h for message, publish, tag):
 *	- A producer is one rd_kafka_t for one kafka destination, created on its
 *	  first publish and kept across batches; made anew when the
 *	  destination's settings change (a reload) or after a fatal error.
 *	- A slot is the publish in flight under one tag: its producer and the
 *	  generation it was started in.  A message's opaque carries both, so a
 *	  report from before abort_all finds another generation and is dropped.
 *	- A report is librdkafka's delivery report for one message; its error
 *	  decides the outcome (qbk_classify): ok, retry or dead.
 *
 * Rules:
 *	- librdkafka's threads block every signal (qb_publish.h) and never call
 *	  us: every callback is served by rd_kafka_poll() on the engine's thread.
 *	- Every producer's main queue writes a byte to one shared pipe, fd();
 *	  perform() drains it and polls every producer without waiting.
 *	- Idempotent, acks=all, message.timeout.ms below the lease: every
 *	  message in flight gets a report before its row could be claimed
 *	  again; a producev that fails at once starts nothing (README.md).
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "qb_extract.h"
#include "qb_kafka.h"
#include "qb_pub_kafka.h"
#include "qb_pub_kafka_int.h"

typedef struct QbkProducer
{
	struct QbKafka *kafka;
	char	   *dest;			/* the destination's name */
	char	   *fingerprint;	/* brokers, props and timeout it was made with */
	rd_kafka_t *rk;
	bool		fatal;			/* error_cb saw __FATAL: make it anew */
	char		last_error[QB_ERRLEN];	/* the latest error_cb text, for context */
	QbEgress   *egress;			/* the destination's rules (a copy), or NULL */
	const QbEgressPolicy *host_egress;	/* the host's, or NULL: none */
	pthread_mutex_t refused_lock;	/* connect_cb runs on librdkafka's threads */
	char		refused[QB_ERRLEN];	/* why connect_cb last refused an address */
	struct QbkProducer *next;
} QbkProducer;

typedef struct QbkSlot
{
	QbkProducer *producer;		/* NULL: no publish under this tag */
	uint32_t	gen;
} QbkSlot;

typedef struct QbKafka
{
	int			pipe_rd;
	int			pipe_wr;
	uint32_t	gen;			/* bumped by abort_all */
	QbkSlot    *slots;			/* indexed by tag */
	int			nslots;
	int			in_flight;
	QbkProducer *producers;
	/* set while perform() polls, for the delivery report callback */
	QbPubDone	done;
	void	   *done_arg;
} QbKafka;

static void qbk_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque);

/* The opaque of a message: the generation above the tag. */
static void *
qbk_opaque(uint32_t gen, int tag)
{
	return (void *) (uintptr_t) (((uint64_t) gen << 32) | (uint32_t) tag);
}

static void *
qbk_create(char *err, size_t errlen)
{
	QbKafka    *k = calloc(1, sizeof(QbKafka));
	int			fds[2];

	if (k == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if (pipe(fds) != 0)
	{
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		free(k);
		return NULL;
	}
	/* non-blocking: a full pipe already means "wake up", and drain stops */
	for (int i = 0; i < 2; i++)
	{
		fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK);
		fcntl(fds[i], F_SETFD, FD_CLOEXEC);
	}
	k->pipe_rd = fds[0];
	k->pipe_wr = fds[1];
	return k;
}

/* qbk_producer_free: drop whatever it still holds; no report is served. */
static void
qbk_producer_free(QbkProducer *p)
{
	if (p->rk != NULL)
	{
		rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
		rd_kafka_destroy(p->rk);
	}
	free(p->dest);
	free(p->fingerprint);
	qb_egress_free(p->egress);
	pthread_mutex_destroy(&p->refused_lock);
	free(p);
}

/*
 * qbk_connect_cb: librdkafka's connect, on its broker threads, for every
 * address it resolved: the egress rules judge the address actually used
 * (a name re-pointed after configure() cannot lead elsewhere), with the
 * broker's name (id: "host:port/nodeid", a listed name or not).  A refusal
 * is kept for the rows that then time out.
 */
static int
qbk_connect_cb(int sockfd, const struct sockaddr *addr, int addrlen, const char *id, void *opaque)
{
	QbkProducer *p = opaque;
	char		why[QB_ERRLEN];

	if (!qb_egress_addr_ok(qb_egress_in_force(p->egress, p->host_egress), id, addr, why, sizeof(why)))
	{
		pthread_mutex_lock(&p->refused_lock);
		snprintf(p->refused, sizeof(p->refused), "%s", why);
		pthread_mutex_unlock(&p->refused_lock);
		return EACCES;
	}
	if (connect(sockfd, addr, (socklen_t) addrlen) == -1 && errno != EINPROGRESS)
		return errno;
	return 0;
}

static void
qbk_destroy(void *arg)
{
	QbKafka    *k = arg;

	while (k->producers != NULL)
	{
		QbkProducer *p = k->producers;

		k->producers = p->next;
		qbk_producer_free(p);
	}
	close(k->pipe_rd);
	close(k->pipe_wr);
	free(k->slots);
	free(k);
}

/* error_cb: served by rd_kafka_poll on the engine's thread; copy only. */
static void
qbk_error_cb(rd_kafka_t *rk, int err, const char *reason, void *opaque)
{
	QbkProducer *p = opaque;

	snprintf(p->last_error, sizeof(p->last_error), "%s", reason);
	if (err == RD_KAFKA_RESP_ERR__FATAL)
		p->fatal = true;
}

/* qbk_fingerprint: what the producer is made from, to see a change. */
static char *
qbk_fingerprint(const QbDestination *d)
{
	size_t		len = strlen(d->broker_url) + 32 + (d->egress ? strlen(d->egress->list) : 0);
	char	   *s;
	char	   *w;

	for (int i = 0; i < d->nprops; i++)
		len += strlen(d->props[i].name) + strlen(d->props[i].value) + 2;
	if ((s = malloc(len)) == NULL)
		return NULL;
	w = s + sprintf(s, "%s\n%ld\negress=%s", d->broker_url, d->timeout_ms,
					d->egress ? d->egress->list : "(the host's)");
	for (int i = 0; i < d->nprops; i++)
		w += sprintf(w, "\n%s=%s", d->props[i].name, d->props[i].value);
	return s;
}

/*
 * qbk_producer_new: the destination's properties first, then the ones
 * QueueBox owns, so a property can never weaken them.
 */
static QbkProducer *
qbk_producer_new(QbKafka *k, const QbDestination *d, char *err, size_t errlen)
{
	QbkProducer *p = calloc(1, sizeof(QbkProducer));
	rd_kafka_conf_t *conf = NULL;
	rd_kafka_queue_t *q;
	char		timeout[32];
	char		why[QB_ERRLEN];

	if (p == NULL || (p->dest = strdup(d->name)) == NULL ||
		(p->fingerprint = qbk_fingerprint(d)) == NULL ||
		(conf = rd_kafka_conf_new()) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto err;
	}
	p->kafka = k;
	pthread_mutex_init(&p->refused_lock, NULL);
	p->egress = qb_egress_copy(d->egress);
	p->host_egress = d->host_egress;
	snprintf(timeout, sizeof(timeout), "%ld", d->timeout_ms);
	for (int i = 0; i < d->nprops; i++)
		if (!qb_kafka_set(conf, d->props[i].name, d->props[i].value, err, errlen))
			goto err;
	if (!qb_kafka_set(conf, "bootstrap.servers", d->broker_url, err, errlen) ||
		!qb_kafka_set(conf, "enable.idempotence", "true", err, errlen) ||
		!qb_kafka_set(conf, "acks", "all", err, errlen) ||
		!qb_kafka_set(conf, "message.timeout.ms", timeout, err, errlen) ||
		!qb_kafka_set(conf, "log.queue", "true", err, errlen))
		goto err;
	rd_kafka_conf_set_dr_msg_cb(conf, qbk_dr_cb);
	rd_kafka_conf_set_error_cb(conf, qbk_error_cb);
	rd_kafka_conf_set_connect_cb(conf, qbk_connect_cb);
	rd_kafka_conf_set_log_cb(conf, qb_kafka_log_silent);
	rd_kafka_conf_set_opaque(conf, p);
	/* rd_kafka_new starts librdkafka's threads; they block every signal */
	if ((p->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, why, sizeof(why))) == NULL)
	{
		snprintf(err, errlen, "kafka destination \"%s\": cannot create the producer: %s",
				 d->name, why);
		goto err;
	}
	conf = NULL;				/* rd_kafka_new owns it now */
	rd_kafka_set_log_queue(p->rk, NULL);
	q = rd_kafka_queue_get_main(p->rk);
	rd_kafka_queue_io_event_enable(q, k->pipe_wr, "1", 1);
	rd_kafka_queue_destroy(q);
	return p;

err:
	if (conf != NULL)
		rd_kafka_conf_destroy(conf);
	if (p != NULL)
		qbk_producer_free(p);
	return NULL;
}

/* qbk_fail_producer: report every publish in flight on p as failed. */
static void
qbk_fail_producer(QbKafka *k, QbkProducer *p, const char *why, QbPubDone done, void *arg)
{
	for (int t = 0; t < k->nslots; t++)
		if (k->slots[t].producer == p)
		{
			QbPubOutcome out = QB_PUB_OUTCOME_INIT;

			k->slots[t].producer = NULL;
			k->in_flight--;
			snprintf(out.error, sizeof(out.error), "%s", why);
			if (done != NULL)
				done(arg, t, &out);
		}
}

/* qbk_producer_busy: a publish of p is in flight (its report is still due). */
static bool
qbk_producer_busy(const QbKafka *k, const QbkProducer *p)
{
	for (int t = 0; t < k->nslots; t++)
		if (k->slots[t].producer == p)
			return true;
	return false;
}

/*
 * qbk_producer_for: the destination's producer, made on first use, or anew
 * when its settings changed or it hit a fatal error and nothing of it is in
 * flight any more.
 */
static QbkProducer *
qbk_producer_for(QbKafka *k, const QbDestination *d, char *err, size_t errlen)
{
	QbkProducer **pp;
	QbkProducer *p;
	char	   *fp;

	for (pp = &k->producers; *pp != NULL; pp = &(*pp)->next)
		if (strcmp((*pp)->dest, d->name) == 0)
			break;
	if ((p = *pp) != NULL)
	{
		if ((fp = qbk_fingerprint(d)) == NULL)
		{
			snprintf(err, errlen, "out of memory");
			return NULL;
		}
		if ((strcmp(fp, p->fingerprint) == 0 && !p->fatal) || qbk_producer_busy(k, p))
		{
			free(fp);
			return p;
		}
		free(fp);
		*pp = p->next;
		qbk_producer_free(p);
	}
	if ((p = qbk_producer_new(k, d, err, errlen)) == NULL)
		return NULL;
	p->next = k->producers;
	k->producers = p;
	return p;
}

/* qbk_prune destroys the producers of destinations gone from cfg or changed. */
static void
qbk_prune(void *arg, const QbConfig *cfg)
{
	QbKafka    *k = arg;
	QbkProducer **pp = &k->producers;
	QbkProducer *p;

	while ((p = *pp) != NULL)
	{
		const QbDestination *d = qb_pubset_dest(cfg, QB_DEST_KAFKA, p->dest);
		char	   *fp = d != NULL ? qbk_fingerprint(d) : NULL;
		bool		keep = fp != NULL && strcmp(fp, p->fingerprint) == 0;

		free(fp);
		if (!keep && !qbk_producer_busy(k, p))
		{
			*pp = p->next;
			qbk_producer_free(p);
			continue;
		}
		pp = &p->next;
	}
}

/* qbk_header_add: one kept row header onto the list (the rule's callback) */
static bool
qbk_header_add(void *hdrs, const char *name, const char *value)
{
	return rd_kafka_header_add(hdrs, name, -1, value, -1) == RD_KAFKA_RESP_ERR_NO_ERROR;
}

/* qbk_headers: see qb_pub_kafka_int.h. */
QbHdrResult
qbk_headers(const QbMessage *m, rd_kafka_headers_t **out, char *err, size_t errlen)
{
	rd_kafka_headers_t *hdrs = rd_kafka_headers_new(8);
	QbHdrResult r = qb_hdr_each(QB_HDR_KAFKA, NULL, m->headers, qbk_header_add, hdrs, err, errlen);

	if (r == QB_HDR_OK)
		rd_kafka_header_add(hdrs, QB_HDR_MESSAGE_ID_KAFKA, -1, m->message_id, -1);
	if (r != QB_HDR_OK)
	{
		rd_kafka_headers_destroy(hdrs);
		hdrs = NULL;
	}
	*out = hdrs;
	return r;
}

/* qbk_topic_valid: Kafka's legal topic names ([A-Za-z0-9._-], 1..249). */
static bool
qbk_topic_valid(const char *t)
{
	size_t		n = strlen(t);

	if (n == 0 || n > 249 || strcmp(t, ".") == 0 || strcmp(t, "..") == 0)
		return false;
	for (; *t != '\0'; t++)
		if (!((*t >= 'a' && *t <= 'z') || (*t >= 'A' && *t <= 'Z') ||
			  (*t >= '0' && *t <= '9') || *t == '.' || *t == '_' || *t == '-'))
			return false;
	return true;
}

/* qbk_unknown_topic: the last_error of a row whose topic does not exist. */
static void
qbk_unknown_topic(char *err, size_t errlen, const char *topic)
{
	snprintf(err, errlen,
			 "topic \"%.120s\" does not exist on the Kafka cluster and is not created automatically; create it (kafka-topics.sh --create --topic %.120s) or route the row elsewhere, then requeue the row (queuebox.requeue_outbox)",
			 topic, topic);
}

static bool
qbk_slot_reserve(QbKafka *k, int tag)
{
	if (tag < k->nslots)
		return true;
	{
		int			n = tag + 64;
		QbkSlot    *s = realloc(k->slots, n * sizeof(QbkSlot));

		if (s == NULL)
			return false;
		memset(s + k->nslots, 0, (n - k->nslots) * sizeof(QbkSlot));
		k->slots = s;
		k->nslots = n;
	}
	return true;
}

static QbPubStart
qbk_start(void *arg, const QbDestination *d, const QbMessage *m, int tag,
		  char *err, size_t errlen)
{
	static const char *const names[] = {"topic", "key", NULL};
	QbKafka    *k = arg;
	QbkProducer *p;
	rd_kafka_headers_t *hdrs = NULL;
	const char *values[2] = {m->topic, m->key};
	char	   *topic = NULL;
	QbPubStart	r = QB_PUB_NOT_STARTED;
	QbHdrResult hr;
	rd_kafka_resp_err_t e;

	if (tag < 0 || !qbk_slot_reserve(k, tag))
	{
		snprintf(err, errlen, "out of memory");
		return QB_PUB_NOT_STARTED;
	}
	topic = d->target ? qb_template_render(d->target, names, values) : strdup(m->topic);
	if (topic == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto done;
	}
	if (!qbk_topic_valid(topic))
	{
		snprintf(err, errlen,
				 "\"%.200s\" is not a legal Kafka topic name (1 to 249 of a-z A-Z 0-9 . _ -); change the row's topic or the destination's topic template, then requeue the row (queuebox.requeue_outbox)",
				 topic);
		r = QB_PUB_ROW_INVALID;
		goto done;
	}
	if ((hr = qbk_headers(m, &hdrs, err, errlen)) != QB_HDR_OK)
	{
		r = qb_hdr_start(hr);
		goto done;
	}
	if ((p = qbk_producer_for(k, d, err, errlen)) == NULL)
		goto done;
	e = rd_kafka_producev(p->rk,
						  RD_KAFKA_V_TOPIC(topic),
						  RD_KAFKA_V_KEY(m->key, m->key ? strlen(m->key) : 0),
						  RD_KAFKA_V_VALUE((void *) m->body, m->body_len),
						  RD_KAFKA_V_HEADERS(hdrs),
						  RD_KAFKA_V_OPAQUE(qbk_opaque(k->gen, tag)),
						  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
						  RD_KAFKA_V_END);
	switch (e)
	{
		case RD_KAFKA_RESP_ERR_NO_ERROR:
			hdrs = NULL;		/* the message owns them now */
			k->slots[tag].producer = p;
			k->slots[tag].gen = k->gen;
			k->in_flight++;
			r = QB_PUB_STARTED;
			break;
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
			snprintf(err, errlen,
					 "the message (%zu bytes of payload) is larger than the producer allows (message.max.bytes); shrink the payload, or raise message.max.bytes under the destination's config and the broker's limit, then requeue the row",
					 m->body_len);
			r = QB_PUB_ROW_INVALID;
			break;
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
			qbk_unknown_topic(err, errlen, topic);
			r = QB_PUB_ROW_INVALID;
			break;
		default:
			snprintf(err, errlen, "kafka destination \"%s\": the producer did not take the message: %s",
					 d->name, rd_kafka_err2str(e));
			if (e == RD_KAFKA_RESP_ERR__FATAL)
				p->fatal = true;
			break;
	}

done:
	if (hdrs != NULL)
		rd_kafka_headers_destroy(hdrs);
	free(topic);
	return r;
}

/*
 * qbk_classify: a delivery report's error as an outcome.  librdkafka has
 * already retried what it could inside message.timeout.ms, so a failure is
 * final for this attempt; only errors no retry can cure are permanent.
 */
static void
qbk_classify(const rd_kafka_message_t *m, QbPubOutcome *out)
{
	const char *topic = m->rkt ? rd_kafka_topic_name(m->rkt) : "?";
	const char *advice = NULL;	/* set: permanent */

	*out = (QbPubOutcome) QB_PUB_OUTCOME_INIT;
	out->ok = m->err == RD_KAFKA_RESP_ERR_NO_ERROR;
	switch (m->err)
	{
		case RD_KAFKA_RESP_ERR_NO_ERROR:
			return;
		case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
		case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
			out->permanent = true;
			qbk_unknown_topic(out->error, sizeof(out->error), topic);
			return;
		case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
		case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
			advice = "refused for good: shrink the payload or raise the topic's max.message.bytes, then requeue the row";
			break;
		case RD_KAFKA_RESP_ERR_INVALID_RECORD:
		case RD_KAFKA_RESP_ERR_INVALID_MSG:
		case RD_KAFKA_RESP_ERR__INVALID_ARG:
		case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
		case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
		case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
			advice = "refused for good: fix the row, the topic or its permissions, then requeue the row";
			break;
		default:
			break;
	}
	out->permanent = advice != NULL;
	snprintf(out->error, sizeof(out->error), "topic \"%.200s\": %s%s%s",
			 topic, rd_kafka_err2str(m->err), advice ? "; " : "",
			 advice ? advice :
			 rd_kafka_message_status(m) == RD_KAFKA_MSG_STATUS_POSSIBLY_PERSISTED ?
			 " (the broker may have stored it: a consumer may see it twice, with the same message-id header)" : "");
}

/*
 * qbk_is_fatal: the producer raised a fatal error (an idempotence guarantee
 * it can no longer keep); it takes no more messages and is made anew once
 * nothing of it is in flight.
 */
static bool
qbk_is_fatal(QbkProducer *p)
{
	char		why[8];

	if (!p->fatal && rd_kafka_fatal_error(p->rk, why, sizeof(why)) != RD_KAFKA_RESP_ERR_NO_ERROR)
		p->fatal = true;
	return p->fatal;
}

/* qbk_fatal_message: the last_error of a row failed by a fatal error. */
static void
qbk_fatal_message(QbkProducer *p, char *buf, size_t len)
{
	char		why[QB_ERRLEN];

	if (rd_kafka_fatal_error(p->rk, why, sizeof(why)) == RD_KAFKA_RESP_ERR_NO_ERROR)
		snprintf(why, sizeof(why), "%s", p->last_error);
	snprintf(buf, len, "kafka destination \"%s\": the producer hit a fatal error and is made anew: %.300s",
			 p->dest, why);
}

/* dr_msg_cb: served by rd_kafka_poll inside perform, on the engine thread. */
static void
qbk_dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
	QbkProducer *p = opaque;
	QbKafka    *k = p->kafka;
	uint64_t	o = (uint64_t) (uintptr_t) m->_private;
	int			tag = (int) (uint32_t) o;
	uint32_t	gen = (uint32_t) (o >> 32);
	QbPubOutcome out;			/* qbk_classify starts it from QB_PUB_OUTCOME_INIT */

	if (tag >= k->nslots || k->slots[tag].producer != p || k->slots[tag].gen != gen)
		return;					/* aborted, or failed with its producer */
	k->slots[tag].producer = NULL;
	k->in_flight--;
	qbk_classify(m, &out);
	if (!out.ok && qbk_is_fatal(p))
		qbk_fatal_message(p, out.error, sizeof(out.error));
	else
	{
		size_t		n = strlen(out.error);

		/* a refusal explains the failures that follow it, until a success */
		pthread_mutex_lock(&p->refused_lock);
		if (out.ok)
			p->refused[0] = '\0';
		else if (p->refused[0] != '\0')
			snprintf(out.error + n, sizeof(out.error) - n, " (%s)", p->refused);
		pthread_mutex_unlock(&p->refused_lock);
	}
	if (k->done != NULL)
		k->done(k->done_arg, tag, &out);
}

static int
qbk_in_flight(void *arg)
{
	return ((QbKafka *) arg)->in_flight;
}

static int
qbk_fd(void *arg)
{
	return ((QbKafka *) arg)->pipe_rd;
}

/* A poll now and then serves what a missed wake-up would leave queued. */
static long
qbk_timeout_ms(void *arg)
{
	return 200;
}

/* qbk_drain: empty the wake-up pipe before polling, so no wake-up is lost. */
static void
qbk_drain(QbKafka *k)
{
	char		buf[256];

	while (read(k->pipe_rd, buf, sizeof(buf)) > 0)
		;
}

static void
qbk_perform(void *arg, QbPubDone done, void *done_arg)
{
	QbKafka    *k = arg;

	qbk_drain(k);
	k->done = done;
	k->done_arg = done_arg;
	for (QbkProducer *p = k->producers; p != NULL; p = p->next)
	{
		rd_kafka_poll(p->rk, 0);
		if (qbk_is_fatal(p))
		{
			char		msg[QB_ERRLEN];

			/* the idempotent producer cannot go on: fail its rows, make it anew */
			qbk_fatal_message(p, msg, sizeof(msg));
			qbk_fail_producer(k, p, msg, done, done_arg);
		}
	}
	k->done = NULL;
	k->done_arg = NULL;
}

/* qbk_abort_all: purge every message; their reports find no slot. */
static void
qbk_abort_all(void *arg)
{
	QbKafka    *k = arg;

	for (QbkProducer *p = k->producers; p != NULL; p = p->next)
		rd_kafka_purge(p->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
	for (int t = 0; t < k->nslots; t++)
		k->slots[t].producer = NULL;
	k->in_flight = 0;
	k->gen++;
}

const QbPublisherOps qb_kafka_publisher = {
	.type = QB_DEST_KAFKA,
	.create = qbk_create,
	.destroy = qbk_destroy,
	.start = qbk_start,
	.in_flight = qbk_in_flight,
	.fd = qbk_fd,
	.timeout_ms = qbk_timeout_ms,
	.perform = qbk_perform,
	.abort_all = qbk_abort_all,
	.prune = qbk_prune,
};
