/*-------------------------------------------------------------------------
 * qb_config_env.c
 *	  ${NAME} expansion and the checks of URLs and broker lists.
 *
 * Both run on values that may hold secrets (a password in a URL, a token
 * from the environment), so no message here repeats a value: they name the
 * variable, the scheme or the part that is wrong.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qb_config_int.h"

/* ---------------------------------------------------------------------
 * A growing string
 * ---------------------------------------------------------------------
 */
typedef struct QbcfBuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
	bool		oom;
} QbcfBuf;

/* qbcf_buf_add: append len bytes; on failure the buffer remembers it. */
static void
qbcf_buf_add(QbcfBuf *b, const char *s, size_t len)
{
	if (b->oom)
		return;
	if (b->len + len + 1 > b->cap)
	{
		size_t		cap = b->cap ? b->cap : 64;
		char	   *data;

		while (cap < b->len + len + 1)
			cap *= 2;
		data = realloc(b->data, cap);
		if (data == NULL)
		{
			b->oom = true;
			return;
		}
		b->data = data;
		b->cap = cap;
	}
	memcpy(b->data + b->len, s, len);
	b->len += len;
	b->data[b->len] = '\0';
}

/* ---------------------------------------------------------------------
 * ${NAME} expansion
 * ---------------------------------------------------------------------
 */

/* qb_expand_env: see qb_config.h.  Messages name variables, never values. */
char *
qb_expand_env(const char *in, char *err, size_t errlen)
{
	QbcfBuf		b = {0};
	const char *p = in;
	char	   *name = NULL;

	qbcf_buf_add(&b, "", 0);			/* an empty input still gives a string */
	while (*p != '\0')
	{
		if (p[0] == '$' && p[1] == '$' && p[2] == '{')
		{
			qbcf_buf_add(&b, "${", 2);
			p += 3;
		}
		else if (p[0] == '$' && p[1] == '{')
		{
			const char *start = p + 2;
			const char *close = strchr(start, '}');
			size_t		nlen;
			size_t		i;
			bool		ok;
			const char *value;

			if (close == NULL)
			{
				snprintf(err, errlen,
						 "unterminated ${ reference: close it with '}', or write $${ for a literal ${");
				goto fail;
			}
			nlen = close - start;
			ok = nlen > 0 && (isalpha((unsigned char) start[0]) || start[0] == '_');
			for (i = 1; ok && i < nlen; i++)
				ok = isalnum((unsigned char) start[i]) || start[i] == '_';
			if (!ok)
			{
				snprintf(err, errlen,
						 "bad variable name in \"${%.*s}\": a name is a letter or '_' followed by letters, digits and '_' (write $${ for a literal ${)",
						 nlen > 40 ? 40 : (int) nlen, start);
				goto fail;
			}
			name = strndup(start, nlen);
			if (name == NULL)
			{
				snprintf(err, errlen, "out of memory");
				goto fail;
			}
			value = getenv(name);
			if (value == NULL)
			{
				snprintf(err, errlen,
						 "environment variable %s is not set; set it in the environment of the server or daemon that loads the configuration",
						 name);
				goto fail;
			}
			qbcf_buf_add(&b, value, strlen(value));
			free(name);
			name = NULL;
			p = close + 1;
		}
		else
		{
			qbcf_buf_add(&b, p, 1);
			p++;
		}
	}
	if (b.oom)
	{
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	return b.data;

fail:
	free(name);
	free(b.data);
	return NULL;
}

/* ---------------------------------------------------------------------
 * URLs
 * ---------------------------------------------------------------------
 */

/*
 * qbcf_hostport: check "host[:port]" or "[v6]:port" of len bytes.  The port
 * is optional; when present it must be 1..65535.
 */
static bool
qbcf_hostport(const char *s, size_t len, char *err, size_t errlen)
{
	size_t		i = 0;
	size_t		hostlen;

	if (len > 0 && s[0] == '[')
	{
		for (i = 1; i < len && s[i] != ']'; i++)
			if (!isxdigit((unsigned char) s[i]) && s[i] != ':' && s[i] != '.')
			{
				snprintf(err, errlen, "invalid character in the IPv6 address of the host");
				return false;
			}
		if (i >= len || i == 1)
		{
			snprintf(err, errlen, "the IPv6 host needs its closing ']' and an address inside");
			return false;
		}
		i++;
		if (i < len && s[i] != ':')
		{
			snprintf(err, errlen, "unexpected text after the IPv6 host; write [address]:port");
			return false;
		}
	}
	else
	{
		for (i = 0; i < len && s[i] != ':'; i++)
			if (!isalnum((unsigned char) s[i]) && s[i] != '-' && s[i] != '.' && s[i] != '_')
			{
				snprintf(err, errlen, "invalid character in the host name (letters, digits, '-', '.' and '_' only)");
				return false;
			}
		hostlen = i;
		if (hostlen == 0)
		{
			snprintf(err, errlen, "no host; write scheme://host[:port]");
			return false;
		}
	}
	if (i < len)
	{
		long		port = 0;
		size_t		digits = 0;

		for (i++; i < len; i++, digits++)
		{
			if (!isdigit((unsigned char) s[i]) || port > 65535)
			{
				port = -1;
				break;
			}
			port = port * 10 + (s[i] - '0');
		}
		if (digits == 0 || port < 1 || port > 65535)
		{
			snprintf(err, errlen, "the port must be a number from 1 to 65535");
			return false;
		}
	}
	return true;
}

/* qb_url_check_scheme: see qb_config.h. */
bool
qb_url_check_scheme(const char *url, const char *const *schemes, int flags,
					char *err, size_t errlen)
{
	const char *sep;
	const char *auth;
	const char *rest;
	const char *at;
	const char *p;
	size_t		slen;
	int			i;
	bool		known = false;

	sep = strstr(url, "://");
	for (p = url; sep != NULL && p < sep; p++)
		if (!isalnum((unsigned char) *p) && *p != '+' && *p != '-' && *p != '.')
			sep = NULL;
	if (sep == NULL || sep == url)
	{
		snprintf(err, errlen, "not a URL: expected %s://host[:port][/path]", schemes[0]);
		return false;
	}
	for (p = url; *p != '\0'; p++)
		if ((unsigned char) *p <= ' ' || *p == 0x7f)
		{
			snprintf(err, errlen, "the URL contains a space or a control character; percent-encode it");
			return false;
		}
	slen = sep - url;
	for (i = 0; schemes[i] != NULL; i++)
		if (strlen(schemes[i]) == slen && strncasecmp(url, schemes[i], slen) == 0)
			known = true;
	if (!known)
	{
		QbcfBuf		list = {0};

		for (i = 0; schemes[i] != NULL; i++)
		{
			if (i > 0)
				qbcf_buf_add(&list, schemes[i + 1] ? ", " : " or ", schemes[i + 1] ? 2 : 4);
			qbcf_buf_add(&list, schemes[i], strlen(schemes[i]));
		}
		snprintf(err, errlen, "unsupported scheme \"%.*s\" (use %s)",
				 slen > 20 ? 20 : (int) slen, url, list.data ? list.data : "?");
		free(list.data);
		return false;
	}
	auth = sep + 3;
	rest = auth + strcspn(auth, "/?#");
	if (rest == auth)
	{
		snprintf(err, errlen, "no host after \"%.*s://\"; write %s://host[:port]",
				 (int) slen, url, schemes[0]);
		return false;
	}
	at = NULL;
	for (p = auth; p < rest; p++)
		if (*p == '@')
			at = p;
	if (at != NULL)
	{
		if (!(flags & QB_URL_USERINFO))
		{
			snprintf(err, errlen,
					 "user info (user@ or user:password@) is not allowed in this URL; send credentials as headers instead");
			return false;
		}
		auth = at + 1;
	}
	if (!qbcf_hostport(auth, rest - auth, err, errlen))
		return false;
	p = rest + strcspn(rest, "?#");
	if (*p == '?' && !(flags & QB_URL_QUERY))
	{
		snprintf(err, errlen, "a query string (?...) is not allowed in this URL; remove it");
		return false;
	}
	if (strchr(p, '#') != NULL)
	{
		snprintf(err, errlen, "a fragment (#...) is not allowed in a URL here; remove it");
		return false;
	}
	return true;
}

/* qb_url_check: see qb_config.h. */
bool
qb_url_check(const char *url, char *err, size_t errlen)
{
	static const char *const http[] = {"http", "https", NULL};

	return qb_url_check_scheme(url, http, 0, err, errlen);
}

/*
 * qbcf_brokers_check: kafka's bootstrap list, "host[:port],host[:port]", each
 * entry optionally with a "proto://" prefix as librdkafka allows.
 */
bool
qbcf_brokers_check(const char *s, char *err, size_t errlen)
{
	const char *p = s;

	for (;;)
	{
		size_t		len = strcspn(p, ",");
		const char *sep;
		const char *q;

		for (q = p; q < p + len; q++)
			if ((unsigned char) *q <= ' ' || *q == 0x7f)
			{
				snprintf(err, errlen, "the broker list contains a space or a control character; write host:port,host:port");
				return false;
			}
		sep = strstr(p, "://");
		if (sep != NULL && sep < p + len)
		{
			len -= (sep + 3) - p;
			p = sep + 3;
		}
		if (len == 0)
		{
			snprintf(err, errlen, "empty entry in the broker list; write host:port,host:port");
			return false;
		}
		if (!qbcf_hostport(p, len, err, errlen))
			return false;
		p += len;
		if (*p == '\0')
			return true;
		p++;
	}
}
