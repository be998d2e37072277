/*-------------------------------------------------------------------------
 * qb_url.c
 *	  The one URL reader (see qb_url.h for the wording): the scheme checked
 *	  here, the rest read by libcurl's URL API as "tcp://" + rest.
 *
 * libcurl 7.88 (Debian 12): CURLU_NON_SUPPORT_SCHEME for tcp://,
 * CURLU_PATH_AS_IS so that "/a/../b" stays three segments.  It reads the
 * user info up to the first '@' (a second one makes the host invalid:
 * a '@' in a user or password is written %40), an empty port as none,
 * and IPv4 addresses in every spelling a resolver takes.
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE				/* asprintf */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#include "qb_crypto.h"
#include "qb_url.h"

static const struct
{
	const char *scheme;
	int			port;
}			qbu_ports[] = {
	{"amqp", 5672}, {"amqps", 5671}, {"nats", 4222}, {"tls", 4222}, {"http", 80},
	{"https", 443}, {"postgres", 5432}, {"postgresql", 5432}, {"sqlserver", 1433},
};

/* qb_url_default_port: see qb_url.h. */
int
qb_url_default_port(const char *scheme)
{
	for (size_t i = 0; scheme != NULL && i < sizeof(qbu_ports) / sizeof(qbu_ports[0]); i++)
		if (strcasecmp(scheme, qbu_ports[i].scheme) == 0)
			return qbu_ports[i].port;
	return 0;
}

void
qb_url_free(QbUrl *u)
{
	free(u->scheme);
	if (u->password != NULL)
		explicit_bzero(u->password, strlen(u->password));
	free(u->user);
	free(u->password);
	free(u->host);
	free(u->path);
	free(u->query);
	memset(u, 0, sizeof(*u));
}

/* qbu_decode: a malloc'd percent-decoded copy of s[0..len), the part named what. */
static char *
qbu_decode(const char *s, size_t len, const char *what, char *err, size_t errlen)
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
		int			hi;
		int			lo;

		if (s[i] != '%')
		{
			out[o++] = s[i];
			continue;
		}
		hi = i + 2 < len ? qb_hex_digit((unsigned char) s[i + 1]) : -1;
		lo = i + 2 < len ? qb_hex_digit((unsigned char) s[i + 2]) : -1;
		if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
		{
			if (hi < 0 || lo < 0)
				snprintf(err, errlen, "bad percent-encoding in the %s (write %%XX with two hex digits)", what);
			else
				snprintf(err, errlen, "the %s contains %%00", what);
			free(out);
			return NULL;
		}
		out[o++] = (char) (hi * 16 + lo);
		i += 2;
	}
	out[o] = '\0';
	return out;
}

/*
 * qbu_scheme: check url's scheme against schemes and its characters; the
 * text after "://", or NULL with err set.
 */
static const char *
qbu_scheme(const char *url, const char *const *schemes, QbUrl *u, char *err, size_t errlen)
{
	const char *sep = strstr(url, "://");
	size_t		slen = sep != NULL ? (size_t) (sep - url) : 0;
	char		list[160] = "";

	for (const char *p = url; sep != NULL && p < sep; p++)
		if (!isalnum((unsigned char) *p) && *p != '+' && *p != '-' && *p != '.')
			sep = NULL;
	if (sep == NULL || slen == 0)
	{
		snprintf(err, errlen, "not a URL: expected %s://host[:port][/path]", schemes[0]);
		return NULL;
	}
	for (const char *p = url; *p != '\0'; p++)
		if ((unsigned char) *p <= ' ' || *p == 0x7f)
		{
			snprintf(err, errlen, "the URL contains a space or a control character; percent-encode it");
			return NULL;
		}
	for (int i = 0; schemes[i] != NULL; i++)
	{
		if (strlen(schemes[i]) == slen && strncasecmp(url, schemes[i], slen) == 0)
		{
			if ((u->scheme = strdup(schemes[i])) == NULL)
				snprintf(err, errlen, "out of memory");
			return u->scheme != NULL ? sep + 3 : NULL;
		}
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s%s",
				 i == 0 ? "" : schemes[i + 1] ? ", " : " or ", schemes[i]);
	}
	snprintf(err, errlen, "unsupported scheme \"%.*s\" (use %s)", slen > 20 ? 20 : (int) slen, url, list);
	return NULL;
}

/* qbu_curl_error: what libcurl's refusal of "tcp://" + rest means, and what to do. */
static void
qbu_curl_error(CURLUcode rc, const char *rest, const char *scheme, char *err, size_t errlen)
{
	const char *rb = strchr(rest, ']');	/* only to choose the message */

	switch (rc)
	{
		case CURLUE_NO_HOST:
			snprintf(err, errlen, "no host after \"%s://\"; write %s://host[:port]", scheme, scheme);
			break;
		case CURLUE_BAD_PORT_NUMBER:
			if (rb != NULL && strchr(":/?", rb[1]) == NULL)
				snprintf(err, errlen, "unexpected text after the IPv6 host; write [address]:port");
			else
				snprintf(err, errlen, "the port must be a number from 1 to 65535");
			break;
		case CURLUE_BAD_IPV6:
			snprintf(err, errlen, "the IPv6 host needs its closing ']' and an address inside; write [address]:port");
			break;
		case CURLUE_BAD_HOSTNAME:
			snprintf(err, errlen, "invalid character in the host name (letters, digits, '-', '.' and '_' only; "
					 "percent-encode @, : and / in a user or password)");
			break;
		case CURLUE_BAD_LOGIN:
		case CURLUE_BAD_USER:
		case CURLUE_BAD_PASSWORD:
			snprintf(err, errlen, "the user info cannot be read; percent-encode @, : and / in the user or password");
			break;
		case CURLUE_OUT_OF_MEMORY:
			snprintf(err, errlen, "out of memory");
			break;
		default:
			snprintf(err, errlen, "not a valid URL (%s); write %s://[user:password@]host[:port][/path]",
					 curl_url_strerror(rc), scheme);
			break;
	}
}

/* qbu_get: one part as written (NULL when absent); false only out of memory */
static bool
qbu_get(CURLU *h, CURLUPart part, char **out, char *err, size_t errlen)
{
	char	   *v = NULL;
	CURLUcode	rc = curl_url_get(h, part, &v, 0);

	*out = NULL;
	if (rc == CURLUE_OUT_OF_MEMORY)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	if (rc == CURLUE_OK && v != NULL && (*out = strdup(v)) == NULL)
		snprintf(err, errlen, "out of memory");
	curl_free(v);
	return rc != CURLUE_OK || v == NULL || *out != NULL;
}

/* qbu_get_decoded: qbu_get, then percent-decoded as the part named what */
static bool
qbu_get_decoded(CURLU *h, CURLUPart part, const char *what, char **out, char *err, size_t errlen)
{
	char	   *raw;

	if (!qbu_get(h, part, &raw, err, errlen))
		return false;
	*out = raw != NULL ? qbu_decode(raw, strlen(raw), what, err, errlen) : NULL;
	free(raw);
	return raw == NULL || *out != NULL;
}

/*
 * qbu_host: the host libcurl read, decoded, without brackets, into
 * u->host: a name of the allowed characters, or an address.
 */
static bool
qbu_host(CURLU *h, QbUrl *u, char *err, size_t errlen)
{
	char	   *zone = NULL;
	size_t		len;

	if (curl_url_get(h, CURLUPART_ZONEID, &zone, 0) == CURLUE_OK)
	{
		curl_free(zone);
		snprintf(err, errlen, "a zone id (%%25...) in an IPv6 host is not supported; remove it");
		return false;
	}
	if (!qbu_get_decoded(h, CURLUPART_HOST, "host", &u->host, err, errlen))
		return false;
	if (u->host == NULL || u->host[0] == '\0')
	{
		snprintf(err, errlen, "no host after \"%s://\"; write %s://host[:port]", u->scheme, u->scheme);
		return false;
	}
	len = strlen(u->host);
	if (u->host[0] == '[')
	{
		memmove(u->host, u->host + 1, len - 2);
		u->host[len - 2] = '\0';
		return true;
	}
	if (strspn(u->host, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") != len)
	{
		snprintf(err, errlen, "invalid character in the host name (letters, digits, '-', '.' and '_' only)");
		return false;
	}
	return true;
}

/* qbu_port: the port as written (1..65535), else the scheme's default */
static bool
qbu_port(CURLU *h, QbUrl *u, char *err, size_t errlen)
{
	char	   *port = NULL;
	long		v = 0;

	u->port = qb_url_default_port(u->scheme);
	if (curl_url_get(h, CURLUPART_PORT, &port, 0) != CURLUE_OK || port == NULL)
		return true;
	v = strtol(port, NULL, 10);
	curl_free(port);
	if (v < 1 || v > 65535)
	{
		snprintf(err, errlen, "the port must be a number from 1 to 65535");
		return false;
	}
	u->port = (int) v;
	u->port_written = true;
	return true;
}

/*
 * qbu_authority: rest (what follows "scheme://", len bytes) read by
 * libcurl as "tcp://" + rest: host and port always, the user info, path
 * and query into u.
 */
static bool
qbu_authority(const char *rest, size_t len, QbUrl *u, char *err, size_t errlen)
{
	CURLU	   *h = curl_url();
	char	   *tcp = NULL;
	char	   *raw = NULL;
	CURLUcode	rc = CURLUE_OUT_OF_MEMORY;
	bool		ok = false;

	if (len == 0 || rest[0] == '/' || rest[0] == '?')
		rc = CURLUE_NO_HOST;
	else if (h != NULL && asprintf(&tcp, "tcp://%.*s", (int) len, rest) >= 0)
		rc = curl_url_set(h, CURLUPART_URL, tcp, CURLU_NON_SUPPORT_SCHEME | CURLU_PATH_AS_IS);
	free(tcp);
	if (rc != CURLUE_OK)
		qbu_curl_error(rc, rest, u->scheme, err, errlen);
	else if (qbu_host(h, u, err, errlen) && qbu_port(h, u, err, errlen) &&
			 qbu_get_decoded(h, CURLUPART_USER, "user name", &u->user, err, errlen) &&
			 qbu_get_decoded(h, CURLUPART_PASSWORD, "password", &u->password, err, errlen) &&
			 qbu_get(h, CURLUPART_QUERY, &u->query, err, errlen) &&
			 qbu_get(h, CURLUPART_PATH, &raw, err, errlen))
	{
		const char *path = raw != NULL ? raw : "/";

		u->path_one_segment = path[0] == '\0' || strchr(path + 1, '/') == NULL;
		u->path = qbu_decode(path, strlen(path), "path", err, errlen);
		ok = u->path != NULL;
	}
	free(raw);
	curl_url_cleanup(h);
	return ok;
}

/* qb_url_read: see qb_url.h. */
bool
qb_url_read(const char *url, const char *const *schemes, int flags,
			QbUrl *u, char *err, size_t errlen)
{
	const char *rest;

	memset(u, 0, sizeof(*u));
	if ((rest = qbu_scheme(url, schemes, u, err, errlen)) == NULL)
		goto fail;
	if (strchr(rest, '#') != NULL)
	{
		snprintf(err, errlen, "a fragment (#...) is not allowed in a URL here; remove it");
		goto fail;
	}
	if (flags & QB_URL_ANY_AUTHORITY)
		return true;
	if (!qbu_authority(rest, strlen(rest), u, err, errlen))
		goto fail;
	if (!(flags & QB_URL_USERINFO) && (u->user != NULL || u->password != NULL))
	{
		snprintf(err, errlen,
				 "user info (user@ or user:password@) is not allowed in this URL; send credentials as headers instead");
		goto fail;
	}
	if (!(flags & QB_URL_QUERY) && u->query != NULL)
	{
		snprintf(err, errlen, "a query string (?...) is not allowed in this URL; remove it");
		goto fail;
	}
	return true;

fail:
	qb_url_free(u);
	return false;
}

/* qb_url_check_scheme: see qb_url.h. */
bool
qb_url_check_scheme(const char *url, const char *const *schemes, int flags,
					char *err, size_t errlen)
{
	QbUrl		u;
	bool		ok = qb_url_read(url, schemes, flags, &u, err, errlen);

	qb_url_free(&u);
	return ok;
}

/* qb_url_check: see qb_url.h. */
bool
qb_url_check(const char *url, char *err, size_t errlen)
{
	static const char *const http[] = {"http", "https", NULL};

	return qb_url_check_scheme(url, http, 0, err, errlen);
}

/*
 * qbu_entry: one entry of a destination (len bytes of s), its scheme, if
 * any, dropped (librdkafka's "sasl_ssl" is no URL scheme): read as a URL's
 * authority, path and query are.
 */
static bool
qbu_entry(const char *s, size_t len, QbUrl *u, char *err, size_t errlen)
{
	const char *sep = memmem(s, len, "://", 3);

	memset(u, 0, sizeof(*u));
	if (sep != NULL)
	{
		len -= (size_t) (sep + 3 - s);
		s = sep + 3;
	}
	if ((u->scheme = strdup("tcp")) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	if (!qbu_authority(s, len, u, err, errlen))
	{
		qb_url_free(u);
		return false;
	}
	return true;
}

/* qb_url_host: see qb_url.h. */
bool
qb_url_host(const char *s, size_t len, char *host, size_t hostlen, char *err, size_t errlen)
{
	const char *sep = memmem(s, len, "://", 3);
	const char *rest = sep != NULL ? sep + 3 : s;
	size_t		rlen = len - (size_t) (rest - s);
	unsigned char addr[16];
	char		buf[INET6_ADDRSTRLEN + 1];
	QbUrl		u;

	/* a bare IPv6 address ("::1": a broker link's host) */
	snprintf(buf, sizeof(buf), "%.*s", (int) (rlen < sizeof(buf) ? rlen : 0), rest);
	if (buf[0] != '\0' && inet_pton(AF_INET6, buf, addr) == 1)
	{
		snprintf(host, hostlen, "%s", buf);
		return rlen < hostlen;
	}
	if (!qbu_entry(s, len, &u, err, errlen))
		return false;
	if (strlen(u.host) >= hostlen)
		snprintf(err, errlen, "a host longer than %zu bytes", hostlen - 1);
	else
		snprintf(host, hostlen, "%s", u.host);
	len = strlen(u.host);
	qb_url_free(&u);
	return len < hostlen;
}

/* qb_url_hostport_check: see qb_url.h. */
bool
qb_url_hostport_check(const char *s, size_t len, char *err, size_t errlen)
{
	const char *sep = memmem(s, len, "://", 3);
	QbUrl		u;
	bool		ok;

	if (len == 0 || (sep != NULL && sep + 3 == s + len))
	{
		snprintf(err, errlen, "empty entry in the broker list; write host:port,host:port");
		return false;
	}
	if (!qbu_entry(s, len, &u, err, errlen))
		return false;
	ok = u.user == NULL && u.password == NULL && u.query == NULL && strcmp(u.path, "/") == 0;
	if (!ok)
		snprintf(err, errlen, "a broker is host[:port] and nothing more; write host:port,host:port");
	qb_url_free(&u);
	return ok;
}

/* qb_url_query_next: see qb_url.h. */
int
qb_url_query_next(const char **p, char **name, char **value, char *err, size_t errlen)
{
	const char *s = *p + strspn(*p, "&");
	size_t		n = strcspn(s, "&");
	const char *eq = memchr(s, '=', n);

	*name = *value = NULL;
	*p = s;
	if (*s == '\0')
		return 0;
	*p = s + n;
	if ((*name = qbu_decode(s, eq != NULL ? (size_t) (eq - s) : n, "query", err, errlen)) == NULL)
		return -1;
	if (eq != NULL && (*value = qbu_decode(eq + 1, n - (size_t) (eq + 1 - s), "query", err, errlen)) == NULL)
	{
		free(*name);
		*name = NULL;
		return -1;
	}
	return 1;
}

/* qb_url_list_next: see qb_url.h. */
const char *
qb_url_list_next(const char **next, size_t *len)
{
	const char *one = *next;

	if (one == NULL)
		return NULL;
	*len = strcspn(one, ",");
	*next = one[*len] == ',' ? one + *len + 1 : NULL;
	return one;
}
