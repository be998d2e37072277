/*-------------------------------------------------------------------------
 * qb_config.c
 *	  Load, override and validate a configuration document.
 *
 * A document goes through three steps, so that a value from the document
 * and a value from an override meet exactly one validator:
 *
 *	1. load	  libyaml's event stream becomes a tree of nodes (mapping,
 *			  sequence, scalar), each with the 1-based line and column where
 *			  it starts.  Scalars are kept raw: ${NAME} is not expanded yet.
 *	2. override  QUEUEBOX_* variables replace or add scalar nodes in the tree.
 *	3. validate  the tree is checked key by key into a QbConfig.  Each scalar
 *			  of the document is expanded (qb_expand_env) when it is read,
 *			  then type-checked; an override's value is taken as it is.
 *
 * Wording:
 *	- node: one element of the tree.  A node made by an override has line 0
 *	  and remembers the variable's name, so its errors name the variable.
 *	- null: an unquoted empty value, "~" or "null".  A null section
 *	  ("outbox:" with nothing under it) counts as absent.
 *	- key path: see qb_config.h.  A key holding a '.' is written ["a.b"].
 *
 * Overrides (QUEUEBOX_* environment variables)
 * --------------------------------------------
 * The text after "QUEUEBOX_" is compared, ignoring case, with the name of
 * each known scalar key path: every path segment upper-cased, each character
 * other than a letter or a digit turned into '_', the segments joined by '_'.
 *
 *	QUEUEBOX_OUTBOX_BATCHSIZE					outbox.batchSize
 *	QUEUEBOX_OUTBOX_BACKOFF_INITIALMS			outbox.backoff.initialMs
 *	QUEUEBOX_DESTINATIONS_PAYMENTS_BASEURL		destinations.payments.baseUrl
 *	QUEUEBOX_DESTINATIONS_MY_API_TIMEOUTMS		destinations.my-api.timeoutMs
 *	QUEUEBOX_DESTINATIONS_PAYMENTS_HEADERS_X_API_KEY
 *												destinations.payments.headers.X-Api-Key
 *	QUEUEBOX_ROUTES_0_DESTINATION				routes[0].destination
 *
 *	QUEUEBOX_HTTP_LISTEN						http.listen
 *	QUEUEBOX_ADMIN_TOKEN						admin.token
 *	QUEUEBOX_SOURCES_STRIPE_AUTH_SECRET			sources.stripe.auth.secret
 *	QUEUEBOX_DESTINATIONS_BILLING_SIGNING_SECRET	destinations.billing.signing.secret
 *
 * The known scalar key paths are the outbox, outbox.backoff, inbox,
 * inbox.relay, http and admin keys, and, for each source (its scalar keys
 * and auth's) and each destination and route the document defines: every scalar
 * key of any destination type and of signing:, the headers and kafka config
 * entries the document already has, and routes[i].topicPattern / .destination.  An
 * override cannot create a destination, a route, a header or a kafka
 * property, and cannot replace a mapping or a sequence.
 *
 * An override replaces the value at its path, or adds the key when the
 * document lacks it (creating outbox: and outbox.backoff: as needed).  Its
 * value is validated like a document value but is not ${}-expanded: it
 * already comes from the environment.  Errors name the variable and the key
 * path, e.g. "QUEUEBOX_OUTBOX_BATCHSIZE (outbox.batchSize): expected ...".
 * A key that is known but not allowed for the destination's type (say
 * QUEUEBOX_DESTINATIONS_PAYMENTS_EXCHANGE on an http destination) is an
 * error, so a stale override is noticed.  A variable matching no known path
 * (QUEUEBOX_TEST_*, for one) is ignored.  Two variables for one path, or a
 * name matching two paths (destinations "a-b" and "a_b"), are errors.
 *
 * YAML aliases (*name) are refused: a handful of nested aliases can expand a
 * small document into billions of nodes.  Anchors alone are harmless.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <librdkafka/rdkafka.h>
#include <yaml.h>

#include "qb_config.h"
#include "qb_extract.h"
#include "qb_http.h"
#include "qb_pub_amqp.h"
#include "qb_route.h"

extern char **environ;

#define QT_MAX_DEPTH	64		/* deeper than any valid document */
#define QV_PATHLEN		512
#define QV_MSGLEN		QB_ERRLEN

/* ---------------------------------------------------------------------
 * The tree
 * ---------------------------------------------------------------------
 */
typedef enum QtKind
{
	QT_SCALAR,
	QT_MAP,
	QT_SEQ
} QtKind;

typedef struct QtNode QtNode;
struct QtNode
{
	QtKind		kind;
	int			line;			/* 1-based; 0 for a node made by an override */
	int			column;
	char	   *text;			/* scalar: raw value, NUL-terminated */
	size_t		len;			/* scalar: its length (a "\0" escape makes it
								 * differ from strlen) */
	bool		plain;			/* scalar: unquoted, so it may be null */
	char	   *envvar;			/* the override variable that made this node */
	QtNode	  **keys;			/* map: the key scalars, parallel to kids */
	QtNode	  **kids;			/* map: values; seq: items */
	int			n;
	int			cap;
};

/* qt_new: an empty node. */
static QtNode *
qt_new(QtKind kind, int line, int column)
{
	QtNode	   *n = calloc(1, sizeof(QtNode));

	if (n != NULL)
	{
		n->kind = kind;
		n->line = line;
		n->column = column;
	}
	return n;
}

/* qt_scalar: a scalar node holding a copy of len bytes of text. */
static QtNode *
qt_scalar(const char *text, size_t len, int line, int column)
{
	QtNode	   *n = qt_new(QT_SCALAR, line, column);

	if (n == NULL)
		return NULL;
	n->text = malloc(len + 1);
	if (n->text == NULL)
	{
		free(n);
		return NULL;
	}
	memcpy(n->text, text, len);
	n->text[len] = '\0';
	n->len = len;
	return n;
}

/* qt_free: a node and everything under it. */
static void
qt_free(QtNode *n)
{
	int			i;

	if (n == NULL)
		return;
	for (i = 0; i < n->n; i++)
	{
		if (n->keys != NULL)
			qt_free(n->keys[i]);
		qt_free(n->kids[i]);
	}
	free(n->keys);
	free(n->kids);
	free(n->text);
	free(n->envvar);
	free(n);
}

/* qt_append: add an item (key NULL) or a key/value pair; false when out of memory. */
static bool
qt_append(QtNode *parent, QtNode *key, QtNode *kid)
{
	if (parent->n == parent->cap)
	{
		int			cap = parent->cap ? parent->cap * 2 : 8;
		QtNode	  **kids;

		kids = realloc(parent->kids, cap * sizeof(QtNode *));
		if (kids == NULL)
			return false;
		parent->kids = kids;
		if (parent->kind == QT_MAP)
		{
			QtNode	  **keys = realloc(parent->keys, cap * sizeof(QtNode *));

			if (keys == NULL)
				return false;
			parent->keys = keys;
		}
		parent->cap = cap;
	}
	if (parent->kind == QT_MAP)
		parent->keys[parent->n] = key;
	parent->kids[parent->n] = kid;
	parent->n++;
	return true;
}

/* qt_is_null: absent, or a YAML null (unquoted "", "~", "null"). */
static bool
qt_is_null(const QtNode *n)
{
	if (n == NULL)
		return true;
	if (n->kind != QT_SCALAR || !n->plain || n->envvar != NULL)
		return false;
	return n->len == 0 || strcmp(n->text, "~") == 0 ||
		strcmp(n->text, "null") == 0 || strcmp(n->text, "Null") == 0 ||
		strcmp(n->text, "NULL") == 0;
}

/* qt_find: index of key in a mapping, or -1.  The first one wins. */
static int
qt_find(const QtNode *map, const char *key)
{
	int			i;

	if (map == NULL || map->kind != QT_MAP)
		return -1;
	for (i = 0; i < map->n; i++)
		if (map->keys[i]->kind == QT_SCALAR && strcmp(map->keys[i]->text, key) == 0)
			return i;
	return -1;
}

/* qt_get: the value under key in a mapping, or NULL. */
static QtNode *
qt_get(const QtNode *map, const char *key)
{
	int			i = qt_find(map, key);

	return i < 0 ? NULL : map->kids[i];
}

/* qt_kind_name: "a mapping", ... for messages. */
static const char *
qt_kind_name(const QtNode *n)
{
	switch (n->kind)
	{
		case QT_MAP:
			return "a mapping";
		case QT_SEQ:
			return "a sequence";
		default:
			return "a scalar";
	}
}

/* ---------------------------------------------------------------------
 * Loading: libyaml events to a tree
 *
 * The event API rather than yaml_parser_load because an alias must be
 * refused where it is written; the document API resolves it silently.
 * ---------------------------------------------------------------------
 */
typedef struct QtLoader
{
	yaml_parser_t parser;
	const char *text;
	size_t		len;
	char	   *err;
	size_t		errlen;
} QtLoader;

/*
 * qt_parser_error: turn libyaml's error into our message.  A reader error
 * (bad UTF-8, a control character) carries a byte offset and no mark,
 * because libyaml decodes ahead of the parser; count lines and characters
 * up to that offset ourselves.
 */
static void
qt_parser_error(QtLoader *ld)
{
	yaml_parser_t *p = &ld->parser;

	if (p->error == YAML_MEMORY_ERROR)
		snprintf(ld->err, ld->errlen, "out of memory while parsing the YAML document");
	else if (p->error == YAML_READER_ERROR)
	{
		size_t		off = p->problem_offset < ld->len ? p->problem_offset : ld->len;
		size_t		i;
		int			line = 1;
		int			column = 1;
		char		value[16] = "";

		for (i = 0; i < off; i++)
		{
			unsigned char c = (unsigned char) ld->text[i];

			if (c == '\n' || (c == '\r' && (i + 1 >= ld->len || ld->text[i + 1] != '\n')))
			{
				line++;
				column = 1;
			}
			else if (c != '\r' && (c & 0xC0) != 0x80)
				column++;
		}
		if (p->problem_value != -1)
			snprintf(value, sizeof(value), " (0x%X)", (unsigned) p->problem_value);
		snprintf(ld->err, ld->errlen,
				 "YAML syntax error at line %d, column %d: %s%s; the document must be UTF-8 text without control characters",
				 line, column, p->problem ? p->problem : "unreadable input", value);
	}
	else
	{
		char		context[160] = "";

		if (p->context != NULL)
			snprintf(context, sizeof(context), " (%s at line %d, column %d)",
					 p->context, (int) p->context_mark.line + 1,
					 (int) p->context_mark.column + 1);
		snprintf(ld->err, ld->errlen,
				 "YAML syntax error at line %d, column %d: %s%s; check the indentation and quote values that contain \": \" or start with a special character",
				 (int) p->problem_mark.line + 1, (int) p->problem_mark.column + 1,
				 p->problem ? p->problem : "unknown error", context);
	}
}

/* qt_next: the next event, or false with the error written. */
static bool
qt_next(QtLoader *ld, yaml_event_t *ev)
{
	if (!yaml_parser_parse(&ld->parser, ev))
	{
		qt_parser_error(ld);
		return false;
	}
	return true;
}

/*
 * qt_node: build the node that starts with *ev, reading the events of its
 * content.  Consumes *ev.  NULL with the error written on failure.
 */
static QtNode *
qt_node(QtLoader *ld, yaml_event_t *ev, int depth)
{
	int			line = (int) ev->start_mark.line + 1;
	int			column = (int) ev->start_mark.column + 1;
	QtNode	   *node = NULL;
	QtNode	   *key = NULL;
	QtNode	   *val = NULL;
	yaml_event_t sub;
	yaml_event_type_t end;

	switch (ev->type)
	{
		case YAML_SCALAR_EVENT:
			node = qt_scalar((const char *) ev->data.scalar.value,
							 ev->data.scalar.length, line, column);
			if (node == NULL)
				goto oom;
			node->plain = (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE);
			yaml_event_delete(ev);
			return node;

		case YAML_ALIAS_EVENT:
			snprintf(ld->err, ld->errlen,
					 "YAML alias \"*%.40s\" at line %d, column %d: aliases are not supported, because a few of them can expand a small document without bound; write the value out instead",
					 (const char *) ev->data.alias.anchor, line, column);
			yaml_event_delete(ev);
			return NULL;

		case YAML_MAPPING_START_EVENT:
		case YAML_SEQUENCE_START_EVENT:
			if (depth >= QT_MAX_DEPTH)
			{
				snprintf(ld->err, ld->errlen,
						 "YAML nesting deeper than %d levels at line %d, column %d: a configuration needs no more than a few",
						 QT_MAX_DEPTH, line, column);
				yaml_event_delete(ev);
				return NULL;
			}
			if (ev->type == YAML_MAPPING_START_EVENT)
			{
				node = qt_new(QT_MAP, line, column);
				end = YAML_MAPPING_END_EVENT;
			}
			else
			{
				node = qt_new(QT_SEQ, line, column);
				end = YAML_SEQUENCE_END_EVENT;
			}
			if (node == NULL)
				goto oom;
			yaml_event_delete(ev);
			for (;;)
			{
				if (!qt_next(ld, &sub))
					goto fail;
				if (sub.type == end)
				{
					yaml_event_delete(&sub);
					break;
				}
				if (node->kind == QT_MAP)
				{
					key = qt_node(ld, &sub, depth + 1);
					if (key == NULL)
						goto fail;
					if (!qt_next(ld, &sub))
						goto fail;
				}
				val = qt_node(ld, &sub, depth + 1);
				if (val == NULL)
					goto fail;
				if (!qt_append(node, key, val))
				{
					snprintf(ld->err, ld->errlen, "out of memory while loading the YAML document");
					goto fail;
				}
				key = val = NULL;
			}
			return node;

		default:
			snprintf(ld->err, ld->errlen,
					 "YAML syntax error at line %d, column %d: unexpected YAML event %d",
					 line, column, (int) ev->type);
			yaml_event_delete(ev);
			return NULL;
	}

oom:
	snprintf(ld->err, ld->errlen, "out of memory while loading the YAML document");
	yaml_event_delete(ev);
	return NULL;

fail:
	qt_free(key);
	qt_free(val);
	qt_free(node);
	return NULL;
}

/*
 * qt_load: the tree of a whole stream.  *root stays NULL for an empty
 * stream (nothing, or only comments).  A second document is refused rather
 * than ignored, so that a stray "---" cannot hide half of a file.
 */
static int
qt_load(const char *text, size_t len, QtNode **root, char *err, size_t errlen)
{
	QtLoader	ld;
	yaml_event_t ev;
	QtNode	   *node = NULL;
	int			rc = -1;

	*root = NULL;
	memset(&ld, 0, sizeof(ld));
	ld.text = text;
	ld.len = len;
	ld.err = err;
	ld.errlen = errlen;
	if (!yaml_parser_initialize(&ld.parser))
	{
		snprintf(err, errlen, "out of memory while parsing the YAML document");
		return -1;
	}
	yaml_parser_set_input_string(&ld.parser, (const unsigned char *) text, len);
	/* no UTF-16 detection: the document is UTF-8, and a BOM is still fine */
	yaml_parser_set_encoding(&ld.parser, YAML_UTF8_ENCODING);

	if (!qt_next(&ld, &ev))		/* stream start */
		goto done;
	yaml_event_delete(&ev);
	if (!qt_next(&ld, &ev))
		goto done;
	if (ev.type == YAML_STREAM_END_EVENT)
	{
		yaml_event_delete(&ev);
		rc = 0;
		goto done;
	}
	yaml_event_delete(&ev);		/* document start */
	if (!qt_next(&ld, &ev))
		goto done;
	node = qt_node(&ld, &ev, 0);
	if (node == NULL)
		goto done;
	if (!qt_next(&ld, &ev))		/* document end */
		goto done;
	yaml_event_delete(&ev);
	if (!qt_next(&ld, &ev))
		goto done;
	if (ev.type != YAML_STREAM_END_EVENT)
	{
		snprintf(err, errlen,
				 "a second YAML document starts at line %d: keep the whole configuration in one document (remove the \"---\" line)",
				 (int) ev.start_mark.line + 1);
		yaml_event_delete(&ev);
		goto done;
	}
	yaml_event_delete(&ev);
	*root = node;
	node = NULL;
	rc = 0;

done:
	qt_free(node);
	yaml_parser_delete(&ld.parser);
	return rc;
}

/* ---------------------------------------------------------------------
 * A growing string
 * ---------------------------------------------------------------------
 */
typedef struct QsBuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
	bool		oom;
} QsBuf;

/* qs_add: append len bytes; on failure the buffer remembers it. */
static void
qs_add(QsBuf *b, const char *s, size_t len)
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
	QsBuf		b = {0};
	const char *p = in;
	char	   *name = NULL;

	qs_add(&b, "", 0);			/* an empty input still gives a string */
	while (*p != '\0')
	{
		if (p[0] == '$' && p[1] == '$' && p[2] == '{')
		{
			qs_add(&b, "${", 2);
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
			qs_add(&b, value, strlen(value));
			free(name);
			name = NULL;
			p = close + 1;
		}
		else
		{
			qs_add(&b, p, 1);
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
 * url_hostport: check "host[:port]" or "[v6]:port" of len bytes.  The port
 * is optional; when present it must be 1..65535.
 */
static bool
url_hostport(const char *s, size_t len, char *err, size_t errlen)
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
		QsBuf		list = {0};

		for (i = 0; schemes[i] != NULL; i++)
		{
			if (i > 0)
				qs_add(&list, schemes[i + 1] ? ", " : " or ", schemes[i + 1] ? 2 : 4);
			qs_add(&list, schemes[i], strlen(schemes[i]));
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
	if (!url_hostport(auth, rest - auth, err, errlen))
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
 * url_brokers: kafka's bootstrap list, "host[:port],host[:port]", each
 * entry optionally with a "proto://" prefix as librdkafka allows.
 */
static bool
url_brokers(const char *s, char *err, size_t errlen)
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
		if (!url_hostport(p, len, err, errlen))
			return false;
		p += len;
		if (*p == '\0')
			return true;
		p++;
	}
}

/* ---------------------------------------------------------------------
 * The schema
 * ---------------------------------------------------------------------
 */
static const char *const qs_top_keys[] =
{"outbox", "destinations", "routes", "sources", "inbox", "http", "admin", NULL};
static const char *const qs_outbox_keys[] =
{"pollIntervalMs", "batchSize", "maxAttempts", "claimTimeoutMs", "backoff", "retention", NULL};
static const char *const qs_outbox_scalars[] =
{"pollIntervalMs", "batchSize", "maxAttempts", "claimTimeoutMs", "retention", NULL};
static const char *const qs_backoff_keys[] =
{"initialMs", "maxMs", "multiplier", "jitter", NULL};
static const char *const qs_http_keys[] =
{"type", "baseUrl", "path", "headers", "timeoutMs", "transform", "signing", "maxInFlight",
"circuitBreaker", NULL};
static const char *const qs_rabbitmq_keys[] =
{"type", "url", "exchange", "routingKey", "persistent", "mandatory", "transform", "maxInFlight", "circuitBreaker", NULL};
static const char *const qs_kafka_keys[] =
{"type", "brokers", "topic", "config", "transform", "maxInFlight", "circuitBreaker", NULL};
static const char *const qs_nats_keys[] =
{"type", "url", "subject", "jetstream", "transform", "maxInFlight", "circuitBreaker", NULL};
/* every scalar key of any destination type: what an override may set */
static const char *const qs_dest_scalars[] =
{"type", "baseUrl", "path", "timeoutMs", "url", "exchange", "routingKey",
"persistent", "mandatory", "brokers", "topic", "subject", "jetstream", "transform",
"maxInFlight", NULL};
static const char *const qs_breaker_keys[] =
{"failures", "cooldownMs", NULL};
static const char *const qs_route_keys[] =
{"topicPattern", "destination", "transform", NULL};
static const char *const qs_source_keys[] =
{"type", "path", "idempotencyKeyPath", "idempotencyKeyHeader", "eventTypePath",
"eventTypeHeader", "aggregateIdPath", "topic", "consumption", "maxBodyBytes", "auth",
"transform", NULL};
static const char *const qs_rabbitmq_source_keys[] =
{"type", "url", "queue", "prefetch", "idempotencyKeyPath", "idempotencyKeyHeader",
"eventTypePath", "eventTypeFromHeader", "aggregateIdPath", "topic", "consumption",
"transform", "batchSize", NULL};
static const char *const qs_kafka_source_keys[] =
{"type", "brokers", "topics", "group", "config", "idempotencyKeyPath", "idempotencyKeyHeader",
"eventTypePath", "eventTypeHeader", "aggregateIdPath", "topic", "consumption", "transform",
"batchSize", NULL};
static const char *const qs_nats_source_keys[] =
{"type", "url", "subject", "stream", "durable", "idempotencyKeyPath", "idempotencyKeyHeader",
"eventTypePath", "eventTypeHeader", "aggregateIdPath", "topic", "consumption", "transform",
"batchSize", NULL};
/* every scalar key of any source type: what an override may set */
static const char *const qs_source_scalars[] =
{"type", "path", "idempotencyKeyPath", "idempotencyKeyHeader", "eventTypePath",
"eventTypeHeader", "aggregateIdPath", "topic", "consumption", "maxBodyBytes", "transform",
"url", "queue", "prefetch", "eventTypeFromHeader", "brokers", "group", "subject", "stream",
"durable", "batchSize", NULL};
/* auth keys by type, in the order of QbAuthType (NONE has none) */
static const char *const qs_auth_hmac_keys[] =
{"type", "secret", "secrets", "header", "prefix", "encoding", NULL};
static const char *const qs_auth_github_keys[] =
{"type", "secret", "secrets", NULL};
static const char *const qs_auth_timed_keys[] =
{"type", "secret", "secrets", "toleranceSec", NULL};
static const char *const qs_auth_bearer_keys[] =
{"type", "token", NULL};
static const char *const qs_auth_scalars[] =
{"type", "secret", "header", "prefix", "encoding", "toleranceSec", "token", NULL};
/* an http destination's signing: keys by scheme are auth's github and hmac ones */
static const char *const qs_signing_scalars[] =
{"type", "secret", "header", "prefix", "encoding", NULL};
static const char *const qs_inbox_keys[] =
{"basePath", "relay", NULL};
static const char *const qs_relay_keys[] =
{"enabled", "pollIntervalMs", "batchSize", "claimTimeoutMs", "maxAttempts", NULL};
static const char *const qs_http_section_keys[] =
{"listen", "maxConnections", "connectionTimeoutMs", "storeTimeoutMs", NULL};
static const char *const qs_admin_keys[] =
{"token", NULL};

#define QS_RETENTION_MAX	(36500L * 86400L)
/* signing: every signature of a request fits one 8 KiB header line */
#define QV_SIGNING_MAX_KEYS		16
#define QV_SIGNING_MAX_PREFIX	64
#define QS_MS_MAX			2147483647L

/* ---------------------------------------------------------------------
 * Key paths
 * ---------------------------------------------------------------------
 */

/*
 * qv_fmt: snprintf through a va_list, so that a path cut at QV_PATHLEN (it
 * stays recognisable) is not a -Wformat-truncation error.
 */
static void
qv_fmt(char *buf, size_t size, const char *fmt,...)
	__attribute__((format(printf, 3, 4)));

static void
qv_fmt(char *buf, size_t size, const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(buf, size, fmt, ap);
	va_end(ap);
}

/* qv_path_key: parent.key, or parent["key"] when the key would be ambiguous. */
static void
qv_path_key(char *buf, size_t size, const char *parent, const char *key)
{
	bool		plain = key[0] != '\0' && strpbrk(key, ".[]\" ") == NULL;

	if (plain)
		qv_fmt(buf, size, "%s%s%s", parent, parent[0] ? "." : "", key);
	else
		qv_fmt(buf, size, "%s[\"%s\"]", parent, key);
}

/* qv_path_index: parent[i]. */
static void
qv_path_index(char *buf, size_t size, const char *parent, int i)
{
	qv_fmt(buf, size, "%s[%d]", parent, i);
}

/* ---------------------------------------------------------------------
 * Overrides
 * ---------------------------------------------------------------------
 */

/* A candidate key path; seg[k] NULL stands for the route index. */
typedef struct QoPath
{
	const char *seg[4];
	int			nseg;
	int			index;
} QoPath;

/* qo_seg_match: does the segment's override spelling begin *r?  Advances *r. */
static bool
qo_seg_match(const char **r, const char *seg)
{
	const char *p = *r;

	for (; *seg != '\0'; seg++, p++)
	{
		int			want = isalnum((unsigned char) *seg) ? toupper((unsigned char) *seg) : '_';

		if (toupper((unsigned char) *p) != want)
			return false;
	}
	*r = p;
	return true;
}

/* qo_matches: does rest (the name after QUEUEBOX_) spell this path? */
static bool
qo_matches(const char *rest, const QoPath *path)
{
	const char *r = rest;
	int			s;

	for (s = 0; s < path->nseg; s++)
	{
		char		num[16];

		if (s > 0)
		{
			if (*r != '_')
				return false;
			r++;
		}
		if (path->seg[s] == NULL)
		{
			snprintf(num, sizeof(num), "%d", path->index);
			if (!qo_seg_match(&r, num))
				return false;
		}
		else if (!qo_seg_match(&r, path->seg[s]))
			return false;
	}
	return *r == '\0';
}

/* qo_display: a candidate path as the validator would print it. */
static void
qo_display(char *buf, size_t size, const QoPath *path)
{
	char		tmp[QV_PATHLEN];
	int			s;

	buf[0] = '\0';
	for (s = 0; s < path->nseg; s++)
	{
		qv_fmt(tmp, sizeof(tmp), "%s", buf);
		if (path->seg[s] == NULL)
			qv_path_index(buf, size, tmp, path->index);
		else
			qv_path_key(buf, size, tmp, path->seg[s]);
	}
}

typedef struct QoFound
{
	int			count;
	QoPath		first;
	QoPath		second;
} QoFound;

/* qo_try: count a candidate that rest spells, keeping the first two. */
static void
qo_try(QoFound *f, const char *rest, const QoPath *path)
{
	if (!qo_matches(rest, path))
		return;
	if (f->count == 0)
		f->first = *path;
	else if (f->count == 1)
		f->second = *path;
	f->count++;
}

/* qo_try_map: the entries of a headers: or config: mapping. */
static void
qo_try_map(QoFound *f, const char *rest, const char *name, const QtNode *dest,
		   const char *section)
{
	const QtNode *m = qt_get(dest, section);
	int			i;

	if (m == NULL || m->kind != QT_MAP)
		return;
	for (i = 0; i < m->n; i++)
	{
		QoPath		p = {{"destinations", name, section, m->keys[i]->text}, 4, 0};

		if (m->keys[i]->kind == QT_SCALAR)
			qo_try(f, rest, &p);
	}
}

/* qo_collect: every known scalar key path that rest spells. */
static void
qo_collect(const QtNode *root, const char *rest, QoFound *f)
{
	const QtNode *m;
	int			i,
				k;

	for (k = 0; qs_outbox_scalars[k] != NULL; k++)
	{
		QoPath		p = {{"outbox", qs_outbox_scalars[k]}, 2, 0};

		qo_try(f, rest, &p);
	}
	for (k = 0; qs_backoff_keys[k] != NULL; k++)
	{
		QoPath		p = {{"outbox", "backoff", qs_backoff_keys[k]}, 3, 0};

		qo_try(f, rest, &p);
	}
	{
		QoPath		p = {{"inbox", "basePath"}, 2, 0};

		qo_try(f, rest, &p);
	}
	for (k = 0; qs_relay_keys[k] != NULL; k++)
	{
		QoPath		p = {{"inbox", "relay", qs_relay_keys[k]}, 3, 0};

		qo_try(f, rest, &p);
	}
	for (k = 0; qs_http_section_keys[k] != NULL; k++)
	{
		QoPath		p = {{"http", qs_http_section_keys[k]}, 2, 0};

		qo_try(f, rest, &p);
	}
	for (k = 0; qs_admin_keys[k] != NULL; k++)
	{
		QoPath		p = {{"admin", qs_admin_keys[k]}, 2, 0};

		qo_try(f, rest, &p);
	}
	m = qt_get(root, "sources");
	if (m != NULL && m->kind == QT_MAP)
	{
		for (i = 0; i < m->n; i++)
		{
			const char *name = m->keys[i]->text;

			if (m->keys[i]->kind != QT_SCALAR || m->kids[i]->kind != QT_MAP)
				continue;
			for (k = 0; qs_source_scalars[k] != NULL; k++)
			{
				QoPath		p = {{"sources", name, qs_source_scalars[k]}, 3, 0};

				qo_try(f, rest, &p);
			}
			for (k = 0; qs_auth_scalars[k] != NULL; k++)
			{
				QoPath		p = {{"sources", name, "auth", qs_auth_scalars[k]}, 4, 0};

				qo_try(f, rest, &p);
			}
		}
	}
	m = qt_get(root, "destinations");
	if (m != NULL && m->kind == QT_MAP)
	{
		for (i = 0; i < m->n; i++)
		{
			const char *name = m->keys[i]->text;

			if (m->keys[i]->kind != QT_SCALAR || m->kids[i]->kind != QT_MAP)
				continue;
			for (k = 0; qs_dest_scalars[k] != NULL; k++)
			{
				QoPath		p = {{"destinations", name, qs_dest_scalars[k]}, 3, 0};

				qo_try(f, rest, &p);
			}
			for (k = 0; qs_breaker_keys[k] != NULL; k++)
			{
				QoPath		p = {{"destinations", name, "circuitBreaker", qs_breaker_keys[k]}, 4, 0};

				qo_try(f, rest, &p);
			}
			for (k = 0; qs_signing_scalars[k] != NULL; k++)
			{
				QoPath		p = {{"destinations", name, "signing", qs_signing_scalars[k]}, 4, 0};

				qo_try(f, rest, &p);
			}
			qo_try_map(f, rest, name, m->kids[i], "headers");
			qo_try_map(f, rest, name, m->kids[i], "config");
		}
	}
	m = qt_get(root, "routes");
	if (m != NULL && m->kind == QT_SEQ)
	{
		for (i = 0; i < m->n; i++)
		{
			if (m->kids[i]->kind != QT_MAP)
				continue;
			for (k = 0; qs_route_keys[k] != NULL; k++)
			{
				QoPath		p = {{"routes", NULL, qs_route_keys[k]}, 3, i};

				qo_try(f, rest, &p);
			}
		}
	}
}

/*
 * qo_apply: set the scalar at path to value, made by variable var.  Missing
 * outbox:/backoff: mappings are created; a path through something that is
 * not a mapping is left for the validator to report.  -1 on error.
 */
static int
qo_apply(QtNode **root, const QoPath *path, const char *var, const char *value,
		 char *err, size_t errlen)
{
	QtNode	   *cur;
	QtNode	   *node = NULL;
	QtNode	   *key = NULL;
	int			s,
				i;

	if (*root == NULL && (*root = qt_new(QT_MAP, 0, 0)) == NULL)
		goto oom;
	cur = *root;
	for (s = 0; s < path->nseg - 1; s++)
	{
		if (path->seg[s + 1] == NULL)
		{
			/* routes: collected from the tree, so the item exists */
			cur = qt_get(cur, path->seg[s])->kids[path->index];
			s++;
			continue;
		}
		i = qt_find(cur, path->seg[s]);
		if (i >= 0 && cur->kids[i]->kind == QT_MAP)
		{
			cur = cur->kids[i];
			continue;
		}
		if (i >= 0 && !qt_is_null(cur->kids[i]))
			return 0;
		if ((node = qt_new(QT_MAP, 0, 0)) == NULL)
			goto oom;
		if (i >= 0)
		{
			qt_free(cur->kids[i]);
			cur->kids[i] = node;
		}
		else
		{
			if ((key = qt_scalar(path->seg[s], strlen(path->seg[s]), 0, 0)) == NULL ||
				!qt_append(cur, key, node))
				goto oom;
		}
		cur = node;
		node = key = NULL;
	}

	if ((node = qt_scalar(value, strlen(value), 0, 0)) == NULL ||
		(node->envvar = strdup(var)) == NULL)
		goto oom;
	i = qt_find(cur, path->seg[path->nseg - 1]);
	if (i >= 0)
	{
		if (cur->kids[i]->envvar != NULL)
		{
			char		disp[QV_PATHLEN];

			qo_display(disp, sizeof(disp), path);
			snprintf(err, errlen, "%s and %s both set %s: unset one of them",
					 cur->kids[i]->envvar, var, disp);
			qt_free(node);
			return -1;
		}
		qt_free(cur->kids[i]);
		cur->kids[i] = node;
		return 0;
	}
	key = qt_scalar(path->seg[path->nseg - 1], strlen(path->seg[path->nseg - 1]), 0, 0);
	if (key == NULL || (key->envvar = strdup(var)) == NULL || !qt_append(cur, key, node))
		goto oom;
	return 0;

oom:
	qt_free(node);
	qt_free(key);
	snprintf(err, errlen, "out of memory while applying %s", var);
	return -1;
}

/* qo_overrides: apply every QUEUEBOX_* variable of the environment. */
static int
qo_overrides(QtNode **root, char *err, size_t errlen)
{
	char	  **e;

	/* a document that is not a mapping fails validation anyway */
	if (*root != NULL && (*root)->kind != QT_MAP)
		return 0;
	for (e = environ; e != NULL && *e != NULL; e++)
	{
		const char *eq;
		char	   *var;
		QoFound		f = {0};
		int			rc = 0;

		if (strncmp(*e, "QUEUEBOX_", 9) != 0 || (eq = strchr(*e, '=')) == NULL)
			continue;
		if ((var = strndup(*e, eq - *e)) == NULL)
		{
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		qo_collect(*root, var + 9, &f);
		if (f.count > 1)
		{
			char		a[QV_PATHLEN],
						b[QV_PATHLEN];

			qo_display(a, sizeof(a), &f.first);
			qo_display(b, sizeof(b), &f.second);
			snprintf(err, errlen,
					 "%s matches both %s and %s: override names compare letters and digits only, so rename one of them",
					 var, a, b);
			rc = -1;
		}
		else if (f.count == 1)
			rc = qo_apply(root, &f.first, var, eq + 1, err, errlen);
		free(var);
		if (rc != 0)
			return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------------
 * Validation
 * ---------------------------------------------------------------------
 */
typedef struct QvCtx
{
	char	   *err;
	size_t		errlen;
} QvCtx;

/*
 * qv_error: "path: message (line L, column C)", or for a node made by an
 * override "VAR (path): message".
 */
static bool
qv_error(QvCtx *cx, const char *path, const QtNode *at, const char *fmt,...)
	__attribute__((format(printf, 4, 5)));

static bool
qv_error(QvCtx *cx, const char *path, const QtNode *at, const char *fmt,...)
{
	char		msg[QV_MSGLEN];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
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
 * qv_echo: a value quoted for a message, control characters escaped and cut
 * at 40 characters.  Used for numbers, booleans and names only: strings such
 * as URLs and header values may hold secrets and are never echoed.
 */
static const char *
qv_echo(char *buf, size_t size, const char *s)
{
	size_t		o = 0;
	int			n;

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
 * qv_text: a scalar's value as a new string: a document value ${}-expanded,
 * an override's value as it is.  what describes the expected value for the
 * message when the node is not a scalar.
 */
static bool
qv_text(QvCtx *cx, const char *path, const QtNode *n, const char *what, char **out)
{
	char		msg[QV_MSGLEN];

	*out = NULL;
	if (n->kind != QT_SCALAR)
		return qv_error(cx, path, n, "expected %s, got %s", what, qt_kind_name(n));
	if (n->envvar != NULL)
		*out = strdup(n->text);
	else
	{
		if (strlen(n->text) != n->len)
			return qv_error(cx, path, n, "the value contains a NUL character (\\0); remove it");
		*out = qb_expand_env(n->text, msg, sizeof(msg));
		if (*out == NULL)
			return qv_error(cx, path, n, "%s", msg);
	}
	if (*out == NULL)
		return qv_error(cx, path, n, "out of memory");
	return true;
}

/* qv_parse_long: an optionally signed decimal integer, nothing else. */
static bool
qv_parse_long(const char *s, long *out)
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

/* qv_int: an integer in lo..hi. */
static bool
qv_int(QvCtx *cx, const char *path, const QtNode *n, long lo, long hi, long *out)
{
	char		what[96];
	char		echo[64];
	char	   *s;
	long		v = 0;
	bool		ok;

	snprintf(what, sizeof(what), "an integer from %ld to %ld", lo, hi);
	if (!qv_text(cx, path, n, what, &s))
		return false;
	ok = qv_parse_long(s, &v) && v >= lo && v <= hi;
	if (ok)
		*out = v;
	else
		qv_error(cx, path, n, "expected %s, got %s", what, qv_echo(echo, sizeof(echo), s));
	free(s);
	return ok;
}

/*
 * qv_number: a finite decimal number in lo..hi (hi may be INFINITY).  The
 * syntax is checked before strtod, which would also take "nan", "inf" and
 * hexadecimal.
 */
static bool
qv_number(QvCtx *cx, const char *path, const QtNode *n, double lo, double hi,
		  const char *what, double *out)
{
	char		echo[64];
	char	   *s;
	const char *p;
	bool		ok;
	int			digits = 0;
	double		v = 0;

	if (!qv_text(cx, path, n, what, &s))
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
		qv_error(cx, path, n, "expected %s, got %s", what, qv_echo(echo, sizeof(echo), s));
	free(s);
	return ok;
}

/* qv_bool: true or false, nothing else (no yes/no/on/off: YAML 1.1 traps). */
static bool
qv_bool(QvCtx *cx, const char *path, const QtNode *n, bool *out)
{
	char		echo[64];
	char	   *s;
	bool		ok = true;

	if (!qv_text(cx, path, n, "true or false", &s))
		return false;
	if (strcmp(s, "true") == 0)
		*out = true;
	else if (strcmp(s, "false") == 0)
		*out = false;
	else
		ok = qv_error(cx, path, n, "expected true or false, got %s",
					  qv_echo(echo, sizeof(echo), s));
	free(s);
	return ok;
}

/* qv_string: any scalar as text; nonempty refuses "". */
static bool
qv_string(QvCtx *cx, const char *path, const QtNode *n, bool nonempty, char **out)
{
	if (!qv_text(cx, path, n, "a string", out))
		return false;
	if (nonempty && (*out)[0] == '\0')
	{
		free(*out);
		*out = NULL;
		return qv_error(cx, path, n, "must not be empty");
	}
	return true;
}

/* qv_duration: "<n>d", "<n>h", "<n>m", "<n>s" or plain seconds, in seconds. */
static bool
qv_duration(QvCtx *cx, const char *path, const QtNode *n, long *out)
{
	static const char what[] =
		"a duration like \"7d\", \"12h\", \"30m\", \"45s\" or a number of seconds, from 1s to 36500d";
	char		echo[64];
	char	   *s;
	const char *p;
	long		v = 0;
	long		unit = 1;
	bool		ok;

	if (!qv_text(cx, path, n, what, &s))
		return false;
	for (p = s; isdigit((unsigned char) *p) && v <= QS_RETENTION_MAX; p++)
		v = v * 10 + (*p - '0');
	ok = p > s;
	if (ok && *p != '\0')
	{
		switch (*p)
		{
			case 'd':
				unit = 86400;
				break;
			case 'h':
				unit = 3600;
				break;
			case 'm':
				unit = 60;
				break;
			case 's':
				unit = 1;
				break;
			default:
				ok = false;
		}
		ok = ok && p[1] == '\0';
	}
	ok = ok && v >= 1 && v <= QS_RETENTION_MAX / unit;
	if (ok)
		*out = v * unit;
	else
		qv_error(cx, path, n, "expected %s, got %s", what, qv_echo(echo, sizeof(echo), s));
	free(s);
	return ok;
}

/*
 * qv_section: a mapping or a sequence, or NULL (absent or null) in *out.
 */
static bool
qv_section(QvCtx *cx, const char *path, const QtNode *n, QtKind want, const QtNode **out)
{
	*out = NULL;
	if (qt_is_null(n))
		return true;
	if (n->kind != want)
		return qv_error(cx, path, n, "expected %s, got %s",
						want == QT_MAP ? "a mapping (indented key: value lines)"
						: "a sequence (lines starting with \"- \")",
						qt_kind_name(n));
	*out = n;
	return true;
}

/* qv_list: "a, b, c" into buf. */
static void
qv_list(char *buf, size_t size, const char *const *names)
{
	size_t		o = 0;
	int			i;

	buf[0] = '\0';
	for (i = 0; names[i] != NULL && o < size; i++)
		o += snprintf(buf + o, size - o, "%s%s", i ? ", " : "", names[i]);
}

/*
 * qv_keys: check the keys of a mapping: strings, no duplicate, and (when
 * allowed is not NULL) each one of allowed.  forwhat qualifies "unknown key"
 * ("for an http destination").
 */
static bool
qv_keys(QvCtx *cx, const char *path, const QtNode *map, const char *const *allowed,
		const char *forwhat)
{
	char		sub[QV_PATHLEN];
	int			i,
				j,
				k;

	for (i = 0; i < map->n; i++)
	{
		const QtNode *key = map->keys[i];

		if (key->kind != QT_SCALAR)
			return qv_error(cx, path, key, "a key must be a string, got %s", qt_kind_name(key));
		if (strlen(key->text) != key->len)
			return qv_error(cx, path, key, "a key contains a NUL character (\\0); remove it");
		qv_path_key(sub, sizeof(sub), path, key->text);
		for (j = 0; j < i; j++)
			if (strcmp(map->keys[j]->text, key->text) == 0)
				return qv_error(cx, sub, key,
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

			qv_list(list, sizeof(list), allowed);
			for (k = 0; allowed[k] != NULL; k++)
				if (strcasecmp(allowed[k], key->text) == 0)
					snprintf(hint, sizeof(hint), "; did you mean %s?", allowed[k]);
			return qv_error(cx, sub, key, "unknown key%s%s (allowed: %s)%s",
							forwhat ? " " : "", forwhat ? forwhat : "", list, hint);
		}
	}
	return true;
}

/* qv_outbox: the outbox: section onto the defaults already in *o. */
static bool
qv_outbox(QvCtx *cx, const QtNode *node, QbOutboxConf *o)
{
	const QtNode *m;
	const QtNode *b;
	const QtNode *n;
	const QtNode *max_node;
	long		v;

	if (!qv_section(cx, "outbox", node, QT_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qv_keys(cx, "outbox", m, qs_outbox_keys, NULL))
		return false;
	if ((n = qt_get(m, "pollIntervalMs")) != NULL)
	{
		if (!qv_int(cx, "outbox.pollIntervalMs", n, 10, 3600000, &v))
			return false;
		o->poll_interval_ms = (int) v;
	}
	if ((n = qt_get(m, "batchSize")) != NULL)
	{
		if (!qv_int(cx, "outbox.batchSize", n, 1, 10000, &v))
			return false;
		o->batch_size = (int) v;
	}
	if ((n = qt_get(m, "maxAttempts")) != NULL)
	{
		if (!qv_int(cx, "outbox.maxAttempts", n, 1, 1000000, &v))
			return false;
		o->max_attempts = (int) v;
	}
	if ((n = qt_get(m, "claimTimeoutMs")) != NULL &&
		!qv_int(cx, "outbox.claimTimeoutMs", n, 1000, 86400000, &o->claim_timeout_ms))
		return false;
	if ((n = qt_get(m, "retention")) != NULL &&
		!qv_duration(cx, "outbox.retention", n, &o->retention_sec))
		return false;

	if (!qv_section(cx, "outbox.backoff", qt_get(m, "backoff"), QT_MAP, &b))
		return false;
	if (b == NULL)
		return true;
	if (!qv_keys(cx, "outbox.backoff", b, qs_backoff_keys, NULL))
		return false;
	if ((n = qt_get(b, "initialMs")) != NULL &&
		!qv_int(cx, "outbox.backoff.initialMs", n, 1, QS_MS_MAX, &o->backoff.initial_ms))
		return false;
	if ((max_node = qt_get(b, "maxMs")) != NULL &&
		!qv_int(cx, "outbox.backoff.maxMs", max_node, 1, QS_MS_MAX, &o->backoff.max_ms))
		return false;
	if ((n = qt_get(b, "multiplier")) != NULL &&
		!qv_number(cx, "outbox.backoff.multiplier", n, 1.0, INFINITY,
				   "a number >= 1 (1 keeps the delay constant)", &o->backoff.multiplier))
		return false;
	if ((n = qt_get(b, "jitter")) != NULL &&
		!qv_number(cx, "outbox.backoff.jitter", n, 0.0, 1.0,
				   "a number from 0 to 1", &o->backoff.jitter))
		return false;
	if (o->backoff.max_ms < o->backoff.initial_ms)
	{
		if (max_node != NULL)
			return qv_error(cx, "outbox.backoff.maxMs", max_node,
							"must be at least initialMs (%ld), got %ld; raise maxMs or lower initialMs",
							o->backoff.initial_ms, o->backoff.max_ms);
		return qv_error(cx, "outbox.backoff.initialMs", qt_get(b, "initialMs"),
						"is larger than maxMs (%ld, the default); lower it or set outbox.backoff.maxMs",
						o->backoff.max_ms);
	}
	return true;
}

/* qv_header_name: an HTTP token (RFC 9110 tchar). */
static bool
qv_header_name(const char *s)
{
	if (*s == '\0')
		return false;
	for (; *s != '\0'; s++)
		if (!isalnum((unsigned char) *s) && strchr("!#$%&'*+-.^_`|~", *s) == NULL)
			return false;
	return true;
}

/*
 * qv_pairs: a string-to-string mapping (headers:, kafka config:) into a new
 * array.  Header names must be HTTP tokens, unique in any letter case, and
 * header values may hold no control character but a tab: libcurl would send
 * them as they are and split the request.
 */
static bool
qv_pairs(QvCtx *cx, const char *path, const QtNode *node, bool http,
		 QbHeader **out, int *nout)
{
	const QtNode *m;
	char		sub[QV_PATHLEN];
	int			i,
				j;

	if (!qv_section(cx, path, node, QT_MAP, &m))
		return false;
	if (m == NULL || m->n == 0)
		return true;
	if (!qv_keys(cx, path, m, NULL, NULL))
		return false;
	if ((*out = calloc(m->n, sizeof(QbHeader))) == NULL)
		return qv_error(cx, path, m, "out of memory");
	*nout = m->n;
	for (i = 0; i < m->n; i++)
	{
		const char *name = m->keys[i]->text;
		const char *p;

		qv_path_key(sub, sizeof(sub), path, name);
		if (http && !qv_header_name(name))
			return qv_error(cx, sub, m->keys[i],
							"not a valid HTTP header name: use letters, digits and !#$%%&'*+-.^_`|~ only");
		if (!http && name[0] == '\0')
			return qv_error(cx, sub, m->keys[i], "a property name must not be empty");
		for (j = 0; http && j < i; j++)
			if (strcasecmp(m->keys[j]->text, name) == 0)
				return qv_error(cx, sub, m->keys[i],
								"the same header as at line %d, column %d (header names ignore case); keep one",
								m->keys[j]->line, m->keys[j]->column);
		if (((*out)[i].name = strdup(name)) == NULL)
			return qv_error(cx, sub, m->keys[i], "out of memory");
		if (!qv_string(cx, sub, m->kids[i], false, &(*out)[i].value))
			return false;
		for (p = (*out)[i].value; http && *p != '\0'; p++)
			if (((unsigned char) *p < ' ' && *p != '\t') || *p == 0x7f)
				return qv_error(cx, sub, m->kids[i],
								"the header value contains a line break or another control character; remove it");
	}
	return true;
}

/* qv_required: the value under key, or an error naming what is missing. */
static const QtNode *
qv_required(QvCtx *cx, const char *path, const QtNode *m, const char *key,
			const char *why)
{
	const QtNode *n = qt_get(m, key);

	if (n == NULL)
		qv_error(cx, path, m, "missing required key %s (%s)", key, why);
	return n;
}

static bool qv_url_path(QvCtx *cx, const char *path, const QtNode *n, const char *s,
						const char *example);
static bool qv_signing(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d);

/* qv_http: the keys of an http destination. */
static bool
qv_http(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d)
{
	static const char url_why[] = "an http destination needs one, e.g. baseUrl: \"https://host:8443\"";
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	const QtNode *n;
	size_t		len;
	long		v;

	if ((n = qv_required(cx, path, m, "baseUrl", url_why)) == NULL)
		return false;
	qv_path_key(sub, sizeof(sub), path, "baseUrl");
	if (!qv_string(cx, sub, n, false, &d->base_url))
		return false;
	if (!qb_url_check(d->base_url, msg, sizeof(msg)))
		return qv_error(cx, sub, n, "%s", msg);
	/* the path is appended to it: keep no trailing '/' */
	len = strlen(d->base_url);
	while (len > 0 && d->base_url[len - 1] == '/')
		d->base_url[--len] = '\0';

	if ((n = qt_get(m, "path")) != NULL)
	{
		qv_path_key(sub, sizeof(sub), path, "path");
		if (!qv_string(cx, sub, n, false, &d->path))
			return false;
		if (d->path[0] != '\0' && !qv_url_path(cx, sub, n, d->path, "path: /events"))
			return false;
	}
	else if ((d->path = strdup("")) == NULL)
		return qv_error(cx, path, m, "out of memory");

	if ((d->url = malloc(strlen(d->base_url) + strlen(d->path) + 1)) == NULL)
		return qv_error(cx, path, m, "out of memory");
	strcpy(d->url, d->base_url);
	strcat(d->url, d->path);

	qv_path_key(sub, sizeof(sub), path, "headers");
	if (!qv_pairs(cx, sub, qt_get(m, "headers"), true, &d->headers, &d->nheaders))
		return false;

	if ((n = qt_get(m, "timeoutMs")) != NULL)
	{
		qv_path_key(sub, sizeof(sub), path, "timeoutMs");
		if (!qv_int(cx, sub, n, 1, 600000, &v))
			return false;
		d->timeout_ms = v;
	}
	return qt_get(m, "signing") == NULL || qv_signing(cx, path, m, d);
}

/*
 * qv_broker_url: a required url/brokers key into d->broker_url.  A NATS url
 * may list several servers separated by commas, as cnats accepts.
 */
static bool
qv_broker_url(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d,
			  const char *key, const char *why)
{
	static const char *const amqp[] = {"amqp", "amqps", NULL};
	static const char *const nats[] = {"nats", "tls", NULL};
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	const QtNode *n;
	bool		ok = true;

	if ((n = qv_required(cx, path, m, key, why)) == NULL)
		return false;
	qv_path_key(sub, sizeof(sub), path, key);
	if (!qv_string(cx, sub, n, false, &d->broker_url))
		return false;
	if (d->type == QB_DEST_RABBITMQ)
		ok = qb_url_check_scheme(d->broker_url, amqp, QB_URL_USERINFO | QB_URL_QUERY,
								 msg, sizeof(msg));
	else if (d->type == QB_DEST_KAFKA)
		ok = url_brokers(d->broker_url, msg, sizeof(msg));
	else
	{
		char	   *copy = strdup(d->broker_url);
		char	   *one;
		char	   *save = NULL;

		if (copy == NULL)
			return qv_error(cx, sub, n, "out of memory");
		if (copy[0] == '\0' || copy[strlen(copy) - 1] == ',' || strstr(copy, ",,") != NULL)
		{
			snprintf(msg, sizeof(msg), "empty entry in the server list; write nats://host:port[,nats://host:port]");
			ok = false;
		}
		for (one = strtok_r(copy, ",", &save); ok && one != NULL; one = strtok_r(NULL, ",", &save))
			ok = qb_url_check_scheme(one, nats, QB_URL_USERINFO, msg, sizeof(msg));
		free(copy);
	}
	if (!ok)
		return qv_error(cx, sub, n, "%s", msg);
	return true;
}

/* qv_target: an optional or required exchange/topic/subject into d->target. */
static bool
qv_target(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d,
		  const char *key, const char *why, bool nonempty)
{
	char		sub[QV_PATHLEN];
	const QtNode *n;

	if (why != NULL)
	{
		if ((n = qv_required(cx, path, m, key, why)) == NULL)
			return false;
	}
	else if ((n = qt_get(m, key)) == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, key);
	return qv_string(cx, sub, n, nonempty, &d->target);
}

/*
 * qv_subject_template: a nats subject is a template over the row's topic and
 * key; check it now so a typo fails the document, not every delivery.
 */
static bool
qv_subject_template(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d)
{
	static const char *const names[] = {"topic", "key", NULL};
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];

	if (d->target == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, "subject");
	if (!qb_template_check(d->target, names, msg, sizeof(msg)))
		return qv_error(cx, sub, qt_get(m, "subject"), "%s", msg);
	return true;
}

/* qv_flag: an optional boolean key. */
static bool
qv_flag(QvCtx *cx, const char *path, const QtNode *m, const char *key, bool *out)
{
	char		sub[QV_PATHLEN];
	const QtNode *n = qt_get(m, key);

	if (n == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, key);
	return qv_bool(cx, sub, n, out);
}

/*
 * The kafka branch of qv_destination.  d->timeout_ms is the producer's
 * message.timeout.ms: how long librdkafka may keep retrying a message before
 * its delivery report says it failed (default 30000, below the default
 * claimTimeoutMs so a report always arrives before the row's lease ends).
 */
#define QV_KAFKA_TIMEOUT_MS 30000

/* qv_kafka_topic: the topic template may name {{ topic }} and {{ key }}. */
static bool
qv_kafka_topic(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d)
{
	static const char *const names[] = {"topic", "key", NULL};
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];

	d->timeout_ms = QV_KAFKA_TIMEOUT_MS;
	if (d->target == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, "topic");
	if (!qb_template_check(d->target, names, msg, sizeof(msg)))
		return qv_error(cx, sub, qt_get(m, "topic"), "%s", msg);
	return true;
}

/*
 * A librdkafka property QueueBox sets itself: refused in config: unless it
 * has the one value QueueBox gives it (only), with why.
 */
typedef struct QvOwnedProp
{
	const char *name;
	const char *only;			/* the one value accepted, or NULL: none */
	const char *why;
} QvOwnedProp;

/* a producer's: they carry the delivery guarantees or come from other keys */
static const QvOwnedProp qv_kafka_producer_owned[] =
{
	{"enable.idempotence", "true", "QueueBox always produces idempotently, so a retried message is never written twice"},
	{"acks", "all", "QueueBox marks a row sent only once every in-sync replica has it"},
	{"request.required.acks", "all", "QueueBox marks a row sent only once every in-sync replica has it"},
	{"delivery.report.only.error", "false", "QueueBox needs a delivery report for every message to mark its row sent"},
	{"dr_cb", NULL, "QueueBox handles the delivery reports itself"},
	{"dr_msg_cb", NULL, "QueueBox handles the delivery reports itself"},
	{"transactional.id", NULL, "QueueBox's producer is idempotent, not transactional"},
	{"bootstrap.servers", NULL, "write the servers under brokers:"},
	{"metadata.broker.list", NULL, "write the servers under brokers:"},
	{"log.queue", NULL, "QueueBox reads librdkafka's log on its own thread"},
	{NULL, NULL, NULL}
};

/* a consumer's: offsets are committed only after the rows commit */
static const QvOwnedProp qv_kafka_consumer_owned[] =
{
	{"enable.auto.commit", "false", "QueueBox commits an offset only after its row is stored"},
	{"enable.auto.offset.store", "false", "QueueBox commits an offset only after its row is stored"},
	{"group.id", NULL, "write the consumer group under group:"},
	{"bootstrap.servers", NULL, "write the servers under brokers:"},
	{"metadata.broker.list", NULL, "write the servers under brokers:"},
	{"log.queue", NULL, "QueueBox serves librdkafka's log and events on the worker's thread"},
	{"rebalance_cb", NULL, "QueueBox uses librdkafka's default rebalancing"},
	{"offset_commit_cb", NULL, "QueueBox commits offsets itself"},
	{NULL, NULL, NULL}
};

/*
 * qv_kafka_props: each property of a config: mapping (node) is applied to a
 * scratch rd_kafka_conf_t (no thread starts), so a typo or a bad value is
 * refused now with librdkafka's own words; the properties QueueBox owns
 * are refused with why.  timeout_ms (a producer's, or NULL) gets
 * message.timeout.ms or delivery.timeout.ms when one is set.
 */
static bool
qv_kafka_props(QvCtx *cx, const char *path, const QtNode *node, const QbHeader *props,
			   int nprops, const QvOwnedProp *owned, long *timeout_ms)
{
	rd_kafka_conf_t *conf;
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	bool		ok = true;

	if (nprops == 0)
		return true;
	if ((conf = rd_kafka_conf_new()) == NULL)
		return qv_error(cx, path, node, "out of memory");
	for (int i = 0; ok && i < nprops; i++)
	{
		const char *name = props[i].name;
		const char *value = props[i].value;

		qv_path_key(sub, sizeof(sub), path, name);
		for (int o = 0; owned[o].name != NULL; o++)
		{
			const char *only = owned[o].only;

			if (strcmp(owned[o].name, name) != 0 ||
				(only != NULL && (strcmp(only, value) == 0 ||
								  (strcmp(only, "all") == 0 && strcmp(value, "-1") == 0))))
				continue;
			ok = qv_error(cx, sub, node->kids[i], "QueueBox sets %s itself%s%s: %s; remove it",
						  name, only ? " to " : "", only ? only : "", owned[o].why);
			break;
		}
		if (!ok)
			break;
		if (rd_kafka_conf_set(conf, name, value, msg, sizeof(msg)) != RD_KAFKA_CONF_OK)
		{
			ok = qv_error(cx, sub, node->kids[i], "librdkafka refused it: %s", msg);
			break;
		}
		if (timeout_ms != NULL &&
			(strcmp(name, "message.timeout.ms") == 0 || strcmp(name, "delivery.timeout.ms") == 0))
		{
			*timeout_ms = strtol(value, NULL, 10);
			if (*timeout_ms <= 0)
				ok = qv_error(cx, sub, node->kids[i],
							  "0 means retry forever, and a row's delivery report must arrive before its lease ends; give a number of milliseconds, e.g. 30000");
		}
	}
	rd_kafka_conf_destroy(conf);
	return ok;
}

/*
 * qv_transform: an optional transform: key of mapping m, compiled into *out;
 * a program libjq refuses is refused with its message.
 */
static bool
qv_transform(QvCtx *cx, const char *path, const QtNode *m, QbTransform **out)
{
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	char	   *text = NULL;
	const QtNode *n = qt_get(m, "transform");

	if (n == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, "transform");
	if (!qv_string(cx, sub, n, true, &text))
		return false;
	*out = qb_transform_compile(text, msg, sizeof(msg));
	free(text);
	if (*out == NULL)
		return qv_error(cx, sub, n, "%s", msg);
	return true;
}

/*
 * qv_typed: a mapping whose type: key names one of types (what spells them
 * for messages); sets *m and the index *t.  empty is the message for an
 * empty value, why the hint for a missing type:.
 */
static bool
qv_typed(QvCtx *cx, const char *path, const QtNode *node, const char *const *types,
		 const char *what, const char *empty, const char *why, const QtNode **m, int *t)
{
	char		sub[QV_PATHLEN];
	char		echo[64];
	char	   *type = NULL;
	const QtNode *n;

	if (!qv_section(cx, path, node, QT_MAP, m))
		return false;
	if (*m == NULL)
		return qv_error(cx, path, node, "%s", empty);
	if (!qv_keys(cx, path, *m, NULL, NULL))
		return false;
	if ((n = qv_required(cx, path, *m, "type", why)) == NULL)
		return false;
	qv_path_key(sub, sizeof(sub), path, "type");
	if (!qv_text(cx, sub, n, what, &type))
		return false;
	for (*t = 0; types[*t] != NULL; (*t)++)
		if (strcmp(types[*t], type) == 0)
			break;
	if (types[*t] == NULL)
	{
		qv_error(cx, sub, n, "expected %s, got %s", what, qv_echo(echo, sizeof(echo), type));
		free(type);
		return false;
	}
	free(type);
	return true;
}

static bool qv_opt_int(QvCtx *cx, const char *path, const QtNode *m, const char *key,
					   long lo, long hi, long *out);

/*
 * qv_delivery_control: the keys every destination type has that shape how
 * the engine feeds it: maxInFlight, circuitBreaker {failures, cooldownMs}.
 */
static bool
qv_delivery_control(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d)
{
	char		sub[QV_PATHLEN];
	const QtNode *cb = qt_get(m, "circuitBreaker");
	long		v = d->max_in_flight;
	long		failures = d->breaker_failures;

	if (!qv_opt_int(cx, path, m, "maxInFlight", 1, 10000, &v))
		return false;
	d->max_in_flight = (int) v;
	if (cb == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, "circuitBreaker");
	if (cb->kind != QT_MAP)
		return qv_error(cx, sub, cb,
						"expected a mapping such as { failures: 10, cooldownMs: 30000 }, got %s",
						qt_kind_name(cb));
	if (!qv_keys(cx, sub, cb, qs_breaker_keys, "in circuitBreaker") ||
		!qv_opt_int(cx, sub, cb, "failures", 1, 1000000, &failures) ||
		!qv_opt_int(cx, sub, cb, "cooldownMs", 100, 86400000, &d->breaker_cooldown_ms))
		return false;
	d->breaker_failures = (int) failures;
	return true;
}

/* qv_destination: one entry of destinations: into *d (d->name already set). */
static bool
qv_destination(QvCtx *cx, const char *path, const QtNode *node, QbDestination *d)
{
	static const char *const types[] = {"http", "rabbitmq", "kafka", "nats", NULL};
	char		sub[QV_PATHLEN];
	char		forwhat[48];
	const QtNode *m;
	const QtNode *n;
	const char *const *allowed;
	int			t;

	d->path = NULL;
	d->timeout_ms = 10000;
	d->persistent = true;
	d->mandatory = true;
	d->max_in_flight = QB_DEFAULT_MAX_IN_FLIGHT;
	d->breaker_failures = QB_DEFAULT_BREAKER_FAILURES;
	d->breaker_cooldown_ms = QB_DEFAULT_BREAKER_COOLDOWN_MS;
	if (!qv_typed(cx, path, node, types, "one of http, rabbitmq, kafka, nats",
				  "expected a mapping with at least type: (http, rabbitmq, kafka or nats), got an empty value",
				  "one of http, rabbitmq, kafka, nats", &m, &t))
		return false;
	d->type = (QbDestType) t;
	allowed = d->type == QB_DEST_HTTP ? qs_http_keys :
		d->type == QB_DEST_RABBITMQ ? qs_rabbitmq_keys :
		d->type == QB_DEST_KAFKA ? qs_kafka_keys : qs_nats_keys;
	snprintf(forwhat, sizeof(forwhat), "for a%s %s destination",
			 d->type == QB_DEST_HTTP ? "n" : "", types[t]);
	if (d->type != QB_DEST_HTTP && (n = qt_get(m, "signing")) != NULL)
	{
		qv_path_key(sub, sizeof(sub), path, "signing");
		return qv_error(cx, sub, n,
						"signing is for http destinations only (it signs the HTTP request); remove it, or sign the payload in a transform");
	}
	if (!qv_keys(cx, path, m, allowed, forwhat) ||
		!qv_transform(cx, path, m, &d->transform) ||
		!qv_delivery_control(cx, path, m, d))
		return false;

	switch (d->type)
	{
		case QB_DEST_HTTP:
			return qv_http(cx, path, m, d);
		case QB_DEST_RABBITMQ:
			if (!qv_broker_url(cx, path, m, d, "url",
							   "a rabbitmq destination needs one, e.g. url: \"amqp://user:password@host:5672/\"") ||
				!qv_target(cx, path, m, d, "exchange",
						   "a rabbitmq destination publishes to an exchange; \"\" is the default exchange",
						   false) ||
				!qv_flag(cx, path, m, "persistent", &d->persistent) ||
				!qv_flag(cx, path, m, "mandatory", &d->mandatory))
				return false;
			{
				/* what the publisher reads from the url: vhost, options */
				QbAmqpUrl	u;
				char		msg[QV_MSGLEN];
				bool		ok = qb_amqp_url_parse(d->broker_url, &u, msg, sizeof(msg));

				qb_amqp_url_free(&u);
				if (!ok)
				{
					qv_path_key(sub, sizeof(sub), path, "url");
					return qv_error(cx, sub, qt_get(m, "url"), "%s", msg);
				}
				if (strlen(d->target) > 255)
				{
					qv_path_key(sub, sizeof(sub), path, "exchange");
					return qv_error(cx, sub, qt_get(m, "exchange"),
									"an exchange name is at most 255 bytes");
				}
				if ((n = qt_get(m, "routingKey")) != NULL)
				{
					qv_path_key(sub, sizeof(sub), path, "routingKey");
					if (!qv_string(cx, sub, n, false, &d->routing_key))
						return false;
					if (!qb_template_check(d->routing_key, qb_amqp_routing_key_names,
										   msg, sizeof(msg)))
						return qv_error(cx, sub, n, "%s", msg);
					return true;
				}
			}
			if ((d->routing_key = strdup("{{ topic }}")) == NULL)
				return qv_error(cx, path, m, "out of memory");
			return true;
		case QB_DEST_KAFKA:
			qv_path_key(sub, sizeof(sub), path, "config");
			return qv_broker_url(cx, path, m, d, "brokers",
								 "a kafka destination needs its bootstrap servers, e.g. brokers: \"host:9092\"") &&
				qv_target(cx, path, m, d, "topic", NULL, true) &&
				qv_kafka_topic(cx, path, m, d) &&
				qv_pairs(cx, sub, qt_get(m, "config"), false, &d->props, &d->nprops) &&
				qv_kafka_props(cx, sub, qt_get(m, "config"), d->props, d->nprops,
							   qv_kafka_producer_owned, &d->timeout_ms);
		case QB_DEST_NATS:
			/*
			 * JetStream by default: core NATS is at most once and loses
			 * messages across a server restart (measured), which an outbox
			 * must not do silently.
			 */
			d->jetstream = true;
			return qv_broker_url(cx, path, m, d, "url",
								 "a nats destination needs one, e.g. url: \"nats://host:4222\"") &&
				qv_target(cx, path, m, d, "subject", NULL, true) &&
				qv_subject_template(cx, path, m, d) &&
				qv_flag(cx, path, m, "jetstream", &d->jetstream);
	}
	return true;
}

/*
 * qv_named_section: a mapping of named entries (destinations:, sources:)
 * into a zeroed array of n elements of size each; n stays 0 when the
 * section is absent or empty.
 */
static bool
qv_named_section(QvCtx *cx, const char *path, const QtNode *node, size_t size,
				 void **arr, int *n, const QtNode **m)
{
	if (!qv_section(cx, path, node, QT_MAP, m))
		return false;
	if (*m == NULL || (*m)->n == 0)
		return true;
	if (!qv_keys(cx, path, *m, NULL, NULL))
		return false;
	if ((*arr = calloc((*m)->n, size)) == NULL)
		return qv_error(cx, path, *m, "out of memory");
	*n = (*m)->n;
	return true;
}

/* qv_name: an entry's name: letters, digits, '_' and '-'; copied to *out. */
static bool
qv_name(QvCtx *cx, const char *path, const QtNode *key, const char *what, char **out)
{
	const char *p;

	for (p = key->text; *p != '\0'; p++)
		if (!isalnum((unsigned char) *p) && *p != '_' && *p != '-')
			break;
	if (*p != '\0' || key->text[0] == '\0')
		return qv_error(cx, path, key, "%s name may use only letters, digits, '_' and '-'", what);
	if ((*out = strdup(key->text)) == NULL)
		return qv_error(cx, path, key, "out of memory");
	return true;
}

/* qv_destinations: the destinations: section. */
static bool
qv_destinations(QvCtx *cx, const QtNode *node, QbConfig *cfg)
{
	char		sub[QV_PATHLEN];
	const QtNode *m;
	int			i;

	if (!qv_named_section(cx, "destinations", node, sizeof(QbDestination),
						  (void **) &cfg->destinations, &cfg->ndestinations, &m))
		return false;
	for (i = 0; i < cfg->ndestinations; i++)
	{
		qv_path_key(sub, sizeof(sub), "destinations", m->keys[i]->text);
		if (!qv_name(cx, sub, m->keys[i], "a destination", &cfg->destinations[i].name) ||
			!qv_destination(cx, sub, m->kids[i], &cfg->destinations[i]))
			return false;
	}
	return true;
}

/* qv_routes: the routes: section, after the destinations it names. */
static bool
qv_routes(QvCtx *cx, const QtNode *node, QbConfig *cfg)
{
	char		path[QV_PATHLEN];
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	const QtNode *seq;
	int			i,
				j;

	if (!qv_section(cx, "routes", node, QT_SEQ, &seq))
		return false;
	if (seq == NULL || seq->n == 0)
		return true;
	if ((cfg->routes = calloc(seq->n, sizeof(QbRoute))) == NULL)
		return qv_error(cx, "routes", seq, "out of memory");
	cfg->nroutes = seq->n;
	for (i = 0; i < seq->n; i++)
	{
		QbRoute    *r = &cfg->routes[i];
		const QtNode *m;
		const QtNode *n;

		qv_path_index(path, sizeof(path), "routes", i);
		if (!qv_section(cx, path, seq->kids[i], QT_MAP, &m))
			return false;
		if (m == NULL)
			return qv_error(cx, path, seq->kids[i],
							"expected a mapping with topicPattern and destination, got an empty value");
		if (!qv_keys(cx, path, m, qs_route_keys, NULL))
			return false;

		if ((n = qv_required(cx, path, m, "topicPattern",
							 "the topics this route takes, e.g. topicPattern: \"orders.**\"")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "topicPattern");
		if (!qv_string(cx, sub, n, false, &r->topic_pattern))
			return false;
		if (!qb_pattern_check(r->topic_pattern, msg, sizeof(msg)))
			return qv_error(cx, sub, n, "%s", msg);

		if ((n = qv_required(cx, path, m, "destination",
							 "the name of an entry under destinations:")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "destination");
		if (!qv_string(cx, sub, n, false, &r->destination))
			return false;
		r->dest_index = -1;
		for (j = 0; j < cfg->ndestinations; j++)
			if (strcmp(cfg->destinations[j].name, r->destination) == 0)
				r->dest_index = j;
		if (r->dest_index < 0)
		{
			char		echo[64];
			char		names[256];
			size_t		o = 0;

			names[0] = '\0';
			for (j = 0; j < cfg->ndestinations && o < sizeof(names); j++)
				o += snprintf(names + o, sizeof(names) - o, "%s%s", j ? ", " : "",
							  cfg->destinations[j].name);
			if (cfg->ndestinations == 0)
				return qv_error(cx, sub, n,
								"unknown destination %s (no destination is defined; add it under destinations:)",
								qv_echo(echo, sizeof(echo), r->destination));
			return qv_error(cx, sub, n, "unknown destination %s (defined: %s)",
							qv_echo(echo, sizeof(echo), r->destination), names);
		}
		if (!qv_transform(cx, path, m, &r->transform))
			return false;
	}
	return true;
}

/* ---------------------------------------------------------------------
 * Sources, inbox, http, admin
 * ---------------------------------------------------------------------
 */

/* qv_opt_int: an optional integer key of mapping m into *out. */
static bool
qv_opt_int(QvCtx *cx, const char *path, const QtNode *m, const char *key,
		   long lo, long hi, long *out)
{
	char		sub[QV_PATHLEN];
	const QtNode *n = qt_get(m, key);

	if (n == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, key);
	return qv_int(cx, sub, n, lo, hi, out);
}

/* qv_opt_string: an optional string key of mapping m into *out (left NULL). */
static bool
qv_opt_string(QvCtx *cx, const char *path, const QtNode *m, const char *key,
			  bool nonempty, char **out)
{
	char		sub[QV_PATHLEN];
	const QtNode *n = qt_get(m, key);

	if (n == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, key);
	return qv_string(cx, sub, n, nonempty, out);
}

/*
 * qv_url_path: a URL path as configured: starts with '/', no space, control
 * character, '?' or '#'.  Shared by destination paths and inbox paths.
 */
static bool
qv_url_path(QvCtx *cx, const char *path, const QtNode *n, const char *s, const char *example)
{
	const char *p;

	if (s[0] != '/')
		return qv_error(cx, path, n, "must start with '/', e.g. %s", example);
	for (p = s; *p != '\0'; p++)
		if ((unsigned char) *p <= ' ' || *p == 0x7f || *p == '?' || *p == '#')
			return qv_error(cx, path, n,
							"must not contain a space, a control character, '?' or '#'; percent-encode them");
	return true;
}

/* qv_opt_jsonpath: an optional JSONPath key, checked. */
static bool
qv_opt_jsonpath(QvCtx *cx, const char *path, const QtNode *m, const char *key, char **out)
{
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];

	if (!qv_opt_string(cx, path, m, key, true, out))
		return false;
	if (*out == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, key);
	if (!qb_jsonpath_check(*out, msg, sizeof(msg)))
		return qv_error(cx, sub, qt_get(m, key), "%s", msg);
	return true;
}

/* qv_opt_header: an optional key naming an HTTP header, checked. */
static bool
qv_opt_header(QvCtx *cx, const char *path, const QtNode *m, const char *key, char **out)
{
	char		sub[QV_PATHLEN];

	if (!qv_opt_string(cx, path, m, key, true, out))
		return false;
	if (*out == NULL || qv_header_name(*out))
		return true;
	qv_path_key(sub, sizeof(sub), path, key);
	return qv_error(cx, sub, qt_get(m, key),
					"not a valid HTTP header name: use letters, digits and !#$%%&'*+-.^_`|~ only");
}

/*
 * qv_one_of: at most one of two keys (a JSONPath and a header) is set; with
 * required, exactly one.
 */
static bool
qv_one_of(QvCtx *cx, const char *path, const QtNode *m, const char *a, const char *b)
{
	char		sub[QV_PATHLEN];

	if (qt_get(m, a) == NULL || qt_get(m, b) == NULL)
		return true;
	qv_path_key(sub, sizeof(sub), path, b);
	return qv_error(cx, sub, qt_get(m, b),
					"set %s or %s, not both: the value must come from one place", a, b);
}

/*
 * qv_secrets: secret or secrets (a list, for rotation) of an auth: or
 * signing: section m, each checked for scheme t, into *out (owned by the
 * caller even on failure).  hint follows "missing required key secret".
 */
static bool
qv_secrets(QvCtx *cx, const char *path, const QtNode *m, QbAuthType t, const char *hint,
		   char ***out, int *nout)
{
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	const QtNode *one = qt_get(m, "secret");
	const QtNode *many = qt_get(m, "secrets");
	const QtNode *seq;
	char	  **secrets;
	int			n,
				i;

	if (one != NULL && many != NULL)
	{
		qv_path_key(sub, sizeof(sub), path, "secrets");
		return qv_error(cx, sub, many,
						"set secret or secrets, not both (secrets: [new, old] accepts either during a rotation)");
	}
	if (one == NULL && many == NULL)
		return qv_error(cx, path, m, "missing required key secret (%s)", hint);
	qv_path_key(sub, sizeof(sub), path, one ? "secret" : "secrets");
	if (many != NULL)
	{
		if (!qv_section(cx, sub, many, QT_SEQ, &seq))
			return false;
		if (seq == NULL || seq->n == 0)
			return qv_error(cx, sub, many, "expected a list of at least one secret");
		n = seq->n;
	}
	else
	{
		seq = NULL;
		n = 1;
	}
	if ((secrets = calloc(n, sizeof(char *))) == NULL)
		return qv_error(cx, sub, m, "out of memory");
	*out = secrets;
	*nout = n;
	for (i = 0; i < n; i++)
	{
		const QtNode *item = seq ? seq->kids[i] : one;
		char		at[QV_PATHLEN];

		if (seq)
			qv_path_index(at, sizeof(at), sub, i);
		else
			snprintf(at, sizeof(at), "%s", sub);
		if (!qv_string(cx, at, item, true, &secrets[i]))
			return false;
		if (!qb_auth_secret_check(t, secrets[i], msg, sizeof(msg)))
			return qv_error(cx, at, item, "%s", msg);
	}
	return true;
}

/*
 * qv_hmac_keys: the header (required; why says what it carries), prefix and
 * encoding keys of an hmac-sha256 scheme, in a source's auth: or an http
 * destination's signing:.
 */
static bool
qv_hmac_keys(QvCtx *cx, const char *path, const QtNode *m, const char *why,
			 char **header, char **prefix, QbSigEncoding *encoding)
{
	char		sub[QV_PATHLEN];
	char		echo[64];
	char	   *enc = NULL;

	if (qt_get(m, "header") == NULL)
		return qv_error(cx, path, m, "missing required key header (%s, e.g. header: X-Signature)", why);
	if (!qv_opt_header(cx, path, m, "header", header) ||
		!qv_opt_string(cx, path, m, "prefix", false, prefix) ||
		!qv_opt_string(cx, path, m, "encoding", true, &enc))
		return false;
	*encoding = QB_SIG_HEX;
	if (enc != NULL)
	{
		if (strcmp(enc, "base64") == 0)
			*encoding = QB_SIG_BASE64;
		else if (strcmp(enc, "hex") != 0)
		{
			qv_path_key(sub, sizeof(sub), path, "encoding");
			qv_error(cx, sub, qt_get(m, "encoding"), "expected hex or base64, got %s",
					 qv_echo(echo, sizeof(echo), enc));
			free(enc);
			return false;
		}
		free(enc);
	}
	return true;
}

/* qv_auth: a source's auth: section into s->auth. */
static bool
qv_auth(QvCtx *cx, const char *path, const QtNode *node, QbSource *s)
{
	static const char *const types[] =
	{"hmac-sha256", "github", "stripe", "standard-webhooks", "bearer", NULL};
	static const char *const *const keys[] =
	{qs_auth_hmac_keys, qs_auth_github_keys, qs_auth_timed_keys, qs_auth_timed_keys,
	qs_auth_bearer_keys};
	char		sub[QV_PATHLEN];
	char		forwhat[64];
	const QtNode *m;
	const QtNode *n;
	QbAuth	   *a = &s->auth;
	char	  **secrets = NULL;
	int			nsecrets = 0;
	bool		ok;
	int			t;

	a->tolerance_sec = 300;
	if (!qv_typed(cx, path, node, types, "one of hmac-sha256, github, stripe, standard-webhooks, bearer",
				  "expected a mapping with at least type: (hmac-sha256, github, stripe, standard-webhooks or bearer); remove auth: to accept unsigned requests",
				  "one of hmac-sha256, github, stripe, standard-webhooks, bearer", &m, &t))
		return false;
	a->type = (QbAuthType) (QB_AUTH_HMAC_SHA256 + t);
	snprintf(forwhat, sizeof(forwhat), "for auth type %s", types[t]);
	if (!qv_keys(cx, path, m, keys[t], forwhat))
		return false;

	if (a->type == QB_AUTH_BEARER)
	{
		if ((n = qv_required(cx, path, m, "token",
							 "the token senders put in Authorization: Bearer <token>, e.g. token: \"${ORDERS_TOKEN}\"")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "token");
		return qv_string(cx, sub, n, true, (char **) &a->token);
	}
	ok = qv_secrets(cx, path, m, a->type,
					"the signing secret, e.g. secret: \"${STRIPE_WEBHOOK_SECRET}\"; secrets: [..] accepts several during a rotation",
					&secrets, &nsecrets);
	a->secrets = (const char *const *) secrets;
	a->nsecrets = nsecrets;
	if (!ok)
		return false;
	if (a->type == QB_AUTH_STRIPE || a->type == QB_AUTH_STANDARD_WEBHOOKS)
		return qv_opt_int(cx, path, m, "toleranceSec", 1, 86400, &a->tolerance_sec);
	if (a->type != QB_AUTH_HMAC_SHA256)
		return true;
	return qv_hmac_keys(cx, path, m, "the request header that carries the signature",
						(char **) &a->header, (char **) &a->prefix, &a->encoding);
}

/*
 * qv_signing: the signing: section of the http destination mapping m (at
 * path) into d->signing, each secret decoded into its key here so that no
 * request decodes one.  The headers it sets must be none that QueueBox sets
 * on every request or that the destination's headers: already send.
 * Secrets are never echoed.
 */
static bool
qv_signing(QvCtx *cx, const char *path, const QtNode *m, QbDestination *d)
{
	static const char *const types[] = {"standard-webhooks", "hmac-sha256", NULL};
	static const QbAuthType codes[] = {QB_AUTH_STANDARD_WEBHOOKS, QB_AUTH_HMAC_SHA256};
	static const char *const *const keys[] = {qs_auth_github_keys, qs_auth_hmac_keys};
	char		at[QV_PATHLEN];
	char		sub[QV_PATHLEN];
	char		forwhat[64];
	char		msg[QV_MSGLEN];
	const QtNode *sm;
	const QtNode *hm = qt_get(m, "headers");
	QbSigning  *s = &d->signing;
	char	  **secrets = NULL;
	int			nsecrets = 0;
	bool		ok;
	int			t;

	qv_path_key(at, sizeof(at), path, "signing");
	if (!qv_typed(cx, at, qt_get(m, "signing"), types, "one of standard-webhooks, hmac-sha256",
				  "expected a mapping with at least type: (standard-webhooks or hmac-sha256) and secret:; remove signing: to send unsigned requests",
				  "one of standard-webhooks, hmac-sha256", &sm, &t))
		return false;
	snprintf(forwhat, sizeof(forwhat), "for signing type %s", types[t]);
	if (!qv_keys(cx, at, sm, keys[t], forwhat))
		return false;
	s->type = codes[t];
	if (s->type == QB_AUTH_HMAC_SHA256)
	{
		if (!qv_hmac_keys(cx, at, sm, "the request header QueueBox puts the signature in",
						  &s->header, &s->prefix, &s->encoding))
			return false;
		qv_path_key(sub, sizeof(sub), at, "header");
		if (qb_http_header_reserved(s->header))
			return qv_error(cx, sub, qt_get(sm, "header"),
							"QueueBox sets %s itself on every request; choose another name, e.g. X-Signature",
							s->header);
		qv_path_key(sub, sizeof(sub), at, "prefix");
		if (s->prefix != NULL && strlen(s->prefix) > QV_SIGNING_MAX_PREFIX)
			return qv_error(cx, sub, qt_get(sm, "prefix"), "a prefix is at most %d bytes",
							QV_SIGNING_MAX_PREFIX);
		for (const char *p = s->prefix; p != NULL && *p != '\0'; p++)
			if (((unsigned char) *p < ' ' && *p != '\t') || *p == 0x7f)
				return qv_error(cx, sub, qt_get(sm, "prefix"),
								"the prefix contains a line break or another control character; remove it");
	}
	ok = qv_secrets(cx, at, sm, s->type,
					s->type == QB_AUTH_STANDARD_WEBHOOKS ?
					"the key requests are signed with, whsec_ and base64, e.g. secret: \"${BILLING_SIGNING_SECRET}\"; secrets: [new, old] signs with each during a rotation" :
					"the key requests are signed with, e.g. secret: \"${BILLING_SIGNING_SECRET}\"; secrets: [new, old] signs with each during a rotation",
					&secrets, &nsecrets);
	if (ok && nsecrets > QV_SIGNING_MAX_KEYS)
	{
		qv_path_key(sub, sizeof(sub), at, "secrets");
		ok = qv_error(cx, sub, qt_get(sm, "secrets"),
					  "at most %d secrets (each adds a signature to every request); keep the new and the previous one",
					  QV_SIGNING_MAX_KEYS);
	}
	if (ok && (s->keys = calloc(nsecrets, sizeof(QbSignKey))) == NULL)
		ok = qv_error(cx, at, sm, "out of memory");
	if (ok)
		s->nkeys = nsecrets;
	for (int i = 0; ok && i < nsecrets; i++)
		if (!qb_sign_key(s->type, secrets[i], &s->keys[i], msg, sizeof(msg)))
			ok = qv_error(cx, at, sm, "%s", msg);
	for (int i = 0; secrets != NULL && i < nsecrets; i++)
	{
		if (secrets[i] != NULL)
			explicit_bzero(secrets[i], strlen(secrets[i]));
		free(secrets[i]);
	}
	free(secrets);
	if (!ok)
		return false;

	/* a header sent twice leaves the receiver to pick one of the values */
	for (int i = 0; i < d->nheaders; i++)
		if (qb_sign_sets(s, d->headers[i].name))
		{
			qv_path_key(at, sizeof(at), path, "headers");
			qv_path_key(sub, sizeof(sub), at, d->headers[i].name);
			return qv_error(cx, sub, hm->keys[i],
							"signing: sets this header itself on every request; remove it from headers:");
		}
	return true;
}

/*
 * qv_topic: the topic template of a source.  A push source whose template
 * reads {{ eventType }} with no way to find an event type would send every
 * message to dead, so it is refused here.
 */
static bool
qv_topic(QvCtx *cx, const char *path, const QtNode *m, QbSource *s)
{
	static const char *const names[] = {"source", "eventType", NULL};
	const char *with[] = {"s", "e"};
	const char *without[] = {"s", NULL};
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	const QtNode *n = qt_get(m, "topic");
	char	   *a,
			   *b;
	bool		reads_event,
				empty;

	qv_path_key(sub, sizeof(sub), path, "topic");
	if (n != NULL)
	{
		if (!qv_string(cx, sub, n, true, &s->topic))
			return false;
		if (!qb_template_check(s->topic, names, msg, sizeof(msg)))
			return qv_error(cx, sub, n, "%s", msg);
	}
	else if ((s->topic = strdup(s->type == QB_SOURCE_HTTP ? "{{ eventType }}" : "{{ source }}")) == NULL)
		return qv_error(cx, path, m, "out of memory");
	if (s->consumption == QB_CONSUME_PULL)
		return true;
	a = qb_template_render(s->topic, names, with);
	b = qb_template_render(s->topic, names, without);
	if (a == NULL || b == NULL)
	{
		free(a);
		free(b);
		return qv_error(cx, sub, n ? n : m, "out of memory");
	}
	reads_event = strcmp(a, b) != 0;
	empty = a[0] == '\0';
	free(a);
	free(b);
	if (empty)
		return qv_error(cx, sub, n ? n : m,
						"the template renders an empty topic, so no route could match; write text or {{ source }} in it");
	if (reads_event && s->event_type_path == NULL && s->event_type_header == NULL &&
		!s->event_type_from_header)
		return qv_error(cx, sub, n ? n : m,
						"%s {{ eventType }} but the source sets neither eventTypePath nor %s, so every message would render an empty topic and go dead; set one of them, or use {{ source }}",
						n ? "the template reads" : "the default topic is",
						s->type == QB_SOURCE_RABBITMQ ? "eventTypeFromHeader: true" : "eventTypeHeader");
	return true;
}

/* qv_prefixed: prefix followed by name, malloc'd (a default consumer name). */
static char *
qv_prefixed(const char *prefix, const char *name)
{
	size_t		n = strlen(prefix) + strlen(name) + 1;
	char	   *out = malloc(n);

	if (out != NULL)
		snprintf(out, n, "%s%s", prefix, name);
	return out;
}

/*
 * qv_broker_source: the connection keys of a rabbitmq, kafka or nats source.
 * Names that default from the source name (kafka group, nats durable) are
 * filled in here.
 */
static bool
qv_broker_source(QvCtx *cx, const char *path, const QtNode *m, QbSource *s)
{
	static const char *const amqp[] = {"amqp", "amqps", NULL};
	static const char *const nats[] = {"nats", "tls", NULL};
	char		sub[QV_PATHLEN];
	char		msg[QV_MSGLEN];
	const QtNode *n;
	const QtNode *seq;
	long		v;
	bool		ok;

	if (s->type == QB_SOURCE_KAFKA)
	{
		if ((n = qv_required(cx, path, m, "brokers",
							 "a kafka source needs its bootstrap servers, e.g. brokers: \"host:9092\"")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "brokers");
		if (!qv_string(cx, sub, n, true, &s->broker_url))
			return false;
		if (!url_brokers(s->broker_url, msg, sizeof(msg)))
			return qv_error(cx, sub, n, "%s", msg);
		if ((n = qv_required(cx, path, m, "topics",
							 "the Kafka topics to consume, e.g. topics: [orders]")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "topics");
		if (!qv_section(cx, sub, n, QT_SEQ, &seq))
			return false;
		if (seq == NULL || seq->n == 0)
			return qv_error(cx, sub, n, "expected a list of at least one topic, e.g. topics: [orders]");
		if ((s->topics = calloc(seq->n, sizeof(char *))) == NULL)
			return qv_error(cx, sub, n, "out of memory");
		s->ntopics = seq->n;
		for (int i = 0; i < seq->n; i++)
		{
			char		at[QV_PATHLEN];

			qv_path_index(at, sizeof(at), sub, i);
			if (!qv_string(cx, at, seq->kids[i], true, &s->topics[i]))
				return false;
		}
		qv_path_key(sub, sizeof(sub), path, "config");
		if (!qv_opt_string(cx, path, m, "group", true, &s->group) ||
			!qv_pairs(cx, sub, qt_get(m, "config"), false, &s->props, &s->nprops) ||
			!qv_kafka_props(cx, sub, qt_get(m, "config"), s->props, s->nprops,
							qv_kafka_consumer_owned, NULL))
			return false;
		/* the close path (rd_kafka_assign(NULL)) assumes eager rebalancing */
		for (int i = 0; i < s->nprops; i++)
			if (strcmp(s->props[i].name, "partition.assignment.strategy") == 0 &&
				strstr(s->props[i].value, "cooperative") != NULL)
			{
				char		at[QV_PATHLEN];

				qv_path_key(at, sizeof(at), sub, s->props[i].name);
				return qv_error(cx, at, qt_get(m, "config")->kids[i],
								"QueueBox consumes with an eager assignor (range or roundrobin); cooperative rebalancing is not supported yet");
			}
		if (s->group == NULL && (s->group = qv_prefixed("queuebox-", s->name)) == NULL)
			return qv_error(cx, path, m, "out of memory");
		return true;
	}

	if ((n = qv_required(cx, path, m, "url", s->type == QB_SOURCE_RABBITMQ ?
						 "a rabbitmq source needs one, e.g. url: \"amqp://user:password@host:5672/\"" :
						 "a nats source needs one, e.g. url: \"nats://host:4222\"")) == NULL)
		return false;
	qv_path_key(sub, sizeof(sub), path, "url");
	if (!qv_string(cx, sub, n, true, &s->broker_url))
		return false;
	ok = s->type == QB_SOURCE_RABBITMQ ?
		qb_url_check_scheme(s->broker_url, amqp, QB_URL_USERINFO | QB_URL_QUERY, msg, sizeof(msg)) :
		qb_url_check_scheme(s->broker_url, nats, QB_URL_USERINFO, msg, sizeof(msg));
	if (!ok)
		return qv_error(cx, sub, n, "%s", msg);

	if (s->type == QB_SOURCE_RABBITMQ)
	{
		if ((n = qv_required(cx, path, m, "queue",
							 "the queue to consume (QueueBox does not declare it), e.g. queue: orders")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "queue");
		if (!qv_string(cx, sub, n, true, &s->queue))
			return false;
		v = s->prefetch;
		if (!qv_opt_int(cx, path, m, "prefetch", 1, 65535, &v))
			return false;
		s->prefetch = (int) v;
		return true;
	}

	/* nats */
	if ((n = qv_required(cx, path, m, "subject", "the subject to consume, e.g. subject: orders.>")) == NULL)
		return false;
	qv_path_key(sub, sizeof(sub), path, "subject");
	if (!qv_string(cx, sub, n, true, &s->subject))
		return false;
	if ((n = qv_required(cx, path, m, "stream",
						 "the JetStream stream that captures the subject, e.g. stream: ORDERS")) == NULL)
		return false;
	qv_path_key(sub, sizeof(sub), path, "stream");
	if (!qv_string(cx, sub, n, true, &s->stream) ||
		!qv_opt_string(cx, path, m, "durable", true, &s->durable))
		return false;
	if (s->durable == NULL && (s->durable = qv_prefixed("queuebox-", s->name)) == NULL)
		return qv_error(cx, path, m, "out of memory");
	return true;
}

/* qv_source: one entry of sources: into *s (s->name already set). */
static bool
qv_source(QvCtx *cx, const char *path, const QtNode *node, QbSource *s)
{
	static const char *const types[] = {"http", "rabbitmq", "kafka", "nats", NULL};
	static const char *const *const keys[] =
	{qs_source_keys, qs_rabbitmq_source_keys, qs_kafka_source_keys, qs_nats_source_keys};
	char		sub[QV_PATHLEN];
	char		echo[64];
	char		forwhat[48];
	char	   *text = NULL;
	const QtNode *m;
	const QtNode *n;
	int			t;
	long		v;

	s->consumption = QB_CONSUME_PUSH;
	s->max_body_bytes = 1048576;
	s->auth.tolerance_sec = 300;
	s->prefetch = 100;
	s->batch_size = 100;
	if (!qv_typed(cx, path, node, types, "one of http, rabbitmq, kafka, nats",
				  "expected a mapping with at least type: (http, rabbitmq, kafka or nats), got an empty value",
				  "the kind of source: http receives webhooks; rabbitmq, kafka and nats consume a broker",
				  &m, &t))
		return false;
	s->type = (QbSourceType) t;
	snprintf(forwhat, sizeof(forwhat), "for a%s %s source", t == 0 ? "n" : "", types[t]);
	if (!qv_keys(cx, path, m, keys[t], forwhat))
		return false;

	if (s->type == QB_SOURCE_HTTP)
	{
		size_t		len;

		if ((n = qv_required(cx, path, m, "path",
							 "where the source answers under inbox.basePath, e.g. path: /stripe")) == NULL)
			return false;
		qv_path_key(sub, sizeof(sub), path, "path");
		if (!qv_string(cx, sub, n, true, &s->path) ||
			!qv_url_path(cx, sub, n, s->path, "path: /stripe"))
			return false;
		len = strlen(s->path);
		if (len < 2 || s->path[len - 1] == '/')
			return qv_error(cx, sub, n, "must name something after '/' and not end with '/', e.g. path: /stripe");
		if ((n = qt_get(m, "auth")) != NULL)
		{
			qv_path_key(sub, sizeof(sub), path, "auth");
			if (!qv_auth(cx, sub, n, s))
				return false;
		}
	}
	else if (!qv_broker_source(cx, path, m, s))
		return false;

	if ((n = qt_get(m, "consumption")) != NULL)
	{
		qv_path_key(sub, sizeof(sub), path, "consumption");
		if (!qv_text(cx, sub, n, "push or pull", &text))
			return false;
		if (strcmp(text, "pull") == 0)
			s->consumption = QB_CONSUME_PULL;
		else if (strcmp(text, "push") != 0)
		{
			qv_error(cx, sub, n, "expected push (the relay forwards the rows) or pull (your workers claim them), got %s",
					 qv_echo(echo, sizeof(echo), text));
			free(text);
			return false;
		}
		free(text);
	}

	v = s->batch_size;
	if (!qv_one_of(cx, path, m, "idempotencyKeyPath", "idempotencyKeyHeader") ||
		!qv_opt_jsonpath(cx, path, m, "idempotencyKeyPath", &s->idempotency_key_path) ||
		!qv_opt_header(cx, path, m, "idempotencyKeyHeader", &s->idempotency_key_header) ||
		!qv_one_of(cx, path, m, "eventTypePath", "eventTypeHeader") ||
		!qv_one_of(cx, path, m, "eventTypePath", "eventTypeFromHeader") ||
		!qv_opt_jsonpath(cx, path, m, "eventTypePath", &s->event_type_path) ||
		!qv_opt_header(cx, path, m, "eventTypeHeader", &s->event_type_header) ||
		!qv_flag(cx, path, m, "eventTypeFromHeader", &s->event_type_from_header) ||
		!qv_opt_jsonpath(cx, path, m, "aggregateIdPath", &s->aggregate_id_path) ||
		!qv_opt_int(cx, path, m, "maxBodyBytes", 1, 67108864, &s->max_body_bytes) ||
		!qv_opt_int(cx, path, m, "batchSize", 1, 10000, &v) ||
		!qv_transform(cx, path, m, &s->transform))
		return false;
	s->batch_size = (int) v;
	if (s->type == QB_SOURCE_HTTP && s->idempotency_key_path == NULL &&
		s->idempotency_key_header == NULL)
	{
		/* Standard Webhooks names each message in webhook-id */
		if (s->auth.type != QB_AUTH_STANDARD_WEBHOOKS)
			return qv_error(cx, path, m,
							"missing idempotencyKeyPath or idempotencyKeyHeader: the value that makes a repeat a duplicate, e.g. idempotencyKeyPath: $.id");
		if ((s->idempotency_key_header = strdup("webhook-id")) == NULL)
			return qv_error(cx, path, m, "out of memory");
	}
	return qv_topic(cx, path, m, s);
}

/* qv_sources: the sources: section. */
static bool
qv_sources(QvCtx *cx, const QtNode *node, QbConfig *cfg)
{
	char		sub[QV_PATHLEN];
	const QtNode *m;
	int			i,
				j;

	if (!qv_named_section(cx, "sources", node, sizeof(QbSource),
						  (void **) &cfg->sources, &cfg->nsources, &m))
		return false;
	for (i = 0; i < cfg->nsources; i++)
	{
		qv_path_key(sub, sizeof(sub), "sources", m->keys[i]->text);
		if (!qv_name(cx, sub, m->keys[i], "a source", &cfg->sources[i].name) ||
			!qv_source(cx, sub, m->kids[i], &cfg->sources[i]))
			return false;
		for (j = 0; j < i; j++)
			if (cfg->sources[i].type == QB_SOURCE_HTTP && cfg->sources[j].type == QB_SOURCE_HTTP &&
				strcmp(cfg->sources[j].path, cfg->sources[i].path) == 0)
			{
				char		at[QV_PATHLEN];

				qv_path_key(at, sizeof(at), sub, "path");
				return qv_error(cx, at, qt_get(m->kids[i], "path"),
								"the same path as source %s: each source needs a path of its own",
								cfg->sources[j].name);
			}
	}
	return true;
}

/* qv_inbox: the inbox: section (basePath, relay). */
static bool
qv_inbox(QvCtx *cx, const QtNode *node, QbInboxConf *in)
{
	const QtNode *m;
	const QtNode *r;
	const QtNode *n;
	char	   *base = NULL;
	size_t		len;
	long		v;

	if (!qv_section(cx, "inbox", node, QT_MAP, &m))
		return false;
	if (m != NULL && !qv_keys(cx, "inbox", m, qs_inbox_keys, NULL))
		return false;
	if (m != NULL && (n = qt_get(m, "basePath")) != NULL)
	{
		if (!qv_string(cx, "inbox.basePath", n, false, &base))
			return false;
		if (base[0] != '\0' && !qv_url_path(cx, "inbox.basePath", n, base, "basePath: /inbox"))
		{
			free(base);
			return false;
		}
		len = strlen(base);
		while (len > 0 && base[len - 1] == '/')
			base[--len] = '\0';
	}
	else if ((base = strdup("/inbox")) == NULL)
		return qv_error(cx, "inbox", m, "out of memory");
	in->base_path = base;

	if (m == NULL)
		return true;
	if (!qv_section(cx, "inbox.relay", qt_get(m, "relay"), QT_MAP, &r))
		return false;
	if (r == NULL)
		return true;
	if (!qv_keys(cx, "inbox.relay", r, qs_relay_keys, NULL) ||
		!qv_flag(cx, "inbox.relay", r, "enabled", &in->relay.enabled))
		return false;
	v = in->relay.poll_interval_ms;
	if (!qv_opt_int(cx, "inbox.relay", r, "pollIntervalMs", 10, 3600000, &v))
		return false;
	in->relay.poll_interval_ms = (int) v;
	v = in->relay.batch_size;
	if (!qv_opt_int(cx, "inbox.relay", r, "batchSize", 1, 10000, &v))
		return false;
	in->relay.batch_size = (int) v;
	if (!qv_opt_int(cx, "inbox.relay", r, "claimTimeoutMs", 1000, 86400000,
					&in->relay.claim_timeout_ms))
		return false;
	v = in->relay.max_attempts;
	if (!qv_opt_int(cx, "inbox.relay", r, "maxAttempts", 1, 1000000, &v))
		return false;
	in->relay.max_attempts = (int) v;
	return true;
}

/*
 * qv_listen: http.listen into host and port.  A port alone binds loopback:
 * listening on every interface must be asked for (0.0.0.0:8080).
 */
static bool
qv_listen(QvCtx *cx, const QtNode *n, QbHttpConf *h)
{
	static const char what[] =
		"expected host:port with an IP address (127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080 for every interface) or a port alone (8080 listens on 127.0.0.1)";
	unsigned char addr[16];
	char	   *colon;
	char	   *host;
	char	   *end;
	long		port;
	bool		v6 = false;

	if (!qv_string(cx, "http.listen", n, true, &h->listen))
		return false;
	host = h->listen;
	if (host[0] == '[')
	{
		if ((end = strchr(host, ']')) == NULL || end[1] != ':')
			return qv_error(cx, "http.listen", n, "%s", what);
		host = strndup(host + 1, end - host - 1);
		colon = end + 1;
		v6 = true;
	}
	else
	{
		colon = strrchr(host, ':');
		host = colon ? strndup(host, colon - host) : strdup("");
	}
	if (host == NULL)
		return qv_error(cx, "http.listen", n, "out of memory");
	h->host = host;
	errno = 0;
	port = strtol(colon ? colon + 1 : h->listen, &end, 10);
	if (errno != 0 || *end != '\0' || end == (colon ? colon + 1 : h->listen) || port < 1 || port > 65535)
		return qv_error(cx, "http.listen", n, "%s; the port must be 1 to 65535", what);
	h->port = (int) port;
	if (host[0] == '\0' || strcmp(host, "localhost") == 0)
	{
		free(h->host);
		if ((h->host = strdup("127.0.0.1")) == NULL)
			return qv_error(cx, "http.listen", n, "out of memory");
		return true;
	}
	if (inet_pton(v6 ? AF_INET6 : AF_INET, host, addr) != 1)
		return qv_error(cx, "http.listen", n, "%s; %s is not an IP%s address", what,
						v6 ? "the part in brackets" : "the host", v6 ? "v6" : "v4");
	return true;
}

/* qv_http_section: the http: section (the ingress, health, metrics, admin). */
static bool
qv_http_section(QvCtx *cx, const QtNode *node, QbHttpConf *h)
{
	const QtNode *m;
	const QtNode *n;
	long		v;

	if (!qv_section(cx, "http", node, QT_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qv_keys(cx, "http", m, qs_http_section_keys, NULL))
		return false;
	if ((n = qt_get(m, "listen")) != NULL && !qt_is_null(n) && !qv_listen(cx, n, h))
		return false;
	v = h->max_connections;
	if (!qv_opt_int(cx, "http", m, "maxConnections", 1, 10000, &v))
		return false;
	h->max_connections = (int) v;
	return qv_opt_int(cx, "http", m, "connectionTimeoutMs", 1000, 3600000,
					  &h->connection_timeout_ms) &&
		qv_opt_int(cx, "http", m, "storeTimeoutMs", 100, 600000, &h->store_timeout_ms);
}

/* qv_admin: the admin: section. */
static bool
qv_admin(QvCtx *cx, const QtNode *node, QbConfig *cfg)
{
	const QtNode *m;
	const QtNode *n;

	if (!qv_section(cx, "admin", node, QT_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qv_keys(cx, "admin", m, qs_admin_keys, NULL))
		return false;
	if ((n = qt_get(m, "token")) == NULL || qt_is_null(n))
		return true;
	if (!qv_string(cx, "admin.token", n, true, &cfg->admin_token))
		return false;
	if (strlen(cfg->admin_token) < 16)
		return qv_error(cx, "admin.token", n,
						"an admin token needs at least 16 characters; generate one with: openssl rand -hex 32");
	return true;
}

/*
 * qv_leases: a request must end before its row's lease does, or the reclaim
 * step hands the row to another worker while the first is still waiting for
 * the answer, and the message goes out twice.
 */
static bool
qv_leases(QvCtx *cx, const QtNode *root, const QbConfig *cfg)
{
	const QtNode *dests = root ? qt_get(root, "destinations") : NULL;
	const QtNode *outbox = root ? qt_get(root, "outbox") : NULL;
	int			i;

	for (i = 0; i < cfg->ndestinations; i++)
	{
		const QbDestination *d = &cfg->destinations[i];
		const QtNode *dn = dests ? qt_get(dests, d->name) : NULL;
		bool		kafka = d->type == QB_DEST_KAFKA;
		/* kafka: the wait is librdkafka's message.timeout.ms, under config: */
		const QtNode *cf = kafka && dn ? qt_get(dn, "config") : NULL;
		const char *what = kafka ? "config[\"message.timeout.ms\"]" : "timeoutMs";
		const QtNode *at = kafka ? (cf && cf->kind == QT_MAP ? qt_get(cf, "message.timeout.ms") : NULL)
			: dn ? qt_get(dn, "timeoutMs") : NULL;
		char		path[QV_PATHLEN];

		if ((d->type != QB_DEST_HTTP && !kafka) || d->timeout_ms < cfg->outbox.claim_timeout_ms)
			continue;
		if (at == NULL && outbox != NULL && qt_get(outbox, "claimTimeoutMs") != NULL)
		{
			at = qt_get(outbox, "claimTimeoutMs");
			snprintf(path, sizeof(path), "outbox.claimTimeoutMs");
		}
		else
		{
			char		parent[QV_PATHLEN];

			qv_path_key(parent, sizeof(parent), "destinations", d->name);
			if (kafka)
			{
				char		conf[QV_PATHLEN];

				qv_path_key(conf, sizeof(conf), parent, "config");
				qv_path_key(path, sizeof(path), conf, "message.timeout.ms");
			}
			else
				qv_path_key(path, sizeof(path), parent, "timeoutMs");
			if (at == NULL)
				at = dn;
		}
		return qv_error(cx, path, at,
						"destination %s waits up to %ld ms for an answer (%s), which is not less than outbox.claimTimeoutMs (%ld ms): the lease would expire mid-request and the row be delivered twice; lower %s or raise claimTimeoutMs",
						d->name, d->timeout_ms, what, cfg->outbox.claim_timeout_ms, what);
	}
	return true;
}

/* qv_document: the whole tree into cfg, which holds the defaults. */
static bool
qv_document(QvCtx *cx, const QtNode *root, QbConfig *cfg)
{
	if (qt_is_null(root))
		return qv_inbox(cx, NULL, &cfg->inbox);
	if (root->kind != QT_MAP)
	{
		snprintf(cx->err, cx->errlen,
				 "the document must be a mapping with the keys outbox, destinations, routes, sources, inbox, http and admin, got %s (line %d, column %d)",
				 qt_kind_name(root), root->line, root->column);
		return false;
	}
	return qv_keys(cx, "", root, qs_top_keys, NULL) &&
		qv_outbox(cx, qt_get(root, "outbox"), &cfg->outbox) &&
		qv_destinations(cx, qt_get(root, "destinations"), cfg) &&
		qv_routes(cx, qt_get(root, "routes"), cfg) &&
		qv_leases(cx, root, cfg) &&
		qv_sources(cx, qt_get(root, "sources"), cfg) &&
		qv_inbox(cx, qt_get(root, "inbox"), &cfg->inbox) &&
		qv_http_section(cx, qt_get(root, "http"), &cfg->http) &&
		qv_admin(cx, qt_get(root, "admin"), cfg);
}

/* ---------------------------------------------------------------------
 * Public functions
 * ---------------------------------------------------------------------
 */

/* qb_config_defaults: see qb_config.h; the table of defaults is there. */
void
qb_config_defaults(QbConfig *out)
{
	memset(out, 0, sizeof(QbConfig));
	out->outbox.poll_interval_ms = 500;
	out->outbox.batch_size = 100;
	out->outbox.max_attempts = 10;
	out->outbox.claim_timeout_ms = 300000;
	out->outbox.backoff.initial_ms = 1000;
	out->outbox.backoff.max_ms = 3600000;
	out->outbox.backoff.multiplier = 2.0;
	out->outbox.backoff.jitter = 0.2;
	out->outbox.retention_sec = 7L * 86400L;
	out->inbox.relay.enabled = true;
	out->inbox.relay.poll_interval_ms = 100;
	out->inbox.relay.batch_size = 100;
	out->inbox.relay.claim_timeout_ms = 300000;
	out->http.max_connections = 256;
	out->http.connection_timeout_ms = 10000;
	out->http.store_timeout_ms = 5000;
}

/* qb_config_parse: load, override, validate; see qb_config.h. */
int
qb_config_parse(const char *text, size_t len, QbConfig **out, char *err,
				size_t errlen)
{
	QtNode	   *root = NULL;
	QbConfig   *cfg = NULL;
	QvCtx		cx = {err, errlen};

	*out = NULL;
	if (errlen > 0)
		err[0] = '\0';
	if (qt_load(text ? text : "", text ? len : 0, &root, err, errlen) != 0)
		goto fail;
	if (qo_overrides(&root, err, errlen) != 0)
		goto fail;
	if ((cfg = malloc(sizeof(QbConfig))) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	qb_config_defaults(cfg);
	if (!qv_document(&cx, root, cfg))
		goto fail;
	qt_free(root);
	*out = cfg;
	return 0;

fail:
	qt_free(root);
	qb_config_free(cfg);
	return -1;
}

/* qb_pairs_free: a headers or props array and its strings. */
static void
qb_pairs_free(QbHeader *pairs, int n)
{
	int			i;

	for (i = 0; pairs != NULL && i < n; i++)
	{
		free(pairs[i].name);
		free(pairs[i].value);
	}
	free(pairs);
}

/* qb_config_free: also takes a half-built config (the parser's error path). */
int
qb_config_broker_sources(const QbConfig *cfg)
{
	int			n = 0;

	for (int i = 0; cfg != NULL && i < cfg->nsources; i++)
		n += cfg->sources[i].type != QB_SOURCE_HTTP;
	return n;
}

void
qb_config_free(QbConfig *cfg)
{
	int			i;

	if (cfg == NULL)
		return;
	for (i = 0; cfg->destinations != NULL && i < cfg->ndestinations; i++)
	{
		QbDestination *d = &cfg->destinations[i];

		free(d->name);
		free(d->base_url);
		free(d->path);
		free(d->url);
		qb_pairs_free(d->headers, d->nheaders);
		qb_signing_free(&d->signing);
		free(d->broker_url);
		free(d->target);
		free(d->routing_key);
		qb_pairs_free(d->props, d->nprops);
		qb_transform_free(d->transform);
	}
	free(cfg->destinations);
	for (i = 0; cfg->routes != NULL && i < cfg->nroutes; i++)
	{
		free(cfg->routes[i].topic_pattern);
		free(cfg->routes[i].destination);
		qb_transform_free(cfg->routes[i].transform);
	}
	free(cfg->routes);
	for (i = 0; cfg->sources != NULL && i < cfg->nsources; i++)
	{
		QbSource   *src = &cfg->sources[i];

		free(src->name);
		free(src->path);
		free(src->idempotency_key_path);
		free(src->idempotency_key_header);
		free(src->event_type_path);
		free(src->event_type_header);
		free(src->aggregate_id_path);
		free(src->topic);
		free(src->broker_url);
		free(src->queue);
		for (int k = 0; src->topics != NULL && k < src->ntopics; k++)
			free(src->topics[k]);
		free(src->topics);
		free(src->group);
		qb_pairs_free(src->props, src->nprops);
		free(src->subject);
		free(src->stream);
		free(src->durable);
		for (int k = 0; src->auth.secrets != NULL && k < src->auth.nsecrets; k++)
			free((char *) src->auth.secrets[k]);
		free((char **) src->auth.secrets);
		free((char *) src->auth.header);
		free((char *) src->auth.prefix);
		free((char *) src->auth.token);
		qb_transform_free(src->transform);
	}
	free(cfg->sources);
	free(cfg->inbox.base_path);
	free(cfg->http.listen);
	free(cfg->http.host);
	free(cfg->admin_token);
	free(cfg);
}

/* qb_config_destination: see qb_config.h. */
const QbDestination *
qb_config_destination(const QbConfig *cfg, const char *name)
{
	int			i;

	for (i = 0; cfg != NULL && i < cfg->ndestinations; i++)
		if (strcmp(cfg->destinations[i].name, name) == 0)
			return &cfg->destinations[i];
	return NULL;
}

/* qb_config_source: see qb_config.h. */
const QbSource *
qb_config_source(const QbConfig *cfg, const char *name)
{
	int			i;

	for (i = 0; cfg != NULL && i < cfg->nsources; i++)
		if (strcmp(cfg->sources[i].name, name) == 0)
			return &cfg->sources[i];
	return NULL;
}

/* qb_config_relay_max_attempts: inbox.relay.maxAttempts, else outbox.maxAttempts. */
int
qb_config_relay_max_attempts(const QbConfig *cfg)
{
	return cfg->inbox.relay.max_attempts > 0 ? cfg->inbox.relay.max_attempts
		: cfg->outbox.max_attempts;
}

/* qb_dest_type_name: the type as written in the document. */
const char *
qb_dest_type_name(QbDestType t)
{
	switch (t)
	{
		case QB_DEST_HTTP:
			return "http";
		case QB_DEST_RABBITMQ:
			return "rabbitmq";
		case QB_DEST_KAFKA:
			return "kafka";
		case QB_DEST_NATS:
			return "nats";
	}
	return "unknown";
}
