/*-------------------------------------------------------------------------
 * qb_auth.c
 *	  Signature and token checks for inbound webhooks (see qb_auth.h).
 *
 * Every check ends in qbau_same(): both sides are hashed with SHA-256 and the
 * digests compared with CRYPTO_memcmp, so neither the content nor the length
 * of a guess shows in the timing.  HMACs and base64 come from qb_crypto.c,
 * which outbound signing (qb_sign.c) shares.
 *-------------------------------------------------------------------------
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "qb_auth.h"
#include "qb_crypto.h"

#define QBA_MAX_SIGS 16

const char *
qb_auth_type_name(QbAuthType t)
{
	switch (t)
	{
		case QB_AUTH_NONE:
			return "none";
		case QB_AUTH_HMAC_SHA256:
			return "hmac-sha256";
		case QB_AUTH_GITHUB:
			return "github";
		case QB_AUTH_STRIPE:
			return "stripe";
		case QB_AUTH_STANDARD_WEBHOOKS:
			return "standard-webhooks";
		case QB_AUTH_BEARER:
			return "bearer";
	}
	return "?";
}

/* qbau_same: constant-time equality of two byte strings of any lengths. */
static bool
qbau_same(const void *a, size_t alen, const void *b, size_t blen)
{
	unsigned char da[SHA256_DIGEST_LENGTH];
	unsigned char db[SHA256_DIGEST_LENGTH];

	SHA256(a, alen, da);
	SHA256(b, blen, db);
	return CRYPTO_memcmp(da, db, sizeof(da)) == 0 && alen == blen;
}

/* qb_auth_secret_check: see qb_auth.h. */
bool
qb_auth_secret_check(QbAuthType t, const char *secret, char *err, size_t errlen)
{
	unsigned char key[QB_WHSEC_MAX];

	if (secret[0] == '\0')
	{
		snprintf(err, errlen, "a secret must not be empty");
		return false;
	}
	if (t != QB_AUTH_STANDARD_WEBHOOKS)
		return true;
	if (qb_whsec_decode(secret, key) <= 0)
	{
		snprintf(err, errlen,
				 "a standard-webhooks secret is whsec_ followed by base64 (as the sender shows it); this one is not valid base64");
		return false;
	}
	return true;
}

/*
 * qbau_match_any: does the candidate (already encoded as the sender encodes
 * it) equal the HMAC of the parts under any secret?  Every secret is
 * tried, whatever the outcome, so timing does not tell which one matched.
 */
static bool
qbau_match_any(const QbAuth *a, const unsigned char *const *parts, const size_t *lens,
			  int nparts, bool whsec, QbSigEncoding enc, const char *candidate)
{
	bool		ok = false;

	for (int i = 0; i < a->nsecrets; i++)
	{
		unsigned char key[QB_WHSEC_MAX];
		const unsigned char *k = (const unsigned char *) a->secrets[i];
		size_t		klen = strlen(a->secrets[i]);
		unsigned char mac[QB_HMAC_LEN];
		char		expect[QB_HMAC_HEX_LEN + 1];

		if (whsec)
		{
			int			n = qb_whsec_decode(a->secrets[i], key);

			if (n < 0)
				continue;
			k = key;
			klen = (size_t) n;
		}
		qb_hmac_sha256(k, klen, parts, lens, nparts, mac);
		if (enc == QB_SIG_HEX)
			qb_hex_encode(mac, sizeof(mac), expect);
		else
			qb_b64_encode(mac, sizeof(mac), expect);
		if (qbau_same(expect, strlen(expect), candidate, strlen(candidate)))
			ok = true;
	}
	return ok;
}

/* qbau_timestamp: parse a Unix-seconds header value and check the tolerance. */
static bool
qbau_timestamp(const QbAuth *a, const char *header, const char *value, time_t now,
			  char *err, size_t errlen)
{
	char	   *end = NULL;
	long long	t;
	long		tol = a->tolerance_sec > 0 ? a->tolerance_sec : 300;

	t = strtoll(value, &end, 10);
	if (end == value || *end != '\0')
	{
		snprintf(err, errlen, "%s: the timestamp is not a number of seconds", header);
		return false;
	}
	if (t < (long long) now - tol || t > (long long) now + tol)
	{
		/* unsigned: a timestamp near LLONG_MIN is as far as 2^63 s and more */
		unsigned long long away = t > now ?
			(unsigned long long) t - (unsigned long long) now :
			(unsigned long long) now - (unsigned long long) t;

		snprintf(err, errlen,
				 "%s: the signed timestamp is %llu s away from now, more than the tolerance of %ld s (a replay, or a clock out of sync)",
				 header, away, tol);
		return false;
	}
	return true;
}

static bool
qbau_hmac_header(const QbAuth *a, QbHeaderGet get, void *ctx,
				const unsigned char *body, size_t len, char *err, size_t errlen)
{
	const char *name = a->header ? a->header : "X-Signature";
	const char *v = get(ctx, name);
	const unsigned char *parts[1] = {body};
	size_t		lens[1] = {len};
	char		sig[256];
	size_t		plen = a->prefix ? strlen(a->prefix) : 0;

	if (v == NULL)
	{
		snprintf(err, errlen, "%s header missing: the sender must sign the body", name);
		return false;
	}
	if (plen > 0 && strncmp(v, a->prefix, plen) != 0)
	{
		snprintf(err, errlen, "%s: the value does not start with \"%s\"", name, a->prefix);
		return false;
	}
	v += plen;
	if (strlen(v) >= sizeof(sig))
	{
		snprintf(err, errlen, "%s: the signature is too long", name);
		return false;
	}
	strcpy(sig, v);
	if (a->encoding == QB_SIG_HEX)
		for (char *p = sig; *p; p++)
			*p = (char) tolower((unsigned char) *p);
	if (!qbau_match_any(a, parts, lens, 1, false, a->encoding, sig))
	{
		snprintf(err, errlen, "%s: the signature does not match the body under any configured secret", name);
		return false;
	}
	return true;
}

static bool
qbau_stripe(const QbAuth *a, QbHeaderGet get, void *ctx,
		   const unsigned char *body, size_t len, time_t now, char *err, size_t errlen)
{
	const char *name = "Stripe-Signature";
	const char *v = get(ctx, name);
	char		buf[2048];
	char	   *t = NULL;
	char	   *sigs[QBA_MAX_SIGS];
	int			nsigs = 0;
	char	   *save = NULL;
	bool		ok = false;

	if (v == NULL)
	{
		snprintf(err, errlen, "%s header missing", name);
		return false;
	}
	if (strlen(v) >= sizeof(buf))
	{
		snprintf(err, errlen, "%s: the header is too long", name);
		return false;
	}
	strcpy(buf, v);
	for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save))
	{
		while (*item == ' ')
			item++;
		if (strncmp(item, "t=", 2) == 0)
			t = item + 2;
		else if (strncmp(item, "v1=", 3) == 0 && nsigs < QBA_MAX_SIGS)
			sigs[nsigs++] = item + 3;
	}
	if (t == NULL || nsigs == 0)
	{
		snprintf(err, errlen, "%s: expected t=<timestamp> and at least one v1=<signature>", name);
		return false;
	}
	if (!qbau_timestamp(a, name, t, now, err, errlen))
		return false;
	{
		const unsigned char *parts[3] = {(const unsigned char *) t, (const unsigned char *) ".", body};
		size_t		lens[3] = {strlen(t), 1, len};

		for (int i = 0; i < nsigs; i++)
		{
			for (char *p = sigs[i]; *p; p++)
				*p = (char) tolower((unsigned char) *p);
			if (qbau_match_any(a, parts, lens, 3, false, QB_SIG_HEX, sigs[i]))
				ok = true;
		}
	}
	if (!ok)
		snprintf(err, errlen, "%s: no v1 signature matches the body under any configured secret", name);
	return ok;
}

static bool
qbau_standard(const QbAuth *a, QbHeaderGet get, void *ctx,
			 const unsigned char *body, size_t len, time_t now, char *err, size_t errlen)
{
	const char *id = get(ctx, "webhook-id");
	const char *ts = get(ctx, "webhook-timestamp");
	const char *sv = get(ctx, "webhook-signature");
	char		buf[2048];
	char	   *save = NULL;
	bool		ok = false;
	bool		any = false;

	if (id == NULL || ts == NULL || sv == NULL)
	{
		snprintf(err, errlen, "%s header missing: standard webhooks carry webhook-id, webhook-timestamp and webhook-signature",
				 id == NULL ? "webhook-id" : ts == NULL ? "webhook-timestamp" : "webhook-signature");
		return false;
	}
	if (!qbau_timestamp(a, "webhook-timestamp", ts, now, err, errlen))
		return false;
	if (strlen(sv) >= sizeof(buf))
	{
		snprintf(err, errlen, "webhook-signature: the header is too long");
		return false;
	}
	strcpy(buf, sv);
	{
		const unsigned char *parts[5] = {(const unsigned char *) id, (const unsigned char *) ".",
		(const unsigned char *) ts, (const unsigned char *) ".", body};
		size_t		lens[5] = {strlen(id), 1, strlen(ts), 1, len};

		for (char *item = strtok_r(buf, " ", &save); item; item = strtok_r(NULL, " ", &save))
		{
			if (strncmp(item, "v1,", 3) != 0)
				continue;
			any = true;
			if (qbau_match_any(a, parts, lens, 5, true, QB_SIG_BASE64, item + 3))
				ok = true;
		}
	}
	if (!any)
		snprintf(err, errlen, "webhook-signature: no v1,<base64> signature in the header");
	else if (!ok)
		snprintf(err, errlen, "webhook-signature: no v1 signature matches the body under any configured secret");
	return ok;
}

static bool
qbau_bearer(const QbAuth *a, QbHeaderGet get, void *ctx, char *err, size_t errlen)
{
	const char *v = get(ctx, "Authorization");
	const char *tok = a->token ? a->token : "";

	if (v == NULL)
	{
		snprintf(err, errlen, "Authorization header missing: send Authorization: Bearer <token>");
		return false;
	}
	if (strncasecmp(v, "Bearer ", 7) != 0)
	{
		snprintf(err, errlen, "Authorization: expected the Bearer scheme");
		return false;
	}
	v += 7;
	if (!qbau_same(v, strlen(v), tok, strlen(tok)) || tok[0] == '\0')
	{
		snprintf(err, errlen, "Authorization: the bearer token is not the configured one");
		return false;
	}
	return true;
}

bool
qb_auth_verify(const QbAuth *a, QbHeaderGet get, void *ctx,
			   const unsigned char *body, size_t len, time_t now,
			   char *err, size_t errlen)
{
	if (errlen > 0)
		err[0] = '\0';
	if (a == NULL || a->type == QB_AUTH_NONE)
		return true;
	if (a->type != QB_AUTH_BEARER && a->nsecrets < 1)
	{
		snprintf(err, errlen, "no secret is configured for %s", qb_auth_type_name(a->type));
		return false;
	}
	switch (a->type)
	{
		case QB_AUTH_HMAC_SHA256:
			return qbau_hmac_header(a, get, ctx, body, len, err, errlen);
		case QB_AUTH_GITHUB:
			{
				QbAuth		gh = *a;

				gh.header = "X-Hub-Signature-256";
				gh.prefix = "sha256=";
				gh.encoding = QB_SIG_HEX;
				return qbau_hmac_header(&gh, get, ctx, body, len, err, errlen);
			}
		case QB_AUTH_STRIPE:
			return qbau_stripe(a, get, ctx, body, len, now, err, errlen);
		case QB_AUTH_STANDARD_WEBHOOKS:
			return qbau_standard(a, get, ctx, body, len, now, err, errlen);
		case QB_AUTH_BEARER:
			return qbau_bearer(a, get, ctx, err, errlen);
		case QB_AUTH_NONE:
			break;
	}
	return true;
}
