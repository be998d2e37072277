/*-------------------------------------------------------------------------
 * config_file.c
 *	  The configuration from a file: queuebox.config_file, and
 *	  queuebox.config_source(), which says where the configuration in force
 *	  came from.
 *
 * Wording:
 *	- The file is the YAML document queuebox.config_file names (a superuser's
 *	  setting: postgresql.conf or ALTER SYSTEM).  While it is set it is the
 *	  one source of truth: configure() refuses (sql_api.c), and the workers
 *	  read the file at start and at every SIGHUP (worker_host.c).
 *	- The copy is queuebox.config's row: a worker that loads a valid file
 *	  writes its text there when it differs, so every reader of the stored
 *	  document (route_of(), replays, the console, pg_dump) sees the document
 *	  in force.  An invalid file is not copied: the previous document stays
 *	  in force, in the workers and in the table.
 *	- The load record is QbMetrics.config in shared memory (qb_metrics.h):
 *	  the last load's source, path, SHA-256 and time, and the last failure.
 *	  Every worker writes it when it loads; they all read the same file, so
 *	  the last writer is as good as any, and a failure they all meet is
 *	  counted once (the record knows the failed document).
 *
 * Transactions: qb_config_file_load runs inside a worker's store call
 * (spi_store.c, its own transaction, SPI connected): the file's copy
 * commits with it.  An invalid file raises an ERROR that the store call
 * turns into the engine's "keeping the previous one" (qb_host.c).
 *-------------------------------------------------------------------------
 */
#include "postgres.h"
#include "pg_compat.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "storage/fd.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "qb_pg.h"

PG_FUNCTION_INFO_V1(qb_sql_config_source);

/*
 * qbcfile_read: the file's text, malloc'd; NULL with err set when it cannot
 * be read, is too large, or holds a NUL byte.
 */
static char *
qbcfile_read(const char *path, char *err, size_t errlen)
{
	FILE	   *f = AllocateFile(path, PG_BINARY_R);
	char	   *buf;
	size_t		len;

	if (f == NULL)
	{
		snprintf(err, errlen, "could not open it: %m");
		return NULL;
	}
	if ((buf = malloc(QB_CONFIG_DOC_MAX + 2)) == NULL)
	{
		FreeFile(f);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	len = fread(buf, 1, QB_CONFIG_DOC_MAX + 1, f);
	if (ferror(f))
		snprintf(err, errlen, "could not read it: %m");
	else if (len > QB_CONFIG_DOC_MAX)
		snprintf(err, errlen, "it is larger than %d bytes; move large transforms into fewer, shorter programs",
				 QB_CONFIG_DOC_MAX);
	else if (memchr(buf, '\0', len) != NULL)
		snprintf(err, errlen, "it holds a NUL byte at offset %zu; a configuration is UTF-8 text",
				 (size_t) ((char *) memchr(buf, '\0', len) - buf));
	else
	{
		FreeFile(f);
		buf[len] = '\0';
		return buf;
	}
	FreeFile(f);
	free(buf);
	return NULL;
}

/*
 * qb_config_file_load: see config_file.c's banner.  *text gets the file's
 * document (malloc'd); an ERROR when it is not valid.
 */
void
qb_config_file_load(char **text)
{
	const char *path = qb_config_file;
	char		why[QB_ERRLEN];
	char		msg[QB_ERRLEN + MAXPGPATH + 64];
	char	   *doc = qbcfile_read(path, why, sizeof(why));
	QbConfig   *cfg = NULL;
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	if (doc == NULL || qb_config_parse(doc, strlen(doc), qb_pg_config_env(), &cfg, why, sizeof(why)) != 0)
	{
		snprintf(msg, sizeof(msg), "queuebox.config_file %s: %s", path, why);
		qb_config_load_note(&qb_shared->metrics, QB_CONFIG_SOURCE_FILE, path, false,
							doc, doc ? strlen(doc) : 0, msg);
		free(doc);
		ereport(ERROR,
				(errcode(ERRCODE_CONFIG_FILE_ERROR),
				 errmsg("%s", msg),
				 errhint("Fix the file and run SELECT pg_reload_conf(); the configuration in force stays until then.")));
	}
	qb_config_free(cfg);
	*text = doc;

	/* the copy in queuebox.config, written only when it differs */
	values[0] = CStringGetTextDatum(doc);
	if (SPI_execute_with_args("INSERT INTO queuebox.config (id, document, updated_by)"
							  " VALUES (1, $1, 'queuebox.config_file')"
							  " ON CONFLICT (id) DO UPDATE SET document = excluded.document,"
							  " updated_at = now(), updated_by = excluded.updated_by"
							  " WHERE queuebox.config.document IS DISTINCT FROM excluded.document",
							  1, types, values, NULL, false, 0) != SPI_OK_INSERT)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not copy queuebox.config_file into queuebox.config")));
	qb_config_load_note(&qb_shared->metrics, QB_CONFIG_SOURCE_FILE, path, true, doc, strlen(doc), NULL);
}

/*
 * qb_config_table_loaded: the workers loaded queuebox.config's document
 * (text NULL: none is stored); noted as the load record, valid or not.
 */
void
qb_config_table_loaded(const char *text)
{
	char		why[QB_ERRLEN];
	QbConfig   *cfg = NULL;

	if (text == NULL)
		return;
	if (qb_config_parse(text, strlen(text), qb_pg_config_env(), &cfg, why, sizeof(why)) != 0)
	{
		qb_config_load_note(&qb_shared->metrics, QB_CONFIG_SOURCE_TABLE, NULL, false, text, strlen(text), why);
		return;
	}
	qb_config_free(cfg);
	qb_config_load_note(&qb_shared->metrics, QB_CONFIG_SOURCE_TABLE, NULL, true, text, strlen(text), NULL);
}

static Datum
qbcfile_time(int64_t ms, bool *isnull)
{
	*isnull = ms == 0;
	return *isnull ? (Datum) 0 :
		TimestampTzGetDatum(time_t_to_timestamptz((pg_time_t) (ms / 1000)) + (ms % 1000) * 1000);
}

/*
 * queuebox.config_source(): one row, where the configuration in force came
 * from (file, table, or none yet), the file's path, when the workers
 * loaded it, its SHA-256, and the last failed load (NULL: none since the
 * server started, or since a good one).  Before any worker loaded one, the
 * source is what they will read: the file when queuebox.config_file is
 * set.
 */
Datum
qb_sql_config_source(PG_FUNCTION_ARGS)
{
	TupleDesc	desc;
	QbConfigLoad c;
	Datum		values[6];
	bool		nulls[6] = {0};
	QbConfigSource source;

	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("queuebox.config_source() must return a row")));
	desc = BlessTupleDesc(desc);
	qb_config_load_read(&qb_shared->metrics, &c);
	source = c.loads > 0 ? (QbConfigSource) c.source :
		(qb_config_file[0] != '\0' ? QB_CONFIG_SOURCE_FILE : QB_CONFIG_SOURCE_NONE);
	values[0] = CStringGetTextDatum(qb_config_source_name(source));
	if (c.loads > 0 ? c.path[0] != '\0' : qb_config_file[0] != '\0')
		values[1] = CStringGetTextDatum(c.loads > 0 ? c.path : qb_config_file);
	else
		nulls[1] = true;
	values[2] = qbcfile_time(c.loaded_at_ms, &nulls[2]);
	if (c.sha256[0] != '\0')
		values[3] = CStringGetTextDatum(c.sha256);
	else
		nulls[3] = true;
	if (c.last_failed)
	{
		values[4] = CStringGetTextDatum(c.error);
		values[5] = qbcfile_time(c.failed_at_ms, &nulls[5]);
	}
	else
		nulls[4] = nulls[5] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
