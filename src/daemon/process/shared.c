/*-------------------------------------------------------------------------
 * shared.c
 *	  The block the supervisor shares with every role: the metrics and the
 *	  configuration document in force.
 *
 * Locking protocol (the document):
 *	- Only the supervisor writes.  It makes doc_gen odd, writes doc_len and
 *	  doc, then makes doc_gen even again (release stores), so a reader that
 *	  saw the same even generation before and after its copy has a whole
 *	  document.
 *	- A reader that sees an odd generation, or a different one after its
 *	  copy, copies again.  The supervisor writes a document in well under a
 *	  millisecond, so the retry loop sleeps 1 ms between tries.
 *	- The generation only grows: a role compares it with the generation it
 *	  last loaded to know that a reload is due.
 *
 * The metrics (QbMetrics) have their own protocol (qb_metrics.h: relaxed
 * atomic adds, slots taken by compare-and-swap), which holds across
 * processes because the block is one MAP_SHARED mapping made before the
 * first fork.
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

#include "qbd.h"

QbdShared *
qbd_shared_create(char *err, size_t errlen)
{
	void	   *p = mmap(NULL, sizeof(QbdShared), PROT_READ | PROT_WRITE,
						 MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
	{
		snprintf(err, errlen, "could not map %zu bytes of shared memory: %s",
				 sizeof(QbdShared), strerror(errno));
		return NULL;
	}
	/* a fresh anonymous mapping is zero: metrics empty, no document (gen 0) */
	return (QbdShared *) p;
}

void
qbd_shared_publish(QbdShared *sh, const char *doc, size_t len)
{
	uint64_t	g = __atomic_load_n(&sh->doc_gen, __ATOMIC_RELAXED);

	if (len > QBD_DOC_MAX)
		len = QBD_DOC_MAX;		/* qbd_config_read refuses longer files */
	__atomic_store_n(&sh->doc_gen, g + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memcpy(sh->doc, doc, len);
	sh->doc_len = len;
	__atomic_store_n(&sh->doc_gen, g + 2, __ATOMIC_RELEASE);
}

uint64_t
qbd_shared_gen(const QbdShared *sh)
{
	return __atomic_load_n(&sh->doc_gen, __ATOMIC_ACQUIRE);
}

char *
qbd_shared_read(QbdShared *sh, uint64_t *gen)
{
	for (;;)
	{
		uint64_t	g1 = __atomic_load_n(&sh->doc_gen, __ATOMIC_ACQUIRE);
		size_t		len;
		char	   *copy;

		if (g1 == 0)
		{
			*gen = 0;
			return NULL;
		}
		if ((g1 & 1) == 0)
		{
			len = sh->doc_len;
			if (len > QBD_DOC_MAX)
				len = QBD_DOC_MAX;
			if ((copy = malloc(len + 1)) == NULL)
				return NULL;
			memcpy(copy, sh->doc, len);
			copy[len] = '\0';
			__atomic_thread_fence(__ATOMIC_ACQUIRE);
			if (__atomic_load_n(&sh->doc_gen, __ATOMIC_RELAXED) == g1)
			{
				*gen = g1;
				return copy;
			}
			free(copy);
		}
		nanosleep(&(struct timespec) {0, 1000000}, NULL);
	}
}
