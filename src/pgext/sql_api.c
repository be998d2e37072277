/*-------------------------------------------------------------------------
 * sql_api.c
 *	  SQL-callable functions: configure, validate, route_of, worker_status,
 *	  replay_inbox, and the triggers that arm the outbox and relay wakes.
 *
 * configure() validates with the same core validator as the daemon; an
 * invalid document raises an ERROR naming the key path and changes nothing.
 * The stored document is the raw text: ${NAME} references are expanded by
 * whoever loads it, so secrets never reach a table.  While
 * queuebox.config_file is set, configure() refuses: the file is the one
 * source (config_file.c).
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "commands/dbcommands.h"
#include "commands/trigger.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"

#include "catalog/pg_trigger.h"
#include "catalog/pg_type.h"
#include "utils/array.h"

#include "qb_config.h"
#include "qb_pg.h"
#include "qb_relay.h"
#include "qb_route.h"

PG_FUNCTION_INFO_V1(qb_sql_configure);
PG_FUNCTION_INFO_V1(qb_sql_validate);
PG_FUNCTION_INFO_V1(qb_sql_wake_outbox);
PG_FUNCTION_INFO_V1(qb_sql_wake_relay);
PG_FUNCTION_INFO_V1(qb_sql_arm_relay_wake);
PG_FUNCTION_INFO_V1(qb_sql_replay_inbox_one);
PG_FUNCTION_INFO_V1(qb_sql_replay_inbox);
PG_FUNCTION_INFO_V1(qb_sql_route_of);
PG_FUNCTION_INFO_V1(qb_sql_worker_status);
PG_FUNCTION_INFO_V1(qb_sql_topic_matches);
PG_FUNCTION_INFO_V1(qb_sql_arm_outbox_wake);
PG_FUNCTION_INFO_V1(qb_sql_relay_claim);
PG_FUNCTION_INFO_V1(qb_sql_relay_forward);
PG_FUNCTION_INFO_V1(qb_sql_outbox_claim);
PG_FUNCTION_INFO_V1(qb_sql_outbox_settle);
PG_FUNCTION_INFO_V1(qb_sql_outbox_breaker);
PG_FUNCTION_INFO_V1(qb_sql_outbox_states);
PG_FUNCTION_INFO_V1(qb_sql_outbox_unpark);
PG_FUNCTION_INFO_V1(qb_sql_destination_names);
PG_FUNCTION_INFO_V1(qb_sql_outbox_reclaim);
PG_FUNCTION_INFO_V1(qb_sql_outbox_retention);

/* The last document route_of() parsed, malloc'd, with its text. */
static char *qbsql_cached_text = NULL;
static QbConfig *qbsql_cached_cfg = NULL;

/*
 * qbsql_parse validates a document or raises the ERROR users see from
 * configure() and validate().
 */
static QbConfig *
qbsql_parse(text *doc)
{
	char	   *s = text_to_cstring(doc);
	char		err[QB_ERRLEN];
	QbConfig   *cfg = NULL;

	if (qb_config_parse(s, strlen(s), qb_pg_config_env(), &cfg, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid queuebox configuration: %s", err),
				 errdetail("Nothing was changed; the active configuration is the one before this call."),
				 errhint("See docs/configuration.md for every key, its type and its default.")));
	pfree(s);
	return cfg;
}

static text *
qbsql_summary(const char *verb, const QbConfig *cfg)
{
	char		buf[512];
	char		listen[128] = "";

	if (cfg->http.host != NULL)
		snprintf(listen, sizeof(listen), strchr(cfg->http.host, ':') ?
				 ", listening on [%s]:%d" : ", listening on %s:%d",
				 cfg->http.host, cfg->http.port);
	snprintf(buf, sizeof(buf), "%s: %d destination%s, %d route%s, %d source%s%s",
			 verb, cfg->ndestinations, cfg->ndestinations == 1 ? "" : "s",
			 cfg->nroutes, cfg->nroutes == 1 ? "" : "s",
			 cfg->nsources, cfg->nsources == 1 ? "" : "s", listen);
	return cstring_to_text(buf);
}

/* queuebox.configure(document text) returns text */
Datum
qb_sql_configure(PG_FUNCTION_ARGS)
{
	text	   *doc = PG_GETARG_TEXT_PP(0);
	QbConfig   *cfg;
	text	   *summary;
	Oid			types[1] = {TEXTOID};
	Datum		values[1] = {PointerGetDatum(doc)};
	int			broker_sources;

	/* one source of truth: the file, while queuebox.config_file names one */
	if (qb_config_file[0] != '\0')
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("queuebox.configure() is disabled while queuebox.config_file is set"),
				 errdetail("The workers read their configuration from %s; nothing was changed.", qb_config_file),
				 errhint("Edit that file and run SELECT pg_reload_conf(); or, to store documents with configure() again, "
						 "ALTER SYSTEM RESET queuebox.config_file and SELECT pg_reload_conf().")));
	cfg = qbsql_parse(doc);
	summary = qbsql_summary("configuration stored (workers reload it at commit)", cfg);
	broker_sources = qb_config_broker_sources(cfg);

	/* the routes take effect at commit, in the database the workers serve */
	if (qb_database != NULL && strcmp(get_database_name(MyDatabaseId), qb_database) == 0)
		qb_stage_routes(cfg, false);
	qb_config_free(cfg);
	SPI_connect();
	if (SPI_execute_with_args("INSERT INTO queuebox.config (id, document) VALUES (1, $1)"
							  " ON CONFLICT (id) DO UPDATE SET document = excluded.document,"
							  " updated_at = now(), updated_by = current_user",
							  1, types, values, NULL, false, 0) != SPI_OK_INSERT)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not store the queuebox configuration")));
	SPI_finish();
	qb_arm_config_wake(broker_sources);
	PG_RETURN_TEXT_P(summary);
}

/* queuebox.validate(document text) returns text */
Datum
qb_sql_validate(PG_FUNCTION_ARGS)
{
	QbConfig   *cfg = qbsql_parse(PG_GETARG_TEXT_PP(0));
	text	   *summary = qbsql_summary("valid", cfg);

	qb_config_free(cfg);
	PG_RETURN_TEXT_P(summary);
}

/* qbsql_check_trigger: the wake functions run only as triggers. */
static void
qbsql_check_trigger(FunctionCallInfo fcinfo, const char *name)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("queuebox.%s() must be called as a trigger", name)));
}

/*
 * qbsql_route_fires_with: the outbox_route trigger fires for every row of a
 * statement that fires `wake` (the same enabled state, no WHEN clause), so
 * it notes each intake row's id.  Looked up in the relation's trigger
 * descriptor (relcache): no catalog read.  False on a schema before 0.3.0,
 * which has no such trigger.
 */
static bool
qbsql_route_fires_with(Relation outbox, const Trigger *wake)
{
	TriggerDesc *trigdesc = outbox->trigdesc;

	for (int i = 0; trigdesc != NULL && i < trigdesc->numtriggers; i++)
	{
		const Trigger *t = &trigdesc->triggers[i];

		if (strcmp(t->tgname, "outbox_route") == 0)
			return t->tgenabled == wake->tgenabled && t->tgqual == NULL &&
				TRIGGER_FOR_ROW(t->tgtype) && TRIGGER_FOR_BEFORE(t->tgtype);
	}
	return false;
}

/*
 * BEFORE INSERT FOR EACH STATEMENT on queuebox.outbox: wake the workers at
 * commit.  The late-commit report (claim.md, the intake floor) comes from
 * the rows themselves: the outbox_route trigger notes each intake row's id.
 * When that trigger does not fire with this one, or this one fires AFTER (a
 * 0.1.0 schema), the report is "from the start".
 */
Datum
qb_sql_wake_outbox(PG_FUNCTION_ARGS)
{
	TriggerData *td = (TriggerData *) fcinfo->context;

	qbsql_check_trigger(fcinfo, "_wake_outbox");
	qb_arm_outbox_wake();
	if (!TRIGGER_FIRED_BEFORE(td->tg_event) || !qbsql_route_fires_with(td->tg_relation, td->tg_trigger))
		qb_note_outbox_first_id(-1);
	return PointerGetDatum(NULL);
}

/* AFTER INSERT FOR EACH STATEMENT on queuebox.inbox */
Datum
qb_sql_wake_relay(PG_FUNCTION_ARGS)
{
	qbsql_check_trigger(fcinfo, "_wake_relay");
	qb_arm_relay_wake();
	return PointerGetDatum(NULL);
}

/*
 * queuebox._arm_relay_wake(): wake the relay when this transaction commits
 * (requeue_inbox makes rows pending by UPDATE, which the trigger misses).
 */
Datum
qb_sql_arm_relay_wake(PG_FUNCTION_ARGS)
{
	qb_arm_relay_wake();
	PG_RETURN_VOID();
}

/*
 * qbsql_cached_config: the stored document, parsed; cached per backend and
 * reparsed only when the stored text changes.  NULL when none is stored or
 * it does not parse (it was valid when stored: an override changed).
 */
static const QbConfig *
qbsql_cached_config(void)
{
	char	   *doc = qb_spi_load_document();

	if (doc == NULL)
		return NULL;
	if (qbsql_cached_text == NULL || strcmp(qbsql_cached_text, doc) != 0)
	{
		char		err[QB_ERRLEN];
		QbConfig   *cfg = NULL;

		if (qb_config_parse(doc, strlen(doc), qb_pg_config_env(), &cfg, err, sizeof(err)) != 0)
			return NULL;
		qb_config_free(qbsql_cached_cfg);
		free(qbsql_cached_text);
		qbsql_cached_cfg = cfg;
		qbsql_cached_text = strdup(doc);
		if (qbsql_cached_text == NULL)
		{
			qb_config_free(qbsql_cached_cfg);
			qbsql_cached_cfg = NULL;
			ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
		}
	}
	return qbsql_cached_cfg;
}

/*
 * queuebox.route_of(topic text) returns text: the destination the active
 * configuration gives a topic.  The parsed document is cached per backend
 * and reparsed only when the stored text changes.
 */
Datum
qb_sql_route_of(PG_FUNCTION_ARGS)
{
	char	   *topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	const QbConfig *cfg = qbsql_cached_config();
	int			ri;

	if (cfg == NULL)
		PG_RETURN_NULL();
	ri = qb_config_route_find(cfg, topic);
	if (ri < 0)
		PG_RETURN_NULL();
	/* fan-out: every destination, in the route's order */
	PG_RETURN_TEXT_P(cstring_to_text(cfg->routes[ri].dest_list));
}

/* queuebox._destination_names(): the destinations of the stored document. */
Datum
qb_sql_destination_names(PG_FUNCTION_ARGS)
{
	const QbConfig *cfg = qbsql_cached_config();
	int			n = cfg ? cfg->ndestinations : 0;
	Datum	   *d = palloc(sizeof(Datum) * (n + 1));

	for (int i = 0; i < n; i++)
		d[i] = CStringGetTextDatum(cfg->destinations[i].name);
	PG_RETURN_ARRAYTYPE_P(qb_text_array(d, n));
}

/* queuebox.worker_status(): the launcher, the outbox workers, the relay and the ingress running now. */
Datum
qb_sql_worker_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum		values[3];
	bool		nulls[3] = {false, false, false};

	InitMaterializedSRF(fcinfo, 0);
	if (qb_shared->launcher_pid != 0)
	{
		values[0] = CStringGetTextDatum("launcher");
		values[1] = Int32GetDatum(qb_shared->launcher_pid);
		nulls[2] = true;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	nulls[2] = false;
	values[2] = CStringGetTextDatum(qb_shared->database);
	for (int i = 0; i < QB_MAX_OUTBOX_WORKERS; i++)
	{
		pid_t		pid = qb_shared->outbox[i].pid;
		char		name[32];

		if (pid == 0)
			continue;
		snprintf(name, sizeof(name), "outbox %d", i);
		values[0] = CStringGetTextDatum(name);
		values[1] = Int32GetDatum(pid);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	for (int r = 0; r < 2 + QB_MAX_CONSUMER_WORKERS; r++)
	{
		QbWorkerSlot *slot = r == 0 ? &qb_shared->relay : r == 1 ? &qb_shared->ingress :
			&qb_shared->consumer[r - 2];
		char		name[32];

		if (slot->pid == 0)
			continue;
		if (r < 2)
			snprintf(name, sizeof(name), "%s", r == 0 ? "relay" : "ingress");
		else
			snprintf(name, sizeof(name), "consumer %d", r - 2);
		values[0] = CStringGetTextDatum(name);
		values[1] = Int32GetDatum(slot->pid);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}

/*
 * qbsql_run executes one of the worker statements in the caller's
 * transaction with the caller's first arguments, which have the
 * statement's types (qb_pg_stmts); a claim called from SQL records no
 * claimer, so only its lease ends it.
 */
static uint64
qbsql_run(FunctionCallInfo fcinfo, QbPgStmtId id, int ok_code)
{
	Oid			types[QB_PG_MAXPARAMS];
	int			nargs = qb_spi_stmt_types(id, types);
	Datum		values[QB_PG_MAXPARAMS];
	char		nulls[QB_PG_MAXPARAMS];
	int			rc;

	/* parameters past the function's arguments (a claim's claimer) are NULL: none */
	for (int i = 0; i < nargs; i++)
	{
		values[i] = i < PG_NARGS() ? PG_GETARG_DATUM(i) : (Datum) 0;
		nulls[i] = i >= PG_NARGS() || PG_ARGISNULL(i) ? 'n' : ' ';
	}
	rc = SPI_execute_with_args(qb_pg_stmts[id].sql, nargs, types, values, nulls, false, 0);
	if (rc != ok_code)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("queuebox statement failed: %s", SPI_result_code_string(rc))));
	return SPI_processed;
}

/* qbsql_count: run a worker statement, return the rows it changed. */
static Datum
qbsql_count(FunctionCallInfo fcinfo, QbPgStmtId id, int ok_code)
{
	uint64		n;

	SPI_connect();
	n = qbsql_run(fcinfo, id, ok_code);
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

/*
 * qbsql_rows: run a worker statement that returns rows, return them as a
 * set.  pre (or -1), an INSERT taking the first argument, runs first in a
 * statement of its own.
 */
static Datum
qbsql_rows(FunctionCallInfo fcinfo, int pre, QbPgStmtId id, int ok_code)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	uint64		n;

	InitMaterializedSRF(fcinfo, 0);
	SPI_connect();
	if (pre >= 0)
		qbsql_run(fcinfo, pre, SPI_OK_INSERT);
	n = qbsql_run(fcinfo, id, ok_code);
	for (uint64 i = 0; i < n; i++)
		tuplestore_puttuple(rsinfo->setResult, SPI_tuptable->vals[i]);
	SPI_finish();
	return (Datum) 0;
}

/*
 * qbsql_check_nargs: a function of the 0.1.0 schema called into this
 * library has fewer arguments than the statement needs.
 */
static void
qbsql_check_nargs(FunctionCallInfo fcinfo, int nargs, const char *name)
{
	if (PG_NARGS() != nargs)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("queuebox.%s() of an older schema version was called", name),
				 errdetail("The installed library is version %s; the schema in this database is older.", QB_VERSION),
				 errhint("Run ALTER EXTENSION queuebox UPDATE.")));
}

/*
 * queuebox._outbox_claim(batch_size, lease_ms, default_max_attempts, token,
 * floor, destinations, limits, probes, floors)
 */
Datum
qb_sql_outbox_claim(PG_FUNCTION_ARGS)
{
	qbsql_check_nargs(fcinfo, 9, "_outbox_claim");
	return qbsql_rows(fcinfo, -1, QB_PG_S_CLAIM, SPI_OK_UPDATE_RETURNING);
}

/*
 * queuebox._outbox_settle(token, ids, outcomes, attempts, delays_ms,
 * errors, destinations): the workers' settle and promotion
 * (qb_spi_outbox_settle), every row under one token.
 */
Datum
qb_sql_outbox_settle(PG_FUNCTION_ARGS)
{
	ArrayType  *ids;
	int			n;
	Datum	   *tokens;
	Datum		args[8];
	char		nulls[8];
	uint64		settled;

	qbsql_check_nargs(fcinfo, 7, "_outbox_settle");
	for (int i = 0; i < 6; i++)
		if (PG_ARGISNULL(i))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("queuebox._outbox_settle() argument %d is NULL", i + 1)));
	ids = PG_GETARG_ARRAYTYPE_P(1);
	n = ArrayGetNItems(ARR_NDIM(ids), ARR_DIMS(ids));
	tokens = palloc(sizeof(Datum) * (n + 1));
	for (int i = 0; i < n; i++)
		tokens[i] = PG_GETARG_DATUM(0);
	args[0] = PointerGetDatum(construct_array(tokens, n, UUIDOID, 16, false, TYPALIGN_CHAR));
	nulls[0] = ' ';
	for (int i = 1; i < 7; i++)
	{
		args[i] = PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	/* not known here: each ended row's key is promoted at every destination */
	args[7] = (Datum) 0;
	nulls[7] = 'n';
	SPI_connect();
	/* not known which rows were fan-out rows: as if some were */
	settled = qb_spi_outbox_settle(args, nulls, true, NULL, NULL);
	SPI_finish();
	PG_RETURN_INT64((int64) settled);
}

/* queuebox._outbox_breaker(destinations, succeeded, failed, gone, retry_after_ms, errors, failures, cooldown_ms) */
Datum
qb_sql_outbox_breaker(PG_FUNCTION_ARGS)
{
	/* as qbs_breaker: the rows first, in a statement of their own */
	return qbsql_rows(fcinfo, QB_PG_S_BREAKER_ROWS, QB_PG_S_BREAKER, SPI_OK_SELECT);
}

/* queuebox._outbox_states(probe_ms) */
Datum
qb_sql_outbox_states(PG_FUNCTION_ARGS)
{
	return qbsql_rows(fcinfo, -1, QB_PG_S_STATES, SPI_OK_SELECT);
}

/* queuebox._outbox_unpark(destinations, max_rows) */
Datum
qb_sql_outbox_unpark(PG_FUNCTION_ARGS)
{
	return qbsql_count(fcinfo, QB_PG_S_UNPARK, SPI_OK_UPDATE);
}

/* queuebox._outbox_reclaim(max_rows) */
Datum
qb_sql_outbox_reclaim(PG_FUNCTION_ARGS)
{
	return qbsql_count(fcinfo, QB_PG_S_RECLAIM, SPI_OK_UPDATE);
}

/*
 * queuebox._outbox_retention(keep_sec, max_rows): the rows deleted.  It has
 * no floor argument: the statement's NULL floor walks from the start.
 */
Datum
qb_sql_outbox_retention(PG_FUNCTION_ARGS)
{
	bool		isnull;
	int32		n = 0;

	SPI_connect();
	if (qbsql_run(fcinfo, QB_PG_S_RETENTION, SPI_OK_SELECT) == 1)
		n = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
										&isnull));
	SPI_finish();
	PG_RETURN_INT64((int64) n);
}

/* queuebox.topic_matches(pattern text, topic text): the routes' matcher */
Datum
qb_sql_topic_matches(PG_FUNCTION_ARGS)
{
	char	   *pattern = text_to_cstring(PG_GETARG_TEXT_PP(0));
	char	   *topic = text_to_cstring(PG_GETARG_TEXT_PP(1));
	char		err[QB_ERRLEN];

	if (!qb_pattern_check(pattern, err, sizeof(err)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid topic pattern \"%s\": %s", pattern, err),
				 errhint("Segments are separated by single dots; \"*\" matches one segment, \"**\" any number.")));
	PG_RETURN_BOOL(qb_topic_match(pattern, topic));
}

/*
 * queuebox._arm_outbox_wake(): wake the outbox workers when this transaction
 * commits (for operations that make rows due by UPDATE, which the INSERT
 * trigger does not see).
 */
Datum
qb_sql_arm_outbox_wake(PG_FUNCTION_ARGS)
{
	qb_arm_outbox_wake_always();
	PG_RETURN_VOID();
}

/* queuebox._relay_claim(batch_size, lease_ms, token) */
Datum
qb_sql_relay_claim(PG_FUNCTION_ARGS)
{
	return qbsql_rows(fcinfo, -1, QB_PG_S_RELAY_CLAIM, SPI_OK_SELECT);
}

/*
 * queuebox._relay_forward(token, ids, topics, max_attempts): inbox rows
 * settled; then, in a statement of its own, the next row of each aggregate
 * that ended is promoted (qb_spi_relay_promote), as the relay worker does.
 */
Datum
qb_sql_relay_forward(PG_FUNCTION_ARGS)
{
	bool		isnull;
	int64		n;

	SPI_connect();
	if (qbsql_run(fcinfo, QB_PG_S_RELAY_FORWARD, SPI_OK_SELECT) != 1)
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("relay forward returned no row")));
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	if (!PG_ARGISNULL(1))
		qb_spi_relay_promote(PG_GETARG_DATUM(1));
	SPI_finish();
	PG_RETURN_INT64(n);
}

/*
 * The replay of inbox rows: qbsql_replay selects the rows (one id, or by
 * filter), renders each topic from the CURRENT configuration exactly as the
 * relay does (qb_relay_topic), and inserts the outbox rows through the
 * relay's mapping (QB_PG_INBOX_REPLAY) in created_at, id order.  The inbox
 * rows are not changed.
 */
typedef struct QbsqlReplay
{
	int64		one_id;			/* the id asked for, or 0 */
	bool		single;
	QbReplay	rows;			/* selected and rendered (malloc'd, freed at once) */
	int			nrows;			/* rows selected */
	int			nskipped;		/* of which the topic rendered empty */
	int64		first_id;		/* the first new outbox id */
	int64		inserted;
	/* for the error or NOTICE: the source of a row that rendered empty */
	char	   *skipped_source;
} QbsqlReplay;

/* qbsql_load_config: the stored document, validated, or an ERROR. */
static QbConfig *
qbsql_load_config(void)
{
	char	   *doc = qb_spi_load_document();
	char		err[QB_ERRLEN];
	QbConfig   *cfg = NULL;

	if (doc == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("no queuebox configuration is stored"),
				 errdetail("A replayed inbox row takes its topic from its source's template in the configuration."),
				 errhint("Store one with SELECT queuebox.configure(...).")));
	if (qb_config_parse(doc, strlen(doc), qb_pg_config_env(), &cfg, err, sizeof(err)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the stored queuebox configuration is not valid in this session: %s", err),
				 errhint("Fix the document with queuebox.configure(), or the environment it reads.")));
	pfree(doc);
	return cfg;
}

/*
 * qbsql_replay_rows runs with cfg loaded (the caller frees it and r->rows,
 * also on an ERROR): select, render (qb_replay_render), insert.
 */
static void
qbsql_replay_rows(const QbConfig *cfg, Datum *sel_values, char *sel_nulls,
				  QbsqlReplay *r)
{
	Oid			sel_types[QB_PG_MAXPARAMS];
	Oid			ins_types[QB_PG_MAXPARAMS];
	int			nsel = qb_spi_stmt_types(QB_PG_S_REPLAY_SELECT, sel_types);
	int			nins = qb_spi_stmt_types(QB_PG_S_REPLAY, ins_types);
	Datum		ins_values[3];
	Datum	   *ids;
	Datum	   *topics;
	int64	   *sel_ids;
	const char **sources;
	const char **event_types;
	int			nrows;
	SPITupleTable *tt;

	if (SPI_execute_with_args(qb_pg_stmts[QB_PG_S_REPLAY_SELECT].sql, nsel, sel_types, sel_values,
							  sel_nulls, true, 0) != SPI_OK_SELECT)
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("reading queuebox.inbox failed")));
	tt = SPI_tuptable;
	nrows = (int) SPI_processed;
	sel_ids = palloc(sizeof(int64) * (nrows + 1));
	sources = palloc(sizeof(char *) * (nrows + 1));
	event_types = palloc(sizeof(char *) * (nrows + 1));
	for (int i = 0; i < nrows; i++)
	{
		bool		isnull;

		sel_ids[i] = DatumGetInt64(SPI_getbinval(tt->vals[i], tt->tupdesc, 1, &isnull));
		sources[i] = SPI_getvalue(tt->vals[i], tt->tupdesc, 2);
		event_types[i] = SPI_getvalue(tt->vals[i], tt->tupdesc, 3);
	}
	if (!qb_replay_render(cfg, (const int64_t *) sel_ids, sources, event_types, nrows, &r->rows))
		ereport(ERROR, (errcode(ERRCODE_OUT_OF_MEMORY), errmsg("out of memory")));
	r->nrows = r->rows.nrows;
	r->nskipped = r->rows.nskipped;
	if (r->rows.skipped >= 0)
		r->skipped_source = (char *) sources[r->rows.skipped];
	if (r->rows.n == 0)
		return;
	ids = palloc(sizeof(Datum) * r->rows.n);
	topics = palloc(sizeof(Datum) * r->rows.n);
	for (int i = 0; i < r->rows.n; i++)
	{
		ids[i] = Int64GetDatum(r->rows.ids[i]);
		topics[i] = CStringGetTextDatum(r->rows.topics[i]);
	}
	ins_values[0] = PointerGetDatum(qb_int8_array(ids, r->rows.n));
	ins_values[1] = PointerGetDatum(qb_text_array(topics, r->rows.n));
	ins_values[2] = Int32GetDatum(qb_config_relay_max_attempts(cfg));
	if (SPI_execute_with_args(qb_pg_stmts[QB_PG_S_REPLAY].sql, nins, ins_types, ins_values, NULL,
							  false, 0) != SPI_OK_INSERT_RETURNING)
		ereport(ERROR, (errcode(ERRCODE_INTERNAL_ERROR), errmsg("inserting the replayed outbox rows failed")));
	r->inserted = (int64) SPI_processed;
	if (r->inserted > 0)
	{
		bool		isnull;

		r->first_id = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
												  SPI_tuptable->tupdesc, 1, &isnull));
	}
}

static void
qbsql_replay(Datum *sel_values, char *sel_nulls, QbsqlReplay *r)
{
	MemoryContext caller = CurrentMemoryContext;
	QbConfig   *volatile cfg = NULL;

	SPI_connect();
	cfg = qbsql_load_config();
	PG_TRY();
	{
		qbsql_replay_rows(cfg, sel_values, sel_nulls, r);
	}
	PG_FINALLY();
	{
		qb_config_free(cfg);
		qb_replay_free(&r->rows);
	}
	PG_END_TRY();
	if (r->skipped_source)
		r->skipped_source = MemoryContextStrdup(caller, r->skipped_source);
	SPI_finish();
}

/*
 * queuebox.replay_inbox(id bigint) returns bigint: a new outbox row from
 * one inbox row, in any state; returns its id.
 */
Datum
qb_sql_replay_inbox_one(PG_FUNCTION_ARGS)
{
	QbsqlReplay r = {0};
	Datum		values[5] = {PG_GETARG_DATUM(0), 0, 0, 0, 0};
	char		nulls[5] = {' ', 'n', 'n', 'n', 'n'};

	r.one_id = PG_GETARG_INT64(0);
	r.single = true;
	qbsql_replay(values, nulls, &r);
	if (r.nrows == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg(QB_REPLAY_MISSING_FMT, (long long) r.one_id),
				 errhint("Find the row with SELECT id, source, idempotency_key, state FROM queuebox.inbox.")));
	if (r.nskipped > 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg(QB_REPLAY_EMPTY_FMT, (long long) r.one_id),
				 errdetail(QB_REPLAY_EMPTY_DETAIL_FMT, r.skipped_source),
				 errhint(QB_REPLAY_EMPTY_HINT)));
	PG_RETURN_INT64(r.first_id);
}

/*
 * queuebox.replay_inbox(state, source, since, until) returns bigint: every
 * inbox row in that state (NULL: any) of that source (NULL: any) created in
 * [since, until), in created_at, id order; rows whose topic renders empty
 * are skipped (a NOTICE counts them).  Returns the outbox rows inserted.
 */
Datum
qb_sql_replay_inbox(PG_FUNCTION_ARGS)
{
	QbsqlReplay r = {0};
	Datum		values[5] = {0};
	char		nulls[5] = {'n', ' ', ' ', ' ', ' '};

	for (int i = 0; i < 4; i++)
	{
		values[i + 1] = PG_GETARG_DATUM(i);
		nulls[i + 1] = PG_ARGISNULL(i) ? 'n' : ' ';
	}
	qbsql_replay(values, nulls, &r);
	if (r.nskipped > 0)
		ereport(NOTICE,
				(errmsg("%d inbox row%s skipped: the topic renders empty", r.nskipped,
						r.nskipped == 1 ? " was" : "s were"),
				 errdetail("For example a row of source \"%s\".", r.skipped_source),
				 errhint(QB_REPLAY_EMPTY_HINT)));
	PG_RETURN_INT64(r.inserted);
}
