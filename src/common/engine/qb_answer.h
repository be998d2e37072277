/*-------------------------------------------------------------------------
 * qb_answer.h
 *	  The JSON answers of the HTTP routes (qb_answer.c).
 *-------------------------------------------------------------------------
 */
#ifndef QB_ANSWER_H
#define QB_ANSWER_H

/* {"status":..., "reason":...} as malloc'd JSON text; reason NULL: none. */
extern char *qb_answer(const char *status, const char *reason);

#endif							/* QB_ANSWER_H */
