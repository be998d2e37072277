/*-------------------------------------------------------------------------
 * qb_console.c
 *	  The web console's pieces that need no connection: the embedded
 *	  static files, the session cookie, the login body's token
 *	  (qb_console_login_token), the security headers and the per-peer
 *	  limit of wrong tokens.
 *
 * The session is the admin token itself, in an HttpOnly, SameSite=Strict
 * cookie (hex, so any byte of the token fits a cookie value): nothing to
 * store server-side, and changing admin.token ends every session.  The
 * admin gate (qb_admin_gate.c) checks it as it checks the bearer header,
 * in constant time.
 * Wrong tokens are rate limited per peer (qb_console_limit_*).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <netinet/in.h>
#include <sys/socket.h>

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

/* qbcon_peer_key: the bytes a peer is counted by; 0 for an unknown family */
static size_t
qbcon_peer_key(const struct sockaddr *sa, unsigned char *key)
{
	if (sa != NULL && sa->sa_family == AF_INET)
	{
		memcpy(key, &((const struct sockaddr_in *) sa)->sin_addr, 4);
		return 4;
	}
	/* one host often has a whole /64: count it as one peer */
	if (sa != NULL && sa->sa_family == AF_INET6)
	{
		memcpy(key, &((const struct sockaddr_in6 *) sa)->sin6_addr, 8);
		return 8;
	}
	return 0;
}

static const QbConsolePeer *
qbcon_peer_find(const QbConsoleLimit *l, const unsigned char *key, size_t len)
{
	for (int i = 0; i < QB_CONSOLE_LIMIT_SLOTS; i++)
		if (l->peers[i].len == len && memcmp(l->peers[i].addr, key, len) == 0)
			return &l->peers[i];
	return NULL;
}

long
qb_console_limit_wait(const QbConsoleLimit *l, const struct sockaddr *peer, long now)
{
	unsigned char key[16];
	size_t		len = qbcon_peer_key(peer, key);
	const QbConsolePeer *p = len ? qbcon_peer_find(l, key, len) : NULL;

	if (p == NULL || p->fails < QB_CONSOLE_LIMIT_FAILS || now - p->since >= QB_CONSOLE_LIMIT_WINDOW)
		return 0;
	return QB_CONSOLE_LIMIT_WINDOW - (now - p->since);
}

void
qb_console_limit_fail(QbConsoleLimit *l, const struct sockaddr *peer, long now)
{
	unsigned char key[16];
	size_t		len = qbcon_peer_key(peer, key);
	QbConsolePeer *p;

	if (len == 0)
		return;
	p = (QbConsolePeer *) qbcon_peer_find(l, key, len);
	if (p == NULL)
	{
		/* a free slot, else the one whose window began first */
		p = &l->peers[0];
		for (int i = 0; i < QB_CONSOLE_LIMIT_SLOTS && p->len != 0; i++)
			if (l->peers[i].len == 0 || l->peers[i].since < p->since)
				p = &l->peers[i];
		memcpy(p->addr, key, len);
		p->len = (unsigned char) len;
		p->fails = 0;
		p->since = now;
	}
	if (now - p->since >= QB_CONSOLE_LIMIT_WINDOW)
	{
		p->fails = 0;
		p->since = now;
	}
	p->fails++;
}
