/*-------------------------------------------------------------------------
 * qb_config_rabbitmq.c
 *	  The rabbitmq type: a rabbitmq destination (url, exchange, routingKey,
 *	  persistent, mandatory) and a rabbitmq source (url, queue, prefetch).
 *
 * The url is checked twice: as a URL of the amqp family here, and by
 * qb_amqp_url_parse, so that what the publisher and the consumer will read
 * from it (vhost, options) is known good when the document is stored.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_amqp.h"
#include "qb_config_int.h"
#include "qb_extract.h"

static const char *const qbcf_keys_rabbitmq[] =
{"type", "url", "exchange", "routingKey", "persistent", "mandatory", "transform", "maxInFlight", "circuitBreaker", "onDead",
"rateLimit", "maxConcurrent", NULL};
static const char *const qbcf_keys_rabbitmq_source[] =
{"type", "url", "queue", "prefetch", "idempotencyKeyPath", "idempotencyKeyHeader",
"eventTypePath", "eventTypeFromHeader", "aggregateIdPath", "topic", "consumption",
"transform", "batchSize", "onDead", NULL};

/* an amqp or amqps URL, with credentials and client options allowed */
static const char *const qbcf_amqp_schemes[] = {"amqp", "amqps", NULL};

/* qbcf_amqp_url: the url key (already read into *url, at node n) checked. */
static bool
qbcf_amqp_url(QbcfCtx *cx, const char *path, const QbcfNode *n, const char *url)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];

	qbcf_path_key(sub, sizeof(sub), path, "url");
	if (!qb_url_check_scheme(url, qbcf_amqp_schemes, QB_URL_USERINFO | QB_URL_QUERY,
							 msg, sizeof(msg)))
		return qbcf_error(cx, sub, n, "%s", msg);
	return true;
}

/* qbcf_rabbitmq: the keys of a rabbitmq destination (the shared ones are read). */
static bool
qbcf_rabbitmq(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	const QbcfNode *n;
	QbAmqpUrl	u;
	bool		ok;

	if (!qbcf_required_string(cx, path, m, "url",
							  "a rabbitmq destination needs one, e.g. url: \"amqp://user:password@host:5672/\"",
							  false, &d->broker_url, &n) ||
		!qbcf_amqp_url(cx, path, n, d->broker_url) ||
		!qbcf_target(cx, path, m, d, "exchange",
					 "a rabbitmq destination publishes to an exchange; \"\" is the default exchange",
					 false) ||
		!qbcf_flag(cx, path, m, "persistent", &d->persistent) ||
		!qbcf_flag(cx, path, m, "mandatory", &d->mandatory))
		return false;
	/* what the publisher reads from the url: vhost, options */
	ok = qb_amqp_url_parse(d->broker_url, &u, msg, sizeof(msg));
	qb_amqp_url_free(&u);
	if (!ok)
	{
		qbcf_path_key(sub, sizeof(sub), path, "url");
		return qbcf_error(cx, sub, n, "%s", msg);
	}
	if (strlen(d->target) > 255)
	{
		qbcf_path_key(sub, sizeof(sub), path, "exchange");
		return qbcf_error(cx, sub, qbcf_get(m, "exchange"),
						  "an exchange name is at most 255 bytes");
	}
	if ((n = qbcf_get(m, "routingKey")) != NULL)
	{
		qbcf_path_key(sub, sizeof(sub), path, "routingKey");
		if (!qbcf_string(cx, sub, n, false, &d->routing_key))
			return false;
		if (!qb_template_check(d->routing_key, qb_amqp_routing_key_names,
							   msg, sizeof(msg)))
			return qbcf_error(cx, sub, n, "%s", msg);
		return true;
	}
	if ((d->routing_key = qbcf_arena_strdup(cx->arena, "{{ topic }}")) == NULL)
		return qbcf_error(cx, path, m, "out of memory");
	return true;
}

const QbcfDestType qbcf_dest_rabbitmq =
{
	.type = "rabbitmq",
	.keys = qbcf_keys_rabbitmq,
	.check = qbcf_rabbitmq,
};

/* qbcf_rabbitmq_source: the queue a rabbitmq source consumes, and where. */
static bool
qbcf_rabbitmq_source(QbcfCtx *cx, const char *path, const QbcfNode *m, QbSource *s)
{
	const QbcfNode *n;
	long		v;

	if (!qbcf_required_string(cx, path, m, "url",
							  "a rabbitmq source needs one, e.g. url: \"amqp://user:password@host:5672/\"",
							  true, &s->broker_url, &n) ||
		!qbcf_amqp_url(cx, path, n, s->broker_url) ||
		!qbcf_required_string(cx, path, m, "queue",
							  "the queue to consume (QueueBox does not declare it), e.g. queue: orders",
							  true, &s->queue, &n))
		return false;
	v = s->prefetch;
	if (!qbcf_opt_int(cx, path, m, "prefetch", 1, 65535, &v))
		return false;
	s->prefetch = (int) v;
	return true;
}

const QbcfSourceType qbcf_source_rabbitmq =
{
	.type = "rabbitmq",
	.keys = qbcf_keys_rabbitmq_source,
	.check = qbcf_rabbitmq_source,
};
