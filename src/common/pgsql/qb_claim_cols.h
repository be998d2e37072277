/*-------------------------------------------------------------------------
 * qb_claim_cols.h
 *	  The columns of a claim row, in the order every store's claim returns
 *	  them: QB_PG_OUTBOX_CLAIM and QB_PG_OUTBOX_PROMOTE (the SPI and libpq
 *	  stores), and the last result set of SQL Server's
 *	  queuebox._outbox_cycle (the ODBC store).  Numbered from 0; SPI's
 *	  attribute numbers are these plus 1.
 *-------------------------------------------------------------------------
 */
#ifndef QB_CLAIM_COLS_H
#define QB_CLAIM_COLS_H

typedef enum QbClaimCol
{
	QB_CLAIM_COL_ID,			/* int8 */
	QB_CLAIM_COL_MESSAGE_ID,	/* uuid */
	QB_CLAIM_COL_TOPIC,			/* text */
	QB_CLAIM_COL_KEY,			/* text, NULL: no key */
	QB_CLAIM_COL_PAYLOAD,		/* JSON text */
	QB_CLAIM_COL_HEADERS,		/* JSON text */
	QB_CLAIM_COL_ATTEMPT,		/* int4 */
	QB_CLAIM_COL_MAX_ATTEMPTS,	/* int4, the default when the row has none */
	QB_CLAIM_COL_CREATED_EPOCH, /* float8 seconds */
	QB_CLAIM_COL_CLAIMED,		/* bool: false, parked or moved */
	QB_CLAIM_COL_DESTINATION,	/* text, NULL: not routed */
	QB_CLAIM_COL_IN_INTAKE,		/* bool */
	QB_CLAIM_COL_NOT_DUE,		/* bool */
	QB_CLAIM_COL_PROBE,			/* bool */
	QB_CLAIM_NCOLS
} QbClaimCol;

#endif							/* QB_CLAIM_COLS_H */
