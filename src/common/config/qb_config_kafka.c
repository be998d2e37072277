/*-------------------------------------------------------------------------
 * qb_config_kafka.c
 *	  The kafka type: a kafka destination (brokers, topic, config) and a kafka
 *	  source (brokers, topics, group, config).
 *
 * config: holds librdkafka properties; each is applied to a scratch
 * rd_kafka_conf_t here so that librdkafka's own words refuse a typo now, and
 * the properties QueueBox sets itself (the delivery guarantees, the offsets)
 * are refused with the reason.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "qb_config_int.h"

static const char *const qbcf_keys_kafka[] =
{"type", "brokers", "topic", "config", "transform", "maxInFlight", "circuitBreaker", "onDead",
"rateLimit", "maxConcurrent", NULL};
static const char *const qbcf_keys_kafka_source[] =
{"type", "brokers", "topics", "group", "config", "idempotencyKeyPath", "idempotencyKeyHeader",
"eventTypePath", "eventTypeHeader", "aggregateIdPath", "topic", "consumption", "transform",
"batchSize", "onDead", NULL};

/*
 * A destination's d->timeout_ms is the producer's message.timeout.ms: how
 * long librdkafka may keep retrying a message before its delivery report
 * says it failed (default 30000, below the default claimTimeoutMs so a
 * report always arrives before the row's lease ends).
 */
#define QBCF_KAFKA_TIMEOUT_MS 30000

/*
 * A librdkafka property QueueBox sets itself: refused in config: unless it
 * has the one value QueueBox gives it (only), with why.
 */
typedef struct QbcfOwnedProp
{
	const char *name;
	const char *only;			/* the one value accepted, or NULL: none */
	const char *why;
} QbcfOwnedProp;

/* a producer's: they carry the delivery guarantees or come from other keys */
static const QbcfOwnedProp qbcf_kafka_producer_owned[] =
{
	{"enable.idempotence", "true", "QueueBox always produces idempotently, so a retried message is never written twice"},
	{"acks", "all", "QueueBox marks a row sent only once every in-sync replica has it"},
	{"request.required.acks", "all", "QueueBox marks a row sent only once every in-sync replica has it"},
	{"delivery.report.only.error", "false", "QueueBox needs a delivery report for every message to mark its row sent"},
	{"dr_cb", NULL, "QueueBox handles the delivery reports itself"},
	{"dr_msg_cb", NULL, "QueueBox handles the delivery reports itself"},
	{"transactional.id", NULL, "QueueBox's producer is idempotent, not transactional"},
	{"bootstrap.servers", NULL, "write the servers under brokers:"},
	{"metadata.broker.list", NULL, "write the servers under brokers:"},
	{"log.queue", NULL, "QueueBox reads librdkafka's log on its own thread"},
	{NULL, NULL, NULL}
};

/* a consumer's: offsets are committed only after the rows commit */
static const QbcfOwnedProp qbcf_kafka_consumer_owned[] =
{
	{"enable.auto.commit", "false", "QueueBox commits an offset only after its row is stored"},
	{"enable.auto.offset.store", "false", "QueueBox commits an offset only after its row is stored"},
	{"group.id", NULL, "write the consumer group under group:"},
	{"bootstrap.servers", NULL, "write the servers under brokers:"},
	{"metadata.broker.list", NULL, "write the servers under brokers:"},
	{"log.queue", NULL, "QueueBox serves librdkafka's log and events on the worker's thread"},
	{"rebalance_cb", NULL, "QueueBox uses librdkafka's default rebalancing"},
	{"offset_commit_cb", NULL, "QueueBox commits offsets itself"},
	{NULL, NULL, NULL}
};

/*
 * qbcf_kafka_props: each property of a config: mapping (node) is applied to a
 * scratch rd_kafka_conf_t (no thread starts), so a typo or a bad value is
 * refused now with librdkafka's own words; the properties QueueBox owns
 * are refused with why.  timeout_ms (a producer's, or NULL) gets
 * message.timeout.ms or delivery.timeout.ms when one is set.
 */
static bool
qbcf_kafka_props(QbcfCtx *cx, const char *path, const QbcfNode *node, const QbHeader *props,
				 int nprops, const QbcfOwnedProp *owned, long *timeout_ms)
{
	rd_kafka_conf_t *conf;
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	bool		ok = true;

	if (nprops == 0)
		return true;
	if ((conf = rd_kafka_conf_new()) == NULL)
		return qbcf_error(cx, path, node, "out of memory");
	for (int i = 0; ok && i < nprops; i++)
	{
		const char *name = props[i].name;
		const char *value = props[i].value;

		qbcf_path_key(sub, sizeof(sub), path, name);
		for (int o = 0; owned[o].name != NULL; o++)
		{
			const char *only = owned[o].only;

			if (strcmp(owned[o].name, name) != 0 ||
				(only != NULL && (strcmp(only, value) == 0 ||
								  (strcmp(only, "all") == 0 && strcmp(value, "-1") == 0))))
				continue;
			ok = qbcf_error(cx, sub, node->kids[i], "QueueBox sets %s itself%s%s: %s; remove it",
							name, only ? " to " : "", only ? only : "", owned[o].why);
			break;
		}
		if (!ok)
			break;
		if (rd_kafka_conf_set(conf, name, value, msg, sizeof(msg)) != RD_KAFKA_CONF_OK)
		{
			ok = qbcf_error(cx, sub, node->kids[i], "librdkafka refused it: %s", msg);
			break;
		}
		if (timeout_ms != NULL &&
			(strcmp(name, "message.timeout.ms") == 0 || strcmp(name, "delivery.timeout.ms") == 0))
		{
			*timeout_ms = strtol(value, NULL, 10);
			if (*timeout_ms <= 0)
				ok = qbcf_error(cx, sub, node->kids[i],
								"0 means retry forever, and a row's delivery report must arrive before its lease ends; give a number of milliseconds, e.g. 30000");
		}
	}
	rd_kafka_conf_destroy(conf);
	return ok;
}

/*
 * qbcf_kafka_brokers: the required bootstrap list (brokers:) into *out.
 * nonempty as qbcf_string's (a destination's may be "" to fail later as the
 * list check says).
 */
static bool
qbcf_kafka_brokers(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *why,
				   bool nonempty, char **out)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	const QbcfNode *n;

	if (!qbcf_required_string(cx, path, m, "brokers", why, nonempty, out, &n))
		return false;
	qbcf_path_key(sub, sizeof(sub), path, "brokers");
	if (!qbcf_brokers_check(*out, msg, sizeof(msg)))
		return qbcf_error(cx, sub, n, "%s", msg);
	return true;
}

/* qbcf_kafka: the keys of a kafka destination (the shared ones are read). */
static bool
qbcf_kafka(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	char		sub[QBCF_PATHLEN];

	d->timeout_ms = QBCF_KAFKA_TIMEOUT_MS;
	qbcf_path_key(sub, sizeof(sub), path, "config");
	return qbcf_kafka_brokers(cx, path, m,
							  "a kafka destination needs its bootstrap servers, e.g. brokers: \"host:9092\"",
							  false, &d->broker_url) &&
		qbcf_target(cx, path, m, d, "topic", NULL, true) &&
		qbcf_target_template(cx, path, m, d, "topic") &&
		qbcf_pairs(cx, sub, qbcf_get(m, "config"), false, &d->props, &d->nprops) &&
		qbcf_kafka_props(cx, sub, qbcf_get(m, "config"), d->props, d->nprops,
						 qbcf_kafka_producer_owned, &d->timeout_ms);
}

const QbcfDestType qbcf_dest_kafka =
{
	.type = "kafka",
	.keys = qbcf_keys_kafka,
	.check = qbcf_kafka,
};

/*
 * qbcf_kafka_source: the servers, topics, group and consumer properties of a
 * kafka source; the group defaults from the source's name.
 */
static bool
qbcf_kafka_source(QbcfCtx *cx, const char *path, const QbcfNode *m, QbSource *s)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *n;
	const QbcfNode *seq;

	if (!qbcf_kafka_brokers(cx, path, m,
							"a kafka source needs its bootstrap servers, e.g. brokers: \"host:9092\"",
							true, &s->broker_url))
		return false;
	if ((n = qbcf_required(cx, path, m, "topics",
						   "the Kafka topics to consume, e.g. topics: [orders]")) == NULL)
		return false;
	qbcf_path_key(sub, sizeof(sub), path, "topics");
	if (!qbcf_section(cx, sub, n, QBCF_SEQ, &seq))
		return false;
	if (seq == NULL || seq->n == 0)
		return qbcf_error(cx, sub, n, "expected a list of at least one topic, e.g. topics: [orders]");
	if ((s->topics = qbcf_arena_alloc(cx->arena, seq->n * sizeof(char *))) == NULL)
		return qbcf_error(cx, sub, n, "out of memory");
	s->ntopics = seq->n;
	for (int i = 0; i < seq->n; i++)
	{
		char		at[QBCF_PATHLEN];

		qbcf_path_index(at, sizeof(at), sub, i);
		if (!qbcf_string(cx, at, seq->kids[i], true, &s->topics[i]))
			return false;
	}
	qbcf_path_key(sub, sizeof(sub), path, "config");
	if (!qbcf_opt_string(cx, path, m, "group", true, &s->group) ||
		!qbcf_pairs(cx, sub, qbcf_get(m, "config"), false, &s->props, &s->nprops) ||
		!qbcf_kafka_props(cx, sub, qbcf_get(m, "config"), s->props, s->nprops,
						  qbcf_kafka_consumer_owned, NULL))
		return false;
	/* the close path (rd_kafka_assign(NULL)) assumes eager rebalancing */
	for (int i = 0; i < s->nprops; i++)
		if (strcmp(s->props[i].name, "partition.assignment.strategy") == 0 &&
			strstr(s->props[i].value, "cooperative") != NULL)
		{
			char		at[QBCF_PATHLEN];

			qbcf_path_key(at, sizeof(at), sub, s->props[i].name);
			return qbcf_error(cx, at, qbcf_get(m, "config")->kids[i],
							  "QueueBox consumes with an eager assignor (range or roundrobin); cooperative rebalancing is not supported yet");
		}
	if (s->group == NULL && (s->group = qbcf_prefixed(cx, "queuebox-", s->name)) == NULL)
		return qbcf_error(cx, path, m, "out of memory");
	return true;
}

const QbcfSourceType qbcf_source_kafka =
{
	.type = "kafka",
	.keys = qbcf_keys_kafka_source,
	.check = qbcf_kafka_source,
};
