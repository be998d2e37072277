/*-------------------------------------------------------------------------
 * qb_publish.c
 *	  The publish set: one instance of each publisher type in use.
 *
 * See qb_publish.h for the vocabulary.  The set keeps one instance per
 * destination type, created on first use; each instance's fd joins the
 * set's epoll fd once, when the instance is created (a publisher's fd is
 * constant for its life).
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "qb_ops.h"
#include "qb_pub_amqp.h"
#include "qb_pub_http.h"
#include "qb_pub_kafka.h"
#include "qb_publish.h"
#include "qb_pub_nats.h"

#define QBP_NTYPES 4

/* The publishers this build has, indexed by QbDestType; NULL: not yet. */
static const QbPublisherOps *const qbp_ops[QBP_NTYPES] = {
	[QB_DEST_HTTP] = &qb_http_publisher,
	[QB_DEST_RABBITMQ] = &qb_amqp_publisher,
	[QB_DEST_KAFKA] = &qb_kafka_publisher,
	[QB_DEST_NATS] = &qb_nats_publisher,
};

struct QbPubSet
{
	int			epfd;
	void	   *inst[QBP_NTYPES];
};

QB_OPS_LISTED(QbPublisherOps, 1, QB_PUBLISHER_OPS, QB_PUBLISHER_OPS_OPTIONAL);

/* qb_publisher_check: see qb_publish.h. */
int
qb_publisher_check(const QbPublisherOps *ops, char *err, size_t errlen)
{
	static const QbOpsField fields[] = {QB_PUBLISHER_OPS(QB_OPS_FIELD, QbPublisherOps)};

	return qb_ops_check("publisher ops", qb_dest_type_name(ops->type), ops, fields,
						sizeof(fields) / sizeof(fields[0]), err, errlen);
}

/* qb_publishers_check: see qb_publish.h. */
int
qb_publishers_check(char *err, size_t errlen)
{
	for (int t = 0; t < QBP_NTYPES; t++)
	{
		if (qbp_ops[t] == NULL)
			continue;
		if ((int) qbp_ops[t]->type != t)
		{
			snprintf(err, errlen, "publisher ops at the index of '%s' are another type's",
					 qb_dest_type_name((QbDestType) t));
			return -1;
		}
		if (qb_publisher_check(qbp_ops[t], err, errlen) != 0)
			return -1;
	}
	return 0;
}

bool
qb_pubset_supports(QbDestType type)
{
	return (int) type >= 0 && (int) type < QBP_NTYPES && qbp_ops[type] != NULL;
}

QbPubSet *
qb_pubset_new(char *err, size_t errlen)
{
	QbPubSet   *s = calloc(1, sizeof(QbPubSet));

	if (s == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	if ((s->epfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
	{
		snprintf(err, errlen, "epoll_create1: %s", strerror(errno));
		free(s);
		return NULL;
	}
	return s;
}

void
qb_pubset_free(QbPubSet *s)
{
	if (s == NULL)
		return;
	for (int t = 0; t < QBP_NTYPES; t++)
		if (s->inst[t] != NULL)
			qbp_ops[t]->destroy(s->inst[t]);
	close(s->epfd);
	free(s);
}

/* qbp_instance: the type's publisher, created on first use. */
static void *
qbp_instance(QbPubSet *s, QbDestType t, char *err, size_t errlen)
{
	int			fd;

	if (s->inst[t] != NULL)
		return s->inst[t];
	if ((s->inst[t] = qbp_ops[t]->create(err, errlen)) == NULL)
		return NULL;
	if ((fd = qbp_ops[t]->fd(s->inst[t])) >= 0)
	{
		struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t) t};

		if (epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &ev) != 0)
		{
			snprintf(err, errlen, "epoll_ctl: %s", strerror(errno));
			qbp_ops[t]->destroy(s->inst[t]);
			s->inst[t] = NULL;
			return NULL;
		}
	}
	return s->inst[t];
}

bool
qb_message_headers(const char *text, json_t **out, char *err, size_t errlen)
{
	json_t	   *obj;

	*out = NULL;
	if (text == NULL || text[0] == '\0' || strcmp(text, "{}") == 0)
		return true;
	obj = json_loads(text, JSON_DECODE_ANY, NULL);
	if (obj == NULL || !json_is_object(obj))
	{
		json_decref(obj);
		snprintf(err, errlen,
				 "the row's headers are not a JSON object; fix them, then requeue the row (queuebox.requeue_outbox)");
		return false;
	}
	if (json_object_size(obj) == 0)
		json_decref(obj);
	else
		*out = obj;
	return true;
}

QbPubStart
qb_pubset_start(QbPubSet *s, const QbDestination *dest, const QbMessage *m, int tag,
				char *err, size_t errlen)
{
	void	   *p;

	if (!qb_pubset_supports(dest->type))
	{
		snprintf(err, errlen,
				 "destination \"%s\" is of type %s, which this build of QueueBox cannot publish to; route the topic to an http destination, then requeue the row (queuebox.requeue_outbox)",
				 dest->name, qb_dest_type_name(dest->type));
		return QB_PUB_ROW_INVALID;
	}
	if ((p = qbp_instance(s, dest->type, err, errlen)) == NULL)
		return QB_PUB_NOT_STARTED;
	return qbp_ops[dest->type]->start(p, dest, m, tag, err, errlen);
}

int
qb_pubset_in_flight(QbPubSet *s)
{
	int			n = 0;

	for (int t = 0; t < QBP_NTYPES; t++)
		if (s->inst[t] != NULL)
			n += qbp_ops[t]->in_flight(s->inst[t]);
	return n;
}

int
qb_pubset_fd(QbPubSet *s)
{
	return s->epfd;
}

long
qb_pubset_timeout_ms(QbPubSet *s)
{
	long		best = 1000;

	for (int t = 0; t < QBP_NTYPES; t++)
		if (s->inst[t] != NULL && qbp_ops[t]->in_flight(s->inst[t]) > 0)
		{
			long		ms = qbp_ops[t]->timeout_ms(s->inst[t]);

			if (ms >= 0 && ms < best)
				best = ms;
		}
	return best;
}

void
qb_pubset_perform(QbPubSet *s, QbPubDone done, void *arg)
{
	for (int t = 0; t < QBP_NTYPES; t++)
		if (s->inst[t] != NULL)
			qbp_ops[t]->perform(s->inst[t], done, arg);
}

void
qb_pubset_prune(QbPubSet *s, const QbConfig *cfg)
{
	for (int t = 0; t < QBP_NTYPES; t++)
		if (s->inst[t] != NULL && qbp_ops[t]->prune != NULL)
			qbp_ops[t]->prune(s->inst[t], cfg);
}

const QbDestination *
qb_pubset_dest(const QbConfig *cfg, QbDestType type, const char *name)
{
	for (int i = 0; cfg != NULL && i < cfg->ndestinations; i++)
		if (cfg->destinations[i].type == type && strcmp(cfg->destinations[i].name, name) == 0)
			return &cfg->destinations[i];
	return NULL;
}

void
qb_pubset_abort_all(QbPubSet *s)
{
	for (int t = 0; t < QBP_NTYPES; t++)
		if (s->inst[t] != NULL)
			qbp_ops[t]->abort_all(s->inst[t]);
}
