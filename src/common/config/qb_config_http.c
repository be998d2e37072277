/*-------------------------------------------------------------------------
 * qb_config_http.c
 *	  The http type: an http destination (baseUrl, path, headers, timeoutMs,
 *	  signing:) and an http source (a webhook path and its auth:).
 *
 * Both kinds of signature share their keys: secret or secrets (a list, for
 * rotation), and for hmac-sha256 header, prefix and encoding.  Secrets are
 * never echoed; signing keys are decoded here, once, never per request.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "qb_config_int.h"

/* qb_config_header_reserved: see qb_config.h. */
bool
qb_config_header_reserved(const char *name)
{
	static const char *const reserved[] = {
		/* what the http publisher sets */
		"Content-Type", "X-Message-Id", "User-Agent", "Expect",
		/* the message's framing, which libcurl writes */
		"Host", "Content-Length", "Transfer-Encoding",
		/* hop-by-hop fields (RFC 9110 7.6.1): the connection's, not the message's */
		"Connection", "Keep-Alive", "Proxy-Connection", "TE", "Trailer", "Upgrade",
		NULL
	};

	for (int i = 0; reserved[i] != NULL; i++)
		if (strcasecmp(name, reserved[i]) == 0)
			return true;
	return false;
}

static const char *const qbcf_keys_http[] =
{"type", "baseUrl", "path", "headers", "timeoutMs", "transform", "signing", "maxInFlight",
"circuitBreaker", "onDead",
"rateLimit", "maxConcurrent", NULL};
static const char *const qbcf_keys_http_source[] =
{"type", "path", "idempotencyKeyPath", "idempotencyKeyHeader", "eventTypePath",
"eventTypeHeader", "aggregateIdPath", "topic", "consumption", "maxBodyBytes", "auth",
"transform", "onDead", NULL};
/* auth keys by type, in the order of QbAuthType (NONE has none) */
static const char *const qbcf_keys_auth_hmac[] =
{"type", "secret", "secrets", "header", "prefix", "encoding", NULL};
static const char *const qbcf_keys_auth_github[] =
{"type", "secret", "secrets", NULL};
static const char *const qbcf_keys_auth_timed[] =
{"type", "secret", "secrets", "toleranceSec", NULL};
static const char *const qbcf_keys_auth_bearer[] =
{"type", "token", NULL};
/* the scalar keys an override may set */
const char *const qbcf_scalars_auth[] =
{"type", "secret", "header", "prefix", "encoding", "toleranceSec", "token", NULL};
/* an http destination's signing: keys by scheme are auth's github and hmac ones */
const char *const qbcf_scalars_signing[] =
{"type", "secret", "header", "prefix", "encoding", NULL};

/* signing: every signature of a request fits one 8 KiB header line */
#define QBCF_SIGNING_MAX_KEYS		16
#define QBCF_SIGNING_MAX_PREFIX	64

/* ---------------------------------------------------------------------
 * Secrets, shared by auth: and signing:
 * ---------------------------------------------------------------------
 */
/*
 * qbcf_secrets: secret or secrets (a list, for rotation) of an auth: or
 * signing: section m, each checked for scheme t, into *out (the arena's,
 * also on failure).  hint follows "missing required key secret".
 */
static bool
qbcf_secrets(QbcfCtx *cx, const char *path, const QbcfNode *m, QbAuthType t, const char *hint,
			 char ***out, int *nout)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	const QbcfNode *one = qbcf_get(m, "secret");
	const QbcfNode *many = qbcf_get(m, "secrets");
	const QbcfNode *seq;
	char	  **secrets;
	int			n,
				i;

	if (one != NULL && many != NULL)
	{
		qbcf_path_key(sub, sizeof(sub), path, "secrets");
		return qbcf_error(cx, sub, many,
						  "set secret or secrets, not both (secrets: [new, old] accepts either during a rotation)");
	}
	if (one == NULL && many == NULL)
		return qbcf_error(cx, path, m, "missing required key secret (%s)", hint);
	qbcf_path_key(sub, sizeof(sub), path, one ? "secret" : "secrets");
	if (many != NULL)
	{
		if (!qbcf_section(cx, sub, many, QBCF_SEQ, &seq))
			return false;
		if (seq == NULL || seq->n == 0)
			return qbcf_error(cx, sub, many, "expected a list of at least one secret");
		n = seq->n;
	}
	else
	{
		seq = NULL;
		n = 1;
	}
	if ((secrets = qbcf_arena_alloc(cx->arena, n * sizeof(char *))) == NULL)
		return qbcf_error(cx, sub, m, "out of memory");
	*out = secrets;
	*nout = n;
	for (i = 0; i < n; i++)
	{
		const QbcfNode *item = seq ? seq->kids[i] : one;
		char		at[QBCF_PATHLEN];

		if (seq)
			qbcf_path_index(at, sizeof(at), sub, i);
		else
			snprintf(at, sizeof(at), "%s", sub);
		if (!qbcf_string(cx, at, item, true, &secrets[i]))
			return false;
		if (!qb_auth_secret_check(t, secrets[i], msg, sizeof(msg)))
			return qbcf_error(cx, at, item, "%s", msg);
	}
	return true;
}

/*
 * qbcf_hmac_keys: the header (required; why says what it carries), prefix and
 * encoding keys of an hmac-sha256 scheme, in a source's auth: or an http
 * destination's signing:.
 */
static bool
qbcf_hmac_keys(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *why,
			   char **header, char **prefix, QbSigEncoding *encoding)
{
	char		sub[QBCF_PATHLEN];
	char		echo[64];
	char	   *enc = NULL;

	if (qbcf_get(m, "header") == NULL)
		return qbcf_error(cx, path, m, "missing required key header (%s, e.g. header: X-Signature)", why);
	if (!qbcf_opt_header(cx, path, m, "header", header) ||
		!qbcf_opt_string(cx, path, m, "prefix", false, prefix) ||
		!qbcf_opt_string(cx, path, m, "encoding", true, &enc))
		return false;
	*encoding = QB_SIG_HEX;
	if (enc != NULL)
	{
		if (strcmp(enc, "base64") == 0)
			*encoding = QB_SIG_BASE64;
		else if (strcmp(enc, "hex") != 0)
		{
			qbcf_path_key(sub, sizeof(sub), path, "encoding");
			return qbcf_error(cx, sub, qbcf_get(m, "encoding"), "expected hex or base64, got %s",
							  qbcf_echo(cx, echo, sizeof(echo), enc));
		}
	}
	return true;
}

/* ---------------------------------------------------------------------
 * The destination
 * ---------------------------------------------------------------------
 */

/*
 * qbcf_sign_key: qb_sign_key's key of one secret, moved into the arena
 * (qb_sign_key mallocs it; the copy it made is wiped and freed).
 */
static bool
qbcf_sign_key(QbcfCtx *cx, QbAuthType t, const char *secret, QbSignKey *out,
			  char *msg, size_t msglen)
{
	QbSignKey	k;

	if (!qb_sign_key(t, secret, &k, msg, msglen))
		return false;
	out->bytes = qbcf_arena_memdup(cx->arena, k.bytes, k.len);
	out->len = k.len;
	explicit_bzero(k.bytes, k.len);
	free(k.bytes);
	if (out->bytes == NULL)
	{
		snprintf(msg, msglen, "out of memory");
		return false;
	}
	return true;
}

/*
 * qbcf_signing_header: hmac-sha256's header:, prefix: and encoding: of the
 * signing mapping sm (at at): not a header QueueBox sets itself, a prefix
 * short and without control characters.
 */
static bool
qbcf_signing_header(QbcfCtx *cx, const char *at, const QbcfNode *sm, QbSigning *s)
{
	char		sub[QBCF_PATHLEN];

	if (!qbcf_hmac_keys(cx, at, sm, "the request header QueueBox puts the signature in",
						&s->header, &s->prefix, &s->encoding))
		return false;
	qbcf_path_key(sub, sizeof(sub), at, "header");
	if (qb_config_header_reserved(s->header))
		return qbcf_error(cx, sub, qbcf_get(sm, "header"),
						  "QueueBox sets %s itself on every request; choose another name, e.g. X-Signature",
						  s->header);
	qbcf_path_key(sub, sizeof(sub), at, "prefix");
	if (s->prefix != NULL && strlen(s->prefix) > QBCF_SIGNING_MAX_PREFIX)
		return qbcf_error(cx, sub, qbcf_get(sm, "prefix"), "a prefix is at most %d bytes",
						  QBCF_SIGNING_MAX_PREFIX);
	for (const char *p = s->prefix; p != NULL && *p != '\0'; p++)
		if (((unsigned char) *p < ' ' && *p != '\t') || *p == 0x7f)
			return qbcf_error(cx, sub, qbcf_get(sm, "prefix"),
							  "the prefix contains a line break or another control character; remove it");
	return true;
}

/*
 * qbcf_signing_keys: the secret: or secrets: of the signing mapping sm (at
 * at), at most QBCF_SIGNING_MAX_KEYS, each decoded into its key in
 * s->keys; the secrets' text wiped once decoded.  Secrets are never echoed.
 */
static bool
qbcf_signing_keys(QbcfCtx *cx, const char *at, const QbcfNode *sm, QbSigning *s)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	char	  **secrets = NULL;
	int			nsecrets = 0;
	bool		ok;

	ok = qbcf_secrets(cx, at, sm, s->type,
					  s->type == QB_AUTH_STANDARD_WEBHOOKS ?
					  "the key requests are signed with, whsec_ and base64, e.g. secret: \"${BILLING_SIGNING_SECRET}\"; secrets: [new, old] signs with each during a rotation" :
					  "the key requests are signed with, e.g. secret: \"${BILLING_SIGNING_SECRET}\"; secrets: [new, old] signs with each during a rotation",
					  &secrets, &nsecrets);
	if (ok && nsecrets > QBCF_SIGNING_MAX_KEYS)
	{
		qbcf_path_key(sub, sizeof(sub), at, "secrets");
		ok = qbcf_error(cx, sub, qbcf_get(sm, "secrets"),
						"at most %d secrets (each adds a signature to every request); keep the new and the previous one",
						QBCF_SIGNING_MAX_KEYS);
	}
	if (ok && (s->keys = qbcf_arena_alloc(cx->arena, nsecrets * sizeof(QbSignKey))) == NULL)
		ok = qbcf_error(cx, at, sm, "out of memory");
	if (ok)
		s->nkeys = nsecrets;
	for (int i = 0; ok && i < nsecrets; i++)
		if (!qbcf_sign_key(cx, s->type, secrets[i], &s->keys[i], msg, sizeof(msg)))
			ok = qbcf_error(cx, at, sm, "%s", msg);
	/* the keys are what requests use: wipe the secrets now, not at the free */
	for (int i = 0; secrets != NULL && i < nsecrets; i++)
		if (secrets[i] != NULL)
			explicit_bzero(secrets[i], strlen(secrets[i]));
	return ok;
}

/*
 * qbcf_signing: the signing: section of the http destination mapping m (at
 * path) into d->signing, each secret decoded into its key here so that no
 * request decodes one.  The headers it sets must be none that QueueBox sets
 * on every request or that the destination's headers: already send.
 * Secrets are never echoed.
 */
static bool
qbcf_signing(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	static const char *const types[] = {"standard-webhooks", "hmac-sha256", NULL};
	static const QbAuthType codes[] = {QB_AUTH_STANDARD_WEBHOOKS, QB_AUTH_HMAC_SHA256};
	static const char *const *const keys[] = {qbcf_keys_auth_github, qbcf_keys_auth_hmac};
	char		at[QBCF_PATHLEN];
	char		sub[QBCF_PATHLEN];
	char		forwhat[64];
	const QbcfNode *sm;
	const QbcfNode *hm = qbcf_get(m, "headers");
	QbSigning  *s = &d->signing;
	int			t;

	qbcf_path_key(at, sizeof(at), path, "signing");
	if (!qbcf_typed(cx, at, qbcf_get(m, "signing"), types, "one of standard-webhooks, hmac-sha256",
					"expected a mapping with at least type: (standard-webhooks or hmac-sha256) and secret:; remove signing: to send unsigned requests",
					"one of standard-webhooks, hmac-sha256", &sm, &t))
		return false;
	snprintf(forwhat, sizeof(forwhat), "for signing type %s", types[t]);
	if (!qbcf_check_keys(cx, at, sm, keys[t], forwhat))
		return false;
	s->type = codes[t];
	if (s->type == QB_AUTH_HMAC_SHA256 && !qbcf_signing_header(cx, at, sm, s))
		return false;
	if (!qbcf_signing_keys(cx, at, sm, s))
		return false;

	/* a header sent twice leaves the receiver to pick one of the values */
	for (int i = 0; i < d->nheaders; i++)
		if (qb_sign_sets(s, d->headers[i].name))
		{
			qbcf_path_key(at, sizeof(at), path, "headers");
			qbcf_path_key(sub, sizeof(sub), at, d->headers[i].name);
			return qbcf_error(cx, sub, hm->keys[i],
							  "signing: sets this header itself on every request; remove it from headers:");
		}
	return true;
}

/* qbcf_http: the keys of an http destination (the shared ones are read). */
static bool
qbcf_http(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	static const char url_why[] = "an http destination needs one, e.g. baseUrl: \"https://host:8443\"";
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	const QbcfNode *n;
	size_t		len;
	long		v;

	if ((n = qbcf_required(cx, path, m, "baseUrl", url_why)) == NULL)
		return false;
	qbcf_path_key(sub, sizeof(sub), path, "baseUrl");
	if (!qbcf_string(cx, sub, n, false, &d->base_url))
		return false;
	if (!qb_url_check(d->base_url, msg, sizeof(msg)))
		return qbcf_error(cx, sub, n, "%s", msg);
	/* the path is appended to it: keep no trailing '/' */
	len = strlen(d->base_url);
	while (len > 0 && d->base_url[len - 1] == '/')
		d->base_url[--len] = '\0';

	if ((n = qbcf_get(m, "path")) != NULL)
	{
		qbcf_path_key(sub, sizeof(sub), path, "path");
		if (!qbcf_string(cx, sub, n, false, &d->path))
			return false;
		if (d->path[0] != '\0' && !qbcf_url_path(cx, sub, n, d->path, "path: /events"))
			return false;
	}
	else if ((d->path = qbcf_arena_strdup(cx->arena, "")) == NULL)
		return qbcf_error(cx, path, m, "out of memory");

	if ((d->url = qbcf_arena_alloc(cx->arena, strlen(d->base_url) + strlen(d->path) + 1)) == NULL)
		return qbcf_error(cx, path, m, "out of memory");
	strcpy(d->url, d->base_url);
	strcat(d->url, d->path);

	qbcf_path_key(sub, sizeof(sub), path, "headers");
	if (!qbcf_pairs(cx, sub, qbcf_get(m, "headers"), true, &d->headers, &d->nheaders))
		return false;

	if ((n = qbcf_get(m, "timeoutMs")) != NULL)
	{
		qbcf_path_key(sub, sizeof(sub), path, "timeoutMs");
		if (!qbcf_int(cx, sub, n, 1, 600000, &v))
			return false;
		d->timeout_ms = v;
	}
	return qbcf_get(m, "signing") == NULL || qbcf_signing(cx, path, m, d);
}

const QbcfDestType qbcf_dest_http =
{
	.type = "http",
	.keys = qbcf_keys_http,
	.check = qbcf_http,
};

/* ---------------------------------------------------------------------
 * The source
 * ---------------------------------------------------------------------
 */
/* qbcf_auth: a source's auth: section into s->auth. */
static bool
qbcf_auth(QbcfCtx *cx, const char *path, const QbcfNode *node, QbSource *s)
{
	static const char *const types[] =
	{"hmac-sha256", "github", "stripe", "standard-webhooks", "bearer", NULL};
	static const char *const *const keys[] =
	{qbcf_keys_auth_hmac, qbcf_keys_auth_github, qbcf_keys_auth_timed, qbcf_keys_auth_timed,
	qbcf_keys_auth_bearer};
	char		sub[QBCF_PATHLEN];
	char		forwhat[64];
	const QbcfNode *m;
	const QbcfNode *n;
	QbAuth	   *a = &s->auth;
	char	  **secrets = NULL;
	int			nsecrets = 0;
	bool		ok;
	int			t;

	a->tolerance_sec = 300;
	if (!qbcf_typed(cx, path, node, types, "one of hmac-sha256, github, stripe, standard-webhooks, bearer",
					"expected a mapping with at least type: (hmac-sha256, github, stripe, standard-webhooks or bearer); remove auth: to accept unsigned requests",
					"one of hmac-sha256, github, stripe, standard-webhooks, bearer", &m, &t))
		return false;
	a->type = (QbAuthType) (QB_AUTH_HMAC_SHA256 + t);
	snprintf(forwhat, sizeof(forwhat), "for auth type %s", types[t]);
	if (!qbcf_check_keys(cx, path, m, keys[t], forwhat))
		return false;

	if (a->type == QB_AUTH_BEARER)
	{
		if ((n = qbcf_required(cx, path, m, "token",
							   "the token senders put in Authorization: Bearer <token>, e.g. token: \"${ORDERS_TOKEN}\"")) == NULL)
			return false;
		qbcf_path_key(sub, sizeof(sub), path, "token");
		return qbcf_string(cx, sub, n, true, (char **) &a->token);
	}
	ok = qbcf_secrets(cx, path, m, a->type,
					  "the signing secret, e.g. secret: \"${STRIPE_WEBHOOK_SECRET}\"; secrets: [..] accepts several during a rotation",
					  &secrets, &nsecrets);
	a->secrets = (const char *const *) secrets;
	a->nsecrets = nsecrets;
	if (!ok)
		return false;
	if (a->type == QB_AUTH_STRIPE || a->type == QB_AUTH_STANDARD_WEBHOOKS)
		return qbcf_opt_int(cx, path, m, "toleranceSec", 1, 86400, &a->tolerance_sec);
	if (a->type != QB_AUTH_HMAC_SHA256)
		return true;
	return qbcf_hmac_keys(cx, path, m, "the request header that carries the signature",
						  (char **) &a->header, (char **) &a->prefix, &a->encoding);
}

/* qbcf_http_source: an http source's path (under inbox.basePath) and auth:. */
static bool
qbcf_http_source(QbcfCtx *cx, const char *path, const QbcfNode *m, QbSource *s)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *n;
	size_t		len;

	if ((n = qbcf_required(cx, path, m, "path",
						   "where the source answers under inbox.basePath, e.g. path: /stripe")) == NULL)
		return false;
	qbcf_path_key(sub, sizeof(sub), path, "path");
	if (!qbcf_string(cx, sub, n, true, &s->path) ||
		!qbcf_url_path(cx, sub, n, s->path, "path: /stripe"))
		return false;
	len = strlen(s->path);
	if (len < 2 || s->path[len - 1] == '/')
		return qbcf_error(cx, sub, n, "must name something after '/' and not end with '/', e.g. path: /stripe");
	if ((n = qbcf_get(m, "auth")) == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, "auth");
	return qbcf_auth(cx, sub, n, s);
}

const QbcfSourceType qbcf_source_http =
{
	.type = "http",
	.keys = qbcf_keys_http_source,
	.check = qbcf_http_source,
};
