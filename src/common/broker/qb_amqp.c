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
#include <time.h>
#include <unistd.h>

#include <amqp.h>
#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <openssl/ssl.h>

#include "qb_amqp.h"
#include "qb_crypto.h"

#define QBAM_RPC_TIMEOUT_MS		10000

/* ---- time ----------------------------------------------------------------- */

long
qb_amqp_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
qb_amqp_tv(struct timeval *tv, long ms)
{
	tv->tv_sec = ms / 1000;
	tv->tv_usec = (ms % 1000) * 1000;
}

/* ---- the url ------------------------------------------------------------ */

/* qba_decode: a malloc'd percent-decoded copy of s[0..len), or NULL. */
static char *
qba_decode(const char *s, size_t len, const char *what, char *err, size_t errlen)
{
	char	   *out = malloc(len + 1);
	size_t		o = 0;

	if (out == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	for (size_t i = 0; i < len; i++)
	{
		if (s[i] == '%')
		{
			int			hi = i + 2 < len ? qb_hex_digit((unsigned char) s[i + 1]) : -1;
			int			lo = i + 2 < len ? qb_hex_digit((unsigned char) s[i + 2]) : -1;

			if (hi < 0 || lo < 0)
			{
				snprintf(err, errlen, "bad percent-encoding in the %s (write %%XX with two hex digits)", what);
				free(out);
				return NULL;
			}
			if (hi == 0 && lo == 0)
			{
				snprintf(err, errlen, "the %s contains %%00", what);
				free(out);
				return NULL;
			}
			out[o++] = (char) (hi * 16 + lo);
			i += 2;
		}
		else
			out[o++] = s[i];
	}
	out[o] = '\0';
	return out;
}

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

/* qba_int: a whole decimal number in [lo, hi]. */
static bool
qba_int(const char *s, long lo, long hi, long *out)
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

/* qba_option: one name=value of the query. */
static bool
qba_option(QbAmqpUrl *u, const char *name, const char *value, char *err, size_t errlen)
{
	long		v;
	char	  **file = NULL;

	if (strcmp(name, "heartbeat") == 0)
	{
		if (!qba_int(value, 0, 3600, &v))
		{
			snprintf(err, errlen, "heartbeat in the URL query must be a number of seconds from 0 to 3600");
			return false;
		}
		u->heartbeat = (int) v;
		return true;
	}
	if (strcmp(name, "connection_timeout") == 0)
	{
		if (!qba_int(value, 1, 600000, &v))
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

bool
qb_amqp_url_parse(const char *url, QbAmqpUrl *u, char *err, size_t errlen)
{
	const char *sep;
	const char *auth;
	const char *end;
	const char *at = NULL;
	const char *hp;
	const char *hend;
	const char *colon = NULL;
	const char *p;
	size_t		slen;

	memset(u, 0, sizeof(*u));
	u->connect_timeout_ms = 5000;
	u->verify = true;

	sep = strstr(url, "://");
	if (sep == NULL)
	{
		snprintf(err, errlen, "not a URL: expected amqp://host[:port][/vhost]");
		return false;
	}
	slen = sep - url;
	if (slen == 4 && strncasecmp(url, "amqp", 4) == 0)
		u->tls = false;
	else if (slen == 5 && strncasecmp(url, "amqps", 5) == 0)
		u->tls = true;
	else
	{
		snprintf(err, errlen, "unsupported scheme (use amqp or amqps)");
		return false;
	}
	for (p = url; *p != '\0'; p++)
		if ((unsigned char) *p <= ' ' || *p == 0x7f)
		{
			snprintf(err, errlen, "the URL contains a space or a control character; percent-encode it");
			return false;
		}
	if (strchr(url, '#') != NULL)
	{
		snprintf(err, errlen, "a fragment (#...) is not allowed in the URL; remove it");
		return false;
	}

	auth = sep + 3;
	end = auth + strcspn(auth, "/?");
	for (p = auth; p < end; p++)
		if (*p == '@')
			at = p;
	if (at != NULL)
	{
		const char *c = memchr(auth, ':', at - auth);

		if (c == NULL)
			c = at;
		if ((u->user = qba_decode(auth, c - auth, "user name", err, errlen)) == NULL)
			return false;
		if (c < at)
		{
			if ((u->password = qba_decode(c + 1, at - c - 1, "password", err, errlen)) == NULL)
				return false;
		}
		else if ((u->password = strdup("")) == NULL)
		{
			snprintf(err, errlen, "out of memory");
			return false;
		}
		hp = at + 1;
	}
	else
	{
		u->user = strdup("guest");
		u->password = strdup("guest");
		hp = auth;
	}
	if (u->user == NULL || u->password == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}

	/* host and port */
	if (hp < end && *hp == '[')
	{
		const char *rb = memchr(hp, ']', end - hp);

		if (rb == NULL || rb == hp + 1)
		{
			snprintf(err, errlen, "an IPv6 address needs its closing ']' (amqp://[::1]:5672)");
			return false;
		}
		u->host = strndup(hp + 1, rb - hp - 1);
		hend = rb + 1;
		if (hend < end && *hend != ':')
		{
			snprintf(err, errlen, "unexpected text after ']'; write [address]:port");
			return false;
		}
		colon = hend < end ? hend : NULL;
	}
	else
	{
		colon = memchr(hp, ':', end - hp);
		hend = colon ? colon : end;
		if (hend == hp)
		{
			snprintf(err, errlen, "no host in the URL; write amqp://host[:port]");
			return false;
		}
		u->host = qba_decode(hp, hend - hp, "host", err, errlen);
		if (u->host == NULL)
			return false;
	}
	if (u->host == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	u->port = u->tls ? 5671 : 5672;
	if (colon != NULL && colon + 1 < end)
	{
		char		num[8];
		long		v;
		size_t		n = end - colon - 1;

		if (n >= sizeof(num))
			n = sizeof(num) - 1;
		memcpy(num, colon + 1, n);
		num[n] = '\0';
		if ((size_t) (end - colon - 1) >= sizeof(num) || !qba_int(num, 1, 65535, &v))
		{
			snprintf(err, errlen, "the port must be a number from 1 to 65535");
			return false;
		}
		u->port = (int) v;
	}

	/* the vhost: one path segment */
	p = end;
	if (*p == '/')
	{
		const char *q = p + 1 + strcspn(p + 1, "?");

		if (memchr(p + 1, '/', q - p - 1) != NULL)
		{
			snprintf(err, errlen,
					 "the vhost is one path segment; percent-encode a '/' in it as %%2f (\"/\" itself is the default)");
			return false;
		}
		if ((u->vhost = qba_decode(p + 1, q - p - 1, "vhost", err, errlen)) == NULL)
			return false;
		p = q;
	}
	if (u->vhost == NULL || u->vhost[0] == '\0')
	{
		free(u->vhost);
		if ((u->vhost = strdup("/")) == NULL)
		{
			snprintf(err, errlen, "out of memory");
			return false;
		}
	}

	/* the query: name=value pairs */
	if (*p == '?')
	{
		p++;
		while (*p != '\0')
		{
			size_t		n = strcspn(p, "&");
			const char *eq = memchr(p, '=', n);
			char	   *name;
			char	   *value;
			bool		ok;

			if (n == 0)
			{
				p++;
				continue;
			}
			if (eq == NULL)
			{
				snprintf(err, errlen, "an option in the URL query has no value; write name=value");
				return false;
			}
			name = qba_decode(p, eq - p, "query", err, errlen);
			if (name == NULL)
				return false;
			value = qba_decode(eq + 1, p + n - eq - 1, "query", err, errlen);
			if (value == NULL)
			{
				free(name);
				return false;
			}
			ok = qba_option(u, name, value, err, errlen);
			free(name);
			free(value);
			if (!ok)
				return false;
			p += n;
			if (*p == '&')
				p++;
		}
	}
	if ((u->cert == NULL) != (u->key == NULL))
	{
		snprintf(err, errlen, "certfile and keyfile in the URL query go together: give both or neither");
		return false;
	}
	return true;
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
	long		deadline = qb_amqp_now_ms() + timeout_ms;
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
					long		left = deadline - qb_amqp_now_ms();
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
	int			rc;
	int			saved_errno;

	if ((amqp = amqp_new_connection()) == NULL)
	{
		snprintf(err, errlen, "%s: out of memory", where);
		return NULL;
	}
	if (u->tls)
	{
		sock = amqp_ssl_socket_new(amqp);
		if (sock != NULL)
		{
			amqp_ssl_socket_set_verify_peer(sock, u->verify);
			amqp_ssl_socket_set_verify_hostname(sock, u->verify);
			if (u->cacert && amqp_ssl_socket_set_cacert(sock, u->cacert) != AMQP_STATUS_OK)
			{
				snprintf(err, errlen, "%s: cannot use cacertfile %s", where, u->cacert);
				goto fail;
			}
			/* librabbitmq 0.11 loads no CA by itself: use the system's */
			if (u->cacert == NULL && u->verify)
				SSL_CTX_set_default_verify_paths(amqp_ssl_socket_get_context(sock));
			if (u->cert && amqp_ssl_socket_set_key(sock, u->cert, u->key) != AMQP_STATUS_OK)
			{
				snprintf(err, errlen, "%s: cannot use certfile %s with keyfile %s",
						 where, u->cert, u->key);
				goto fail;
			}
		}
	}
	else
		sock = amqp_tcp_socket_new(amqp);
	if (sock == NULL)
	{
		snprintf(err, errlen, "%s: cannot create a socket", where);
		goto fail;
	}
	if (u->tls)
	{
		qb_amqp_tv(&tv, u->connect_timeout_ms);
		errno = 0;
		rc = amqp_socket_open_noblock(sock, u->host, u->port, &tv);
		saved_errno = errno;
		if (rc != AMQP_STATUS_OK)
		{
			if (rc == AMQP_STATUS_SOCKET_ERROR && saved_errno != 0 && saved_errno != EINPROGRESS)
				snprintf(err, errlen, "%s: cannot connect: %s", where, strerror(saved_errno));
			else if (rc == AMQP_STATUS_SOCKET_ERROR)
			{
				/* librabbitmq lost the reason: connect once more to learn it */
				char		why[256];
				int			fd = qb_amqp_tcp_connect(u->host, u->port, u->connect_timeout_ms,
													 qb_egress_in_force(u->egress, u->host_egress),
													 why, sizeof(why));

				if (fd >= 0)
				{
					close(fd);
					snprintf(why, sizeof(why), "a socket error");
				}
				snprintf(err, errlen, "%s: cannot connect: %s", where, why);
			}
			else if (rc == AMQP_STATUS_TIMEOUT)
				snprintf(err, errlen, "%s: cannot connect: no answer within %ld ms", where,
						 u->connect_timeout_ms);
			else
				snprintf(err, errlen, "%s: cannot connect: %s", where, amqp_error_string2(rc));
			goto fail;
		}
		/*
		 * librabbitmq resolved and connected (and shook hands, which sends
		 * no credential): judge the address it used before the login does
		 */
		{
			struct sockaddr_storage peer;
			socklen_t	plen = sizeof(peer);
			char		why[300];

			if (getpeername(amqp_get_sockfd(amqp), (struct sockaddr *) &peer, &plen) != 0)
			{
				snprintf(err, errlen, "%s: cannot connect: getpeername: %s", where, strerror(errno));
				goto fail;
			}
			if (!qb_egress_addr_ok(qb_egress_in_force(u->egress, u->host_egress), u->host,
								   (struct sockaddr *) &peer, why, sizeof(why)))
			{
				snprintf(err, errlen, "%s: cannot connect: %s", where, why);
				goto fail;
			}
		}
	}
	else
	{
		/* our own connect, for an exact reason ("Connection refused") */
		char		why[256];
		int			fd = qb_amqp_tcp_connect(u->host, u->port, u->connect_timeout_ms,
											 qb_egress_in_force(u->egress, u->host_egress),
											 why, sizeof(why));

		if (fd < 0)
		{
			snprintf(err, errlen, "%s: cannot connect: %s", where, why);
			goto fail;
		}
		amqp_tcp_socket_set_sockfd(sock, fd);
	}

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
