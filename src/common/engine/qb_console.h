/*-------------------------------------------------------------------------
 * qb_console.h
 *	  The web console's pieces that need no connection (qb_console.c): its
 *	  static files, its session cookie, its security headers.  The ingress
 *	  serves them (docs/console.md).
 *-------------------------------------------------------------------------
 */
#ifndef QB_CONSOLE_H
#define QB_CONSOLE_H

#include <stdbool.h>
#include <stddef.h>

/* One static file, embedded at build time (scripts/embed-console.sh). */
typedef struct QbConsoleAsset
{
	const char *path;			/* "/console", "/console/app.js", ... */
	const char *content_type;
	const char *body;			/* text, NUL-terminated */
} QbConsoleAsset;

/* every asset, ended by {NULL} (build/console/qb_console_assets.c) */
extern const QbConsoleAsset qb_console_assets[];

/* The session cookie's name, and the header every console write carries. */
#define QB_CONSOLE_COOKIE	"queuebox_admin"
#define QB_CONSOLE_CSRF_HEADER "X-QueueBox-CSRF"

/*
 * The headers of every console answer (qb_console_headers's names and
 * values, ended by NULL): a strict Content-Security-Policy, nosniff, no
 * framing, no referrer.
 */
extern const char *const qb_console_headers[][2];

/* The asset at path, or NULL. */
extern const QbConsoleAsset *qb_console_asset(const char *path);

/*
 * The admin token carried by the session cookie in a Cookie header, hex
 * decoded into buf; false when the header has no such cookie or its value
 * is not even-length hex that fits.
 */
extern bool qb_console_cookie_token(const char *cookie_header, char *buf, size_t len);

/*
 * The Set-Cookie value that logs in with token (NULL: the one that logs
 * out), malloc'd: HttpOnly, SameSite=Strict, Path=/, Secure when secure.
 * The value is the token hex-encoded, so any byte the token holds fits.
 */
extern char *qb_console_set_cookie(const char *token, bool secure);

/*
 * The token of a login body, {"token": "..."}, malloc'd; NULL with reason
 * set when the body is not that.
 */
extern char *qb_console_login_token(const char *body, size_t len, char *reason, size_t reasonlen);

#endif							/* QB_CONSOLE_H */
