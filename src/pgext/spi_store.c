/*-------------------------------------------------------------------------
 * spi_store.c
 *	  The SPI store: the core's QbStore over SPI inside a background worker.
 *
 * Transaction rules: every store call is one transaction of its own
 * (StartTransactionCommand ... CommitTransactionCommand) holding one
 * statement from qb_sql_pg.h, the one copy of the SQL for every host (the
 * SQL-callable queuebox._outbox_claim() and friends run the same text).
 * Plans are prepared once per process and kept.
 *
 * Errors: each call runs inside PG_TRY.  An ERROR (the extension was
 * dropped, a lock timeout, the database shutting down) aborts the
 * transaction and comes back as -1 with the message; the core never sees a
 * longjmp, so its malloc'd state is never abandoned.  Results are copied
 * into malloc'd memory before commit.
 *
 * Takeover: with outbox.takeover (inbox.relay.takeover for the relay) the
 * worker takes a session advisory lock on a random claimer id once and
 * records that id on every row it claims (qb_sql_pg.h, "Takeover").  The
 * lock lives as long as the worker's backend: when the worker exits, or
 * the postmaster restarts, it is gone and the rows are taken over at once.
 * Why no more than that: every claimer of this database lives inside this
 * one postmaster, so its lock table already knows who runs; the launcher
 * need not say.
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "access/table.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "nodes/makefuncs.h"
#include "pgstat.h"
#include "storage/bufmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timeout.h"

#include "qb_pg.h"
#include "qb_pg_stmt.h"

/* the saved plan of each statement, prepared on first use */
static SPIPlanPtr qbs_plans[QB_PG_NSTMTS];
static BlockNumber qbs_fit_blocks = 0;	/* the outbox's size when the plans were last fitted */
static Oid	qbs_outbox_relid = InvalidOid;

/* the id this worker's session holds the lock of (0: none yet), and whether claims record it */
static int64 qbs_claimer_id;
static bool qbs_takeover;

/* the claimer a claim records: 0 records none */
static int64
qbs_claimer(void)
{
	return qbs_takeover ? qbs_claimer_id : 0;
}

/* Each QbPgType as SPI takes it, and an array type's element type. */
static const Oid qbs_oids[QB_PG_NTYPES] = {
	[QB_PG_T_NONE] = InvalidOid,
	[QB_PG_T_BOOL] = BOOLOID,
	[QB_PG_T_INT4] = INT4OID,
	[QB_PG_T_INT8] = INT8OID,
	[QB_PG_T_TEXT] = TEXTOID,
	[QB_PG_T_UUID] = UUIDOID,
	[QB_PG_T_TIMESTAMPTZ] = TIMESTAMPTZOID,
	[QB_PG_T_BOOL_ARRAY] = BOOLARRAYOID,
	[QB_PG_T_INT4_ARRAY] = INT4ARRAYOID,
	[QB_PG_T_INT8_ARRAY] = INT8ARRAYOID,
	[QB_PG_T_TEXT_ARRAY] = TEXTARRAYOID,
	[QB_PG_T_UUID_ARRAY] = UUIDARRAYOID,
};

static const Oid qbs_elem_oids[QB_PG_NTYPES] = {
	[QB_PG_T_BOOL_ARRAY] = BOOLOID,
	[QB_PG_T_INT4_ARRAY] = INT4OID,
	[QB_PG_T_INT8_ARRAY] = INT8OID,
	[QB_PG_T_TEXT_ARRAY] = TEXTOID,
	[QB_PG_T_UUID_ARRAY] = UUIDOID,
};

/*
 * qb_spi_stmt_types fills types[0..nparams-1] with the OIDs of statement
 * id's parameters (qb_pg_stmts); returns nparams.
 */
int
qb_spi_stmt_types(QbPgStmtId id, Oid *types)
{
	const QbPgStmt *st = &qb_pg_stmts[id];

	for (int i = 0; i < st->nparams; i++)
		types[i] = qbs_oids[st->params[i]];
	return st->nparams;
}

/* qb_int8_array: a one-dimensional bigint[] of n elements. */
ArrayType *
qb_int8_array(Datum *elems, int n)
{
	return construct_array(elems, n, INT8OID, 8, FLOAT8PASSBYVAL, TYPALIGN_DOUBLE);
}

/* qb_text_array: a one-dimensional text[] of n elements (no NULLs). */
ArrayType *
qb_text_array(Datum *elems, int n)
{
	return construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT);
}

/* qbs_begin opens the call's transaction and SPI; activity names the call. */
static void
qbs_begin(const char *activity)
{
	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, activity);
}

static void
qbs_commit(void)
{
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	/* no transaction is open while requests are in flight: show it */
	pgstat_report_activity(STATE_IDLE, NULL);
}

/*
 * qbs_fail turns the current error into err and rolls the transaction back;
 * returns the error's SQLSTATE.
 */
static int
qbs_fail(MemoryContext cxt, char *err, size_t errlen)
{
	ErrorData  *edata;
	int			code;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	snprintf(err, errlen, "%s", edata->message);
	code = edata->sqlerrcode;
	FreeErrorData(edata);
	AbortCurrentTransaction();
	pgstat_report_activity(STATE_IDLE, NULL);
	return code;
}

/*
 * qbs_txn runs body(arg) in a transaction of its own (qbs_begin ...
 * qbs_commit), the skeleton of every store call.  When an ERROR cuts it
 * short, undo(arg) (or NULL) releases what body had malloc'd or armed, the
 * error becomes err, the transaction rolls back, *sqlstate (or NULL) gets
 * its SQLSTATE, and -1 is returned.  body and undo reach their state only
 * through arg, which lives in the caller's frame: nothing of it is a
 * local of the frame that longjmps.
 */
typedef void (*QbsTxnFn) (void *arg);

static int
qbs_txn(const char *activity, QbsTxnFn body, QbsTxnFn undo, void *arg, int *sqlstate,
		char *err, size_t errlen)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile int rc = 0;

	PG_TRY();
	{
		qbs_begin(activity);
		body(arg);
		qbs_commit();
	}
	PG_CATCH();
	{
		int			code;

		if (undo != NULL)
			undo(arg);
		code = qbs_fail(cxt, err, errlen);
		if (sqlstate != NULL)
			*sqlstate = code;
		rc = -1;
	}
	PG_END_TRY();
	return rc;
}

/*
 * qbs_replan_if_grown: when the outbox has grown past four times its size
 * at the last fit (or at a TRUNCATE since), the saved plans are made
 * again.  A plan made on an empty outbox (a fresh install, a TRUNCATE: the
 * plan cache replans on it at once) believes the table holds a row or two
 * and reads it by sequential or primary-key scan; it stays until
 * autovacuum's ANALYZE, up to autovacuum_naptime later.  Meanwhile every
 * cycle of a bulk load scanned the whole table (a settle behind 300,000
 * rows of a hot key: a nested loop over all of them, 16 s).  Made again,
 * the plans see the table's size (an outbox never analyzed since its
 * TRUNCATE is estimated from its pages).  No ANALYZE here: run during the
 * bulk insert, it counted none of the rows not yet committed, and the
 * plans made after it were as bad.  Costs a look at the table's size per
 * cycle.
 */
static void
qbs_replan_if_grown(void)
{
	Relation	rel = OidIsValid(qbs_outbox_relid) ?
		try_table_open(qbs_outbox_relid, AccessShareLock) : NULL;
	BlockNumber n;

	/* the outbox's oid, looked up once: again only if the table was made anew */
	if (rel != NULL && strcmp(RelationGetRelationName(rel), "outbox") != 0)
	{
		table_close(rel, AccessShareLock);
		rel = NULL;
	}
	if (rel == NULL)
	{
		qbs_outbox_relid = RangeVarGetRelid(makeRangeVar("queuebox", "outbox", -1),
											AccessShareLock, true);
		if (!OidIsValid(qbs_outbox_relid))
			return;
		rel = table_open(qbs_outbox_relid, NoLock);
	}
	n = RelationGetNumberOfBlocks(rel);
	table_close(rel, NoLock);
	if (n < qbs_fit_blocks / 4)
		qbs_fit_blocks = n;		/* truncated: fit again when it grows back */
	if (n <= 4 * qbs_fit_blocks + 16)
		return;
	qbs_fit_blocks = n;
	for (int i = 0; i < QB_PG_NSTMTS; i++)
		if (qbs_plans[i] != NULL)
		{
			SPI_freeplan(qbs_plans[i]);
			qbs_plans[i] = NULL;
		}
}

/* qbs_prepare: the saved plan of statement id, prepared on first use. */
static SPIPlanPtr
qbs_prepare(QbPgStmtId id)
{
	if (qbs_plans[id] == NULL)
	{
		Oid			types[QB_PG_MAXPARAMS];
		int			nargs = qb_spi_stmt_types(id, types);
		SPIPlanPtr	p = SPI_prepare(qb_pg_stmts[id].sql, nargs, types);

		if (p == NULL)
			elog(ERROR, "SPI_prepare failed for the %s statement \"%s\": %s",
				 qb_pg_stmts[id].name, qb_pg_stmts[id].sql,
				 SPI_result_code_string(SPI_result));
		SPI_keepplan(p);
		qbs_plans[id] = p;
	}
	return qbs_plans[id];
}

/* qbs_copy: a malloc'd, NUL-terminated copy of the n bytes at s. */
static char *
qbs_copy(const char *s, size_t n)
{
	char	   *out = malloc(n + 1);

	if (out == NULL)
		elog(ERROR, "out of memory");
	memcpy(out, s, n);
	out[n] = '\0';
	return out;
}

/* qbs_strdup_col: a copy of a column as text (its output function), NULL for NULL. */
static char *
qbs_strdup_col(HeapTuple tup, TupleDesc desc, int col)
{
	char	   *v = SPI_getvalue(tup, desc, col);

	return v == NULL ? NULL : qbs_copy(v, strlen(v));
}

static void
qbs_config_load_body(void *arg)
{
	char	  **text = arg;

	/* the database may not have the extension (yet, or any more) */
	if (OidIsValid(get_extension_oid("queuebox", true)))
	{
		SPIPlanPtr	p;

		/* a library newer than the schema: the statements would fail */
		if (SPI_execute("SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'queuebox'",
						true, 1) == SPI_OK_SELECT && SPI_processed == 1)
		{
			char	   *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

			if (v != NULL && strcmp(v, QB_VERSION) != 0)
				ereport(ERROR,
						(errmsg("the queuebox schema in this database is version %s and the library is version %s; run ALTER EXTENSION queuebox UPDATE",
								v, QB_VERSION)));
		}
		/* queuebox.config_file, when set, is the one source (config_file.c) */
		if (qb_config_file[0] != '\0')
		{
			qb_config_file_load(text);
			return;
		}
		p = qbs_prepare(QB_PG_S_CONFIG_LOAD);
		if (SPI_execute_plan(p, NULL, NULL, true, 1) != SPI_OK_SELECT)
			elog(ERROR, "reading queuebox.config failed");
		if (SPI_processed == 1)
			*text = qbs_strdup_col(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
		qb_config_table_loaded(*text);
	}
}

static void
qbs_free_text(void *arg)
{
	char	  **text = arg;

	free(*text);
	*text = NULL;
}

static int
qbs_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	*text = NULL;
	return qbs_txn("queuebox: load configuration", qbs_config_load_body, qbs_free_text, text,
				   NULL, err, errlen);
}

/* A claim's row copier and row freer: QbOutboxRow or QbRelayRow. */
typedef void (*QbsCopyRow) (HeapTuple tup, TupleDesc desc, void *row);
typedef void (*QbsFreeRows) (void *rows, int n);

/*
 * qbs_claim_call runs a claim statement (values[token_arg] is set from
 * token) and copies its rows into a calloc'd array of row_size elements.
 * Each row is counted before it is copied, so free_rows also frees a row
 * copied in part when an ERROR cut it short.
 */
typedef struct QbsClaimCall
{
	QbPgStmtId	stmt;
	const char *activity;
	int			ok_code;
	Datum	   *values;
	int			token_arg;
	const char *token;
	size_t		row_size;
	QbsCopyRow	copy;
	QbsFreeRows free_rows;
	char	   *rows;
	int			nrows;
} QbsClaimCall;

static void
qbs_claim_call_body(void *arg)
{
	QbsClaimCall *c = arg;
	SPIPlanPtr	p = qbs_prepare(c->stmt);
	uint64		n;

	c->values[c->token_arg] = DirectFunctionCall1(uuid_in, CStringGetDatum(c->token));
	if (SPI_execute_plan(p, c->values, NULL, false, 0) != c->ok_code)
		elog(ERROR, "%s failed", c->activity);
	n = SPI_processed;
	if (n == 0)
		return;
	if ((c->rows = calloc(n, c->row_size)) == NULL)
		elog(ERROR, "out of memory");
	for (uint64 i = 0; i < n; i++)
	{
		c->nrows = i + 1;
		c->copy(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, c->rows + i * c->row_size);
	}
}

static void
qbs_claim_call_undo(void *arg)
{
	QbsClaimCall *c = arg;

	c->free_rows(c->rows, c->nrows);
	c->rows = NULL;
	c->nrows = 0;
}

static int
qbs_claim_call(QbPgStmtId stmt, const char *activity, int ok_code,
			   Datum *values, int token_arg,
			   const char *token, size_t row_size, QbsCopyRow copy,
			   QbsFreeRows free_rows, void **rows_out, int *nrows_out,
			   char *err, size_t errlen)
{
	QbsClaimCall c = {.stmt = stmt, .activity = activity, .ok_code = ok_code,
		.values = values, .token_arg = token_arg,
		.token = token, .row_size = row_size, .copy = copy, .free_rows = free_rows};
	int			rc = qbs_txn(activity, qbs_claim_call_body, qbs_claim_call_undo, &c, NULL,
							 err, errlen);

	*rows_out = c.rows;
	*nrows_out = c.nrows;
	return rc;
}

/*
 * qbs_text_copy: a malloc'd copy of a text Datum (NULL for NULL), its length
 * in *len when asked.  A claim's text columns are read as text, not through
 * their output function: no catalog look-up, no second copy, no strlen.
 */
static char *
qbs_text_copy(Datum d, bool isnull, size_t *len)
{
	text	   *t;

	if (isnull)
	{
		if (len != NULL)
			*len = 0;
		return NULL;
	}
	t = DatumGetTextPP(d);
	if (len != NULL)
		*len = VARSIZE_ANY_EXHDR(t);
	return qbs_copy(VARDATA_ANY(t), VARSIZE_ANY_EXHDR(t));
}

/*
 * qbs_copy_outbox_row copies a claim row (qb_claim_cols.h) out of SPI's
 * memory.  The tuple is deformed once: reading its columns one by one walks
 * it from its start for each column after the first text one.
 */
static void
qbs_copy_outbox_row(HeapTuple tup, TupleDesc desc, void *row)
{
	QbOutboxRow *r = row;
	Datum		v[QB_CLAIM_NCOLS];
	bool		n[QB_CLAIM_NCOLS];

	if (desc->natts != QB_CLAIM_NCOLS)
		elog(ERROR, "a claim returned %d columns, not %d", desc->natts, QB_CLAIM_NCOLS);
	heap_deform_tuple(tup, desc, v, n);
	r->id = DatumGetInt64(v[QB_CLAIM_COL_ID]);
	if (n[QB_CLAIM_COL_MESSAGE_ID])
		r->message_id[0] = '\0';
	else
		strlcpy(r->message_id,
				DatumGetCString(DirectFunctionCall1(uuid_out, v[QB_CLAIM_COL_MESSAGE_ID])),
				sizeof(r->message_id));
	r->topic = qbs_text_copy(v[QB_CLAIM_COL_TOPIC], n[QB_CLAIM_COL_TOPIC], NULL);
	r->key = qbs_text_copy(v[QB_CLAIM_COL_KEY], n[QB_CLAIM_COL_KEY], NULL);
	r->payload = qbs_text_copy(v[QB_CLAIM_COL_PAYLOAD], n[QB_CLAIM_COL_PAYLOAD], &r->payload_len);
	r->headers = qbs_text_copy(v[QB_CLAIM_COL_HEADERS], n[QB_CLAIM_COL_HEADERS], NULL);
	r->attempt = DatumGetInt32(v[QB_CLAIM_COL_ATTEMPT]);
	r->max_attempts = DatumGetInt32(v[QB_CLAIM_COL_MAX_ATTEMPTS]);
	r->created_epoch = DatumGetFloat8(v[QB_CLAIM_COL_CREATED_EPOCH]);
	r->claimed = DatumGetBool(v[QB_CLAIM_COL_CLAIMED]);
	r->destination = qbs_text_copy(v[QB_CLAIM_COL_DESTINATION], n[QB_CLAIM_COL_DESTINATION], NULL);
	r->in_intake = DatumGetBool(v[QB_CLAIM_COL_IN_INTAKE]);
	r->not_due = DatumGetBool(v[QB_CLAIM_COL_NOT_DUE]);
	r->probe = DatumGetBool(v[QB_CLAIM_COL_PROBE]);
}

/* qbs_array: a one-dimensional array of n elements, NULLs where nulls[i]. */
static Datum
qbs_array(Datum *elems, bool *nulls, int n, Oid type)
{
	int			dims[1] = {n};
	int			lbs[1] = {1};
	int16		len;
	bool		byval;
	char		align;

	get_typlenbyvalalign(type, &len, &byval, &align);
	return PointerGetDatum(construct_md_array(elems, nulls, 1, dims, lbs, type,
											  len, byval, align));
}

/*
 * QbsColumns: the columns of an unnest() statement, n values each, built
 * row by row and then turned into one array per column (NULL where
 * null[c][i]; nulls are false unless set).
 */
typedef struct QbsColumns
{
	int			ncols;
	int			n;
	Datum	   *col[QB_PG_MAXPARAMS];
	bool	   *null[QB_PG_MAXPARAMS];
} QbsColumns;

static QbsColumns
qbs_columns_new(int ncols, int n)
{
	QbsColumns	c = {.ncols = ncols, .n = n};

	Assert(ncols <= QB_PG_MAXPARAMS);
	for (int i = 0; i < ncols; i++)
	{
		c.col[i] = palloc(sizeof(Datum) * (n + 1));
		c.null[i] = palloc0(sizeof(bool) * (n + 1));
	}
	return c;
}

/*
 * qbs_columns_arrays: out[i] = column i as the array that parameter
 * param[i] of statement id takes (param NULL: parameter i).
 */
static void
qbs_columns_arrays(const QbsColumns *c, QbPgStmtId id, const int *param, Datum *out)
{
	for (int i = 0; i < c->ncols; i++)
	{
		QbPgType	t = qb_pg_stmts[id].params[param ? param[i] : i];

		Assert(OidIsValid(qbs_elem_oids[t]));
		out[i] = qbs_array(c->col[i], c->null[i], c->n, qbs_elem_oids[t]);
	}
}

/* qbs_text_or_null: a text Datum, or a NULL flag. */
static Datum
qbs_text_or_null(const char *s, bool *isnull)
{
	*isnull = s == NULL;
	return s ? CStringGetTextDatum(s) : (Datum) 0;
}

/*
 * qbs_take_rows appends the rows of the last statement (claim-shaped) to
 * out->rows.  Each row is counted before it is copied, so a row copied in
 * part when an ERROR cuts it short is freed too.
 */
static void
qbs_take_rows(QbCycleOut *out)
{
	uint64		n = SPI_processed;
	QbOutboxRow *rows;

	if (n == 0 || out == NULL)
		return;
	rows = realloc(out->rows, (out->nrows + n) * sizeof(QbOutboxRow));
	if (rows == NULL)
		elog(ERROR, "out of memory");
	memset(rows + out->nrows, 0, n * sizeof(QbOutboxRow));
	out->rows = rows;
	for (uint64 i = 0; i < n; i++)
	{
		out->nrows++;
		qbs_copy_outbox_row(SPI_tuptable->vals[i], SPI_tuptable->tupdesc,
							&out->rows[out->nrows - 1]);
	}
}

/*
 * qbs_promote_past runs QB_PG_OUTBOX_PROMOTE_PAST, after the promotion, for
 * the keys of k (key, destination) whose row had no destination when it
 * was claimed (a fan-out row, or every row when the caller did not say):
 * a row parked behind rows in flight that another transaction ends at the
 * same time is released for the claim to look at again.
 */
static void
qbs_promote_past(const QbsColumns *k)
{
	QbsColumns	past = qbs_columns_new(1, k->n);
	Datum		a[1];

	past.n = 0;
	for (int i = 0; i < k->n; i++)
		if (k->null[1][i])
			past.col[0][past.n++] = k->col[0][i];
	if (past.n == 0)
		return;
	qbs_columns_arrays(&past, QB_PG_S_PROMOTE_PAST, NULL, a);
	if (SPI_execute_plan(qbs_prepare(QB_PG_S_PROMOTE_PAST), a, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "releasing the rows parked behind two ends at once failed");
}

/*
 * qb_spi_outbox_settle runs the settle and then the promotion of the keys
 * whose row ended or was routed, each in its own statement
 * (QB_PG_OUTBOX_PROMOTE says why), then, with past (a fan-out row among
 * them, QbSettle.fanout), qbs_promote_past, inside the
 * caller's transaction with SPI connected.  The arguments are the arrays
 * of QB_PG_OUTBOX_SETTLE.  With claim, the promoted rows
 * that are due are claimed under its token and appended to out->rows.
 * Returns the rows settled.
 */
uint64
qb_spi_outbox_settle(Datum *args, const char *nulls, bool past, const QbClaimReq *claim,
					 QbCycleOut *out)
{
	SPIPlanPtr	p = qbs_prepare(QB_PG_S_SETTLE);
	uint64		settled;
	QbsColumns	k;
	int			nkeys = 0;

	if (SPI_execute_plan(p, args, nulls, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "the outbox settle failed");
	settled = SPI_processed;
	k = qbs_columns_new(2, settled);
	/*
	 * the keys and destinations as text Datums in SPI's tuples: they are
	 * read into the promotion's arrays before the next statement
	 */
	for (uint64 i = 0; i < settled; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		nokey;
		bool		nopromote;
		Datum		key = SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &nokey);
		Datum		promote = SPI_getbinval(tup, SPI_tuptable->tupdesc, 4, &nopromote);

		/* ended, or routed now: its key's rows elsewhere may go (QB_PG_OUTBOX_SETTLE) */
		if (!nokey && !nopromote && DatumGetBool(promote))
		{
			k.col[0][nkeys] = key;
			k.col[1][nkeys] = SPI_getbinval(tup, SPI_tuptable->tupdesc, 3, &k.null[1][nkeys]);
			nkeys++;
		}
	}
	k.n = nkeys;
	if (nkeys > 0)
	{
		Datum		a[6];
		char		n[6] = "      ";
		Datum		ka[2];
		const int	kp[2] = {0, 5};

		qbs_columns_arrays(&k, QB_PG_S_PROMOTE, kp, ka);
		a[0] = ka[0];
		a[5] = ka[1];
		if (claim != NULL)
		{
			a[1] = DirectFunctionCall1(uuid_in, CStringGetDatum(claim->token));
			a[2] = Int64GetDatum(claim->lease_ms);
			a[3] = Int32GetDatum(claim->default_max_attempts);
			a[4] = Int64GetDatum(qbs_claimer());
		}
		else
		{
			n[1] = n[2] = n[3] = n[4] = 'n';
			a[1] = a[2] = a[3] = a[4] = (Datum) 0;
		}
		p = qbs_prepare(QB_PG_S_PROMOTE);
		if (SPI_execute_plan(p, a, n, false, 0) != SPI_OK_UPDATE_RETURNING)
			elog(ERROR, "promoting the next row of each key failed");
		if (claim != NULL)
			qbs_take_rows(out);
		if (past)
			qbs_promote_past(&k);
	}
	return settled;
}

/* qbs_breaker runs QB_PG_OUTBOX_BREAKER for the cycle's tallies. */
static void
qbs_breaker(const QbDestTally *t, int n, QbCycleOut *out)
{
	Datum		v[QB_PG_MAXPARAMS];
	QbsColumns	c = qbs_columns_new(qb_pg_stmts[QB_PG_S_BREAKER].nparams, n);
	SPIPlanPtr	p = qbs_prepare(QB_PG_S_BREAKER);
	SPIPlanPtr	rows;

	for (int i = 0; i < n; i++)
	{
		c.col[0][i] = CStringGetTextDatum(t[i].destination);
		c.col[1][i] = Int32GetDatum(t[i].ok);
		c.col[2][i] = Int32GetDatum(t[i].failed);
		c.col[3][i] = BoolGetDatum(t[i].gone);
		c.col[4][i] = Int64GetDatum(t[i].retry_after_ms);
		c.col[5][i] = qbs_text_or_null(t[i].error, &c.null[5][i]);
		c.col[6][i] = Int32GetDatum(t[i].threshold);
		c.col[7][i] = Int64GetDatum(t[i].cooldown_ms);
		c.col[8][i] = Int64GetDatum(t[i].ok_sent_ago_us);
	}
	qbs_columns_arrays(&c, QB_PG_S_BREAKER, NULL, v);
	rows = qbs_prepare(QB_PG_S_BREAKER_ROWS);
	if (SPI_execute_plan(rows, v, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "creating the circuit breaker rows failed");
	if (SPI_execute_plan(p, v, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "the circuit breaker statement failed");
	if (SPI_processed == 0)
		return;
	out->changes = calloc(SPI_processed, sizeof(QbDestChange));
	if (out->changes == NULL)
		elog(ERROR, "out of memory");
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	d = SPI_tuptable->tupdesc;
		QbDestChange *c = &out->changes[out->nchanges++];
		bool		isnull;

		c->destination = qbs_strdup_col(tup, d, 1);
		c->old_state = qb_circuit_parse(SPI_getvalue(tup, d, 2));
		c->new_state = qb_circuit_parse(SPI_getvalue(tup, d, 3));
		c->paused = DatumGetBool(SPI_getbinval(tup, d, 4, &isnull));
	}
}

/*
 * qbs_states runs QB_PG_OUTBOX_STATES; returns the probe names as text[],
 * and their number in *nprobes.
 */
static Datum
qbs_states(long probe_ms, QbCycleOut *out, int *nprobes_out)
{
	Datum		v[1] = {Int64GetDatum(probe_ms)};
	SPIPlanPtr	p = qbs_prepare(QB_PG_S_STATES);
	Datum	   *probes;
	int			nprobes = 0;

	if (SPI_execute_plan(p, v, NULL, false, 0) != SPI_OK_SELECT)
		elog(ERROR, "reading the destination states failed");
	probes = palloc(sizeof(Datum) * (SPI_processed + 1));
	if (SPI_processed > 0)
	{
		out->states = calloc(SPI_processed, sizeof(QbDestState));
		if (out->states == NULL)
			elog(ERROR, "out of memory");
	}
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	d = SPI_tuptable->tupdesc;
		QbDestState *st = &out->states[out->nstates++];
		bool		isnull;

		st->destination = qbs_strdup_col(tup, d, 1);
		st->state = qb_circuit_parse(SPI_getvalue(tup, d, 2));
		st->failures = DatumGetInt32(SPI_getbinval(tup, d, 3, &isnull));
		st->paused = DatumGetBool(SPI_getbinval(tup, d, 4, &isnull));
		st->probe = DatumGetBool(SPI_getbinval(tup, d, 5, &isnull));
		if (st->probe)
			probes[nprobes++] = CStringGetTextDatum(st->destination);
	}
	*nprobes_out = nprobes;
	return PointerGetDatum(qb_text_array(probes, nprobes));
}

/*
 * qbs_claim runs QB_PG_OUTBOX_CLAIM (QB_PG_OUTBOX_CLAIM_NO_PROBE when
 * probes, a text[], is empty: any_probe false) and copies its rows into out.
 */
static void
qbs_claim(const QbClaimReq *c, Datum probes, bool any_probe, QbCycleOut *out)
{
	Datum		v[10];
	QbsColumns	d = qbs_columns_new(3, c->ndests);
	static const int dest_params[3] = {5, 6, 8};	/* $6 names, $7 limits, $9 floors */
	Datum		arrays[3];
	SPIPlanPtr	p = qbs_prepare(any_probe ? QB_PG_S_CLAIM : QB_PG_S_CLAIM_NO_PROBE);

	for (int i = 0; i < c->ndests; i++)
	{
		d.col[0][i] = CStringGetTextDatum(c->dests[i]);
		d.col[1][i] = Int32GetDatum(c->limits[i]);
		d.col[2][i] = Int64GetDatum(c->floors ? c->floors[i] : 0);
	}
	qbs_columns_arrays(&d, QB_PG_S_CLAIM, dest_params, arrays);
	v[0] = Int32GetDatum(c->batch_size);
	v[1] = Int64GetDatum(c->lease_ms);
	v[2] = Int32GetDatum(c->default_max_attempts);
	v[3] = DirectFunctionCall1(uuid_in, CStringGetDatum(c->token));
	v[4] = Int64GetDatum(c->floor);
	v[5] = arrays[0];
	v[6] = arrays[1];
	v[7] = probes;
	v[8] = arrays[2];
	v[9] = Int64GetDatum(qbs_claimer());
	if (SPI_execute_plan(p, v, NULL, false, 0) != SPI_OK_UPDATE_RETURNING)
		elog(ERROR, "the outbox claim failed");
	qbs_take_rows(out);
}

/*
 * qbs_fanout runs QB_PG_OUTBOX_FANOUT for the settles that copy their row
 * (a route with several destinations), before the settle: the copies and
 * the row's first destination are written in one transaction.
 */
static void
qbs_fanout(const QbSettle *settles, int n)
{
	Datum		args[3];
	QbsColumns	c;
	int			m = 0;

	for (int i = 0; i < n; i++)
		m += settles[i].copies != NULL;
	if (m == 0)
		return;
	c = qbs_columns_new(3, m);
	m = 0;
	for (int i = 0; i < n; i++)
	{
		if (settles[i].copies == NULL)
			continue;
		c.col[0][m] = DirectFunctionCall1(uuid_in, CStringGetDatum(settles[i].token));
		c.col[1][m] = Int64GetDatum(settles[i].id);
		c.col[2][m] = CStringGetTextDatum(settles[i].copies);
		m++;
	}
	qbs_columns_arrays(&c, QB_PG_S_FANOUT, NULL, args);
	if (SPI_execute_plan(qbs_prepare(QB_PG_S_FANOUT), args, NULL, false, 0) != SPI_OK_INSERT)
		elog(ERROR, "copying the rows of routes with several destinations failed");
}

static void
qbs_cycle_body(void *arg)
{
	QbCycleCall *cy = arg;
	const QbClaimReq *claim = cy->claim;
	QbCycleOut *out = cy->out;

	qbs_replan_if_grown();
	if (cy->ntallies > 0)
		qbs_breaker(cy->tallies, cy->ntallies, out);
	if (cy->nsettles > 0)
	{
		const QbSettle *settles = cy->settles;
		Datum		args[8];
		char		nulls[8] = "        ";
		QbsColumns	c = qbs_columns_new(8, cy->nsettles);

		for (int i = 0; i < cy->nsettles; i++)
		{
			c.col[0][i] = DirectFunctionCall1(uuid_in, CStringGetDatum(settles[i].token));
			c.col[1][i] = Int64GetDatum(settles[i].id);
			c.col[2][i] = CStringGetTextDatum(qb_settle_kind_name(settles[i].kind));
			c.col[3][i] = Int32GetDatum(settles[i].attempt);
			c.col[4][i] = Int64GetDatum(settles[i].delay_ms);
			c.col[5][i] = qbs_text_or_null(settles[i].error, &c.null[5][i]);
			c.col[6][i] = qbs_text_or_null(settles[i].destination, &c.null[6][i]);
			c.col[7][i] = BoolGetDatum(settles[i].unrouted);
		}
		qbs_fanout(settles, cy->nsettles);
		qbs_columns_arrays(&c, QB_PG_S_SETTLE, NULL, args);
		out->nsettled = (int) qb_spi_outbox_settle(args, nulls,
												   qb_settles_fanout(settles, cy->nsettles),
												   claim, out);
	}
	/* promoted_only: the promotion claimed all the cycle asks for */
	if (claim != NULL && !claim->promoted_only)
	{
		/*
		 * The rows the promotion claimed came first: each destination is
		 * asked only for the room they left it, and the unrouted places
		 * for what is left of the batch.
		 */
		QbClaimReq	req;
		int		   *limits = palloc(sizeof(int) * (claim->ndests + 1));
		int			nprobes = 0;
		Datum		probes;

		qb_claim_left(claim, out->rows, out->nrows, &req, limits);
		probes = claim->read_states ? qbs_states(claim->probe_ms, out, &nprobes) :
			PointerGetDatum(qb_text_array(NULL, 0));
		qbs_claim(&req, probes, nprobes > 0, out);
	}
}

static void
qbs_cycle_undo(void *arg)
{
	qb_cycle_out_free(((QbCycleCall *) arg)->out);
}

static int
qbs_outbox_cycle(void *ctx, const QbDestTally *tallies, int ntallies,
				 const QbSettle *settles, int nsettles, const QbClaimReq *claim,
				 QbCycleOut *out, char *err, size_t errlen)
{
	QbCycleCall c = {.tallies = tallies, .ntallies = ntallies, .settles = settles,
		.nsettles = nsettles, .claim = claim, .out = out};

	memset(out, 0, sizeof(*out));
	return qbs_txn(claim ? "queuebox: settle and claim" : "queuebox: settle",
				   qbs_cycle_body, qbs_cycle_undo, &c, NULL, err, errlen);
}

/* qbs_names: a text[] of n names. */
static Datum
qbs_names(const char *const *names, int n)
{
	Datum	   *d = palloc(sizeof(Datum) * (n + 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(names[i]);
	return PointerGetDatum(qb_text_array(d, n));
}

/*
 * qbs_count_call runs one statement and reports the rows it changed.  When
 * build is set it fills values inside the transaction (arrays are palloc'd
 * there) from build_arg.
 */
typedef void (*QbsBuild) (Datum *values, const void *build_arg);

typedef struct QbsCountCall
{
	QbPgStmtId	stmt;
	int			ok_code;
	const char *activity;
	Datum	   *values;
	QbsBuild	build;
	const void *build_arg;
	int			count;
} QbsCountCall;

static void
qbs_count_call_body(void *arg)
{
	QbsCountCall *c = arg;
	SPIPlanPtr	p = qbs_prepare(c->stmt);

	if (c->build != NULL)
		c->build(c->values, c->build_arg);
	if (SPI_execute_plan(p, c->values, NULL, false, 0) != c->ok_code)
		elog(ERROR, "%s failed", c->activity);
	c->count = (int) SPI_processed;
}

static int
qbs_count_call(QbPgStmtId stmt, int ok_code, const char *activity,
			   Datum *values, QbsBuild build, const void *build_arg,
			   int *count, char *err, size_t errlen)
{
	QbsCountCall c = {.stmt = stmt, .ok_code = ok_code, .activity = activity,
	.values = values, .build = build, .build_arg = build_arg};
	int			rc = qbs_txn(activity, qbs_count_call_body, NULL, &c, NULL, err, errlen);

	*count = rc == 0 ? c.count : 0;
	return rc;
}

static int
qbs_outbox_reclaim(void *ctx, int limit, int *n, char *err, size_t errlen)
{
	Datum		values[2] = {Int32GetDatum(limit), Int64GetDatum(qbs_claimer_id)};

	return qbs_count_call(QB_PG_S_RECLAIM, SPI_OK_UPDATE, "queuebox: reclaim", values,
						  NULL, NULL, n, err, errlen);
}

/* A retention batch: its floor in and out, the rows it deleted. */
typedef struct QbsRetention
{
	long		retention_sec;
	int			limit;
	int64_t		after;
	int			deleted;
} QbsRetention;

static void
qbs_retention_body(void *arg)
{
	QbsRetention *r = arg;
	Datum		values[3] = {Int64GetDatum(r->retention_sec), Int32GetDatum(r->limit),
	Int64GetDatum(r->after)};
	HeapTuple	tup;
	bool		isnull;
	Datum		walked;

	if (SPI_execute_plan(qbs_prepare(QB_PG_S_RETENTION), values, NULL, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "retention failed");
	tup = SPI_tuptable->vals[0];
	r->deleted = DatumGetInt32(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
	walked = SPI_getbinval(tup, SPI_tuptable->tupdesc, 2, &isnull);
	if (!isnull)
		r->after = DatumGetInt64(walked);
}

static int
qbs_outbox_retention(void *ctx, long retention_sec, int limit, int64_t *after, int *n,
					 char *err, size_t errlen)
{
	QbsRetention r = {.retention_sec = retention_sec, .limit = limit, .after = *after};
	int			rc = qbs_txn("queuebox: retention", qbs_retention_body, NULL, &r, NULL,
							 err, errlen);

	*n = rc == 0 ? r.deleted : 0;
	if (rc == 0)
		*after = r.after;
	return rc;
}

/* The sweep's key to start at and its answer. */
typedef struct QbsSweep
{
	const char *after;
	int			limit;
	int			released;
	char	   *next;			/* malloc'd */
} QbsSweep;

static void
qbs_sweep_body(void *arg)
{
	QbsSweep   *w = arg;
	Datum		values[2] = {CStringGetTextDatum(w->after), Int32GetDatum(w->limit)};
	bool		isnull;

	if (SPI_execute_plan(qbs_prepare(QB_PG_S_SWEEP), values, NULL, false, 0) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "the sweep of parked rows failed");
	w->released = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											  &isnull));
	w->next = qbs_strdup_col(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
}

static void
qbs_sweep_undo(void *arg)
{
	QbsSweep   *w = arg;

	free(w->next);
	w->next = NULL;
}

static int
qbs_outbox_sweep(void *ctx, const char *after, int limit, int *nreleased, char **next,
				 char *err, size_t errlen)
{
	QbsSweep	w = {.after = after, .limit = limit};
	int			rc = qbs_txn("queuebox: sweep parked rows", qbs_sweep_body, qbs_sweep_undo, &w,
							 NULL, err, errlen);

	*nreleased = rc == 0 ? w.released : 0;
	*next = rc == 0 ? w.next : NULL;
	return rc;
}

/* The destinations of an unpark or unroute, as text[] in $1. */
typedef struct QbsNames
{
	const char *const *names;
	int			n;
} QbsNames;

static void
qbs_build_names(Datum *values, const void *arg)
{
	const QbsNames *x = arg;

	values[0] = qbs_names(x->names, x->n);
}

static int
qbs_outbox_unpark(void *ctx, const char *const *dests, int n, int limit, int *nmoved,
				  char *err, size_t errlen)
{
	Datum		values[2] = {0, Int32GetDatum(limit)};
	QbsNames	x = {dests, n};

	return qbs_count_call(QB_PG_S_UNPARK, SPI_OK_UPDATE, "queuebox: unpark", values,
						  qbs_build_names, &x, nmoved, err, errlen);
}

static int
qbs_outbox_unroute(void *ctx, const char *const *dests, int n, int *nmoved,
				   char *err, size_t errlen)
{
	Datum		values[1] = {0};
	QbsNames	x = {dests, n};

	return qbs_count_call(QB_PG_S_UNROUTE, SPI_OK_UPDATE, "queuebox: unroute", values,
						  qbs_build_names, &x, nmoved, err, errlen);
}

static void
qbs_copy_relay_row(HeapTuple tup, TupleDesc desc, void *row)
{
	QbRelayRow *r = row;
	bool		isnull;

	r->id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
	r->source = qbs_strdup_col(tup, desc, 2);
	r->event_type = qbs_strdup_col(tup, desc, 3);
	r->traceparent = desc->natts >= 5 ? qbs_strdup_col(tup, desc, 5) : NULL;
}

static void
qbs_free_relay_rows(void *rows, int n)
{
	qb_relay_rows_free(rows, n);
}

static int
qbs_relay_claim(void *ctx, int batch_size, long lease_ms, const char *token,
				QbRelayRow **rows_out, int *nrows_out, char *err, size_t errlen)
{
	Datum		values[5] = {Int32GetDatum(batch_size), Int64GetDatum(lease_ms), 0,
	Int64GetDatum(qbs_claimer()), Int64GetDatum(qbs_claimer_id)};

	return qbs_claim_call(QB_PG_S_RELAY_CLAIM, "queuebox: relay claim",
						  SPI_OK_SELECT, values, 2, token, sizeof(QbRelayRow),
						  qbs_copy_relay_row, qbs_free_relay_rows,
						  (void **) rows_out, nrows_out, err, errlen);
}

/*
 * qb_spi_relay_promote releases the next row of each aggregate whose row
 * the forward just ended (QB_PG_RELAY_PROMOTE), in a statement of its own
 * after the forward and in its transaction, with SPI connected: a new
 * statement takes a new snapshot, which sees every park made behind the
 * ended rows.  ids is the forward's bigint[].  Returns the rows released.
 */
uint64
qb_spi_relay_promote(Datum ids)
{
	SPIPlanPtr	p = qbs_prepare(QB_PG_S_RELAY_PROMOTE);

	if (SPI_execute_plan(p, &ids, NULL, false, 0) != SPI_OK_UPDATE)
		elog(ERROR, "promoting the next row of each aggregate failed");
	return SPI_processed;
}

typedef struct QbsForward
{
	const char *token;
	const int64_t *ids;
	const char *const *topics;
	const bool *holds;
	int			n;
	int			max_attempts;
	int			nsettled;
	int			ninserted;
} QbsForward;

static void
qbs_relay_forward_body(void *arg)
{
	QbsForward *f = arg;
	Datum		values[5];
	Datum	   *idd = palloc(sizeof(Datum) * (f->n + 1));
	Datum	   *topicd = palloc(sizeof(Datum) * (f->n + 1));
	Datum	   *holdd = palloc(sizeof(Datum) * (f->n + 1));
	SPIPlanPtr	p;
	bool		isnull;

	for (int i = 0; i < f->n; i++)
	{
		idd[i] = Int64GetDatum(f->ids[i]);
		topicd[i] = CStringGetTextDatum(f->topics[i]);
		holdd[i] = BoolGetDatum(f->holds != NULL && f->holds[i]);
	}
	p = qbs_prepare(QB_PG_S_RELAY_FORWARD);
	values[0] = DirectFunctionCall1(uuid_in, CStringGetDatum(f->token));
	values[1] = PointerGetDatum(qb_int8_array(idd, f->n));
	values[2] = PointerGetDatum(qb_text_array(topicd, f->n));
	values[3] = Int32GetDatum(f->max_attempts);
	values[4] = PointerGetDatum(construct_array(holdd, f->n, BOOLOID, 1, true, TYPALIGN_CHAR));
	if (SPI_execute_plan(p, values, NULL, false, 0) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "the relay forward failed");
	f->nsettled = (int) DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1, &isnull));
	f->ninserted = (int) DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
													 SPI_tuptable->tupdesc, 2, &isnull));
	qb_spi_relay_promote(values[1]);
}

static int
qbs_relay_forward(void *ctx, const char *token, const int64_t *ids,
				  const char *const *topics, const bool *holds, int n, int max_attempts,
				  int *nsettled, int *ninserted, char *err, size_t errlen)
{
	QbsForward	f = {.token = token, .ids = ids, .topics = topics, .holds = holds, .n = n,
	.max_attempts = max_attempts};
	int			rc = qbs_txn("queuebox: relay forward", qbs_relay_forward_body, NULL, &f,
							 NULL, err, errlen);

	*nsettled = rc == 0 ? f.nsettled : 0;
	*ninserted = rc == 0 ? f.ninserted : 0;
	return rc;
}

/*
 * qbs_inbox_column: one column of n inbox rows as a text[] datum, NULL for
 * SQL NULL (qb_text_array has no NULLs); field is the byte offset of a
 * const char * in QbInboxRow.
 */
static Datum
qbs_inbox_column(const QbInboxRow *rows, int n, size_t field)
{
	Datum	   *items = palloc(sizeof(Datum) * n);
	bool	   *nulls = palloc(sizeof(bool) * n);
	int			dims[1] = {n};
	int			lbs[1] = {1};

	for (int i = 0; i < n; i++)
	{
		const char *v = *(const char *const *) ((const char *) &rows[i] + field);

		nulls[i] = v == NULL;
		items[i] = v == NULL ? (Datum) 0 : CStringGetTextDatum(v);
	}
	return PointerGetDatum(construct_md_array(items, nulls, 1, dims, lbs, TEXTOID, -1,
											  false, TYPALIGN_INT));
}

/*
 * qbs_arm_timeout bounds the call's statement: SPI does not arm
 * statement_timeout the way a client session does, so the timer is set
 * here and the cancel it raises comes back as an ERROR like any other.
 */
static void
qbs_arm_timeout(long timeout_ms)
{
	if (timeout_ms > 0)
		enable_timeout_after(STATEMENT_TIMEOUT, (int) timeout_ms);
}

static void
qbs_disarm_timeout(void)
{
	disable_timeout(STATEMENT_TIMEOUT, false);
}

typedef struct QbsInsert
{
	const QbInboxRow *rows;
	int			n;
	long		timeout_ms;
	int64_t    *ids;
} QbsInsert;

static void
qbs_inbox_insert_body(void *arg)
{
	QbsInsert  *a = arg;
	const QbInboxRow *rows = a->rows;
	int			n = a->n;
	Datum		values[8];
	Datum	   *consumption = palloc(sizeof(Datum) * (n + 1));
	SPIPlanPtr	p;

	qbs_arm_timeout(a->timeout_ms);
	values[0] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, source));
	values[1] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, idempotency_key));
	values[2] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, event_type));
	values[3] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, aggregate_id));
	values[4] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, payload));
	values[5] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, headers));
	for (int i = 0; i < n; i++)
		consumption[i] = CStringGetTextDatum(rows[i].pull ? "pull" : "push");
	values[6] = PointerGetDatum(construct_array(consumption, n, TEXTOID, -1, false,
												TYPALIGN_INT));
	values[7] = qbs_inbox_column(rows, n, offsetof(QbInboxRow, dead_error));
	p = qbs_prepare(QB_PG_S_INBOX_INSERT);
	if (SPI_execute_plan(p, values, NULL, false, 0) != SPI_OK_INSERT_RETURNING)
		elog(ERROR, "the inbox insert failed");
	/* match each stored row to the first request of its key */
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		HeapTuple	tup = SPI_tuptable->vals[r];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		int64		id = DatumGetInt64(SPI_getbinval(tup, desc, 1, &isnull));
		char	   *source = SPI_getvalue(tup, desc, 2);
		char	   *key = SPI_getvalue(tup, desc, 3);

		(void) qb_inbox_match(rows, n, a->ids, id, source, key);
	}
	qbs_disarm_timeout();
}

static void
qbs_inbox_insert_undo(void *arg)
{
	QbsInsert  *a = arg;

	qbs_disarm_timeout();
	memset(a->ids, 0, sizeof(int64_t) * a->n);
}

static int
qbs_inbox_insert(void *ctx, const QbInboxRow *rows, int n, long timeout_ms,
				 int64_t *ids, char *err, size_t errlen)
{
	QbsInsert	a = {.rows = rows, .n = n, .timeout_ms = timeout_ms, .ids = ids};

	memset(ids, 0, sizeof(int64_t) * n);
	return qbs_txn("queuebox: store received messages", qbs_inbox_insert_body,
				   qbs_inbox_insert_undo, &a, NULL, err, errlen);
}

typedef struct QbsQuery
{
	QbQuery		query;
	const char *const *params;
	long		timeout_ms;
	char	  **out;
} QbsQuery;

static void
qbs_query_text_body(void *arg)
{
	QbsQuery   *q = arg;
	QbPgStmtId	id = QB_PG_S_QUERY + q->query;
	Oid			types[QB_PG_MAXPARAMS];
	int			nparams = qb_spi_stmt_types(id, types);
	Datum		values[QB_PG_MAXPARAMS];
	char		nulls[QB_PG_MAXPARAMS];
	int			ret;

	qbs_arm_timeout(q->timeout_ms);
	for (int i = 0; i < nparams; i++)
	{
		nulls[i] = q->params[i] == NULL ? 'n' : ' ';
		values[i] = q->params[i] == NULL ? (Datum) 0 : CStringGetTextDatum(q->params[i]);
	}
	ret = SPI_execute_with_args(qb_pg_stmts[id].sql, nparams, types, values, nulls,
								false, 1);
	if (ret < 0)
		elog(ERROR, "query failed: %s", SPI_result_code_string(ret));
	if (SPI_tuptable != NULL && SPI_processed > 0)
		*q->out = qbs_strdup_col(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	qbs_disarm_timeout();
}

static void
qbs_query_text_undo(void *arg)
{
	QbsQuery   *q = arg;

	qbs_disarm_timeout();
	free(*q->out);
	*q->out = NULL;
}

static int
qbs_query_text(void *ctx, QbQuery query, const char *const *params, long timeout_ms,
			   char **out, char *err, size_t errlen)
{
	QbsQuery	q = {.query = query, .params = params, .timeout_ms = timeout_ms, .out = out};
	int			code = 0;

	StaticAssertStmt(QB_PG_NQUERIES == QB_NQUERIES, "one statement per QbQuery");
	*out = NULL;
	if (qbs_txn("queuebox: query", qbs_query_text_body, qbs_query_text_undo, &q, &code,
				err, errlen) == 0)
		return 0;
	return qb_query_failure(unpack_sql_state(code));
}

/* qbs_claimer_lock_body: take the lock of a fresh claimer id, drawing again when it is taken. */
static void
qbs_claimer_lock_body(void *arg)
{
	SPIPlanPtr	p = qbs_prepare(QB_PG_S_CLAIMER_LOCK);

	for (int tries = 0; tries < 8 && qbs_claimer_id == 0; tries++)
	{
		int64		id = qb_claimer_id();
		Datum		v[1] = {Int64GetDatum(id)};
		bool		isnull;

		if (id == 0)
			elog(ERROR, "no random bytes for a claimer id");
		if (SPI_execute_plan(p, v, NULL, false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "the claimer lock failed");
		if (DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
			qbs_claimer_id = id;
	}
	if (qbs_claimer_id == 0)
		elog(ERROR, "every claimer id drawn was locked by another session");
}

/*
 * qbs_claimer_op: QbStore.claimer.  The lock, once taken, is kept for the
 * worker's life even when takeover is turned off: rows claimed under it
 * may still be in flight.
 */
static int
qbs_claimer_op(void *ctx, bool on, char *err, size_t errlen)
{
	qbs_takeover = on;
	if (!on || qbs_claimer_id != 0)
		return 0;
	return qbs_txn("queuebox: claimer lock", qbs_claimer_lock_body, NULL, NULL, NULL, err, errlen);
}

void
qb_spi_store_init(QbStore *store)
{
	memset(store, 0, sizeof(QbStore));
	store->config_load = qbs_config_load;
	store->outbox_cycle = qbs_outbox_cycle;
	store->outbox_unpark = qbs_outbox_unpark;
	store->outbox_unroute = qbs_outbox_unroute;
	store->outbox_reclaim = qbs_outbox_reclaim;
	store->outbox_retention = qbs_outbox_retention;
	store->outbox_sweep = qbs_outbox_sweep;
	store->claimer = qbs_claimer_op;
	store->relay_claim = qbs_relay_claim;
	store->relay_forward = qbs_relay_forward;
	store->inbox_insert = qbs_inbox_insert;
	store->query_text = qbs_query_text;
}

/*
 * qb_spi_load_document reads the stored document from inside a running
 * transaction (SQL-callable functions); palloc'd, or NULL.
 */
char *
qb_spi_load_document(void)
{
	MemoryContext caller = CurrentMemoryContext;
	char	   *doc = NULL;

	SPI_connect();
	if (SPI_execute(qb_pg_stmts[QB_PG_S_CONFIG_LOAD].sql, true, 1) == SPI_OK_SELECT &&
		SPI_processed == 1)
	{
		char	   *v = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);

		if (v != NULL)
			doc = MemoryContextStrdup(caller, v);
	}
	SPI_finish();
	return doc;
}
