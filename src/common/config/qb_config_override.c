/*-------------------------------------------------------------------------
 * qb_config_override.c
 *	  Override: QUEUEBOX_* environment variables replace or add scalar
 *	  nodes in the tree, before the validator reads it, so that a value from
 *	  the document and a value from an override meet exactly one validator.
 *
 * The name: the text after "QUEUEBOX_" is compared, ignoring case, with
 * each known scalar key path, every segment upper-cased, each character
 * other than a letter or a digit turned into '_', the segments joined by
 * '_': QUEUEBOX_DESTINATIONS_MY_API_TIMEOUTMS is destinations.my-api.timeoutMs,
 * QUEUEBOX_ROUTES_0_DESTINATION is routes[0].destination.
 *
 * The known paths: the sections' keys (qbcf_ov_sections), and the scalar
 * keys of each source, destination and route the document defines; an
 * override never creates one, nor replaces a mapping or a sequence
 * (README.md; docs/configuration.md, "Overrides").  Its value is validated
 * like a document value but not ${}-expanded.  Errors name the variable and
 * the key path ("QUEUEBOX_OUTBOX_BATCHSIZE (outbox.batchSize): ...").  A
 * variable matching no known path is ignored; one known but not allowed for
 * the type, two for one path, or one matching two paths are errors.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_config_int.h"

extern char **environ;

/* A candidate key path; seg[k] NULL stands for the route index. */
typedef struct QbcfOvPath
{
	const char *seg[4];
	int			nseg;
	int			index;
} QbcfOvPath;

/* qbcf_ov_seg_match: does the segment's override spelling begin *r?  Advances *r. */
static bool
qbcf_ov_seg_match(const char **r, const char *seg)
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

/* qbcf_ov_matches: does rest (the name after QUEUEBOX_) spell this path? */
static bool
qbcf_ov_matches(const char *rest, const QbcfOvPath *path)
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
			if (!qbcf_ov_seg_match(&r, num))
				return false;
		}
		else if (!qbcf_ov_seg_match(&r, path->seg[s]))
			return false;
	}
	return *r == '\0';
}

/* qbcf_ov_display: a candidate path as the validator would print it. */
static void
qbcf_ov_display(char *buf, size_t size, const QbcfOvPath *path)
{
	char		tmp[QBCF_PATHLEN];
	int			s;

	buf[0] = '\0';
	for (s = 0; s < path->nseg; s++)
	{
		qbcf_fmt(tmp, sizeof(tmp), "%s", buf);
		if (path->seg[s] == NULL)
			qbcf_path_index(buf, size, tmp, path->index);
		else
			qbcf_path_key(buf, size, tmp, path->seg[s]);
	}
}

typedef struct QbcfOvFound
{
	int			count;
	QbcfOvPath		first;
	QbcfOvPath		second;
} QbcfOvFound;

/* qbcf_ov_try: count a candidate that rest spells, keeping the first two. */
static void
qbcf_ov_try(QbcfOvFound *f, const char *rest, const QbcfOvPath *path)
{
	if (!qbcf_ov_matches(rest, path))
		return;
	if (f->count == 0)
		f->first = *path;
	else if (f->count == 1)
		f->second = *path;
	f->count++;
}

/* qbcf_ov_try_map: the entries of a headers: or config: mapping. */
static void
qbcf_ov_try_map(QbcfOvFound *f, const char *rest, const char *name, const QbcfNode *dest,
				const char *section)
{
	const QbcfNode *m = qbcf_get(dest, section);
	int			i;

	if (m == NULL || m->kind != QBCF_MAP)
		return;
	for (i = 0; i < m->n; i++)
	{
		QbcfOvPath		p = {{"destinations", name, section, m->keys[i]->text}, 4, 0};

		if (m->keys[i]->kind == QBCF_SCALAR)
			qbcf_ov_try(f, rest, &p);
	}
}

/*
 * The sections at a fixed path and the scalar keys an override may set in
 * them, in the order the candidates are tried.
 */
typedef struct QbcfOvSection
{
	const char *seg[2];
	int			nseg;
	const char *const *keys;
} QbcfOvSection;

static const QbcfOvSection qbcf_ov_sections[] =
{
	{.seg = {"outbox"}, .nseg = 1, .keys = qbcf_scalars_outbox},
	{.seg = {"outbox", "backoff"}, .nseg = 2, .keys = qbcf_keys_backoff},
	{.seg = {"inbox"}, .nseg = 1, .keys = qbcf_scalars_inbox},
	{.seg = {"inbox", "relay"}, .nseg = 2, .keys = qbcf_keys_relay},
	{.seg = {"http"}, .nseg = 1, .keys = qbcf_keys_http_section},
	{.seg = {"admin"}, .nseg = 1, .keys = qbcf_keys_admin},
	{.seg = {"database"}, .nseg = 1, .keys = qbcf_keys_database},
	{.seg = {"daemon"}, .nseg = 1, .keys = qbcf_keys_daemon},
};

/*
 * The keys of a destination or source type that hold a mapping or a
 * sequence: an override cannot replace them (headers: and config: entries
 * are candidates of their own, qbcf_ov_try_map).
 */
static const char *const qbcf_ov_not_scalar[] =
{"headers", "signing", "config", "circuitBreaker", "rateLimit", "auth", "topics", NULL};

/* qbcf_ov_in: is name in the NULL-terminated list? */
static bool
qbcf_ov_in(const char *const *list, const char *name)
{
	for (; *list != NULL; list++)
		if (strcmp(*list, name) == 0)
			return true;
	return false;
}

/*
 * qbcf_ov_type_keys: the scalar keys of every type (keys[t] for each t
 * until NULL), each once, tried under the entry segs: the union, so that
 * a new type brings its keys to the overrides with its table entry.
 */
static void
qbcf_ov_type_keys(QbcfOvFound *f, const char *rest, const char *section, const char *name,
				  const char *const *const *keys)
{
	for (int t = 0; keys[t] != NULL; t++)
		for (int k = 0; keys[t][k] != NULL; k++)
		{
			const char *key = keys[t][k];
			bool		seen = qbcf_ov_in(qbcf_ov_not_scalar, key);
			QbcfOvPath	p = {{section, name, key}, 3, 0};

			for (int u = 0; !seen && u <= t; u++)
				for (int j = 0; !seen && keys[u][j] != NULL && (u < t || j < k); j++)
					seen = strcmp(keys[u][j], key) == 0;
			if (!seen)
				qbcf_ov_try(f, rest, &p);
		}
}

/* qbcf_ov_under: section.name.sub.<key> for each of keys. */
static void
qbcf_ov_under(QbcfOvFound *f, const char *rest, const char *section, const char *name,
			  const char *sub, const char *const *keys)
{
	for (int k = 0; keys[k] != NULL; k++)
	{
		QbcfOvPath	p = {{section, name, sub, keys[k]}, 4, 0};

		qbcf_ov_try(f, rest, &p);
	}
}

/* qbcf_ov_collect: every known scalar key path that rest spells. */
static void
qbcf_ov_collect(const QbcfNode *root, const char *rest, QbcfOvFound *f)
{
	const char *const *dest_keys[QBCF_MAX_TYPES + 1] = {NULL};
	const char *const *source_keys[QBCF_MAX_TYPES + 1] = {NULL};
	const QbcfNode *m;
	int			i,
				k;

	for (i = 0; qbcf_dest_types[i] != NULL; i++)
		dest_keys[i] = qbcf_dest_types[i]->keys;
	for (i = 0; qbcf_source_types[i] != NULL; i++)
		source_keys[i] = qbcf_source_types[i]->keys;
	for (size_t s = 0; s < sizeof(qbcf_ov_sections) / sizeof(qbcf_ov_sections[0]); s++)
	{
		const QbcfOvSection *sec = &qbcf_ov_sections[s];

		for (k = 0; sec->keys[k] != NULL; k++)
		{
			QbcfOvPath	p = {{sec->seg[0], sec->seg[1], sec->keys[k]}, sec->nseg + 1, 0};

			if (sec->nseg == 1)
				p.seg[1] = sec->keys[k];
			qbcf_ov_try(f, rest, &p);
		}
	}
	m = qbcf_get(root, "sources");
	if (m != NULL && m->kind == QBCF_MAP)
	{
		for (i = 0; i < m->n; i++)
		{
			const char *name = m->keys[i]->text;

			if (m->keys[i]->kind != QBCF_SCALAR || m->kids[i]->kind != QBCF_MAP)
				continue;
			qbcf_ov_type_keys(f, rest, "sources", name, source_keys);
			qbcf_ov_under(f, rest, "sources", name, "auth", qbcf_scalars_auth);
		}
	}
	m = qbcf_get(root, "destinations");
	if (m != NULL && m->kind == QBCF_MAP)
	{
		for (i = 0; i < m->n; i++)
		{
			const char *name = m->keys[i]->text;

			if (m->keys[i]->kind != QBCF_SCALAR || m->kids[i]->kind != QBCF_MAP)
				continue;
			qbcf_ov_type_keys(f, rest, "destinations", name, dest_keys);
			qbcf_ov_under(f, rest, "destinations", name, "circuitBreaker", qbcf_keys_breaker);
			qbcf_ov_under(f, rest, "destinations", name, "rateLimit", qbcf_keys_rate_limit);
			qbcf_ov_under(f, rest, "destinations", name, "signing", qbcf_scalars_signing);
			qbcf_ov_try_map(f, rest, name, m->kids[i], "headers");
			qbcf_ov_try_map(f, rest, name, m->kids[i], "config");
		}
	}
	m = qbcf_get(root, "routes");
	if (m != NULL && m->kind == QBCF_SEQ)
	{
		for (i = 0; i < m->n; i++)
		{
			if (m->kids[i]->kind != QBCF_MAP)
				continue;
			for (k = 0; qbcf_keys_route[k] != NULL; k++)
			{
				QbcfOvPath	p = {{"routes", NULL, qbcf_keys_route[k]}, 3, i};

				qbcf_ov_try(f, rest, &p);
			}
		}
	}
}

/*
 * qbcf_ov_apply: set the scalar at path to value, made by variable var, with
 * the new nodes in arena a.  Missing outbox:/backoff: mappings are created;
 * a path through something that is not a mapping is left for the validator
 * to report.  -1 on error.
 */
static int
qbcf_ov_apply(QbcfArena *a, QbcfNode **root, const QbcfOvPath *path, const char *var,
			  const char *value, char *err, size_t errlen)
{
	QbcfNode   *cur;
	QbcfNode   *node;
	QbcfNode   *key;
	const char *last = path->seg[path->nseg - 1];
	int			s,
				i;

	if (*root == NULL && (*root = qbcf_node_new(a, QBCF_MAP, 0, 0)) == NULL)
		goto oom;
	cur = *root;
	for (s = 0; s < path->nseg - 1; s++)
	{
		if (path->seg[s + 1] == NULL)
		{
			/* routes: collected from the tree, so the item exists */
			cur = qbcf_get(cur, path->seg[s])->kids[path->index];
			s++;
			continue;
		}
		i = qbcf_find(cur, path->seg[s]);
		if (i >= 0 && cur->kids[i]->kind == QBCF_MAP)
		{
			cur = cur->kids[i];
			continue;
		}
		if (i >= 0 && !qbcf_is_null(cur->kids[i]))
			return 0;
		if ((node = qbcf_node_new(a, QBCF_MAP, 0, 0)) == NULL)
			goto oom;
		if (i >= 0)
			cur->kids[i] = node;	/* the null it replaces stays in the arena */
		else if ((key = qbcf_scalar(a, path->seg[s], strlen(path->seg[s]), 0, 0)) == NULL ||
				 !qbcf_append(a, cur, key, node))
			goto oom;
		cur = node;
	}

	if ((node = qbcf_scalar(a, value, strlen(value), 0, 0)) == NULL ||
		(node->envvar = qbcf_arena_strdup(a, var)) == NULL)
		goto oom;
	i = qbcf_find(cur, last);
	if (i >= 0)
	{
		if (cur->kids[i]->envvar != NULL)
		{
			char		disp[QBCF_PATHLEN];

			qbcf_ov_display(disp, sizeof(disp), path);
			snprintf(err, errlen, "%s and %s both set %s: unset one of them",
					 cur->kids[i]->envvar, var, disp);
			return -1;
		}
		cur->kids[i] = node;
		return 0;
	}
	if ((key = qbcf_scalar(a, last, strlen(last), 0, 0)) == NULL ||
		(key->envvar = node->envvar) == NULL || !qbcf_append(a, cur, key, node))
		goto oom;
	return 0;

oom:
	snprintf(err, errlen, "out of memory while applying %s", var);
	return -1;
}

/* qbcf_overrides: apply every QUEUEBOX_* variable of the environment (nodes in a). */
int
qbcf_overrides(QbcfArena *a, QbcfNode **root, char *err, size_t errlen)
{
	char	  **e;

	/* a document that is not a mapping fails validation anyway */
	if (*root != NULL && (*root)->kind != QBCF_MAP)
		return 0;
	for (e = environ; e != NULL && *e != NULL; e++)
	{
		const char *eq;
		char	   *var;
		QbcfOvFound f = {0};
		int			rc = 0;

		if (strncmp(*e, "QUEUEBOX_", 9) != 0 || (eq = strchr(*e, '=')) == NULL)
			continue;
		if ((var = qbcf_arena_strndup(a, *e, eq - *e)) == NULL)
		{
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		qbcf_ov_collect(*root, var + 9, &f);
		if (f.count > 1)
		{
			char		first[QBCF_PATHLEN],
						second[QBCF_PATHLEN];

			qbcf_ov_display(first, sizeof(first), &f.first);
			qbcf_ov_display(second, sizeof(second), &f.second);
			snprintf(err, errlen,
					 "%s matches both %s and %s: override names compare letters and digits only, so rename one of them",
					 var, first, second);
			rc = -1;
		}
		else if (f.count == 1)
			rc = qbcf_ov_apply(a, root, &f.first, var, eq + 1, err, errlen);
		if (rc != 0)
			return -1;
	}
	return 0;
}
