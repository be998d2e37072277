/*-------------------------------------------------------------------------
 * qb_src_amqp_int.h
 *	  qb_src_amqp.c's headers table to JSON, exposed so it can be tested
 *	  without a broker.
 *
 * Internal: for the module itself and its tests and fuzz harnesses
 * (test/fuzz); no other module includes it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_SRC_AMQP_INT_H
#define QB_SRC_AMQP_INT_H

#include <stdbool.h>

#include <amqp.h>

/*
 * qbsa_headers: the headers table of a message's properties as JSON object
 * text (malloc'd), NULL when it has none; *oom set when NULL means out of
 * memory.  Strings go as they are, numbers and booleans as their text;
 * void, decimal, table and array values are left out, and so is a header
 * whose name or string value is not UTF-8 or holds a NUL (no JSON string,
 * or none PostgreSQL's jsonb takes).
 */
extern char *qbsa_headers(const amqp_basic_properties_t *p, bool *oom);

#endif							/* QB_SRC_AMQP_INT_H */
