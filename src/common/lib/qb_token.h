/*-------------------------------------------------------------------------
 * qb_token.h
 *	  HTTP field syntax (qb_token.c): what a header name and value may hold
 *	  (RFC 9110 5.1 and 5.5).
 *-------------------------------------------------------------------------
 */
#ifndef QB_TOKEN_H
#define QB_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

/*
 * Offset of the first byte of name that is not a tchar (letters, digits and
 * !#$%&'*+-.^_`|~), 0 for an empty name, or -1 when name is a token.
 */
extern long qb_token_invalid_at(const char *name);

/* Offset of the first control character of value other than tab, or -1. */
extern long qb_field_value_invalid_at(const char *value);

/* name is a token and value has no control character but tab */
extern bool qb_header_valid(const char *name, const char *value);

/*
 * name (up to max bytes) into buf with every byte outside printable ASCII
 * written \xNN: a received name quoted in an error message.
 */
extern void qb_token_printable(char *buf, size_t len, const char *name, size_t max);

#endif							/* QB_TOKEN_H */
