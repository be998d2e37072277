/*-------------------------------------------------------------------------
 * qb_publish.h
 *	  The publishers behind the outbox engine: one per destination type
 *	  (http, rabbitmq, kafka, nats), driven the same way.
 *
 * Wording:
 *	- A message is what one outbox row becomes at a destination: message id,
 *	  topic, key, headers, body.  The engine parses the row's headers text
 *	  once per message (qb_message_headers) and hands every publisher the
 *	  parsed object, so no publisher parses or re-validates it: a row whose
 *	  headers are not a JSON object is dead before any publisher sees it.
 *	  Every publisher makes its transport's headers of it by one rule
 *	  (qb_headers.h).
 *	- A publish is one delivery attempt of one message, tagged with the row's
 *	  index in its batch; its outcome comes back through perform(): ok, a
 *	  failed attempt (retry with backoff), or permanent (dead at once: the
 *	  broker will never accept it as it is).
 *	- The publish set (QbPubSet) holds one publisher per destination type in
 *	  use, created on first use and kept across batches (connections too),
 *	  and one epoll fd over every publisher's fd, so the host waits on one fd.
 *
 * Threads: a publisher runs on the engine's thread.  A library that starts
 * threads of its own (librdkafka, cnats) hands results over through its fd
 * (a pipe or an event queue); its threads never call back into the engine
 * and never run with signals unblocked (so that SIGTERM, SIGHUP and the
 * latch's SIGURG reach only the engine's thread).
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUBLISH_H
#define QB_PUBLISH_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "qb_config.h"

typedef struct QbMessage
{
	const char *message_id;		/* the row's message_id (uuid text) */
	const char *topic;
	const char *key;			/* NULL when the row has none */
	const json_t *headers;		/* a JSON object (borrowed), or NULL: none */
	const char *body;
	size_t		body_len;
} QbMessage;

typedef struct QbPubOutcome
{
	bool		ok;				/* the destination acknowledged it */
	bool		permanent;		/* not ok and retrying cannot help: dead now */
	char		error[QB_ERRLEN];		/* why it failed, for last_error */
	int			status;			/* HTTP status answered, 0 when none (connection error, timeout, broker) */
	bool		gone;			/* HTTP 410 Gone: the receiver asks us to stop sending (disable the destination) */
	long		retry_after_ms; /* 429 or 503 with a Retry-After header: its delay in ms (delta-seconds or HTTP-date); -1 when none */
} QbPubOutcome;

/*
 * A failed attempt with no detail: what every publisher starts an outcome
 * from (QbPubOutcome o = QB_PUB_OUTCOME_INIT, or a compound literal), so
 * that a field added here gets its "none" value everywhere.
 */
#define QB_PUB_OUTCOME_INIT \
	{.ok = false, .permanent = false, .error = "", .status = 0, .gone = false, .retry_after_ms = -1}

typedef void (*QbPubDone) (void *arg, int tag, const QbPubOutcome *outcome);

typedef enum QbPubStart
{
	QB_PUB_STARTED,				/* in flight; the outcome comes via perform */
	QB_PUB_ROW_INVALID,			/* the row can never be sent as it is: dead */
	QB_PUB_NOT_STARTED			/* a local or connection failure: retry */
} QbPubStart;

/*
 * One publisher implementation.  Every function is called on the engine's
 * thread.  fd() is an fd to wait on for readability (-1: none; then the
 * engine relies on timeout_ms()).  perform() never blocks.
 */
typedef struct QbPublisherOps
{
	QbDestType	type;
	void	   *(*create) (char *err, size_t errlen);
	void		(*destroy) (void *p);
	QbPubStart	(*start) (void *p, const QbDestination *dest, const QbMessage *m, int tag,
						  char *err, size_t errlen);
	int			(*in_flight) (void *p);
	int			(*fd) (void *p);
	long		(*timeout_ms) (void *p);
	void		(*perform) (void *p, QbPubDone done, void *arg);
	/* give up on every publish in flight (a stop); they are not reported */
	void		(*abort_all) (void *p);

	/*
	 * After a reload, with nothing in flight: close the connections no
	 * destination of cfg uses any more (removed, or its url changed).
	 * NULL: the publisher keeps none of its own (HTTP: curl's cache).
	 */
	void		(*prune) (void *p, const QbConfig *cfg);
} QbPublisherOps;

/* QbPublisherOps's functions: each must be set but prune (qb_ops.h) */
#define QB_PUBLISHER_OPS(X, T) X(T, create) X(T, destroy) X(T, start) X(T, in_flight) \
	X(T, fd) X(T, timeout_ms) X(T, perform) X(T, abort_all)
#define QB_PUBLISHER_OPS_OPTIONAL(X, T) X(T, prune)

/*
 * At start-up: each publisher of this build sits at its type's index and
 * has every function.  0, or -1 with err ("publisher ops 'kafka' lacks
 * 'perform'").  qb_publisher_check checks one table.
 */
extern int	qb_publishers_check(char *err, size_t errlen);
extern int	qb_publisher_check(const QbPublisherOps *ops, char *err, size_t errlen);

/* The implementations: qb_pub_http.c, qb_pub_amqp.c, qb_pub_kafka.c, qb_pub_nats.c. */

typedef struct QbPubSet QbPubSet;

extern QbPubSet *qb_pubset_new(char *err, size_t errlen);
extern void qb_pubset_free(QbPubSet *s);

/* Start one publish to dest, creating its type's publisher on first use. */
extern QbPubStart qb_pubset_start(QbPubSet *s, const QbDestination *dest, const QbMessage *m,
								  int tag, char *err, size_t errlen);
extern int	qb_pubset_in_flight(QbPubSet *s);

/* The one fd to wait on (an epoll set over the publishers' fds). */
extern int	qb_pubset_fd(QbPubSet *s);

/* How long the host may wait before perform must run (ms, >= 0). */
extern long qb_pubset_timeout_ms(QbPubSet *s);
extern void qb_pubset_perform(QbPubSet *s, QbPubDone done, void *arg);
extern void qb_pubset_abort_all(QbPubSet *s);

/* After a reload, between batches: each publisher's prune. */
extern void qb_pubset_prune(QbPubSet *s, const QbConfig *cfg);

/*
 * The destination of cfg named name with this type, or NULL: what a
 * publisher's prune asks of each connection it holds.
 */
extern const QbDestination *qb_pubset_dest(const QbConfig *cfg, QbDestType type,
										   const char *name);

/*
 * The row's headers text (NULL, "" and "{}" are none) parsed for a
 * QbMessage: *out is a JSON object to json_decref after the publish
 * started (publishers copy what they keep), or NULL for none.  False with
 * err when the text is not a JSON object: the row can never be sent as it
 * is (QB_PUB_ROW_INVALID, whatever the destination type).
 */
extern bool qb_message_headers(const char *text, json_t **out, char *err, size_t errlen);

/* True when this build can publish to the type. */
extern bool qb_pubset_supports(QbDestType type);

#endif							/* QB_PUBLISH_H */
