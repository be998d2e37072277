/*-------------------------------------------------------------------------
 * qb_config_tree.c
 *	  Load: libyaml's event stream becomes a tree of nodes (mapping, sequence,
 *	  scalar), each with the 1-based line and column where it starts.
 *	  Scalars are kept raw: ${NAME} is expanded later, by the validator.
 *
 * Wording: node and null as in qb_config_int.h.
 *
 * YAML aliases (*name) are refused: a handful of nested aliases can expand a
 * small document into billions of nodes.  Anchors alone are harmless.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yaml.h>

#include "qb_config_int.h"

#define QBCF_MAX_DEPTH	64		/* deeper than any valid document */

/* qbcf_node_new: an empty node in arena a. */
QbcfNode *
qbcf_node_new(QbcfArena *a, QbcfKind kind, int line, int column)
{
	QbcfNode   *n = qbcf_arena_alloc(a, sizeof(QbcfNode));

	if (n != NULL)
	{
		n->kind = kind;
		n->line = line;
		n->column = column;
	}
	return n;
}

/* qbcf_scalar: a scalar node holding a copy of len bytes of text. */
QbcfNode *
qbcf_scalar(QbcfArena *a, const char *text, size_t len, int line, int column)
{
	QbcfNode   *n = qbcf_node_new(a, QBCF_SCALAR, line, column);

	/* memdup, not strndup: a "\0" escape puts a NUL inside the value */
	if (n == NULL || (n->text = qbcf_arena_alloc(a, len + 1)) == NULL)
		return NULL;
	memcpy(n->text, text, len);
	n->len = len;
	return n;
}

/*
 * qbcf_append: add an item (key NULL) or a key/value pair; false when out
 * of memory.  A full array is copied into one twice its size; the old one
 * stays in the arena, which costs less than the final array.
 */
bool
qbcf_append(QbcfArena *a, QbcfNode *parent, QbcfNode *key, QbcfNode *kid)
{
	if (parent->n == parent->cap)
	{
		int			cap = parent->cap ? parent->cap * 2 : 8;
		QbcfNode  **kids = qbcf_arena_alloc(a, cap * sizeof(QbcfNode *));
		QbcfNode  **keys = NULL;

		if (kids == NULL)
			return false;
		if (parent->kind == QBCF_MAP &&
			(keys = qbcf_arena_alloc(a, cap * sizeof(QbcfNode *))) == NULL)
			return false;
		if (parent->n > 0)
		{
			memcpy(kids, parent->kids, parent->n * sizeof(QbcfNode *));
			if (keys != NULL)
				memcpy(keys, parent->keys, parent->n * sizeof(QbcfNode *));
		}
		parent->kids = kids;
		parent->keys = keys;
		parent->cap = cap;
	}
	if (parent->kind == QBCF_MAP)
		parent->keys[parent->n] = key;
	parent->kids[parent->n] = kid;
	parent->n++;
	return true;
}

/* qbcf_is_null: absent, or a YAML null (unquoted "", "~", "null"). */
bool
qbcf_is_null(const QbcfNode *n)
{
	if (n == NULL)
		return true;
	if (n->kind != QBCF_SCALAR || !n->plain || n->envvar != NULL)
		return false;
	return n->len == 0 || strcmp(n->text, "~") == 0 ||
		strcmp(n->text, "null") == 0 || strcmp(n->text, "Null") == 0 ||
		strcmp(n->text, "NULL") == 0;
}

/* qbcf_find: index of key in a mapping, or -1.  The first one wins. */
int
qbcf_find(const QbcfNode *map, const char *key)
{
	int			i;

	if (map == NULL || map->kind != QBCF_MAP)
		return -1;
	for (i = 0; i < map->n; i++)
		if (map->keys[i]->kind == QBCF_SCALAR && strcmp(map->keys[i]->text, key) == 0)
			return i;
	return -1;
}

/* qbcf_get: the value under key in a mapping, or NULL. */
QbcfNode *
qbcf_get(const QbcfNode *map, const char *key)
{
	int			i = qbcf_find(map, key);

	return i < 0 ? NULL : map->kids[i];
}

/* qbcf_kind_name: "a mapping", ... for messages. */
const char *
qbcf_kind_name(const QbcfNode *n)
{
	switch (n->kind)
	{
		case QBCF_MAP:
			return "a mapping";
		case QBCF_SEQ:
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
typedef struct QbcfLoader
{
	QbcfArena  *arena;			/* the nodes' */
	yaml_parser_t parser;
	const char *text;
	size_t		len;
	char	   *err;
	size_t		errlen;
} QbcfLoader;


/*
 * qbcf_parser_error: turn libyaml's error into our message.  A reader error
 * (bad UTF-8, a control character) carries a byte offset and no mark,
 * because libyaml decodes ahead of the parser; count lines and characters
 * up to that offset ourselves.
 */
static void
qbcf_parser_error(QbcfLoader *ld)
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

/* qbcf_next: the next event, or false with the error written. */
static bool
qbcf_next(QbcfLoader *ld, yaml_event_t *ev)
{
	if (!yaml_parser_parse(&ld->parser, ev))
	{
		qbcf_parser_error(ld);
		return false;
	}
	return true;
}

static QbcfNode *qbcf_read_node(QbcfLoader *ld, yaml_event_t *ev, int depth);

/*
 * qbcf_read_entries: the entries of collection node up to its end event:
 * key and value pairs in a map, values in a sequence.  false with the
 * error written (the nodes made so far are the arena's).
 */
static bool
qbcf_read_entries(QbcfLoader *ld, QbcfNode *node, yaml_event_type_t end, int depth)
{
	QbcfNode   *key = NULL;
	QbcfNode   *val;
	yaml_event_t sub;

	for (;;)
	{
		if (!qbcf_next(ld, &sub))
			return false;
		if (sub.type == end)
		{
			yaml_event_delete(&sub);
			return true;
		}
		if (node->kind == QBCF_MAP)
		{
			key = qbcf_read_node(ld, &sub, depth + 1);
			if (key == NULL || !qbcf_next(ld, &sub))
				return false;
		}
		val = qbcf_read_node(ld, &sub, depth + 1);
		if (val == NULL)
			return false;
		if (!qbcf_append(ld->arena, node, key, val))
		{
			snprintf(ld->err, ld->errlen, "out of memory while loading the YAML document");
			return false;
		}
		key = NULL;
	}
}

/*
 * qbcf_read_collection: the mapping or sequence that starts with *ev (at
 * line, column), no deeper than QBCF_MAX_DEPTH.  Consumes *ev.  NULL with
 * the error written.
 */
static QbcfNode *
qbcf_read_collection(QbcfLoader *ld, yaml_event_t *ev, int depth, int line, int column)
{
	bool		map = ev->type == YAML_MAPPING_START_EVENT;
	QbcfNode   *node;

	if (depth >= QBCF_MAX_DEPTH)
	{
		snprintf(ld->err, ld->errlen,
				 "YAML nesting deeper than %d levels at line %d, column %d: a configuration needs no more than a few",
				 QBCF_MAX_DEPTH, line, column);
		yaml_event_delete(ev);
		return NULL;
	}
	node = qbcf_node_new(ld->arena, map ? QBCF_MAP : QBCF_SEQ, line, column);
	yaml_event_delete(ev);
	if (node == NULL)
	{
		snprintf(ld->err, ld->errlen, "out of memory while loading the YAML document");
		return NULL;
	}
	if (!qbcf_read_entries(ld, node, map ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT, depth))
		return NULL;
	return node;
}

/*
 * qbcf_read_node: build the node that starts with *ev, reading the events of its
 * content.  Consumes *ev.  NULL with the error written on failure.
 */
static QbcfNode *
qbcf_read_node(QbcfLoader *ld, yaml_event_t *ev, int depth)
{
	int			line = (int) ev->start_mark.line + 1;
	int			column = (int) ev->start_mark.column + 1;
	QbcfNode   *node;

	switch (ev->type)
	{
		case YAML_SCALAR_EVENT:
			node = qbcf_scalar(ld->arena, (const char *) ev->data.scalar.value,
							   ev->data.scalar.length, line, column);
			if (node == NULL)
				snprintf(ld->err, ld->errlen, "out of memory while loading the YAML document");
			else
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
			return qbcf_read_collection(ld, ev, depth, line, column);

		default:
			snprintf(ld->err, ld->errlen,
					 "YAML syntax error at line %d, column %d: unexpected YAML event %d",
					 line, column, (int) ev->type);
			yaml_event_delete(ev);
			return NULL;
	}
}

/*
 * qbcf_load: the tree of a whole stream, in arena a.  *root stays NULL for
 * an empty stream (nothing, or only comments).  A second document is refused rather
 * than ignored, so that a stray "---" cannot hide half of a file.
 */
int
qbcf_load(QbcfArena *a, const char *text, size_t len, QbcfNode **root, char *err,
		  size_t errlen)
{
	QbcfLoader	ld;
	yaml_event_t ev;
	QbcfNode   *node = NULL;
	int			rc = -1;

	*root = NULL;
	memset(&ld, 0, sizeof(ld));
	ld.arena = a;
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

	if (!qbcf_next(&ld, &ev))		/* stream start */
		goto done;
	yaml_event_delete(&ev);
	if (!qbcf_next(&ld, &ev))
		goto done;
	if (ev.type == YAML_STREAM_END_EVENT)
	{
		yaml_event_delete(&ev);
		rc = 0;
		goto done;
	}
	yaml_event_delete(&ev);		/* document start */
	if (!qbcf_next(&ld, &ev))
		goto done;
	node = qbcf_read_node(&ld, &ev, 0);
	if (node == NULL)
		goto done;
	if (!qbcf_next(&ld, &ev))		/* document end */
		goto done;
	yaml_event_delete(&ev);
	if (!qbcf_next(&ld, &ev))
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
	rc = 0;

done:
	yaml_parser_delete(&ld.parser);
	return rc;
}
