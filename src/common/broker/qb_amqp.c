/*-------------------------------------------------------------------------
 * qb_amqp.c
 *	  What the RabbitMQ publisher (qb_pub_amqp.c) and the RabbitMQ source
 *	  consumer (qb_src_amqp.c) share: the url, the TCP/TLS connect and the
 *	  login (librabbitmq-c 0.11), and the wording of a failed RPC.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <openssl/ssl.h>

#include "qb_amqp.h"
#include "qb_crypto.h"
#include "qb_errlen.h"
#include "qb_clock.h"
#include "qb_url.h"

#define QBAM_RPC_TIMEOUT_MS		10000

/* ---- time (the clock is qb_clock.h's) -------------------------------------- */

void
qb_amqp_tv(struct timeval *tv, long ms)
{
	tv->tv_sec = ms / 1000;
	tv->tv_usec = (ms % 1000) * 1000;
}

/* ---- the url ------------------------------------------------------------ */

void
qb_amqp_url_free(QbAmqpUrl *u)
{
	free(u->user);
	free(u->password);
	free(u->host);
	free(u->vhost);
	free(u->cacert);
	free(u->cert);
	free(u->key);
	qb_egress_free(u->egress);
	memset(u, 0, sizeof(*u));
}

const char *const qb_amqp_routing_key_names[] = {"topic", "key", NULL};

/* qbam_int: a whole decimal number in [lo, hi]. */
static bool
qbam_int(const char *s, long lo, long hi, long *out)
{
	char	   *end;
	long		v;

	if (*s == '\0' || !isdigit((unsigned char) *s))
		return false;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

/* qbam_option: one name=value of the query. */
static bool
qbam_option(QbAmqpUrl *u, const char *name, const char *value, char *err, size_t errlen)
{
	long		v;
	char	  **file = NULL;

	if (strcmp(name, "heartbeat") == 0)
	{
		if (!qbam_int(value, 0, 3600, &v))
		{
			snprintf(err, errlen, "heartbeat in the URL query must be a number of seconds from 0 to 3600");
			return false;
		}
		u->heartbeat = (int) v;
		return true;
	}
	if (strcmp(name, "connection_timeout") == 0)
	{
		if (!qbam_int(value, 1, 600000, &v))
		{
			snprintf(err, errlen, "connection_timeout in the URL query must be milliseconds from 1 to 600000");
			return false;
		}
		u->connect_timeout_ms = v;
		return true;
	}
	if (strcmp(name, "cacertfile") == 0)
		file = &u->cacert;
	else if (strcmp(name, "certfile") == 0)
		file = &u->cert;
	else if (strcmp(name, "keyfile") == 0)
		file = &u->key;
	else if (strcmp(name, "verify") != 0)
	{
		snprintf(err, errlen,
				 "unsupported option \"%.40s\" in the URL query (known: heartbeat, connection_timeout, cacertfile, certfile, keyfile, verify)",
				 name);
		return false;
	}
	if (!u->tls)
	{
		snprintf(err, errlen, "%s in the URL query is for amqps:// URLs only", name);
		return false;
	}
	if (file == NULL)
	{
		if (strcmp(value, "verify_peer") == 0)
			u->verify = true;
		else if (strcmp(value, "verify_none") == 0)
			u->verify = false;
		else
		{
			snprintf(err, errlen, "verify in the URL query must be verify_peer or verify_none");
			return false;
		}
		return true;
	}
	if (value[0] == '\0')
	{
		snprintf(err, errlen, "%s in the URL query is empty; give a file path", name);
		return false;
	}
	free(*file);
	if ((*file = strdup(value)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	return true;
}

/* qbam_credentials: the URL's user and password (moved), guest/guest when it has none */
static bool
qbam_credentials(QbAmqpUrl *u, QbUrl *url, char *err, size_t errlen)
{
	if (url->user == NULL && url->password == NULL)
	{
		u->user = strdup("guest");
		u->password = strdup("guest");
	}
	else
	{
		u->user = url->user != NULL ? url->user : strdup("");
		u->password = url->password != NULL ? url->password : strdup("");
		url->user = url->password = NULL;
	}
	if (u->user == NULL || u->password == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	return true;
}

/* qbam_vhost: the path's one segment, decoded; "/" when it is empty */
static bool
qbam_vhost(QbAmqpUrl *u, const QbUrl *url, char *err, size_t errlen)
{
	if (!url->path_one_segment)
	{
		snprintf(err, errlen,
				 "the vhost is one path segment; percent-encode a '/' in it as %%2f (\"/\" itself is the default)");
		return false;
	}
	if ((u->vhost = strdup(url->path[0] == '/' && url->path[1] != '\0' ? url->path + 1 : "/")) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	return true;
}

/* qbam_query: the query's name=value options */
static bool
qbam_query(QbAmqpUrl *u, const char *query, char *err, size_t errlen)
{
	char	   *name;
	char	   *value;
	int			rc;

	while (query != NULL && (rc = qb_url_query_next(&query, &name, &value, err, errlen)) != 0)
	{
		bool		ok = rc > 0;

		if (ok && value == NULL)
		{
			snprintf(err, errlen, "an option in the URL query has no value; write name=value");
			ok = false;
		}
		else if (ok)
			ok = qbam_option(u, name, value, err, errlen);
		free(name);
		free(value);
		if (!ok)
			return false;
	}
	if ((u->cert == NULL) != (u->key == NULL))
	{
		snprintf(err, errlen, "certfile and keyfile in the URL query go together: give both or neither");
		return false;
	}
	return true;
}

/* qb_amqp_url_parse: see qb_amqp.h; the URL read by qb_url_read. */
bool
qb_amqp_url_parse(const char *url, QbAmqpUrl *u, char *err, size_t errlen)
{
	static const char *const schemes[] = {"amqp", "amqps", NULL};
	QbUrl		parts;
	bool		ok;

	memset(u, 0, sizeof(*u));
	u->connect_timeout_ms = 5000;
	u->verify = true;
	if (!qb_url_read(url, schemes, QB_URL_USERINFO | QB_URL_QUERY, &parts, err, errlen))
		return false;
	u->tls = strcmp(parts.scheme, "amqps") == 0;
	u->host = parts.host;
	parts.host = NULL;
	u->port = parts.port;
	ok = u->host != NULL && qbam_credentials(u, &parts, err, errlen) &&
		qbam_vhost(u, &parts, err, errlen) && qbam_query(u, parts.query, err, errlen);
	qb_url_free(&parts);
	return ok;
}

/* ---- connecting ---------------------------------------------------------- */

/* qb_amqp_rpc_error describes a failed RPC reply. */
void
qb_amqp_rpc_error(const char *where, amqp_rpc_reply_t r, const char *what, char *err, size_t errlen)
{
	switch (r.reply_type)
	{
		case AMQP_RESPONSE_NORMAL:
			snprintf(err, errlen, "%s: %s: no error", where, what);
			break;
		case AMQP_RESPONSE_NONE:
			snprintf(err, errlen, "%s: %s: no reply from the broker", where, what);
			break;
		case AMQP_RESPONSE_LIBRARY_EXCEPTION:
			snprintf(err, errlen, "%s: %s failed: %s", where, what,
					 amqp_error_string2(r.library_error));
			break;
		case AMQP_RESPONSE_SERVER_EXCEPTION:
			if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD)
			{
				amqp_connection_close_t *m = r.reply.decoded;

				snprintf(err, errlen, "%s: %s refused by the broker: %u %.*s", where, what,
						 m->reply_code, (int) m->reply_text.len, (char *) m->reply_text.bytes);
			}
			else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD)
			{
				amqp_channel_close_t *m = r.reply.decoded;

				snprintf(err, errlen, "%s: %s refused by the broker: %u %.*s", where, what,
						 m->reply_code, (int) m->reply_text.len, (char *) m->reply_text.bytes);
			}
			else
				snprintf(err, errlen, "%s: %s: unexpected method 0x%08X from the broker",
						 where, what, r.reply.id);
			break;
	}
}

/*
 * qb_amqp_tcp_connect: a non-blocking TCP connection to host:port within
 * timeout_ms (librabbitmq's own loses the errno of a refused connect).
 * The socket stays non-blocking, as librabbitmq's would: its reads and
 * writes wait with poll() where they must.  -1 with the reason in err.
 */
int
qb_amqp_tcp_connect(const char *host, int port, long timeout_ms, const QbEgress *egress,
					char *err, size_t errlen)
{
	struct addrinfo hints = {0};
	struct addrinfo *res = NULL;
	char		service[16];
	long		deadline = qb_now_ms() + timeout_ms;
	int			rc;
	int			fd = -1;

	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_ADDRCONFIG;
	snprintf(service, sizeof(service), "%d", port);
	if ((rc = getaddrinfo(host, service, &hints, &res)) != 0)
	{
		snprintf(err, errlen, "cannot resolve host: %s", gai_strerror(rc));
		return -1;
	}
	snprintf(err, errlen, "no address");
	for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next)
	{
		int			one = 1;
		int			soerr = 0;
		socklen_t	len = sizeof(soerr);

		/* the address about to be used: a name cannot lead past the rules */
		if (!qb_egress_addr_ok(egress, host, ai->ai_addr, err, errlen))
			continue;
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0)
		{
			snprintf(err, errlen, "socket: %s", strerror(errno));
			continue;
		}
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
		{
			if (errno != EINPROGRESS)
				soerr = errno;
			else
			{
				for (;;)
				{
					struct pollfd pfd = {.fd = fd, .events = POLLOUT};
					long		left = deadline - qb_now_ms();
					int			n;

					if (left <= 0)
					{
						soerr = ETIMEDOUT;
						break;
					}
					n = poll(&pfd, 1, (int) left);
					if (n < 0 && errno == EINTR)
						continue;
					if (n < 0)
						soerr = errno;
					else if (n == 0)
						soerr = ETIMEDOUT;
					else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0)
						soerr = errno;
					break;
				}
			}
		}
		if (soerr == 0)
		{
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			freeaddrinfo(res);
			return fd;
		}
		if (soerr == ETIMEDOUT)
			snprintf(err, errlen, "no answer within %ld ms", timeout_ms);
		else
			snprintf(err, errlen, "%s", strerror(soerr));
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	return -1;
}


/*
 * qbam_socket: librabbitmq's socket for u: TLS with u's files and
 * verification (the system's CAs when none is given), or plain TCP.
 */
static amqp_socket_t *
qbam_socket(amqp_connection_state_t amqp, const QbAmqpUrl *u, const char *where,
		   char *err, size_t errlen)
{
	amqp_socket_t *sock = u->tls ? amqp_ssl_socket_new(amqp) : amqp_tcp_socket_new(amqp);

	if (sock == NULL)
	{
		snprintf(err, errlen, "%s: cannot create a socket", where);
		return NULL;
	}
	if (!u->tls)
		return sock;
	amqp_ssl_socket_set_verify_peer(sock, u->verify);
	amqp_ssl_socket_set_verify_hostname(sock, u->verify);
	if (u->cacert && amqp_ssl_socket_set_cacert(sock, u->cacert) != AMQP_STATUS_OK)
	{
		snprintf(err, errlen, "%s: cannot use cacertfile %s", where, u->cacert);
		return NULL;
	}
	/* librabbitmq 0.11 loads no CA by itself: use the system's */
	if (u->cacert == NULL && u->verify)
		SSL_CTX_set_default_verify_paths(amqp_ssl_socket_get_context(sock));
	if (u->cert && amqp_ssl_socket_set_key(sock, u->cert, u->key) != AMQP_STATUS_OK)
	{
		snprintf(err, errlen, "%s: cannot use certfile %s with keyfile %s", where, u->cert, u->key);
		return NULL;
	}
	return sock;
}

/*
 * qbam_open_tls: librabbitmq resolves, connects and shakes hands (which
 * sends no credential); then the address it used is judged before the
 * login.  A socket error it lost the reason of is learnt by connecting
 * once more.
 */
static bool
qbam_open_tls(amqp_connection_state_t amqp, amqp_socket_t *sock, const QbAmqpUrl *u,
			 const char *where, char *err, size_t errlen)
{
	struct timeval tv;
	struct sockaddr_storage peer;
	socklen_t	plen = sizeof(peer);
	char		why[QB_ERRLEN];
	int			rc;
	int			saved_errno;

	qb_amqp_tv(&tv, u->connect_timeout_ms);
	errno = 0;
	rc = amqp_socket_open_noblock(sock, u->host, u->port, &tv);
	saved_errno = errno;
	if (rc == AMQP_STATUS_SOCKET_ERROR && saved_errno != 0 && saved_errno != EINPROGRESS)
		snprintf(why, sizeof(why), "%s", strerror(saved_errno));
	else if (rc == AMQP_STATUS_SOCKET_ERROR)
	{
		int			fd = qb_amqp_tcp_connect(u->host, u->port, u->connect_timeout_ms,
											 qb_egress_in_force(u->egress, u->host_egress), why, sizeof(why));

		if (fd >= 0)
		{
			close(fd);
			snprintf(why, sizeof(why), "a socket error");
		}
	}
	else if (rc == AMQP_STATUS_TIMEOUT)
		snprintf(why, sizeof(why), "no answer within %ld ms", u->connect_timeout_ms);
	else if (rc != AMQP_STATUS_OK)
		snprintf(why, sizeof(why), "%s", amqp_error_string2(rc));
	else if (getpeername(amqp_get_sockfd(amqp), (struct sockaddr *) &peer, &plen) != 0)
		snprintf(why, sizeof(why), "getpeername: %s", strerror(errno));
	else if (qb_egress_addr_ok(qb_egress_in_force(u->egress, u->host_egress), u->host,
							   (struct sockaddr *) &peer, why, sizeof(why)))
		return true;
	snprintf(err, errlen, "%s: cannot connect: %s", where, why);
	return false;
}

/* qbam_open_tcp: our own connect, for an exact reason ("Connection refused") */
static bool
qbam_open_tcp(amqp_socket_t *sock, const QbAmqpUrl *u, const char *where, char *err, size_t errlen)
{
	char		why[QB_ERRLEN];
	int			fd = qb_amqp_tcp_connect(u->host, u->port, u->connect_timeout_ms,
										 qb_egress_in_force(u->egress, u->host_egress), why, sizeof(why));

	if (fd < 0)
	{
		snprintf(err, errlen, "%s: cannot connect: %s", where, why);
		return false;
	}
	amqp_tcp_socket_set_sockfd(sock, fd);
	return true;
}

/*
 * qb_amqp_login: a connection to u (TCP or TLS within connect_timeout),
 * logged in with the client properties connection_name = cname and the
 * capabilities connection.blocked, authentication_failure_close, and
 * publisher_confirms when confirms.  No channel is open yet.  NULL with
 * the reason (prefixed with where) in err.
 */
amqp_connection_state_t
qb_amqp_login(const QbAmqpUrl *u, const char *where, const char *cname, bool confirms,
			  int frame_max, char *err, size_t errlen)
{
	amqp_connection_state_t amqp;
	amqp_socket_t *sock;
	struct timeval tv;
	amqp_rpc_reply_t r;
	amqp_table_entry_t caps[3];
	amqp_table_entry_t props[2];
	amqp_table_t client;

	if ((amqp = amqp_new_connection()) == NULL)
	{
		snprintf(err, errlen, "%s: out of memory", where);
		return NULL;
	}
	if ((sock = qbam_socket(amqp, u, where, err, errlen)) == NULL ||
		!(u->tls ? qbam_open_tls(amqp, sock, u, where, err, errlen)
		  : qbam_open_tcp(sock, u, where, err, errlen)))
		goto fail;

	/* ask for connection.blocked notices; keep authentication_failure_close */
	caps[0].key = amqp_cstring_bytes("connection.blocked");
	caps[0].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[0].value.value.boolean = 1;
	caps[1].key = amqp_cstring_bytes("authentication_failure_close");
	caps[1].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[1].value.value.boolean = 1;
	caps[2].key = amqp_cstring_bytes("publisher_confirms");
	caps[2].value.kind = AMQP_FIELD_KIND_BOOLEAN;
	caps[2].value.value.boolean = 1;
	props[0].key = amqp_cstring_bytes("capabilities");
	props[0].value.kind = AMQP_FIELD_KIND_TABLE;
	props[0].value.value.table.num_entries = confirms ? 3 : 2;
	props[0].value.value.table.entries = caps;
	props[1].key = amqp_cstring_bytes("connection_name");
	props[1].value.kind = AMQP_FIELD_KIND_UTF8;
	props[1].value.value.bytes = amqp_cstring_bytes(cname);
	client.num_entries = 2;
	client.entries = props;

	qb_amqp_tv(&tv, u->connect_timeout_ms > QBAM_RPC_TIMEOUT_MS ? u->connect_timeout_ms : QBAM_RPC_TIMEOUT_MS);
	amqp_set_handshake_timeout(amqp, &tv);
	amqp_set_rpc_timeout(amqp, &tv);
	r = amqp_login_with_properties(amqp, u->vhost, 0, frame_max, u->heartbeat,
								   &client, AMQP_SASL_METHOD_PLAIN, u->user, u->password);
	if (r.reply_type != AMQP_RESPONSE_NORMAL)
	{
		qb_amqp_rpc_error(where, r, "login", err, errlen);
		goto fail;
	}
	return amqp;

fail:
	amqp_destroy_connection(amqp);
	return NULL;
}
