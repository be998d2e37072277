/*-------------------------------------------------------------------------
 * qb_console.c
 *	  The web console's pieces that need no connection: the embedded
 *	  static files, the session cookie and the security headers.
 *
 * The session is the admin token itself, in an HttpOnly, SameSite=Strict
 * cookie (hex, so any byte of the token fits a cookie value): nothing to
 * store server-side, and changing admin.token ends every session.  The
 * ingress checks it as it checks the bearer header, in constant time.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "qb_console.h"
#include "qb_crypto.h"

/* script and style from the listener only; nothing inline, no frame, no plugin */
const char *const qb_console_headers[][2] = {
	{"Content-Security-Policy",
	 "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
	 "img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"},
	{"X-Content-Type-Options", "nosniff"},
	{"X-Frame-Options", "DENY"},
	{"Referrer-Policy", "no-referrer"},
	{NULL, NULL}
};

const QbConsoleAsset *
qb_console_asset(const char *path)
{
	for (const QbConsoleAsset *a = qb_console_assets; a->path != NULL; a++)
		if (strcmp(a->path, path) == 0)
			return a;
	return NULL;
}

bool
qb_console_cookie_token(const char *h, char *buf, size_t len)
{
	size_t		nlen = strlen(QB_CONSOLE_COOKIE);

	/* cookie-string: name=value pairs separated by "; " (RFC 6265 4.2.1) */
	while (h != NULL && *h != '\0')
	{
		while (*h == ' ' || *h == ';')
			h++;
		if (strncmp(h, QB_CONSOLE_COOKIE, nlen) == 0 && h[nlen] == '=')
		{
			const char *v = h + nlen + 1;
			size_t		n = strcspn(v, ";");
			size_t		o = 0;

			if (n % 2 != 0 || n / 2 + 1 > len || n == 0)
				return false;
			for (size_t i = 0; i < n; i += 2)
			{
				int			hi = qb_hex_digit((unsigned char) v[i]),
							lo = qb_hex_digit((unsigned char) v[i + 1]);

				if (hi < 0 || lo < 0)
					return false;
				buf[o++] = (char) (hi * 16 + lo);
			}
			buf[o] = '\0';
			/* a NUL inside would cut the compare short */
			return strlen(buf) == o;
		}
		h = strchr(h, ';');
	}
	return false;
}

char *
qb_console_set_cookie(const char *token, bool secure)
{
	const char *attrs = "; Path=/; HttpOnly; SameSite=Strict";
	size_t		n = token ? strlen(token) : 0;
	size_t		cap = strlen(QB_CONSOLE_COOKIE) + 1 + 2 * n + strlen(attrs) + 64;
	char	   *s = malloc(cap);
	size_t		o;

	if (s == NULL)
		return NULL;
	o = snprintf(s, cap, "%s=", QB_CONSOLE_COOKIE);
	qb_hex_encode((const unsigned char *) (token ? token : ""), n, s + o);
	o += 2 * n;
	snprintf(s + o, cap - o, "%s%s%s", attrs, secure ? "; Secure" : "",
			 token ? "" : "; Max-Age=0");
	return s;
}

char *
qb_console_login_token(const char *body, size_t len, char *reason, size_t reasonlen)
{
	json_error_t jerr;
	json_t	   *doc = len > 0 ? json_loadb(body, len, 0, &jerr) : NULL;
	json_t	   *t = json_object_get(doc, "token");
	char	   *token = NULL;

	if (!json_is_object(doc) || json_object_size(doc) != 1 || !json_is_string(t))
		snprintf(reason, reasonlen,
				 "the login body must be the JSON object {\"token\": \"<admin.token>\"}");
	else if ((token = strdup(json_string_value(t))) == NULL)
		snprintf(reason, reasonlen, "out of memory; retry");
	json_decref(doc);
	return token;
}
