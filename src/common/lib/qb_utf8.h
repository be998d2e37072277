/*-------------------------------------------------------------------------
 * qb_utf8.h
 *	  The UTF-8 check (qb_utf8.c).
 *-------------------------------------------------------------------------
 */
#ifndef QB_UTF8_H
#define QB_UTF8_H

#include <stddef.h>

/* Offset of the first byte that is not valid UTF-8 (or a NUL), or -1. */
extern long qb_utf8_invalid_at(const char *s, size_t len);

#endif							/* QB_UTF8_H */
