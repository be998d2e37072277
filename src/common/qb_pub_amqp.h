/*-------------------------------------------------------------------------
 * qb_pub_amqp.h
 *	  The RabbitMQ publisher (librabbitmq-c 0.11): publisher confirms on one
 *	  connection and channel per destination.
 *
 * Wording:
 *	- A connection is one AMQP connection with channel 1 in confirm mode,
 *	  kept across batches for one destination (keyed by its name and url).
 *	- A delivery tag is the channel's publish counter (1, 2, 3 ...) that the
 *	  broker's basic.ack and basic.nack refer to; multiple=true covers every
 *	  tag up to the one named.
 *	- An unconfirmed message is one published and neither acked nor nacked
 *	  yet.  A returned message (basic.return: mandatory and unroutable) is
 *	  still acked by the broker afterwards; we report that ack as a failure.
 *
 * The URL is amqp[s]://[user[:password]@]host[:port][/vhost][?options]; an
 * empty or missing vhost is "/" (write %2f for it explicitly, or any other
 * vhost percent-encoded).  Options: heartbeat (seconds, 0 = off, the
 * default), connection_timeout (ms, default 5000), and for amqps cacertfile,
 * certfile, keyfile, verify (verify_peer, the default, or verify_none).
 *-------------------------------------------------------------------------
 */
#ifndef QB_PUB_AMQP_H
#define QB_PUB_AMQP_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_publish.h"

typedef struct QbAmqpUrl
{
	bool		tls;			/* amqps */
	char	   *user;			/* default "guest" */
	char	   *password;		/* default "guest" */
	char	   *host;			/* without brackets for an IPv6 literal */
	int			port;			/* default 5672, 5671 with TLS */
	char	   *vhost;			/* default "/" */
	int			heartbeat;		/* seconds; 0 = off */
	long		connect_timeout_ms; /* default 5000 */
	char	   *cacert;			/* amqps: CA bundle (PEM), or NULL */
	char	   *cert;			/* amqps: client certificate (PEM), or NULL */
	char	   *key;			/* amqps: client key (PEM), or NULL */
	bool		verify;			/* amqps: verify the peer and host name */
} QbAmqpUrl;

/*
 * Parse a destination url.  On failure returns false with the reason in err;
 * the message never repeats the url (it may hold a password).  Free with
 * qb_amqp_url_free (also after a failure).
 */
extern bool qb_amqp_url_parse(const char *url, QbAmqpUrl *out, char *err, size_t errlen);
extern void qb_amqp_url_free(QbAmqpUrl *u);

/* The names a routingKey template may use: topic, key (NULL-terminated). */
extern const char *const qb_amqp_routing_key_names[];

/*
 * Build the AMQP headers table of a row (exported for the unit tests):
 * the row's headers (a JSON object text, or NULL) become a table whose
 * string values are long strings; other values are their JSON text, nulls
 * are skipped.  The X-Correlation-Id value (any letter case) is copied to
 * *correlation_id (malloc'd, NULL when absent).  Returns false with err set
 * when the headers can never be sent (not an object, a name longer than 255
 * bytes).  On success the entries and their strings are malloc'd: free with
 * qb_amqp_headers_free.
 */
typedef struct QbAmqpHeader
{
	char	   *name;
	char	   *value;
} QbAmqpHeader;

extern bool qb_amqp_headers_build(const char *row_headers, QbAmqpHeader **out, int *n,
								  char **correlation_id, char *err, size_t errlen);
extern void qb_amqp_headers_free(QbAmqpHeader *h, int n);

extern const QbPublisherOps qb_amqp_publisher;

#endif							/* QB_PUB_AMQP_H */
