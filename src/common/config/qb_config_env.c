/*-------------------------------------------------------------------------
 * qb_config_env.c
 *	  ${NAME} and ${file:PATH} expansion, and the checks of URLs and broker
 *	  lists.
 *
 * All run on values that may hold secrets (a password in a URL, a token
 * from the environment or a file), so no message here repeats a value:
 * they name the variable, the file, the scheme or the part that is wrong.
 *
 * A file is read only where the host allows (QbConfigEnv's file_dirs):
 * the extension lists directories in a superuser's setting, the daemon
 * allows any path its user can read; by default none is allowed.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <sys/stat.h>

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
 * ${file:PATH}: a secret read from a file
 * ---------------------------------------------------------------------
 */

/* the largest secret file read (a key or a certificate, not a document) */
#define QBCF_FILE_MAX	65536

/*
 * qbcf_path_clean: an absolute path with no "." or ".." component and no
 * empty one past the root, so that the lexical check against a directory
 * means what it says before the file is even looked at.
 */
static bool
qbcf_path_clean(const char *path)
{
	const char *p = path;

	if (*p != '/')
		return false;
	while (*p == '/')
	{
		const char *c = p + 1;
		size_t		n = strcspn(c, "/");

		if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.') ||
			(n == 0 && c[0] == '/'))
			return false;
		p = c + n;
	}
	return true;
}

/* qbcf_under: path is dir or inside it (both as written: no trailing '/' needed). */
static bool
qbcf_under(const char *path, const char *dir, size_t dlen)
{
	while (dlen > 1 && dir[dlen - 1] == '/')
		dlen--;
	if (dlen == 1 && dir[0] == '/')
		return path[0] == '/';
	return strncmp(path, dir, dlen) == 0 && path[dlen] == '/';
}

/*
 * qbcf_next_dir: the next entry of a comma-separated list of directories
 * at *d, trimmed, in *s and *n (possibly empty); false at the end.
 */
static bool
qbcf_next_dir(const char **d, const char **s, size_t *n)
{
	if (**d == '\0')
		return false;
	*s = *d;
	*n = strcspn(*d, ",");
	*d += *n;
	if (**d == ',')
		(*d)++;
	while (*n > 0 && isspace((unsigned char) **s))
		(*s)++, (*n)--;
	while (*n > 0 && isspace((unsigned char) (*s)[*n - 1]))
		(*n)--;
	return true;
}

/* qb_config_file_dirs_valid: see qb_config.h. */
bool
qb_config_file_dirs_valid(const char *dirs)
{
	const char *s;
	size_t		n;

	while (qbcf_next_dir(&dirs, &s, &n))
		if (n > 0 && s[0] != '/')
			return false;
	return true;
}

/*
 * qbcf_file_allowed: path (as written, or resolved when real) is inside one
 * of the allowed directories: as listed, or resolved, so that a listed
 * /run/secrets that is a symlink to /var/run/secrets still matches.
 */
static bool
qbcf_file_allowed(const QbConfigEnv *env, const char *path)
{
	const char *d = env->file_dirs != NULL ? env->file_dirs : "";
	const char *s;
	size_t		n;

	if (env->files_anywhere)
		return true;
	while (qbcf_next_dir(&d, &s, &n))
	{
		char		dir[4096];
		char		real[PATH_MAX];

		if (n > 0 && n < sizeof(dir) && s[0] == '/')
		{
			memcpy(dir, s, n);
			dir[n] = '\0';
			if (qbcf_under(path, dir, n))
				return true;
			if (realpath(dir, real) != NULL && qbcf_under(path, real, strlen(real)))
				return true;
		}
	}
	return false;
}

/* qbcf_refused: the message for a file outside the allowed directories (path NULL: not shown). */
static void
qbcf_refused(const QbConfigEnv *env, const char *path, const char *shown, char *err, size_t errlen)
{
	const char *dirs = env->file_dirs;

	if (env->file_setting == NULL)
		snprintf(err, errlen, "file reference ${file:%.200s}: file references are not allowed here", shown);
	else if (dirs == NULL || *dirs == '\0')
		snprintf(err, errlen,
				 "file reference ${file:%.200s}: no directory is allowed for secret files; "
				 "a superuser sets %s to the directories that hold them (e.g. '/run/secrets') and reloads",
				 shown, env->file_setting);
	else
		snprintf(err, errlen,
				 "file reference ${file:%.200s}: %.200s%sis outside the directories %s allows (%.100s); "
				 "move the file there, or have a superuser add its directory",
				 shown, path != NULL ? path : "", path != NULL ? " " : "the file ",
				 env->file_setting, dirs);
}

/*
 * qbcf_read_file appends the content of the file at path to b, less one
 * trailing newline (a file written by echo ends in one).  The path is
 * checked as written (absolute, no "." or "..", inside an allowed
 * directory) before anything is opened, so a refused path says nothing
 * about what exists; then resolved (symlinks) and checked again.  Messages
 * show the reference as written (shown: its ${NAME}s unexpanded, since a
 * variable's value may be a secret) and never the file's content; the
 * paths themselves only when no variable went into them (named).
 */
static bool
qbcf_read_file(const QbConfigEnv *env, QbcfBuf *b, const char *path, const char *shown,
			   bool named, char *err, size_t errlen)
{
	char		real[PATH_MAX];
	char	   *data = NULL;
	struct stat st;
	size_t		len = 0;
	int			fd = -1;

	if (*path == '\0' || !qbcf_path_clean(path))
	{
		snprintf(err, errlen,
				 "file reference ${file:%.200s}: write an absolute path without \".\" or \"..\", e.g. ${file:/run/secrets/github}",
				 shown);
		return false;
	}
	if (!qbcf_file_allowed(env, path))
	{
		qbcf_refused(env, named ? path : NULL, shown, err, errlen);
		return false;
	}
	if (realpath(path, real) == NULL)
	{
		snprintf(err, errlen, "file reference ${file:%.200s}: %s", shown, strerror(errno));
		return false;
	}
	if (!qbcf_file_allowed(env, real))
	{
		qbcf_refused(env, named ? real : NULL, shown, err, errlen);
		return false;
	}
	/* O_NONBLOCK: a FIFO planted there must not hang the load */
	if ((fd = open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0)
	{
		snprintf(err, errlen, "file reference ${file:%.200s}: could not open it: %s",
				 shown, strerror(errno));
		return false;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
	{
		snprintf(err, errlen, "file reference ${file:%.200s}: not a regular file", shown);
		goto fail;
	}
	if (st.st_size > QBCF_FILE_MAX)
	{
		snprintf(err, errlen, "file reference ${file:%.200s}: the file is larger than %d bytes; a secret file holds the secret alone",
				 shown, QBCF_FILE_MAX);
		goto fail;
	}
	if ((data = malloc(QBCF_FILE_MAX + 1)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (;;)
	{
		ssize_t		n = read(fd, data + len, QBCF_FILE_MAX + 1 - len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			snprintf(err, errlen, "file reference ${file:%.200s}: could not read it: %s",
					 shown, strerror(errno));
			goto fail;
		}
		if (n == 0)
			break;
		len += n;
		if (len > QBCF_FILE_MAX)
		{
			snprintf(err, errlen, "file reference ${file:%.200s}: the file is larger than %d bytes; a secret file holds the secret alone",
					 shown, QBCF_FILE_MAX);
			goto fail;
		}
	}
	if (memchr(data, '\0', len) != NULL)
	{
		snprintf(err, errlen, "file reference ${file:%.200s}: the file contains a NUL byte; a secret file holds text", shown);
		goto fail;
	}
	if (len > 0 && data[len - 1] == '\n')
		len -= len > 1 && data[len - 2] == '\r' ? 2 : 1;
	qbcf_buf_add(b, data, len);
	explicit_bzero(data, QBCF_FILE_MAX + 1);
	free(data);
	close(fd);
	return true;

fail:
	if (data != NULL)
	{
		explicit_bzero(data, QBCF_FILE_MAX + 1);
		free(data);
	}
	close(fd);
	return false;
}

/* ---------------------------------------------------------------------
 * ${NAME} and ${file:PATH} expansion
 * ---------------------------------------------------------------------
 */

/*
 * qbcf_expand: expand len bytes of in into b.  files: ${file:PATH} is
 * allowed, where that host allows (NULL: not inside a PATH, whose ${NAME}
 * references are expanded first: ${file:${CREDENTIALS_DIRECTORY}/github}).
 */
static bool
qbcf_expand(QbcfBuf *b, const char *in, size_t len, const QbConfigEnv *files,
			char *err, size_t errlen)
{
	const char *p = in;
	const char *end = in + len;
	char	   *name = NULL;
	char	   *shown = NULL;		/* a ${file:PATH} as written, for messages */

	while (p < end)
	{
		if (end - p >= 3 && p[0] == '$' && p[1] == '$' && p[2] == '{')
		{
			qbcf_buf_add(b, "${", 2);
			p += 3;
		}
		else if (end - p >= 2 && p[0] == '$' && p[1] == '{')
		{
			const char *start = p + 2;
			const char *close = memchr(start, '}', end - start);
			size_t		nlen;
			size_t		i;
			bool		ok;
			const char *value;

			if (end - start >= 5 && memcmp(start, "file:", 5) == 0)
			{
				QbcfBuf		path = {0};
				const char *q = start + 5;

				if (files == NULL)
				{
					snprintf(err, errlen, "a file reference cannot hold another one: only ${NAME} may appear in ${file:PATH}");
					goto fail;
				}
				/* the reference ends at the first '}' outside a ${NAME} */
				while (q < end && *q != '}')
				{
					if (end - q >= 2 && q[0] == '$' && q[1] == '{' &&
						(close = memchr(q + 2, '}', end - q - 2)) != NULL)
						q = close + 1;
					else
						q++;
				}
				if (q >= end)
				{
					snprintf(err, errlen,
							 "unterminated ${file: reference: close it with '}', or write $${ for a literal ${");
					goto fail;
				}
				qbcf_buf_add(&path, "", 0);
				shown = strndup(start + 5, q - (start + 5));
				if (shown == NULL)
				{
					snprintf(err, errlen, "out of memory");
					free(path.data);
					goto fail;
				}
				if (!qbcf_expand(&path, start + 5, q - (start + 5), NULL, err, errlen) ||
					path.oom ||
					!qbcf_read_file(files, b, path.data, shown, strstr(shown, "${") == NULL,
									err, errlen))
				{
					if (path.oom)
						snprintf(err, errlen, "out of memory");
					free(path.data);
					goto fail;
				}
				free(path.data);
				free(shown);
				shown = NULL;
				p = q + 1;
				continue;
			}
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
						 "bad variable name in \"${%.*s}\": a name is a letter or '_' followed by letters, digits and '_'; "
						 "a file is ${file:/path} (write $${ for a literal ${)",
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
			qbcf_buf_add(b, value, strlen(value));
			free(name);
			name = NULL;
			p = close + 1;
		}
		else
		{
			qbcf_buf_add(b, p, 1);
			p++;
		}
	}
	return true;

fail:
	free(name);
	free(shown);
	return false;
}

/* qb_expand_env: see qb_config.h.  Messages name variables and files, never values. */
char *
qb_expand_env(const char *in, const QbConfigEnv *env, char *err, size_t errlen)
{
	QbcfBuf		b = {0};

	qbcf_buf_add(&b, "", 0);			/* an empty input still gives a string */
	if (!qbcf_expand(&b, in, strlen(in), env != NULL ? env : &qbcf_env_default, err, errlen))
		goto fail;
	if (b.oom)
	{
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	return b.data;

fail:
	if (b.data != NULL)
		explicit_bzero(b.data, b.len);
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

/*
 * qbcf_authority: the part between "://" and the path, query or fragment
 * (auth to rest): an optional user info, where flags allow it, then one
 * host[:port].
 */
static bool
qbcf_authority(const char *url, size_t slen, const char *auth, const char *rest,
			   const char *scheme, int flags, char *err, size_t errlen)
{
	const char *at = NULL;

	if (rest == auth)
	{
		snprintf(err, errlen, "no host after \"%.*s://\"; write %s://host[:port]",
				 (int) slen, url, scheme);
		return false;
	}
	for (const char *p = auth; p < rest; p++)
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
	return qbcf_hostport(auth, rest - auth, err, errlen);
}

/* qb_url_check_scheme: see qb_config.h. */
bool
qb_url_check_scheme(const char *url, const char *const *schemes, int flags,
					char *err, size_t errlen)
{
	const char *sep;
	const char *rest;
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
	rest = sep + 3 + strcspn(sep + 3, "/?#");
	/* QB_URL_ANY_AUTHORITY: the client library reads it (libpq's host lists, socket paths) */
	if (!(flags & QB_URL_ANY_AUTHORITY) &&
		!qbcf_authority(url, slen, sep + 3, rest, schemes[0], flags, err, errlen))
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
