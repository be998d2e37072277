/*-------------------------------------------------------------------------
 * qb_source.h
 *	  The broker source consumers: one per source type (rabbitmq, kafka,
 *	  nats), driven the same way by the consumer engine (qb_consume.h).
 *
 * Wording:
 *	- A delivery is one broker message as received: raw body, headers,
 *	  broker message id, type, position (where it sits in the broker: kafka
 *	  "topic/partition/offset", nats "stream/sequence"), and the consumer's
 *	  own handle to acknowledge it.
 *	- A batch is the deliveries of one fetch (qb_consume.h: how the engine
 *	  stores and acknowledges it).
 *
 * Threads: fetch, ack and release run on the engine's thread.  A library
 * that runs threads (librdkafka, cnats) starts them with every signal
 * blocked (so that SIGTERM, SIGHUP and the latch's SIGURG reach only the
 * engine's thread) and hands results over through fd().
 *-------------------------------------------------------------------------
 */
#ifndef QB_SOURCE_H
#define QB_SOURCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "qb_config.h"

typedef struct QbDelivery
{
	char	   *body;			/* raw bytes, NUL-terminated for convenience */
	size_t		len;
	char	   *headers;		/* JSON object text of the broker headers, or NULL */
	char	   *message_id;		/* AMQP message_id, Nats-Msg-Id, or NULL */
	char	   *type;			/* AMQP type property, or NULL */
	char	   *position;		/* kafka "topic/partition/offset", nats "stream/seq", or NULL */
	uint64_t	handle;			/* the consumer's reference for ack/release */
} QbDelivery;

/* Free the strings of n deliveries (not the array). */
extern void qb_deliveries_clear(QbDelivery *d, int n);

/*
 * One consumer implementation.  open() connects and subscribes for one
 * source; fetch() returns up to max deliveries without blocking (0 when
 * none is ready; -1 with err on a connection failure, after which the
 * engine closes and reopens after a pause).  ack() after the rows
 * committed; release() when they could not be stored (delay_ms: when the
 * broker may offer them again, where it supports that).
 */
typedef struct QbConsumerOps
{
	QbSourceType type;
	void	   *(*open) (const QbSource *src, char *err, size_t errlen);
	void		(*close) (void *c);
	int			(*fd) (void *c);
	int			(*fetch) (void *c, QbDelivery *out, int max, char *err, size_t errlen);
	int			(*ack) (void *c, const QbDelivery *d, int n, char *err, size_t errlen);
	void		(*release) (void *c, const QbDelivery *d, int n, long delay_ms);
} QbConsumerOps;

/* QbConsumerOps's functions: each must be set (qb_ops.h) */
#define QB_CONSUMER_OPS(X, T) X(T, open) X(T, close) X(T, fd) X(T, fetch) X(T, ack) X(T, release)

/*
 * At start-up: each consumer of this build sits at its type's index and
 * has every function.  0, or -1 with err ("consumer ops 'nats' lacks
 * 'ack'").  qb_consumer_check checks one table.
 */
extern int	qb_consumers_check(char *err, size_t errlen);
extern int	qb_consumer_check(const QbConsumerOps *ops, char *err, size_t errlen);

/* The implementations (qb_src_*.c); NULL: not a broker (http sources are the ingress's). */
extern const QbConsumerOps *qb_consumer_ops(QbSourceType type);

#endif							/* QB_SOURCE_H */
