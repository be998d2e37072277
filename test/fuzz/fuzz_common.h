/*-------------------------------------------------------------------------
 * fuzz_common.h
 *	  Helpers the libFuzzer harnesses of test/fuzz share: turning the
 *	  fuzzer's bytes into C strings, lines and header lists, and the
 *	  checks every harness makes of what the core returns.
 *
 * Wording:
 *	- An input is the bytes libFuzzer hands LLVMFuzzerTestOneInput.  Each
 *	  harness reads it as lines ('\n'-terminated; the last one may lack it),
 *	  and a C string ends at its first NUL, as the core's callers' strings do.
 *	- A header block is "Name: value" lines up to an empty line (or the end),
 *	  as a request's head after libmicrohttpd: the value's leading blanks
 *	  are dropped; a line without a colon is a name with an empty value.
 *
 * A failed check calls abort() with a message on stderr, which libFuzzer
 * reports as a crash and saves as a reproducer.
 *-------------------------------------------------------------------------
 */
#ifndef QB_FUZZ_COMMON_H
#define QB_FUZZ_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define QBF_MAX_HEADERS 32

/* qbf_fail: a broken invariant; libFuzzer saves the input. */
static inline void qbf_fail(const char *fmt,...) __attribute__((format(printf, 1, 2), noreturn));
static inline void
qbf_fail(const char *fmt,...)
{
	va_list		ap;

	va_start(ap, fmt);
	fprintf(stderr, "fuzz check failed: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	abort();
}

/* qbf_strndup: a NUL-terminated copy of n bytes (never NULL). */
static inline char *
qbf_strndup(const uint8_t *p, size_t n)
{
	char	   *s = malloc(n + 1);

	if (s == NULL)
		abort();
	memcpy(s, p, n);
	s[n] = '\0';
	return s;
}

/*
 * qbf_line: the next line of *p (n bytes left) as a new string, without its
 * '\n'; advances past it.  At the end, an empty string.
 */
static inline char *
qbf_line(const uint8_t **p, size_t *n)
{
	const uint8_t *nl = memchr(*p, '\n', *n);
	size_t		len = nl ? (size_t) (nl - *p) : *n;
	char	   *s = qbf_strndup(*p, len);

	*p += nl ? len + 1 : len;
	*n -= nl ? len + 1 : len;
	return s;
}

/* qbf_err_ok: a message buffer is NUL-terminated inside its size. */
static inline void
qbf_err_ok(const char *err, size_t errlen, const char *what)
{
	if (memchr(err, '\0', errlen) == NULL)
		qbf_fail("%s: the message is not NUL-terminated within %zu bytes", what, errlen);
}

typedef struct QbfHeaders
{
	int			n;
	char	   *names[QBF_MAX_HEADERS];
	char	   *values[QBF_MAX_HEADERS];
} QbfHeaders;

/* qbf_headers_read: a header block from *p; advances past its empty line. */
static inline void
qbf_headers_read(QbfHeaders *h, const uint8_t **p, size_t *n)
{
	h->n = 0;
	while (*n > 0)
	{
		char	   *line = qbf_line(p, n);
		char	   *colon;
		char	   *v;
		size_t		len = strlen(line);

		if (len > 0 && line[len - 1] == '\r')
			line[--len] = '\0';
		if (len == 0)
		{
			free(line);
			break;
		}
		if (h->n == QBF_MAX_HEADERS)
		{
			free(line);
			continue;
		}
		colon = strchr(line, ':');
		v = colon ? colon + 1 : line + len;
		if (colon)
			*colon = '\0';
		while (*v == ' ' || *v == '\t')
			v++;
		h->names[h->n] = line;
		h->values[h->n] = strdup(v);
		if (h->values[h->n] == NULL)
			abort();
		h->n++;
	}
}

/* qbf_headers_get: a QbHeaderGet over a QbfHeaders (the first of a name). */
static inline const char *
qbf_headers_get(void *ctx, const char *name)
{
	QbfHeaders *h = ctx;

	for (int i = 0; i < h->n; i++)
		if (strcasecmp(h->names[i], name) == 0)
			return h->values[i];
	return NULL;
}

static inline void
qbf_headers_free(QbfHeaders *h)
{
	for (int i = 0; i < h->n; i++)
	{
		free(h->names[i]);
		free(h->values[i]);
	}
	h->n = 0;
}

#endif							/* QB_FUZZ_COMMON_H */
