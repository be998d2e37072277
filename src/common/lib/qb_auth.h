/*-------------------------------------------------------------------------
 * qb_auth.h
 *	  Source authentication for inbound webhooks: signature schemes over the
 *	  raw body, and bearer tokens.
 *
 * Wording:
 *	- A scheme is how a sender proves itself: hmac-sha256 (a header holding
 *	  HMAC-SHA256(secret, body), optionally prefixed, hex or base64), github
 *	  (X-Hub-Signature-256: sha256=<hex>), stripe (Stripe-Signature: t=..,
 *	  v1=.. over "t.body"), standard-webhooks (webhook-id, -timestamp,
 *	  -signature over "id.timestamp.body", whsec_ base64 secrets) and bearer
 *	  (Authorization: Bearer <token>).
 *	- Secrets: every HMAC scheme accepts any of several secrets, so a secret
 *	  can be rotated without a window of refusals.
 *
 * Rules: every comparison is constant time (CRYPTO_memcmp over digests of
 * equal length); a refusal's reason names the header and what was wrong and
 * never contains a secret, a signature or a token.
 *-------------------------------------------------------------------------
 */
#ifndef QB_AUTH_H
#define QB_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

typedef enum QbAuthType
{
	QB_AUTH_NONE,
	QB_AUTH_HMAC_SHA256,
	QB_AUTH_GITHUB,
	QB_AUTH_STRIPE,
	QB_AUTH_STANDARD_WEBHOOKS,
	QB_AUTH_BEARER
} QbAuthType;

typedef enum QbSigEncoding
{
	QB_SIG_HEX,
	QB_SIG_BASE64
} QbSigEncoding;

typedef struct QbAuth
{
	QbAuthType	type;
	const char *const *secrets; /* HMAC schemes: one or more */
	int			nsecrets;
	const char *header;			/* hmac-sha256: the signature header */
	const char *prefix;			/* hmac-sha256: e.g. "sha256=", or NULL */
	QbSigEncoding encoding;		/* hmac-sha256: hex (default) or base64 */
	long		tolerance_sec;	/* stripe, standard-webhooks: default 300 */
	const char *token;			/* bearer */
} QbAuth;

/* A request header by name, matched without regard to case; NULL if absent. */
typedef const char *(*QbHeaderGet) (void *ctx, const char *name);

/*
 * qb_auth_verify: true when the request is authentic.  now is the current
 * time in Unix seconds (a parameter, so tests can pin it).  On false, err
 * says which header and what was wrong.
 */
extern bool qb_auth_verify(const QbAuth *auth, QbHeaderGet get, void *ctx,
						   const unsigned char *body, size_t body_len, time_t now,
						   char *err, size_t errlen);

extern const char *qb_auth_type_name(QbAuthType t);

/*
 * qb_auth_secret_check: can this secret sign for the scheme?  A
 * standard-webhooks secret must be base64 (after an optional whsec_
 * prefix) of at most 384 bytes.  The message never repeats the secret.
 */
extern bool qb_auth_secret_check(QbAuthType t, const char *secret, char *err, size_t errlen);

#endif							/* QB_AUTH_H */
