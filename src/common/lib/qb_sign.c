/*-------------------------------------------------------------------------
 * qb_sign.c
 *	  Outbound signing of http requests (see qb_sign.h).
 *
 * One signature per key, each HMAC-SHA256 through qb_crypto.c (the same
 * code that verifies inbound signatures in qb_auth.c).  The header values
 * are built in one malloc'd buffer per request and handed to the caller's
 * add(), which copies them.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>

#include "qb_crypto.h"
#include "qb_sign.h"

bool
qb_sign_key(QbAuthType t, const char *secret, QbSignKey *out, char *err, size_t errlen)
{
	unsigned char key[QB_WHSEC_MAX];
	const unsigned char *src = (const unsigned char *) secret;
	int			n = (int) strlen(secret);

	out->bytes = NULL;
	out->len = 0;
	if (!qb_auth_secret_check(t, secret, err, errlen))
		return false;
	if (t == QB_AUTH_STANDARD_WEBHOOKS)
	{
		n = qb_whsec_decode(secret, key);
		src = key;
	}
	if (n > 0 && (out->bytes = malloc(n)) != NULL)
	{
		memcpy(out->bytes, src, n);
		out->len = (size_t) n;
	}
	OPENSSL_cleanse(key, sizeof(key));
	if (out->bytes == NULL)
		snprintf(err, errlen, "out of memory");
	return out->bytes != NULL;
}

/*
 * qbsg_join: the MAC of the parts under every key, each as lead + encoded
 * MAC, joined by sep; malloc'd, NULL on failure.
 */
static char *
qbsg_join(const QbSigning *s, const unsigned char *const *parts, const size_t *lens,
		 int nparts, const char *lead, QbSigEncoding enc, const char *sep)
{
	size_t		one = strlen(lead) + strlen(sep) + QB_HMAC_HEX_LEN;
	char	   *out = malloc(one * (size_t) s->nkeys + 1);
	char	   *p = out;

	if (out == NULL)
		return NULL;
	for (int i = 0; i < s->nkeys; i++)
	{
		unsigned char mac[QB_HMAC_LEN];

		if (!qb_hmac_sha256(s->keys[i].bytes, s->keys[i].len, parts, lens, nparts, mac))
		{
			free(out);
			return NULL;
		}
		p += sprintf(p, "%s%s", i > 0 ? sep : "", lead);
		if (enc == QB_SIG_HEX)
			qb_hex_encode(mac, sizeof(mac), p);
		else
			qb_b64_encode(mac, sizeof(mac), p);
		p += strlen(p);
	}
	*p = '\0';
	return out;
}

bool
qb_sign_request(const QbSigning *s, const char *message_id, long long timestamp,
				const char *body, size_t body_len, QbSignAdd add, void *ctx,
				char *err, size_t errlen)
{
	const unsigned char *body_bytes = (const unsigned char *) body;
	char		ts[24];
	char	   *value;
	bool		ok;

	if (s == NULL || s->type == QB_AUTH_NONE)
		return true;
	if (s->type == QB_AUTH_STANDARD_WEBHOOKS)
	{
		const unsigned char *parts[5] = {(const unsigned char *) message_id,
			(const unsigned char *) ".", (const unsigned char *) ts,
		(const unsigned char *) ".", body_bytes};
		size_t		lens[5] = {strlen(message_id), 1, 0, 1, body_len};

		snprintf(ts, sizeof(ts), "%lld", timestamp);
		lens[2] = strlen(ts);
		if ((value = qbsg_join(s, parts, lens, 5, "v1,", QB_SIG_BASE64, " ")) == NULL)
		{
			snprintf(err, errlen, "webhook-signature: could not compute the signature (out of memory or OpenSSL failed)");
			return false;
		}
		ok = add(ctx, "webhook-id", message_id) &&
			add(ctx, "webhook-timestamp", ts) &&
			add(ctx, "webhook-signature", value);
		if (!ok)
			snprintf(err, errlen, "webhook-signature: the signature headers could not be added (out of memory)");
	}
	else
	{
		const unsigned char *parts[1] = {body_bytes};
		size_t		lens[1] = {body_len};

		if ((value = qbsg_join(s, parts, lens, 1, s->prefix ? s->prefix : "",
							  s->encoding, ", ")) == NULL)
		{
			snprintf(err, errlen, "%s: could not compute the signature (out of memory or OpenSSL failed)",
					 s->header);
			return false;
		}
		ok = add(ctx, s->header, value);
		if (!ok)
			snprintf(err, errlen, "%s: the signature header could not be added (out of memory)",
					 s->header);
	}
	free(value);
	return ok;
}

bool
qb_sign_sets(const QbSigning *s, const char *name)
{
	if (s == NULL)
		return false;
	switch (s->type)
	{
		case QB_AUTH_STANDARD_WEBHOOKS:
			return strcasecmp(name, "webhook-id") == 0 ||
				strcasecmp(name, "webhook-timestamp") == 0 ||
				strcasecmp(name, "webhook-signature") == 0;
		case QB_AUTH_HMAC_SHA256:
			return s->header != NULL && strcasecmp(name, s->header) == 0;
		default:
			break;
	}
	return false;
}
