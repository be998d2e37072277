/*-------------------------------------------------------------------------
 * qb_config_env.c
 *	  ${NAME} and ${file:PATH} expansion, and the check of kafka's broker
 *	  lists (each entry read by the URL reader, qb_url.h).
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
 * qbcf_resolve: the file a reference names, as real (symlinks resolved),
 * when the path is written as the rules want (absolute, no "." or "..")
 * and both it and real are inside an allowed directory.  The written path
 * is checked before anything is looked up, so a refused path says nothing
 * about what exists.
 */
static bool
qbcf_resolve(const QbConfigEnv *env, const char *path, const char *shown, bool named,
			 char *real, char *err, size_t errlen)
{
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
	return true;
}

/* the message for a file over QBCF_FILE_MAX bytes */
static void
qbcf_too_large(const char *shown, char *err, size_t errlen)
{
	snprintf(err, errlen, "file reference ${file:%.200s}: the file is larger than %d bytes; a secret file holds the secret alone",
			 shown, QBCF_FILE_MAX);
}

/*
 * qbcf_slurp: the whole of fd into data (QBCF_FILE_MAX + 1 bytes), its
 * length in *len; false, with err, when it cannot be read or is larger.
 */
static bool
qbcf_slurp(int fd, const char *shown, char *data, size_t *len, char *err, size_t errlen)
{
	*len = 0;
	for (;;)
	{
		ssize_t		n = read(fd, data + *len, QBCF_FILE_MAX + 1 - *len);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
		{
			snprintf(err, errlen, "file reference ${file:%.200s}: could not read it: %s",
					 shown, strerror(errno));
			return false;
		}
		if (n == 0)
			return true;
		*len += n;
		if (*len > QBCF_FILE_MAX)
		{
			qbcf_too_large(shown, err, errlen);
			return false;
		}
	}
}

/*
 * qbcf_read_file appends the content of the file at path to b, less one
 * trailing newline (a file written by echo ends in one), once qbcf_resolve
 * has allowed it.  Messages show the reference as written (shown: its
 * ${NAME}s unexpanded, since a variable's value may be a secret) and never
 * the file's content; the paths themselves only when no variable went
 * into them (named).
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
	bool		ok = false;

	if (!qbcf_resolve(env, path, shown, named, real, err, errlen))
		return false;
	/* O_NONBLOCK: a FIFO planted there must not hang the load */
	if ((fd = open(real, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0)
	{
		snprintf(err, errlen, "file reference ${file:%.200s}: could not open it: %s",
				 shown, strerror(errno));
		return false;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
		snprintf(err, errlen, "file reference ${file:%.200s}: not a regular file", shown);
	else if (st.st_size > QBCF_FILE_MAX)
		qbcf_too_large(shown, err, errlen);
	else if ((data = malloc(QBCF_FILE_MAX + 1)) == NULL)
		snprintf(err, errlen, "out of memory");
	else if (!qbcf_slurp(fd, shown, data, &len, err, errlen))
		;
	else if (memchr(data, '\0', len) != NULL)
		snprintf(err, errlen, "file reference ${file:%.200s}: the file contains a NUL byte; a secret file holds text", shown);
	else
	{
		if (len > 0 && data[len - 1] == '\n')
			len -= len > 1 && data[len - 2] == '\r' ? 2 : 1;
		qbcf_buf_add(b, data, len);
		ok = true;
	}
	if (data != NULL)
	{
		explicit_bzero(data, QBCF_FILE_MAX + 1);
		free(data);
	}
	close(fd);
	return ok;
}

/* ---------------------------------------------------------------------
 * ${NAME} and ${file:PATH} expansion
 * ---------------------------------------------------------------------
 */

static bool qbcf_expand(QbcfBuf *b, const char *in, size_t len, const QbConfigEnv *files,
						char *err, size_t errlen);

/*
 * qbcf_expand_file: the ${file:PATH} reference whose PATH starts at start
 * (just after "file:"), its content appended to b; *next: just after its
 * '}'.  The reference ends at the first '}' outside a ${NAME}.
 */
static bool
qbcf_expand_file(QbcfBuf *b, const char *start, const char *end, const QbConfigEnv *files,
				 const char **next, char *err, size_t errlen)
{
	QbcfBuf		path = {0};
	const char *q = start;
	const char *close;
	char	   *shown;			/* the reference as written, for messages */
	bool		ok;

	if (files == NULL)
	{
		snprintf(err, errlen, "a file reference cannot hold another one: only ${NAME} may appear in ${file:PATH}");
		return false;
	}
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
		return false;
	}
	if ((shown = strndup(start, q - start)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	qbcf_buf_add(&path, "", 0);
	ok = qbcf_expand(&path, start, q - start, NULL, err, errlen);
	if (ok && path.oom)
	{
		snprintf(err, errlen, "out of memory");
		ok = false;
	}
	if (ok)
		ok = qbcf_read_file(files, b, path.data, shown, strstr(shown, "${") == NULL, err, errlen);
	free(path.data);
	free(shown);
	*next = q + 1;
	return ok;
}

/*
 * qbcf_expand_name: the ${NAME} reference whose NAME starts at start, the
 * variable's value appended to b; *next: just after its '}'.
 */
static bool
qbcf_expand_name(QbcfBuf *b, const char *start, const char *end, const char **next,
				 char *err, size_t errlen)
{
	const char *close = memchr(start, '}', end - start);
	size_t		nlen;
	bool		ok;
	char	   *name;
	const char *value;

	if (close == NULL)
	{
		snprintf(err, errlen,
				 "unterminated ${ reference: close it with '}', or write $${ for a literal ${");
		return false;
	}
	nlen = close - start;
	ok = nlen > 0 && (isalpha((unsigned char) start[0]) || start[0] == '_');
	for (size_t i = 1; ok && i < nlen; i++)
		ok = isalnum((unsigned char) start[i]) || start[i] == '_';
	if (!ok)
	{
		snprintf(err, errlen,
				 "bad variable name in \"${%.*s}\": a name is a letter or '_' followed by letters, digits and '_'; "
				 "a file is ${file:/path} (write $${ for a literal ${)",
				 nlen > 40 ? 40 : (int) nlen, start);
		return false;
	}
	if ((name = strndup(start, nlen)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	if ((value = getenv(name)) == NULL)
		snprintf(err, errlen,
				 "environment variable %s is not set; set it in the environment of the server or daemon that loads the configuration",
				 name);
	else
		qbcf_buf_add(b, value, strlen(value));
	free(name);
	*next = close + 1;
	return value != NULL;
}

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

	while (p < end)
	{
		if (end - p >= 3 && p[0] == '$' && p[1] == '$' && p[2] == '{')
		{
			qbcf_buf_add(b, "${", 2);
			p += 3;
		}
		else if (end - p >= 7 && memcmp(p, "${file:", 7) == 0)
		{
			if (!qbcf_expand_file(b, p + 7, end, files, &p, err, errlen))
				return false;
		}
		else if (end - p >= 2 && p[0] == '$' && p[1] == '{')
		{
			if (!qbcf_expand_name(b, p + 2, end, &p, err, errlen))
				return false;
		}
		else
			qbcf_buf_add(b, p++, 1);
	}
	return true;
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
 * Broker lists (URLs: qb_url.h)
 * ---------------------------------------------------------------------
 */

/*
 * qbcf_brokers_check: kafka's bootstrap list, "host[:port],host[:port]", each
 * entry optionally with a "proto://" prefix as librdkafka allows.
 */
bool
qbcf_brokers_check(const char *s, char *err, size_t errlen)
{
	const char *next = s;
	const char *one;
	size_t		len;

	for (const char *q = s; *q != '\0'; q++)
		if ((unsigned char) *q <= ' ' || *q == 0x7f)
		{
			snprintf(err, errlen, "the broker list contains a space or a control character; write host:port,host:port");
			return false;
		}
	while ((one = qb_url_list_next(&next, &len)) != NULL)
		if (!qb_url_hostport_check(one, len, err, errlen))
			return false;
	return true;
}
