/*-------------------------------------------------------------------------
 * qbd_url.c
 *	  What the daemon says of a database URL: the URL without its password.
 *
 * Every line that names database.url (the log, --check, a connection
 * error of either backend) goes through qbd_redact_url, so no secret of
 * the URL reaches a log.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <string.h>

#include <curl/curl.h>

#include "qbd_backend.h"

/* qbd_is_password_key: is the query key of len bytes "password", %-escapes decoded (as libpq reads it)? */
static bool
qbd_is_password_key(const char *key, size_t len)
{
	int			n = 0;
	char	   *k = curl_easy_unescape(NULL, key, (int) len, &n);
	/* undecodable: hidden, to be safe */
	bool		is = k == NULL || (n == 8 && memcmp(k, "password", 8) == 0);

	curl_free(k);
	return is;
}

/*
 * qbd_redact_url: see qbd_backend.h.  The password is what follows the
 * first ':' of the user info, up to the last '@' before the first '/':
 * libpq's reading (a '?' or '#' in a password does not end the user info
 * there), which hides at least as much as libcurl's for sqlserver://.  And
 * the value of every password= option of the query.  No other part is
 * parsed: the host may be a list, a %-encoded socket directory, or none.
 */
void
qbd_redact_url(const char *url, char *buf, size_t len)
{
	const char *start = strstr(url, "://");
	const char *auth_end;
	const char *colon;
	const char *q;
	size_t		n = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	if (start == NULL)
	{
		snprintf(buf, len, "(a database URL)");
		return;
	}
	start += 3;
	auth_end = NULL;
	for (const char *p = start; *p && *p != '/'; p++)
		if (*p == '@')
			auth_end = p;
	colon = auth_end ? memchr(start, ':', auth_end - start) : NULL;
#define QBD_PUT(s, l) do { size_t l_ = (l); if (n + l_ >= len) l_ = len - 1 - n; memcpy(buf + n, (s), l_); n += l_; buf[n] = '\0'; } while (0)
	if (colon != NULL)
	{
		QBD_PUT(url, (size_t) (colon + 1 - url));
		QBD_PUT("***", 3);
		url = auth_end;
	}
	q = strchr(url, '?');
	if (q == NULL)
	{
		QBD_PUT(url, strlen(url));
		return;
	}
	QBD_PUT(url, (size_t) (q + 1 - url));
	q++;
	while (*q)
	{
		const char *amp = strchr(q, '&');
		size_t		seg = amp ? (size_t) (amp - q) : strlen(q);
		const char *eq = memchr(q, '=', seg);

		if (eq != NULL && qbd_is_password_key(q, (size_t) (eq - q)))
		{
			QBD_PUT(q, (size_t) (eq + 1 - q));
			QBD_PUT("***", 3);
		}
		else
			QBD_PUT(q, seg);
		q += seg;
		if (*q == '&')
		{
			QBD_PUT("&", 1);
			q++;
		}
	}
#undef QBD_PUT
}
