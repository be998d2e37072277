/*-------------------------------------------------------------------------
 * qb_sign.h
 *	  Outbound signing: the headers an http destination's requests carry so
 *	  that the receiver can tell they come from us, unchanged.
 *
 * Wording:
 *	- A scheme (destinations.<name>.signing.type) is one of
 *	  standard-webhooks (webhook-id, webhook-timestamp and webhook-signature
 *	  "v1,<base64>" over "<id>.<timestamp>.<body>", whsec_ secrets) and
 *	  hmac-sha256 (one header of the destination's choosing holding
 *	  prefix + hex or base64 of HMAC-SHA256(secret, body)).
 *	- A key is a secret as the HMAC uses it: a whsec secret's decoded bytes,
 *	  an hmac-sha256 secret's own bytes.  Keys are made once, when the
 *	  document is validated, never per request.
 *	- Rotation: with several secrets every request carries one signature
 *	  per key, in the document's order (standard-webhooks: space-separated
 *	  in webhook-signature; hmac-sha256: joined by ", " in the one header),
 *	  so a receiver holding either the old or the new secret accepts it.
 *
 * Rules: the body signed is the body sent, byte for byte; a key is never
 * written to a message or a log.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SIGN_H
#define QB_SIGN_H

#include <stdbool.h>
#include <stddef.h>

#include "qb_auth.h"

typedef struct QbSignKey
{
	unsigned char *bytes;
	size_t		len;
} QbSignKey;

/* A destination's signing: its keys and strings are the configuration's (its arena wipes them). */
typedef struct QbSigning
{
	QbAuthType	type;			/* QB_AUTH_NONE (no signing:),
								 * QB_AUTH_STANDARD_WEBHOOKS or
								 * QB_AUTH_HMAC_SHA256 */
	QbSignKey  *keys;			/* one per secret, in document order */
	int			nkeys;
	char	   *header;			/* hmac-sha256: the header it sets */
	char	   *prefix;			/* hmac-sha256: before each value, or NULL */
	QbSigEncoding encoding;		/* hmac-sha256: hex (default) or base64 */
} QbSigning;

/* Adds one request header; false when it cannot (too long, no memory). */
typedef bool (*QbSignAdd) (void *ctx, const char *name, const char *value);

/*
 * qb_sign_key: the key of one secret for scheme t into *out (malloc'd).
 * A standard-webhooks secret is whsec_ + base64, or the bare base64.  On
 * false, err says why without repeating the secret.
 */
extern bool qb_sign_key(QbAuthType t, const char *secret, QbSignKey *out,
						char *err, size_t errlen);

/*
 * qb_sign_request: hand the signature headers of one request to add:
 * message_id is the row's message id (X-Message-Id), timestamp the Unix
 * seconds at send time, body the bytes sent.  Nothing for QB_AUTH_NONE.
 * On false (OpenSSL or add failed), err says which header.
 */
extern bool qb_sign_request(const QbSigning *s, const char *message_id, long long timestamp,
							const char *body, size_t body_len, QbSignAdd add, void *ctx,
							char *err, size_t errlen);

/* qb_sign_sets: is name (any letter case) a header the scheme sets? */
extern bool qb_sign_sets(const QbSigning *s, const char *name);

#endif							/* QB_SIGN_H */
