/*-------------------------------------------------------------------------
 * fuzz_auth_sig.h
 *	  The fixed secrets of the signature harnesses, and the "@SIG@" and
 *	  "@TOK@" placeholders that let a fuzzed header carry a signature that
 *	  matches (fuzz_auth, fuzz_ingress).
 *
 * Wording:
 *	- A placeholder is text in a header value the harness replaces before
 *	  the check: "@SIG@" by the signature of this request under the second
 *	  configured secret, in the scheme's encoding; "@TOK@" by the bearer
 *	  token.  Without them the fuzzer could never get past an HMAC.
 *	- The signed content is the scheme's: the body (hmac-sha256, github),
 *	  "t.body" with t the Stripe-Signature's last t= item (stripe), and
 *	  "id.timestamp.body" from the webhook-* headers (standard-webhooks).
 *
 * The MACs are computed here with OpenSSL's HMAC() and EVP_EncodeBlock, not
 * with qb_crypto.c, so the harness does not check the code against itself.
 *-------------------------------------------------------------------------
 */
#ifndef QB_FUZZ_AUTH_SIG_H
#define QB_FUZZ_AUTH_SIG_H

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "fuzz_common.h"
#include "qb_auth.h"

#define QBF_NOW		1764460800
#define QBF_TOKEN	"tok-fuzz-1234567890"
#define QBF_WHKEY	"standard-webhooks-key"	/* the second whsec secret's bytes */

static const char *const qbf_hmac_secrets[] = {"old-secret-fuzz", "s3cret-fuzz"};
static const char *const qbf_whsec_secrets[] = {"whsec_b3RoZXI=", "whsec_c3RhbmRhcmQtd2ViaG9va3Mta2V5"};

/* qbf_mac: HMAC-SHA256 of a . b . body (NULL parts skipped), hex or base64. */
static inline void
qbf_mac(const char *key, size_t keylen, const char *a, const char *b,
		const unsigned char *body, size_t blen, bool b64, char *out)
{
	unsigned char mac[EVP_MAX_MD_SIZE];
	unsigned int maclen = 0;
	size_t		alen = a ? strlen(a) + 1 : 0;
	size_t		bl = b ? strlen(b) + 1 : 0;
	unsigned char *msg = malloc(alen + bl + blen + 1);
	size_t		n = 0;

	if (msg == NULL)
		abort();
	if (a)
	{
		memcpy(msg, a, alen - 1);
		msg[alen - 1] = '.';
		n = alen;
	}
	if (b)
	{
		memcpy(msg + n, b, bl - 1);
		msg[n + bl - 1] = '.';
		n += bl;
	}
	if (blen)
		memcpy(msg + n, body, blen);
	n += blen;
	if (HMAC(EVP_sha256(), key, (int) keylen, msg, n, mac, &maclen) == NULL)
		abort();
	free(msg);
	if (b64)
		EVP_EncodeBlock((unsigned char *) out, mac, (int) maclen);
	else
		for (unsigned int i = 0; i < maclen; i++)
			sprintf(out + 2 * i, "%02x", mac[i]);
}

/* qbf_stripe_t: the last t= item of a Stripe-Signature value (malloc'd), or NULL. */
static inline char *
qbf_stripe_t(const char *v)
{
	char	   *buf = strdup(v);
	char	   *save = NULL;
	char	   *t = NULL;

	if (buf == NULL)
		abort();
	for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save))
	{
		while (*item == ' ')
			item++;
		if (strncmp(item, "t=", 2) == 0)
			t = item + 2;
	}
	t = t ? strdup(t) : NULL;
	free(buf);
	return t;
}

/*
 * qbf_expected_sig: the signature "@SIG@" stands for, for scheme t with
 * encoding enc; "" when the scheme signs nothing or lacks its headers.
 * out holds at least 128 bytes.
 */
static inline void
qbf_expected_sig(QbAuthType t, QbSigEncoding enc, QbfHeaders *h,
				 const unsigned char *body, size_t blen, char *out)
{
	const char *s = qbf_hmac_secrets[1];

	out[0] = '\0';
	switch (t)
	{
		case QB_AUTH_HMAC_SHA256:
			qbf_mac(s, strlen(s), NULL, NULL, body, blen, enc == QB_SIG_BASE64, out);
			break;
		case QB_AUTH_GITHUB:
			qbf_mac(s, strlen(s), NULL, NULL, body, blen, false, out);
			break;
		case QB_AUTH_STRIPE:
			{
				const char *v = qbf_headers_get(h, "Stripe-Signature");
				char	   *ts = v ? qbf_stripe_t(v) : NULL;

				if (ts)
					qbf_mac(s, strlen(s), ts, NULL, body, blen, false, out);
				free(ts);
				break;
			}
		case QB_AUTH_STANDARD_WEBHOOKS:
			{
				const char *id = qbf_headers_get(h, "webhook-id");
				const char *ts = qbf_headers_get(h, "webhook-timestamp");

				if (id && ts)
					qbf_mac(QBF_WHKEY, strlen(QBF_WHKEY), id, ts, body, blen, true, out);
				break;
			}
		default:
			break;
	}
}

/* qbf_replace: v with every "@SIG@" replaced by sig and "@TOK@" by the token (malloc'd). */
static inline char *
qbf_replace(const char *v, const char *sig)
{
	size_t		cap = strlen(v) * 32 + 1;
	char	   *out = malloc(cap);
	size_t		o = 0;

	if (out == NULL)
		abort();
	while (*v)
	{
		const char *with = NULL;

		if (strncmp(v, "@SIG@", 5) == 0)
			with = sig;
		else if (strncmp(v, "@TOK@", 5) == 0)
			with = QBF_TOKEN;
		if (with)
		{
			memcpy(out + o, with, strlen(with));
			o += strlen(with);
			v += 5;
		}
		else
			out[o++] = *v++;
	}
	out[o] = '\0';
	return out;
}

/*
 * qbf_sign_headers: replace the placeholders of every header value.  The
 * signature of a Stripe or standard-webhooks request depends on other
 * headers, which are replaced first (they hold no "@SIG@" of their own).
 */
static inline void
qbf_sign_headers(QbAuthType t, QbSigEncoding enc, QbfHeaders *h,
				 const unsigned char *body, size_t blen)
{
	char		sig[128];

	qbf_expected_sig(t, enc, h, body, blen, sig);
	for (int i = 0; i < h->n; i++)
	{
		char	   *v = qbf_replace(h->values[i], sig);

		free(h->values[i]);
		h->values[i] = v;
	}
}

/*
 * qbf_no_secret_in: a refusal's message never holds a secret, the token or
 * the signature that would have matched (qb_auth.h's rule).
 */
static inline void
qbf_no_secret_in(const char *err, QbAuthType t, QbSigEncoding enc, QbfHeaders *h,
				 const unsigned char *body, size_t blen)
{
	char		sig[128];

	for (int i = 0; i < 2; i++)
		if (strstr(err, qbf_hmac_secrets[i]) || strstr(err, qbf_whsec_secrets[i]))
			qbf_fail("a secret is in the message \"%s\"", err);
	if (strstr(err, QBF_TOKEN))
		qbf_fail("the token is in the message \"%s\"", err);
	qbf_expected_sig(t, enc, h, body, blen, sig);
	if (sig[0] && strstr(err, sig))
		qbf_fail("the signature is in the message \"%s\"", err);
}

#endif							/* QB_FUZZ_AUTH_SIG_H */
