/*-------------------------------------------------------------------------
 * qb_util.c
 *	  Small shared helpers of the core: UUIDs, logging through the host,
 *	  freeing claimed rows.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include <openssl/rand.h>

#include "qb_host.h"
#include "qb_store.h"

/*
 * qb_uuid_v4 writes a random UUID.  Claim tokens must be unguessable by
 * another claimer, so they come from OpenSSL's CSPRNG, not from rand().
 */
bool
qb_uuid_v4(char out[QB_UUID_LEN + 1])
{
	unsigned char b[16];

	if (RAND_bytes(b, sizeof(b)) != 1)
		return false;
	b[6] = (b[6] & 0x0f) | 0x40;
	b[8] = (b[8] & 0x3f) | 0x80;
	snprintf(out, QB_UUID_LEN + 1,
			 "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
			 b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
			 b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
	return true;
}

/* qb_log formats a message and hands it to the host's logger. */
void
qb_log(const QbHost *host, QbLogLevel level, const char *fmt,...)
{
	char		buf[1024];
	va_list		ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	host->log(host->ctx, level, buf);
}

/* qb_outbox_rows_free frees what a store's outbox_claim returned. */
void
qb_outbox_rows_free(QbOutboxRow *rows, int n)
{
	if (rows == NULL)
		return;
	for (int i = 0; i < n; i++)
	{
		free(rows[i].topic);
		free(rows[i].key);
		free(rows[i].payload);
		free(rows[i].headers);
	}
	free(rows);
}
