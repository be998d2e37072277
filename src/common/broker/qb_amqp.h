/*-------------------------------------------------------------------------
 * qb_amqp.h
 *	  What the RabbitMQ publisher and the RabbitMQ source consumer share
 *	  (librabbitmq-c 0.11): the url, connecting and logging in; and what
 *	  the configuration checks with (the url, the routingKey names).
 *
 * The URL is amqp[s]://[user[:password]@]host[:port][/vhost][?options],
 * read by the one URL reader (qb_url.h); no user info is guest/guest; an
 * empty or missing vhost is "/" (write %2f for it explicitly, or any other
 * vhost percent-encoded).  Options: heartbeat (seconds, 0 = off, the
 * default), connection_timeout (ms, default 5000), and for amqps cacertfile,
 * certfile, keyfile, verify (verify_peer, the default, or verify_none).
 *-------------------------------------------------------------------------
 */
#ifndef QB_AMQP_H
#define QB_AMQP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/time.h>

#include <amqp.h>

#include "qb_egress.h"
#include "qb_egress_policy.h"

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
	QbEgress   *egress;			/* the destination's rules (a copy, owned), or
								 * NULL: the host's */
	const QbEgressPolicy *host_egress;	/* the host's, or NULL: none */
} QbAmqpUrl;

/*
 * Parse a destination url.  On failure returns false with the reason in err;
 * the message never repeats the url (it may hold a password).  Free with
 * qb_amqp_url_free (also after a failure).
 */
extern bool qb_amqp_url_parse(const char *url, QbAmqpUrl *out, char *err, size_t errlen);
extern void qb_amqp_url_free(QbAmqpUrl *u);

/*
 * The names a destination's routingKey template may use: topic, key
 * (NULL-terminated); the configuration checks the template against them.
 */
extern const char *const qb_amqp_routing_key_names[];

/* A timeval of ms (deadlines: qb_now_ms, qb_clock.h). */
extern void qb_amqp_tv(struct timeval *tv, long ms);

/* Describe a failed RPC reply as "where: what failed: reason". */
extern void qb_amqp_rpc_error(const char *where, amqp_rpc_reply_t r, const char *what,
							  char *err, size_t errlen);

/* A non-blocking TCP socket connected to host:port, or -1 with err set. */
extern int	qb_amqp_tcp_connect(const char *host, int port, long timeout_ms, const QbEgress *egress,
								char *err, size_t errlen);

/*
 * A logged-in connection to u (TCP or TLS), no channel open yet; NULL with
 * the reason, prefixed with where, in err.  cname: the connection_name
 * client property; confirms: announce the publisher_confirms capability.
 */
extern amqp_connection_state_t qb_amqp_login(const QbAmqpUrl *u, const char *where,
											 const char *cname, bool confirms,
											 int frame_max, char *err, size_t errlen);

#endif							/* QB_AMQP_H */
