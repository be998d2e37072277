/*-------------------------------------------------------------------------
 * qb_extract.c
 *	  JSONPath subset, the key/type/aggregate rule, templates and header
 *	  redaction (see qb_extract.h).
 *
 * The path walker parses the path as it walks, so a path is never compiled
 * into a structure: a step is a name or an index, applied to the current
 * jansson value.  Parsing and walking share qbx_step().
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qb_extract.h"
#include "qb_token.h"
#include "qb_utf8.h"

#define QBX_NAMELEN 256

typedef enum QbxStep
{
	QBX_END,
	QBX_NAME,
	QBX_INDEX,
	QBX_BAD
} QbxStep;

/*
 * qbx_step reads one step at *p: a name into name (unescaped) or an index
 * into *index, and advances *p.  QBX_BAD leaves *p at the offending byte.
 */
static QbxStep
qbx_step(const char **p, char *name, size_t *index)
{
	const char *s = *p;
	size_t		n = 0;

	if (*s == '\0')
		return QBX_END;
	if (*s == '.')
	{
		s++;
		if (!(isalnum((unsigned char) *s) || *s == '_' || *s == '-' || *s == '$'))
		{
			*p = s;
			return QBX_BAD;
		}
		while (isalnum((unsigned char) *s) || *s == '_' || *s == '-' || *s == '$')
		{
			if (n + 1 >= QBX_NAMELEN)
			{
				*p = s;
				return QBX_BAD;
			}
			name[n++] = *s++;
		}
		name[n] = '\0';
		*p = s;
		return QBX_NAME;
	}
	if (*s == '[' && s[1] == '\'')
	{
		s += 2;
		while (*s && *s != '\'')
		{
			if (*s == '\\' && (s[1] == '\'' || s[1] == '\\'))
				s++;
			if (n + 1 >= QBX_NAMELEN)
			{
				*p = s;
				return QBX_BAD;
			}
			name[n++] = *s++;
		}
		if (s[0] != '\'' || s[1] != ']')
		{
			*p = s;
			return QBX_BAD;
		}
		name[n] = '\0';
		*p = s + 2;
		return QBX_NAME;
	}
	if (*s == '[' && isdigit((unsigned char) s[1]))
	{
		size_t		v = 0;

		s++;
		while (isdigit((unsigned char) *s))
		{
			if (v > 100000000)
			{
				*p = s;
				return QBX_BAD;
			}
			v = v * 10 + (size_t) (*s++ - '0');
		}
		if (*s != ']')
		{
			*p = s;
			return QBX_BAD;
		}
		*index = v;
		*p = s + 1;
		return QBX_INDEX;
	}
	return QBX_BAD;
}

bool
qb_jsonpath_check(const char *path, char *err, size_t errlen)
{
	const char *p = path;
	char		name[QBX_NAMELEN];
	size_t		index;
	QbxStep		k;

	if (path == NULL || path[0] != '$')
	{
		snprintf(err, errlen, "a JSONPath starts with \"$\", e.g. \"$.data.id\"");
		return false;
	}
	p++;
	while ((k = qbx_step(&p, name, &index)) != QBX_END)
		if (k == QBX_BAD)
		{
			snprintf(err, errlen,
					 "unexpected character at offset %d of the JSONPath; supported steps are .name, ['name'] and [index]",
					 (int) (p - path));
			return false;
		}
	return true;
}

json_t *
qb_jsonpath_get(json_t *doc, const char *path)
{
	const char *p = path;
	char		name[QBX_NAMELEN];
	size_t		index;
	json_t	   *cur = doc;
	QbxStep		k;

	if (path == NULL || path[0] != '$' || doc == NULL)
		return NULL;
	p++;
	while (cur != NULL && (k = qbx_step(&p, name, &index)) != QBX_END)
	{
		if (k == QBX_BAD)
			return NULL;
		cur = k == QBX_NAME ? (json_is_object(cur) ? json_object_get(cur, name) : NULL)
			: (json_is_array(cur) ? json_array_get(cur, index) : NULL);
	}
	return cur;
}

char *
qb_jsonpath_text(json_t *doc, const char *path)
{
	json_t	   *v = qb_jsonpath_get(doc, path);

	if (v == NULL)
		return NULL;
	if (json_is_string(v))
		return strdup(json_string_value(v));
	if (json_is_integer(v) || json_is_boolean(v))
		return json_dumps(v, JSON_ENCODE_ANY);
	return NULL;
}

/* qb_value_fault: see qb_extract.h. */
QbValueFault
qb_value_fault(const char *v, long *at)
{
	size_t		len = strlen(v);

	*at = -1;
	if (len > QB_VALUE_MAX_BYTES)
		return QB_VALUE_TOO_LONG;
	if ((*at = qb_utf8_invalid_at(v, len)) >= 0)
		return QB_VALUE_NOT_UTF8;
	if ((*at = qb_field_value_invalid_at(v)) >= 0)
		return QB_VALUE_CONTROL;
	return QB_VALUE_OK;
}

/*
 * qbx_placeholder: at "{{", the name inside (trimmed) into name; returns the
 * byte after "}}", or NULL when unterminated or too long.
 */
static const char *
qbx_placeholder(const char *s, char *name, size_t size)
{
	const char *end = strstr(s + 2, "}}");
	const char *a = s + 2;
	const char *b;
	size_t		n;

	if (end == NULL)
		return NULL;
	b = end;
	while (a < b && isspace((unsigned char) *a))
		a++;
	while (b > a && isspace((unsigned char) b[-1]))
		b--;
	n = (size_t) (b - a);
	if (n >= size)
		return NULL;
	memcpy(name, a, n);
	name[n] = '\0';
	return end + 2;
}

bool
qb_template_check(const char *tmpl, const char *const *names, char *err, size_t errlen)
{
	const char *s = tmpl;
	char		name[QBX_NAMELEN];

	while ((s = strstr(s, "{{")) != NULL)
	{
		const char *next = qbx_placeholder(s, name, sizeof(name));
		bool		known = false;

		if (next == NULL)
		{
			snprintf(err, errlen, "unterminated \"{{\" at offset %d: close it with \"}}\"",
					 (int) (s - tmpl));
			return false;
		}
		for (int i = 0; names[i]; i++)
			if (strcmp(names[i], name) == 0)
				known = true;
		if (!known)
		{
			char		list[256] = "";
			size_t		o = 0;

			for (int i = 0; names[i] && o < sizeof(list); i++)
				o += snprintf(list + o, sizeof(list) - o, "%s{{ %s }}", i ? ", " : "", names[i]);
			snprintf(err, errlen, "unknown placeholder \"{{ %.60s }}\" (known: %s)", name, list);
			return false;
		}
		s = next;
	}
	return true;
}

char *
qb_template_render(const char *tmpl, const char *const *names, const char *const *values)
{
	size_t		cap = strlen(tmpl) + 1;
	char	   *out;
	size_t		o = 0;
	const char *s = tmpl;
	char		name[QBX_NAMELEN];

	for (int i = 0; names[i]; i++)
		cap += values[i] ? strlen(values[i]) * 8 : 0;	/* each may repeat */
	out = malloc(cap);
	if (out == NULL)
		return NULL;
	while (*s)
	{
		const char *next;

		if (s[0] == '{' && s[1] == '{' && (next = qbx_placeholder(s, name, sizeof(name))) != NULL)
		{
			for (int i = 0; names[i]; i++)
				if (strcmp(names[i], name) == 0 && values[i])
				{
					size_t		n = strlen(values[i]);

					if (o + n + 1 > cap)
					{
						char	   *bigger = realloc(out, cap = (o + n + 1) * 2);

						if (bigger == NULL)
						{
							free(out);
							return NULL;
						}
						out = bigger;
					}
					memcpy(out + o, values[i], n);
					o += n;
				}
			s = next;
			continue;
		}
		if (o + 2 > cap)
		{
			char	   *bigger = realloc(out, cap *= 2);

			if (bigger == NULL)
			{
				free(out);
				return NULL;
			}
			out = bigger;
		}
		out[o++] = *s++;
	}
	out[o] = '\0';
	return out;
}

bool
qb_header_redacted(const char *name, const char *extra)
{
	static const char *const never[] = {
		"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie",
		"X-Hub-Signature", "X-Hub-Signature-256", "Stripe-Signature",
		"webhook-signature", "svix-signature", NULL
	};

	for (int i = 0; never[i]; i++)
		if (strcasecmp(name, never[i]) == 0)
			return true;
	return extra != NULL && strcasecmp(name, extra) == 0;
}
