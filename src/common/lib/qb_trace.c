/*-------------------------------------------------------------------------
 * qb_trace.c
 *	  W3C Trace Context: parse, format and make children of traceparent
 *	  values; find one in a sqlcommenter comment; rewrite a publish's
 *	  headers (see qb_trace.h for the vocabulary).
 *
 * Pure functions of their arguments but for the random span-ids (OpenSSL's
 * RAND_bytes, safe from any thread).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/rand.h>

#include "qb_trace.h"

/* n lower-case hex digits into n/2 bytes; false on any other character */
static bool
qbtc_hex(const char *s, int n, unsigned char *out)
{
	for (int i = 0; i < n; i += 2)
	{
		int			v = 0;

		for (int j = 0; j < 2; j++)
		{
			char		c = s[i + j];

			if (c >= '0' && c <= '9')
				v = v * 16 + (c - '0');
			else if (c >= 'a' && c <= 'f')
				v = v * 16 + (c - 'a' + 10);
			else
				return false;
		}
		out[i / 2] = (unsigned char) v;
	}
	return true;
}

static bool
qbtc_zero(const unsigned char *b, int n)
{
	for (int i = 0; i < n; i++)
		if (b[i] != 0)
			return false;
	return true;
}

/* qb_trace_parse: see qb_trace.h. */
bool
qb_trace_parse(const char *s, QbTraceContext *out)
{
	unsigned char version;
	size_t		len;

	if (s == NULL)
		return false;
	len = strlen(s);
	if (len < QB_TRACEPARENT_LEN || !qbtc_hex(s, 2, &version) || version == 0xff ||
		s[2] != '-' || s[35] != '-' || s[52] != '-')
		return false;
	/* version 00 is exactly 55 characters; a later one may add "-..." */
	if (version == 0 ? len != QB_TRACEPARENT_LEN : len > QB_TRACEPARENT_LEN && s[55] != '-')
		return false;
	if (!qbtc_hex(s + 3, 32, out->trace_id) || !qbtc_hex(s + 36, 16, out->span_id) ||
		!qbtc_hex(s + 53, 2, &out->flags))
		return false;
	return !qbtc_zero(out->trace_id, 16) && !qbtc_zero(out->span_id, 8);
}

/* qb_trace_format: see qb_trace.h. */
void
qb_trace_format(const QbTraceContext *c, char *out)
{
	char	   *w = out;

	w += sprintf(w, "00-");
	for (int i = 0; i < 16; i++)
		w += sprintf(w, "%02x", c->trace_id[i]);
	*w++ = '-';
	for (int i = 0; i < 8; i++)
		w += sprintf(w, "%02x", c->span_id[i]);
	sprintf(w, "-%02x", c->flags);
}

/* qb_trace_child: see qb_trace.h. */
bool
qb_trace_child(const QbTraceContext *parent, QbTraceContext *child)
{
	*child = *parent;
	do
	{
		if (RAND_bytes(child->span_id, sizeof(child->span_id)) != 1)
			return false;
	} while (qbtc_zero(child->span_id, 8));
	return true;
}

/* qb_tracestate_ok: see qb_trace.h. */
bool
qb_tracestate_ok(const char *s)
{
	size_t		n = 0;

	for (; s[n] != '\0'; n++)
		if ((unsigned char) s[n] < 0x20 || (unsigned char) s[n] > 0x7e || s[n] == '"' || s[n] == '\\')
			return false;
	return n <= QB_TRACESTATE_MAX;
}

/*
 * qbtc_comment_value: the URL-decoded value of key='...' inside the
 * comment [c, end), into out (outlen bytes); false when absent or too long.
 */
static bool
qbtc_comment_value(const char *c, const char *end, const char *key, char *out, size_t outlen)
{
	size_t		klen = strlen(key);

	for (const char *p = c; p + klen + 2 <= end; p++)
	{
		const char *v;
		const char *q;
		char	   *dec;
		int			declen;

		/* the key starts the comment or follows a ',' or a blank */
		if (strncmp(p, key, klen) != 0 || p[klen] != '=' || p[klen + 1] != '\'' ||
			!(p == c || p[-1] == ',' || p[-1] == ' '))
			continue;
		v = p + klen + 2;
		if ((q = memchr(v, '\'', (size_t) (end - v))) == NULL ||
			(dec = curl_easy_unescape(NULL, v, (int) (q - v), &declen)) == NULL)
			return false;
		if ((size_t) declen >= outlen || memchr(dec, '\0', (size_t) declen) != NULL)
		{
			curl_free(dec);
			return false;
		}
		memcpy(out, dec, (size_t) declen);
		out[declen] = '\0';
		curl_free(dec);
		return true;
	}
	return false;
}

/* qb_trace_from_sql: see qb_trace.h. */
bool
qb_trace_from_sql(const char *sql, char *tp, char *ts)
{
	const char *c = sql;

	ts[0] = '\0';
	/* the cheap test first: most statements carry no comment at all */
	while (sql != NULL && (c = strstr(c, "/*")) != NULL)
	{
		const char *end = strstr(c + 2, "*/");
		char		buf[128];
		QbTraceContext ctx;

		if (end == NULL)
			return false;
		c += 2;
		if (qbtc_comment_value(c, end, "traceparent", buf, sizeof(buf)) && qb_trace_parse(buf, &ctx))
		{
			qb_trace_format(&ctx, tp);
			if (!qbtc_comment_value(c, end, "tracestate", ts, QB_TRACESTATE_MAX + 1) ||
				!qb_tracestate_ok(ts))
				ts[0] = '\0';
			return true;
		}
		c = end + 2;
	}
	return false;
}

/* the key of headers named name in any case, or NULL */
static const char *
qbtc_key(json_t *headers, const char *name)
{
	const char *k;
	json_t	   *v;

	json_object_foreach(headers, k, v)
		if (strcasecmp(k, name) == 0)
			return k;
	return NULL;
}

/* qb_trace_publish: see qb_trace.h. */
bool
qb_trace_publish(json_t *headers, QbTraceContext *parent, QbTraceContext *child)
{
	const char *found;
	json_t	   *v;
	char		out[QB_TRACEPARENT_LEN + 1];
	char		k[64];
	char		state_key[64] = "";

	if (headers == NULL || (found = qbtc_key(headers, "traceparent")) == NULL)
		return false;
	/* copies: deleting a member frees its key */
	snprintf(k, sizeof(k), "%s", found);
	v = json_object_get(headers, k);
	if ((found = qbtc_key(headers, "tracestate")) != NULL)
		snprintf(state_key, sizeof(state_key), "%s", found);
	if (!json_is_string(v) || !qb_trace_parse(json_string_value(v), parent) ||
		!qb_trace_child(parent, child))
	{
		json_object_del(headers, k);
		if (state_key[0] != '\0')
			json_object_del(headers, state_key);
		return false;
	}
	json_object_del(headers, k);
	qb_trace_format(child, out);
	json_object_set_new(headers, "traceparent", json_string(out));
	return true;
}

/* qb_trace_state: see qb_trace.h. */
const char *
qb_trace_state(json_t *headers)
{
	const char *k = headers != NULL ? qbtc_key(headers, "tracestate") : NULL;
	const char *v = k != NULL ? json_string_value(json_object_get(headers, k)) : NULL;

	return v != NULL && qb_tracestate_ok(v) ? v : NULL;
}
