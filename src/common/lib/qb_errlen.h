/*-------------------------------------------------------------------------
 * qb_errlen.h
 *	  The one size of an error-message buffer, for every layer: a function
 *	  that reports failure writes at most errlen bytes into its caller's
 *	  err, and a buffer meant for such a message (err, why, reason, a
 *	  last_error kept for context) is char[QB_ERRLEN].  A message that
 *	  wraps one in more words is QB_ERRLEN plus what it adds.  A callee
 *	  writes sizeof(buf) or the errlen it was given, never this constant.
 *-------------------------------------------------------------------------
 */
#ifndef QB_ERRLEN_H
#define QB_ERRLEN_H

#define QB_ERRLEN 512

#endif							/* QB_ERRLEN_H */
