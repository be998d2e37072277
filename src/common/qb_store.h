/*-------------------------------------------------------------------------
 * qb_store.h
 *	  The store interface: every way the engines touch the database.
 *
 * Wording:
 *	- A claim moves due pending rows to processing under one claim token and
 *	  a lease; a settle ends a claim (sent, retry, dead, release), fenced by
 *	  that token so a stale worker changes nothing.
 *	- release puts a claimed row back to pending without spending an attempt
 *	  (used when a worker stops mid-batch).
 *
 * Transaction rules: each call is one short transaction of its own, committed
 * before it returns.  No call is ever made while network I/O is in flight on
 * the same rows' behalf, so no transaction spans a publish.  A store never
 * longjmps into the core: errors come back as -1 with a message in err.
 *
 *	- The relay's claim moves push inbox rows to processing the same way;
 *	  its forward writes their outbox rows and settles them (processed, or
 *	  dead for an empty topic) in one transaction, fenced by the token.
 *
 * Memory: rows returned by outbox_claim and relay_claim are malloc'd by the
 * store and freed by the caller with qb_outbox_rows_free() and
 * qb_relay_rows_free().
 *-------------------------------------------------------------------------
 */
#ifndef QB_STORE_H
#define QB_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QB_UUID_LEN 36

typedef struct QbOutboxRow
{
	int64_t		id;
	char		message_id[QB_UUID_LEN + 1];
	char	   *topic;
	char	   *key;			/* NULL: takes part in no ordering */
	char	   *payload;		/* JSON text */
	size_t		payload_len;
	char	   *headers;		/* JSON object text */
	int			attempt;		/* attempts made before this claim */
	int			max_attempts;	/* the row's, or outbox.maxAttempts */
} QbOutboxRow;

/* A push inbox row the relay claimed: what the topic template needs. */
typedef struct QbRelayRow
{
	int64_t		id;
	char	   *source;
	char	   *event_type;		/* NULL: the message carries none */
} QbRelayRow;

typedef enum QbSettleKind
{
	QB_SETTLE_SENT,
	QB_SETTLE_RETRY,
	QB_SETTLE_DEAD,
	QB_SETTLE_RELEASE
} QbSettleKind;

typedef struct QbSettle
{
	int64_t		id;
	QbSettleKind kind;
	int			attempt;		/* the row's attempt after this outcome */
	long		delay_ms;		/* RETRY: scheduled_at = now() + delay */
	const char *error;			/* last_error; NULL for SENT */
} QbSettle;

typedef struct QbStore
{
	void	   *ctx;

	/* The raw configuration document, malloc'd, or NULL when none is stored. */
	int			(*config_load) (void *ctx, char **text, char *err, size_t errlen);

	int			(*outbox_claim) (void *ctx, int batch_size, long lease_ms,
								 int default_max_attempts, const char *token,
								 QbOutboxRow **rows, int *nrows,
								 char *err, size_t errlen);
	int			(*outbox_settle) (void *ctx, const char *token,
								  const QbSettle *settles, int n,
								  int *nchanged, char *err, size_t errlen);
	/* processing rows whose lease expired go back to pending */
	int			(*outbox_reclaim) (void *ctx, int limit, int *nreclaimed,
								   char *err, size_t errlen);
	/* delete up to limit sent rows created more than retention_sec ago */
	int			(*outbox_retention) (void *ctx, long retention_sec, int limit,
									 int *ndeleted, char *err, size_t errlen);

	/* claim up to batch_size push inbox rows under token with a lease */
	int			(*relay_claim) (void *ctx, int batch_size, long lease_ms,
								const char *token, QbRelayRow **rows, int *nrows,
								char *err, size_t errlen);

	/*
	 * Forward claimed rows: topics[i] is the rendered topic of ids[i] ("" :
	 * dead).  One transaction.  *nsettled is the inbox rows settled (fewer
	 * than n when a lease was taken over), *ninserted the outbox rows.
	 */
	int			(*relay_forward) (void *ctx, const char *token, const int64_t *ids,
								  const char *const *topics, int n, int max_attempts,
								  int *nsettled, int *ninserted,
								  char *err, size_t errlen);
} QbStore;

extern void qb_outbox_rows_free(QbOutboxRow *rows, int n);
extern void qb_relay_rows_free(QbRelayRow *rows, int n);

/* A random (version 4) UUID in canonical text form, from OpenSSL RAND_bytes. */
extern bool qb_uuid_v4(char out[QB_UUID_LEN + 1]);

#endif							/* QB_STORE_H */
