/*-------------------------------------------------------------------------
 * qb_config_value.c
 *	  The validator's pieces: each reads one scalar or checks one mapping's
 *	  keys, and on failure writes the one message of the document.
 *
 * Messages are "key path: what is wrong and what to do (line L, column C)",
 * or for a node an override made "VAR (key path): ...".  Only numbers,
 * booleans and names are echoed (qbcf_echo), unless read from a file:
 * strings such as URLs, header values and secrets may hold credentials and
 * are never repeated.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qb_config_int.h"
#include "qb_token.h"

/* ---------------------------------------------------------------------
 * Key paths
 * ---------------------------------------------------------------------
 */

/*
 * qv_fmt: snprintf through a va_list, so that a path cut at QV_PATHLEN (it
 * stays recognisable) is not a -Wformat-truncation error.
 */
void
qbcf_fmt(char *buf, size_t size, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(buf, size, fmt, ap);
	va_end(ap);
}

/* qbcf_path_key: parent.key, or parent["key"] when the key would be ambiguous. */
void
qbcf_path_key(char *buf, size_t size, const char *parent, const char *key)
{
	bool		plain = key[0] != '\0' && strpbrk(key, ".[]\" ") == NULL;

	if (plain)
		qbcf_fmt(buf, size, "%s%s%s", parent, parent[0] ? "." : "", key);
	else
		qbcf_fmt(buf, size, "%s[\"%s\"]", parent, key);
}

/* qbcf_path_index: parent[i]. */
void
qbcf_path_index(char *buf, size_t size, const char *parent, int i)
{
	qbcf_fmt(buf, size, "%s[%d]", parent, i);
}

/* ---------------------------------------------------------------------
 * Messages and scalars
 * ---------------------------------------------------------------------
 */

/*
 * qbcf_error: "path: message (line L, column C)", or for a node made by an
 * override "VAR (path): message".
 */
/*
 * qbcf_repeats: msg holds 8 consecutive bytes of value (all of it when
 * shorter; a value under 4 bytes is no secret worth the false alarms).
 */
static bool
qbcf_repeats(const char *msg, const char *value)
{
	size_t		vlen = strlen(value);
	size_t		mlen = strlen(msg);
	size_t		w = vlen < 8 ? vlen : 8;

	if (vlen < 4)
		return false;
	for (size_t i = 0; i + w <= mlen; i++)
		for (size_t j = 0; j + w <= vlen; j++)
			if (msg[i] == value[j] && memcmp(msg + i, value + j, w) == 0)
				return true;
	return false;
}

bool
qbcf_error(QbcfCtx *cx, const char *path, const QbcfNode *at, const char *fmt,...)
{
	char		msg[QBCF_MSGLEN];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* a check that quotes part of a value read from a file (a URL's scheme, say) */
	for (const QbcfFileValue *f = cx->file_values; at != NULL && f != NULL; f = f->next)
		if (f->node == at && qbcf_repeats(msg, f->value))
		{
			snprintf(msg, sizeof(msg),
					 "the value, read from a file, is not valid here; the message is not shown, as it would repeat the file's content (it may be a secret): check the file and what this key expects");
			break;
		}
	if (at != NULL && at->envvar != NULL)
		snprintf(cx->err, cx->errlen, "%s (%s): %s", at->envvar,
				 path[0] ? path : "document", msg);
	else if (at != NULL && at->line > 0)
		snprintf(cx->err, cx->errlen, "%s: %s (line %d, column %d)",
				 path[0] ? path : "document", msg, at->line, at->column);
	else
		snprintf(cx->err, cx->errlen, "%s: %s", path[0] ? path : "document", msg);
	return false;
}

/*
 * qbcf_echo: a value quoted for a message, control characters escaped and cut
 * at 40 characters.  Used for numbers, booleans and names only: strings such
 * as URLs and header values may hold secrets and are never echoed.
 */
const char *
qbcf_echo(const QbcfCtx *cx, char *buf, size_t size, const char *s)
{
	size_t		o = 0;
	int			n;

	for (const QbcfFileValue *f = cx->file_values; f != NULL; f = f->next)
		if (f->value == s)
			return "the content of a file (not repeated: it may be a secret)";
	if (*s == '\0')
		return "an empty value";
	buf[o++] = '"';
	for (n = 0; *s != '\0' && o + 8 < size; s++, n++)
	{
		if (n == 40)
		{
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if ((unsigned char) *s < ' ' || *s == 0x7f)
			o += snprintf(buf + o, size - o, "\\x%02X", (unsigned char) *s);
		else
			buf[o++] = *s;
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

/*
 * qbcf_text: a scalar's value as a new string in the config's arena: a
 * document value ${}-expanded, an override's value as it is.  what
 * describes the expected value for the message when the node is not a
 * scalar.
 */
bool
qbcf_text(QbcfCtx *cx, const char *path, const QbcfNode *n, const char *what, char **out)
{
	char		msg[QBCF_MSGLEN];

	*out = NULL;
	if (n->kind != QBCF_SCALAR)
		return qbcf_error(cx, path, n, "expected %s, got %s", what, qbcf_kind_name(n));
	if (n->envvar != NULL)
		*out = qbcf_arena_strdup(cx->arena, n->text);
	else
	{
		char	   *expanded;

		if (strlen(n->text) != n->len)
			return qbcf_error(cx, path, n, "the value contains a NUL character (\\0); remove it");
		if ((expanded = qb_expand_env(n->text, cx->env, msg, sizeof(msg))) == NULL)
			return qbcf_error(cx, path, n, "%s", msg);
		*out = qbcf_arena_strdup(cx->arena, expanded);
		/* it may hold a secret from the environment */
		explicit_bzero(expanded, strlen(expanded));
		free(expanded);
		if (*out != NULL && strstr(n->text, "${file:") != NULL)
		{
			QbcfFileValue *f = qbcf_arena_alloc(cx->arena, sizeof(QbcfFileValue));

			if (f == NULL)
				return qbcf_error(cx, path, n, "out of memory");
			f->value = *out;
			f->node = n;
			f->next = cx->file_values;
			cx->file_values = f;
		}
	}
	if (*out == NULL)
		return qbcf_error(cx, path, n, "out of memory");
	return true;
}

/* qbcf_parse_long: an optionally signed decimal integer, nothing else. */
static bool
qbcf_parse_long(const char *s, long *out)
{
	const char *p = s;
	char	   *end;

	if (*p == '-' || *p == '+')
		p++;
	if (!isdigit((unsigned char) *p))
		return false;
	for (; *p != '\0'; p++)
		if (!isdigit((unsigned char) *p))
			return false;
	errno = 0;
	*out = strtol(s, &end, 10);
	return errno == 0;
}

/* qbcf_int: an integer in lo..hi. */
bool
qbcf_int(QbcfCtx *cx, const char *path, const QbcfNode *n, long lo, long hi, long *out)
{
	char		what[96];
	char		echo[64];
	char	   *s;
	long		v = 0;
	bool		ok;

	snprintf(what, sizeof(what), "an integer from %ld to %ld", lo, hi);
	if (!qbcf_text(cx, path, n, what, &s))
		return false;
	ok = qbcf_parse_long(s, &v) && v >= lo && v <= hi;
	if (ok)
		*out = v;
	else
		qbcf_error(cx, path, n, "expected %s, got %s", what, qbcf_echo(cx, echo, sizeof(echo), s));
	return ok;
}

/*
 * qbcf_number: a finite decimal number in lo..hi (hi may be INFINITY).  The
 * syntax is checked before strtod, which would also take "nan", "inf" and
 * hexadecimal.
 */
bool
qbcf_number(QbcfCtx *cx, const char *path, const QbcfNode *n, double lo, double hi,
			const char *what, double *out)
{
	char		echo[64];
	char	   *s;
	const char *p;
	bool		ok;
	int			digits = 0;
	double		v = 0;

	if (!qbcf_text(cx, path, n, what, &s))
		return false;
	p = s;
	if (*p == '-' || *p == '+')
		p++;
	for (; isdigit((unsigned char) *p); p++)
		digits++;
	if (*p == '.')
		for (p++; isdigit((unsigned char) *p); p++)
			digits++;
	ok = digits > 0;
	if (ok && (*p == 'e' || *p == 'E'))
	{
		p++;
		if (*p == '-' || *p == '+')
			p++;
		ok = isdigit((unsigned char) *p);
		while (isdigit((unsigned char) *p))
			p++;
	}
	ok = ok && *p == '\0';
	if (ok)
	{
		v = strtod(s, NULL);
		ok = isfinite(v) && v >= lo && v <= hi;
	}
	if (ok)
		*out = v;
	else
		qbcf_error(cx, path, n, "expected %s, got %s", what, qbcf_echo(cx, echo, sizeof(echo), s));
	return ok;
}

/* qbcf_bool: true or false, nothing else (no yes/no/on/off: YAML 1.1 traps). */
bool
qbcf_bool(QbcfCtx *cx, const char *path, const QbcfNode *n, bool *out)
{
	char		echo[64];
	char	   *s;
	bool		ok = true;

	if (!qbcf_text(cx, path, n, "true or false", &s))
		return false;
	if (strcmp(s, "true") == 0)
		*out = true;
	else if (strcmp(s, "false") == 0)
		*out = false;
	else
		ok = qbcf_error(cx, path, n, "expected true or false, got %s",
						qbcf_echo(cx, echo, sizeof(echo), s));
	return ok;
}

/* qbcf_string: any scalar as text; nonempty refuses "". */
bool
qbcf_string(QbcfCtx *cx, const char *path, const QbcfNode *n, bool nonempty, char **out)
{
	if (!qbcf_text(cx, path, n, "a string", out))
		return false;
	if (nonempty && (*out)[0] == '\0')
	{
		*out = NULL;
		return qbcf_error(cx, path, n, "must not be empty");
	}
	return true;
}

/*
 * qbcf_section: a mapping or a sequence, or NULL (absent or null) in *out.
 */
bool
qbcf_section(QbcfCtx *cx, const char *path, const QbcfNode *n, QbcfKind want, const QbcfNode **out)
{
	*out = NULL;
	if (qbcf_is_null(n))
		return true;
	if (n->kind != want)
		return qbcf_error(cx, path, n, "expected %s, got %s",
						  want == QBCF_MAP ? "a mapping (indented key: value lines)"
						  : "a sequence (lines starting with \"- \")",
						  qbcf_kind_name(n));
	*out = n;
	return true;
}

/* qbcf_list: "a, b, c" into buf, or with last " or " "a, b or c". */
void
qbcf_list(char *buf, size_t size, const char *const *names, const char *last)
{
	size_t		o = 0;
	int			i;

	buf[0] = '\0';
	for (i = 0; names[i] != NULL && o < size; i++)
		o += snprintf(buf + o, size - o, "%s%s",
					  i == 0 ? "" : names[i + 1] == NULL ? last : ", ", names[i]);
}

/*
 * qbcf_check_keys: check the keys of a mapping: strings, no duplicate, and (when
 * allowed is not NULL) each one of allowed.  forwhat qualifies "unknown key"
 * ("for an http destination").
 */
bool
qbcf_check_keys(QbcfCtx *cx, const char *path, const QbcfNode *map, const char *const *allowed,
				const char *forwhat)
{
	char		sub[QBCF_PATHLEN];
	int			i,
				j,
				k;

	for (i = 0; i < map->n; i++)
	{
		const QbcfNode *key = map->keys[i];

		if (key->kind != QBCF_SCALAR)
			return qbcf_error(cx, path, key, "a key must be a string, got %s", qbcf_kind_name(key));
		if (strlen(key->text) != key->len)
			return qbcf_error(cx, path, key, "a key contains a NUL character (\\0); remove it");
		qbcf_path_key(sub, sizeof(sub), path, key->text);
		for (j = 0; j < i; j++)
			if (strcmp(map->keys[j]->text, key->text) == 0)
				return qbcf_error(cx, sub, key,
								  "duplicate key (first at line %d, column %d); keep only one",
								  map->keys[j]->line, map->keys[j]->column);
		if (allowed == NULL)
			continue;
		for (k = 0; allowed[k] != NULL; k++)
			if (strcmp(allowed[k], key->text) == 0)
				break;
		if (allowed[k] == NULL)
		{
			char		list[256];
			char		hint[96] = "";

			qbcf_list(list, sizeof(list), allowed, ", ");
			for (k = 0; allowed[k] != NULL; k++)
				if (strcasecmp(allowed[k], key->text) == 0)
					snprintf(hint, sizeof(hint), "; did you mean %s?", allowed[k]);
			return qbcf_error(cx, sub, key, "unknown key%s%s (allowed: %s)%s",
							  forwhat ? " " : "", forwhat ? forwhat : "", list, hint);
		}
	}
	return true;
}

/* qbcf_required: the value under key, or an error naming what is missing. */
const QbcfNode *
qbcf_required(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
			  const char *why)
{
	const QbcfNode *n = qbcf_get(m, key);

	if (n == NULL)
		qbcf_error(cx, path, m, "missing required key %s (%s)", key, why);
	return n;
}

/* qbcf_required_string: a required string key of mapping m; *node is its node. */
bool
qbcf_required_string(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
					 const char *why, bool nonempty, char **out, const QbcfNode **node)
{
	char		sub[QBCF_PATHLEN];

	if ((*node = qbcf_required(cx, path, m, key, why)) == NULL)
		return false;
	qbcf_path_key(sub, sizeof(sub), path, key);
	return qbcf_string(cx, sub, *node, nonempty, out);
}

/* qbcf_flag: an optional boolean key. */
bool
qbcf_flag(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key, bool *out)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *n = qbcf_get(m, key);

	if (n == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	return qbcf_bool(cx, sub, n, out);
}

/* qbcf_opt_int: an optional integer key of mapping m into *out. */
bool
qbcf_opt_int(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
			 long lo, long hi, long *out)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *n = qbcf_get(m, key);

	if (n == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	return qbcf_int(cx, sub, n, lo, hi, out);
}

/* qbcf_opt_string: an optional string key of mapping m into *out (left NULL). */
bool
qbcf_opt_string(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
				bool nonempty, char **out)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *n = qbcf_get(m, key);

	if (n == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	return qbcf_string(cx, sub, n, nonempty, out);
}

/* qbcf_header_name: an HTTP token (RFC 9110 tchar). */
bool
qbcf_header_name(const char *s)
{
	return qb_token_invalid_at(s) < 0;
}

/* qbcf_opt_header: an optional key naming an HTTP header, checked. */
bool
qbcf_opt_header(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key, char **out)
{
	char		sub[QBCF_PATHLEN];

	if (!qbcf_opt_string(cx, path, m, key, true, out))
		return false;
	if (*out == NULL || qbcf_header_name(*out))
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	return qbcf_error(cx, sub, qbcf_get(m, key),
					  "not a valid HTTP header name: use letters, digits and !#$%%&'*+-.^_`|~ only");
}

/*
 * qbcf_url_path: a URL path as configured: starts with '/', no space, control
 * character, '?' or '#'.  Shared by destination paths and inbox paths.
 */
bool
qbcf_url_path(QbcfCtx *cx, const char *path, const QbcfNode *n, const char *s, const char *example)
{
	const char *p;

	if (s[0] != '/')
		return qbcf_error(cx, path, n, "must start with '/', e.g. %s", example);
	for (p = s; *p != '\0'; p++)
		if ((unsigned char) *p <= ' ' || *p == 0x7f || *p == '?' || *p == '#')
			return qbcf_error(cx, path, n,
							  "must not contain a space, a control character, '?' or '#'; percent-encode them");
	return true;
}

/*
 * qbcf_pairs: a string-to-string mapping (headers:, kafka config:) into a new
 * array.  Header names must be HTTP tokens, unique in any letter case, and
 * header values may hold no control character but a tab: libcurl would send
 * them as they are and split the request.
 */
bool
qbcf_pairs(QbcfCtx *cx, const char *path, const QbcfNode *node, bool http,
		   QbHeader **out, int *nout)
{
	const QbcfNode *m;
	char		sub[QBCF_PATHLEN];
	int			i,
				j;

	if (!qbcf_section(cx, path, node, QBCF_MAP, &m))
		return false;
	if (m == NULL || m->n == 0)
		return true;
	if (!qbcf_check_keys(cx, path, m, NULL, NULL))
		return false;
	if ((*out = qbcf_arena_alloc(cx->arena, m->n * sizeof(QbHeader))) == NULL)
		return qbcf_error(cx, path, m, "out of memory");
	*nout = m->n;
	for (i = 0; i < m->n; i++)
	{
		const char *name = m->keys[i]->text;
		const char *p;

		qbcf_path_key(sub, sizeof(sub), path, name);
		if (http && !qbcf_header_name(name))
			return qbcf_error(cx, sub, m->keys[i],
							  "not a valid HTTP header name: use letters, digits and !#$%%&'*+-.^_`|~ only");
		if (!http && name[0] == '\0')
			return qbcf_error(cx, sub, m->keys[i], "a property name must not be empty");
		for (j = 0; http && j < i; j++)
			if (strcasecmp(m->keys[j]->text, name) == 0)
				return qbcf_error(cx, sub, m->keys[i],
								  "the same header as at line %d, column %d (header names ignore case); keep one",
								  m->keys[j]->line, m->keys[j]->column);
		if (((*out)[i].name = qbcf_arena_strdup(cx->arena, name)) == NULL)
			return qbcf_error(cx, sub, m->keys[i], "out of memory");
		if (!qbcf_string(cx, sub, m->kids[i], false, &(*out)[i].value))
			return false;
		for (p = (*out)[i].value; http && *p != '\0'; p++)
			if (((unsigned char) *p < ' ' && *p != '\t') || *p == 0x7f)
				return qbcf_error(cx, sub, m->kids[i],
								  "the header value contains a line break or another control character; remove it");
	}
	return true;
}

/*
 * qbcf_typed: a mapping whose type: key names one of types (what spells them
 * for messages); sets *m and the index *t.  empty is the message for an
 * empty value, why the hint for a missing type:.
 */
bool
qbcf_typed(QbcfCtx *cx, const char *path, const QbcfNode *node, const char *const *types,
		   const char *what, const char *empty, const char *why, const QbcfNode **m, int *t)
{
	char		sub[QBCF_PATHLEN];
	char		echo[64];
	char	   *type = NULL;
	const QbcfNode *n;

	if (!qbcf_section(cx, path, node, QBCF_MAP, m))
		return false;
	if (*m == NULL)
		return qbcf_error(cx, path, node, "%s", empty);
	if (!qbcf_check_keys(cx, path, *m, NULL, NULL))
		return false;
	if ((n = qbcf_required(cx, path, *m, "type", why)) == NULL)
		return false;
	qbcf_path_key(sub, sizeof(sub), path, "type");
	if (!qbcf_text(cx, sub, n, what, &type))
		return false;
	for (*t = 0; types[*t] != NULL; (*t)++)
		if (strcmp(types[*t], type) == 0)
			break;
	if (types[*t] == NULL)
		return qbcf_error(cx, sub, n, "expected %s, got %s", what,
						  qbcf_echo(cx, echo, sizeof(echo), type));
	return true;
}

/* qbcf_prefixed: prefix followed by name, in the arena (a default consumer name). */
char *
qbcf_prefixed(QbcfCtx *cx, const char *prefix, const char *name)
{
	size_t		n = strlen(prefix) + strlen(name) + 1;
	char	   *out = qbcf_arena_alloc(cx->arena, n);

	if (out != NULL)
		snprintf(out, n, "%s%s", prefix, name);
	return out;
}
