/*-------------------------------------------------------------------------
 * qb_crypto.h
 *	  The primitives webhook signatures are made of, all from OpenSSL:
 *	  HMAC-SHA256 over several parts, hex and base64 text, and the key of a
 *	  Standard Webhooks secret (and a plain SHA-256, which names a
 *	  configuration document's version).
 *
 * Wording:
 *	- A whsec secret is what a Standard Webhooks sender shows its users:
 *	  "whsec_" followed by the base64 of the key.  The prefix is optional
 *	  (the spec's libraries accept the bare base64 too); the key is the
 *	  decoded bytes, never the text.
 *
 * Below both qb_auth.c (inbound verification) and qb_sign.c (outbound
 * signing), so that a signature is computed one way in either direction.
 * No function here keeps state or allocates.
 *-------------------------------------------------------------------------
 */
#ifndef QB_CRYPTO_H
#define QB_CRYPTO_H

#include <stdbool.h>
#include <stddef.h>

#define QB_HMAC_LEN		32		/* bytes of an HMAC-SHA256 */
#define QB_HMAC_HEX_LEN	64		/* its hex text, without the NUL */
#define QB_WHSEC_MAX	512		/* room for the largest whsec key accepted */

/*
 * qb_hmac_sha256: HMAC-SHA256 of the concatenated parts under key.  False
 * (out zeroed) when OpenSSL fails.
 */
extern bool qb_hmac_sha256(const unsigned char *key, size_t keylen,
						   const unsigned char *const *parts, const size_t *lens,
						   int nparts, unsigned char out[QB_HMAC_LEN]);

/*
 * qb_sha256_hex: lower-case hex of SHA-256(data) into out (65 bytes); false
 * (out empty) when OpenSSL fails.  Names a configuration document's
 * version (queuebox.config_source(), the config metrics).
 */
extern bool qb_sha256_hex(const void *data, size_t len, char out[QB_HMAC_HEX_LEN + 1]);

/* qb_hex_encode: lower-case hex of n bytes into out (2n + 1 bytes). */
extern void qb_hex_encode(const unsigned char *in, size_t n, char *out);

/* qb_hex_digit: the value of one hex digit (either case), or -1. */
extern int	qb_hex_digit(int c);

/* qb_b64_encode: standard padded base64 into out (4 * ceil(n / 3) + 1 bytes). */
extern void qb_b64_encode(const unsigned char *in, size_t n, char *out);

/*
 * qb_b64_decode: standard padded base64 into out (room for 3/4 of the
 * input's length); the decoded length, or -1 when in is not base64.
 */
extern int	qb_b64_decode(const char *in, unsigned char *out);

/*
 * qb_whsec_decode: the key of a whsec secret (see Wording) into out, which
 * has QB_WHSEC_MAX bytes; the key's length, or -1 when the text is not
 * base64, is empty or is too long.
 */
extern int	qb_whsec_decode(const char *secret, unsigned char out[QB_WHSEC_MAX]);

#endif							/* QB_CRYPTO_H */
