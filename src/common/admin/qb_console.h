/*-------------------------------------------------------------------------
 * qb_console.h
 *	  The web console's pieces that need no connection (qb_console.c): its
 *	  static files, its session cookie, its security headers, the rate limit
 *	  of wrong tokens.  The admin gate (qb_admin_gate.c) serves them
 *	  on the ingress's listener (docs/console.md).
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

/*
 * The admin login's rate limit (docs/console.md#the-rate-limit): a peer
 * that presents QB_CONSOLE_LIMIT_FAILS wrong admin tokens within
 * QB_CONSOLE_LIMIT_WINDOW seconds (at /console/login, or as a bearer header
 * or cookie on /admin) is answered 429 until that window is over.  A fixed
 * table of QB_CONSOLE_LIMIT_SLOTS peers, keyed by address (IPv6 by its /64):
 * nothing allocated per request.  When every slot is in use, the peer whose
 * window began first is forgotten.  Times are monotonic seconds.
 */
#define QB_CONSOLE_LIMIT_FAILS	5
#define QB_CONSOLE_LIMIT_WINDOW	60
#define QB_CONSOLE_LIMIT_SLOTS	64

struct sockaddr;

typedef struct QbConsolePeer
{
	unsigned char addr[16];		/* IPv4: 4 bytes; IPv6: its first 8 */
	unsigned char len;			/* 0: a free slot */
	int			fails;
	long		since;			/* the window's start */
} QbConsolePeer;

typedef struct QbConsoleLimit
{
	QbConsolePeer peers[QB_CONSOLE_LIMIT_SLOTS];
} QbConsoleLimit;

/* Seconds the peer must wait before its next try (0: it may try now). */
extern long qb_console_limit_wait(const QbConsoleLimit *l, const struct sockaddr *peer, long now);

/* Count one wrong token from peer (an address of no known family: not counted). */
extern void qb_console_limit_fail(QbConsoleLimit *l, const struct sockaddr *peer, long now);

#endif							/* QB_CONSOLE_H */
