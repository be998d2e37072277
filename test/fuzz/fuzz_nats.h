/*-------------------------------------------------------------------------
 * fuzz_nats.h
 *	  The natsMsg the NATS conversions of fuzz_publish, fuzz_ingress and
 *	  fuzz_broker_headers write headers into.
 *-------------------------------------------------------------------------
 */
#ifndef QB_FUZZ_NATS_H
#define QB_FUZZ_NATS_H

#include <stdlib.h>
#include <string.h>

#include <nats/nats.h>

/*
 * qbf_nats_msg: one natsMsg kept for the process, its headers cleared.  A
 * natsMsg_Destroy hands the message to cnats's garbage collector thread, so
 * an input would end with more allocations than frees and libFuzzer would
 * run LeakSanitizer after every one (50 times slower).
 */
static inline natsMsg *
qbf_nats_msg(void)
{
	static natsMsg *m;
	const char **keys = NULL;
	int			n = 0;

	if (m == NULL && natsMsg_Create(&m, "in.subject", NULL, "{}", 2) != NATS_OK)
		abort();
	if (natsMsgHeader_Keys(m, &keys, &n) == NATS_OK)
	{
		/* copies: deleting a key frees its string */
		char	  **copy = calloc(n, sizeof(char *));

		for (int i = 0; i < n; i++)
			copy[i] = strdup(keys[i]);
		free((void *) keys);
		for (int i = 0; i < n; i++)
		{
			natsMsgHeader_Delete(m, copy[i]);
			free(copy[i]);
		}
		free(copy);
	}
	return m;
}

#endif							/* QB_FUZZ_NATS_H */
