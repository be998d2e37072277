/*-------------------------------------------------------------------------
 * qb_config_arena.c
 *	  The arena: a chunked bump allocator.  Everything a QbConfig holds
 *	  (the struct itself, its arrays and strings, the signing keys) comes
 *	  from the config's arena, and qb_config_free frees the arena: a field
 *	  added to the model needs no line in any free.  The parser's tree and
 *	  its temporaries use a second arena, freed when the parse ends.
 *
 * Wording:
 *	- chunk: one malloc'd block; allocations are cut from it in order and
 *	  never freed one by one.  A request larger than a quarter of the next
 *	  chunk gets a chunk of its own, so little is wasted at a chunk's end.
 *	- release: a handle the arena does not allocate but owns (a compiled jq
 *	  transform, qbcf_arena_own), released when the arena is freed, newest
 *	  first.
 *
 * Memory rules: an arena is used by one thread at a time, like the config
 * it builds.  Each chunk is wiped before it is freed: a config holds
 * secrets (auth secrets and tokens, signing keys, URL passwords), and they
 * should not linger in freed memory.
 *-------------------------------------------------------------------------
 */
#include <stdalign.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "qb_config_int.h"

#define QBCF_CHUNK_MIN	4096	/* a small document fits in one or two */
#define QBCF_CHUNK_MAX	65536

typedef struct QbcfChunk QbcfChunk;
struct QbcfChunk
{
	QbcfChunk  *next;
	size_t		size;			/* bytes of data[] */
	size_t		used;
	alignas(max_align_t) unsigned char data[];
};

typedef struct QbcfRelease QbcfRelease;
struct QbcfRelease
{
	QbcfRelease *next;
	void		(*release) (void *handle);
	void	   *handle;
};

struct QbcfArena
{
	QbcfChunk  *chunks;			/* newest first: allocations come from the head */
	QbcfRelease *releases;		/* newest first */
	size_t		next_size;		/* the next chunk's size: doubles up to the max */
};

/* qbcf_arena_new: an empty arena, or NULL when out of memory. */
QbcfArena *
qbcf_arena_new(void)
{
	QbcfArena  *a = calloc(1, sizeof(QbcfArena));

	if (a != NULL)
		a->next_size = QBCF_CHUNK_MIN;
	return a;
}

/* qbcf_chunk_add: a new chunk of at least size bytes, as the head. */
static QbcfChunk *
qbcf_chunk_add(QbcfArena *a, size_t size)
{
	QbcfChunk  *c;

	if (size > SIZE_MAX - sizeof(QbcfChunk))
		return NULL;
	if ((c = malloc(sizeof(QbcfChunk) + size)) == NULL)
		return NULL;
	c->size = size;
	c->used = 0;
	c->next = a->chunks;
	a->chunks = c;
	return c;
}

/* qbcf_arena_alloc: n zeroed bytes aligned for any type, or NULL. */
void *
qbcf_arena_alloc(QbcfArena *a, size_t n)
{
	const size_t align = alignof(max_align_t);
	QbcfChunk  *c = a->chunks;
	void	   *p;

	if (n == 0)
		n = 1;
	if (n > SIZE_MAX - align)
		return NULL;
	n = (n + align - 1) & ~(align - 1);
	if (c == NULL || c->size - c->used < n)
	{
		if (n > a->next_size / 4)
		{
			/* a chunk of its own, behind the head, whose free space stays usable */
			QbcfChunk  *head = a->chunks;

			if ((c = qbcf_chunk_add(a, n)) == NULL)
				return NULL;
			if (head != NULL)
			{
				a->chunks = head;
				c->next = head->next;
				head->next = c;
			}
		}
		else
		{
			if ((c = qbcf_chunk_add(a, a->next_size)) == NULL)
				return NULL;
			if (a->next_size < QBCF_CHUNK_MAX)
				a->next_size *= 2;
		}
	}
	p = c->data + c->used;
	c->used += n;
	memset(p, 0, n);
	return p;
}

/* qbcf_arena_memdup: a copy of n bytes, or NULL. */
void *
qbcf_arena_memdup(QbcfArena *a, const void *src, size_t n)
{
	void	   *p = qbcf_arena_alloc(a, n);

	if (p != NULL && n > 0)
		memcpy(p, src, n);
	return p;
}

/* qbcf_arena_strndup: the first n bytes of s (at most strlen) and a NUL. */
char *
qbcf_arena_strndup(QbcfArena *a, const char *s, size_t n)
{
	size_t		len = strnlen(s, n);
	char	   *p = qbcf_arena_alloc(a, len + 1);

	if (p != NULL)
		memcpy(p, s, len);		/* the NUL is the alloc's zero */
	return p;
}

/* qbcf_arena_strdup: a copy of s, or NULL. */
char *
qbcf_arena_strdup(QbcfArena *a, const char *s)
{
	return qbcf_arena_strndup(a, s, strlen(s));
}

/*
 * qbcf_arena_own: release(handle) when the arena is freed.  When that
 * cannot be recorded (out of memory) the handle is released now and false
 * returned, so the caller never holds a handle nobody will release.
 */
bool
qbcf_arena_own(QbcfArena *a, void (*release) (void *handle), void *handle)
{
	QbcfRelease *r = qbcf_arena_alloc(a, sizeof(QbcfRelease));

	if (r == NULL)
	{
		release(handle);
		return false;
	}
	r->release = release;
	r->handle = handle;
	r->next = a->releases;
	a->releases = r;
	return true;
}

/* qbcf_arena_free: the releases, then every chunk, wiped; NULL is fine. */
void
qbcf_arena_free(QbcfArena *a)
{
	if (a == NULL)
		return;
	for (QbcfRelease *r = a->releases; r != NULL; r = r->next)
		r->release(r->handle);
	while (a->chunks != NULL)
	{
		QbcfChunk  *c = a->chunks;

		a->chunks = c->next;
		explicit_bzero(c->data, c->used);
		free(c);
	}
	free(a);
}
