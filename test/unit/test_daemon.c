/*
 * test_daemon.c
 *	  cmocka tests of the daemon's process (src/daemon/process): the role
 *	  set a configuration wants, the restart policy, the reload decision,
 *	  the shared document's seqlock across processes, the log line, URL
 *	  redaction, the file checks, the role host's signals and idle
 *	  polling, and the backends' ops tables (which backend a URL picks,
 *	  every field set).  The supervisor and the roles end to end are TAP 028-030.
 */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cmocka.h>

#include <jansson.h>

#include "daemon_host.h"
#include "odbc_store.h"
#include "pq_store.h"
#include "ops_holes.h"
#include "qbd.h"
#include "supervisor.h"

static QbConfig *
parse(const char *doc)
{
	QbConfig   *cfg = NULL;
	char		err[QB_ERRLEN] = "";

	if (qb_config_parse(doc, strlen(doc), NULL, &cfg, err, sizeof(err)) != 0)
		fail_msg("parse failed: %s", err);
	return cfg;
}

static void
test_roles_wanted(void **state)
{
	QbConfig   *cfg = parse(
		"database: {url: 'postgres://q@localhost/db'}\n"
		"daemon: {outboxWorkers: 3}\n"
		"sources:\n"
		"  hook: {type: http, path: /h, idempotencyKeyHeader: X-Id, topic: '{{ source }}'}\n"
		"  orders: {type: rabbitmq, url: 'amqp://localhost', queue: q, topic: '{{ source }}'}\n"
		"  clicks: {type: nats, url: 'nats://localhost', subject: c, stream: s, topic: '{{ source }}'}\n");
	QbdRole		r[16];
	int			n = qbd_roles_wanted(cfg, r, 16);
	char		name[64];

	assert_int_equal(n, 3 + 1 + 1 + 2);
	for (int i = 0; i < 3; i++)
	{
		assert_int_equal(r[i].kind, QB_ENGINE_OUTBOX);
		assert_int_equal(r[i].index, i);
		assert_int_equal(r[i].pid, 0);
	}
	assert_int_equal(r[3].kind, QB_ENGINE_RELAY);
	assert_int_equal(r[4].kind, QB_ENGINE_INGRESS);
	assert_int_equal(r[5].kind, QB_ENGINE_CONSUMER);
	assert_int_equal(r[6].index, 1);
	qb_engine_name(r[6].kind, r[6].index, name, sizeof(name));
	assert_string_equal(name, "consumer 1");
	/* a short table gets what fits */
	assert_int_equal(qbd_roles_wanted(cfg, r, 2), 2);
	qb_config_free(cfg);

	/* the defaults: two outbox workers, the relay, the ingress */
	cfg = parse("database: {url: 'postgres://q@localhost/db'}\n");
	assert_int_equal(qbd_roles_wanted(cfg, r, 16), 4);
	qb_config_free(cfg);
}

static void
test_restart_policy(void **state)
{
	QbdRole		r = {.kind = QB_ENGINE_OUTBOX};

	assert_int_equal(qbd_restart_delay(0), 0);
	assert_int_equal(qbd_restart_delay(1), 1000);
	assert_int_equal(qbd_restart_delay(2), 2000);
	assert_int_equal(qbd_restart_delay(6), 32000);
	assert_int_equal(qbd_restart_delay(7), QBD_RESTART_MAX_MS);
	assert_int_equal(qbd_restart_delay(1000), QBD_RESTART_MAX_MS);

	/* quick exits in a row back off ... */
	r.started_ms = 100000;
	qbd_role_exited(&r, 100500);
	assert_int_equal(r.crashes, 1);
	assert_int_equal(r.restart_at_ms, 101500);
	r.started_ms = 101500;
	qbd_role_exited(&r, 102000);
	assert_int_equal(r.crashes, 2);
	assert_int_equal(r.restart_at_ms, 104000);
	/* ... and a long run forgives them: restarted at once */
	r.started_ms = 104000;
	qbd_role_exited(&r, 104000 + QBD_RESTART_STABLE_MS);
	assert_int_equal(r.crashes, 0);
	assert_int_equal(r.restart_at_ms, 104000 + QBD_RESTART_STABLE_MS);
	assert_int_equal(r.pid, 0);
}

static void
test_database_changed(void **state)
{
	QbConfig   *a = parse("database: {url: 'postgres://q@h1/db'}\n");
	QbConfig   *b = parse("database: {url: 'postgres://q@h1/db'}\noutbox: {batchSize: 7}\n");
	QbConfig   *c = parse("database: {url: 'postgres://q@h2/db'}\n");
	QbConfig   *d = parse("database: {url: 'postgres://q@h1/db', listen: true}\n");

	assert_false(qbd_database_changed(a, b));	/* a reload is enough */
	assert_true(qbd_database_changed(a, c));
	assert_true(qbd_database_changed(a, d));
	qb_config_free(a);
	qb_config_free(b);
	qb_config_free(c);
	qb_config_free(d);
}

static void
expect_redacted(const char *url, const char *want)
{
	char		buf[256];

	qbd_redact_url(url, buf, sizeof(buf));
	assert_string_equal(buf, want);
}

static void
test_redact_url(void **state)
{
	expect_redacted("postgres://app:s3cret@db:5432/app", "postgres://app:***@db:5432/app");
	expect_redacted("postgres://app@db/app", "postgres://app@db/app");
	expect_redacted("postgres://db/app?sslmode=require&password=s3cret&x=1",
					"postgres://db/app?sslmode=require&password=***&x=1");
	/* a password holding '@' or ':': everything up to the host's '@' */
	expect_redacted("postgresql://u:p@s:s@host/db", "postgresql://u:***@host/db");
	/* ... or '?', which libpq keeps in the password (the user info ends at '/') */
	expect_redacted("postgres://u:p?s@host/db", "postgres://u:***@host/db");
	expect_redacted("postgres://u:p?s@host", "postgres://u:***@host");
	/* libpq decodes the query's keys: pass%77ord is password */
	expect_redacted("postgres://h/db?pass%77ord=s3cret&sslmode=require",
					"postgres://h/db?pass%77ord=***&sslmode=require");
	/* Unix sockets: no host, or a %-encoded directory in its place */
	expect_redacted("postgres://u:s3cret@/app?host=/var/run/postgresql",
					"postgres://u:***@/app?host=/var/run/postgresql");
	expect_redacted("postgres://u:s3cret@%2Fvar%2Frun%2Fpostgresql:5433/app",
					"postgres://u:***@%2Fvar%2Frun%2Fpostgresql:5433/app");
	expect_redacted("postgresql://", "postgresql://");
	expect_redacted("sqlserver://sa:s3cret@mssql:1433/app?encrypt=false",
					"sqlserver://sa:***@mssql:1433/app?encrypt=false");
	expect_redacted("not a url", "(a database URL)");
}

static void
test_log_format(void **state)
{
	char		line[1024];
	json_t	   *o;
	json_error_t jerr;

	qbd_log_format(line, sizeof(line), false, 1764596400.25, "outbox 0", 42, QB_LOG_WARNING, "slow");
	assert_string_equal(line, "2025-12-01T13:40:00.250Z WARNING outbox 0[42]: slow");
	qbd_log_format(line, sizeof(line), true, 1764596400.25, "relay", 7, QB_LOG_INFO,
				   "a \"quoted\"\nline");
	o = json_loads(line, 0, &jerr);
	assert_non_null(o);
	assert_string_equal(json_string_value(json_object_get(o, "ts")), "2025-12-01T13:40:00.250Z");
	assert_string_equal(json_string_value(json_object_get(o, "level")), "info");
	assert_string_equal(json_string_value(json_object_get(o, "role")), "relay");
	assert_int_equal(json_integer_value(json_object_get(o, "pid")), 7);
	assert_string_equal(json_string_value(json_object_get(o, "msg")), "a \"quoted\"\nline");
	assert_null(strchr(line, '\n'));	/* one line per event */
	json_decref(o);
}

/*
 * The seqlock across processes: a child reads while the parent publishes
 * documents made of one repeated letter; a torn copy would mix letters.
 */
static void
test_shared_seqlock(void **state)
{
	char		err[256];
	QbdShared  *sh = qbd_shared_create(err, sizeof(err));
	uint64_t	gen;
	char	   *doc;
	char	   *big = malloc(QBD_DOC_MAX);
	pid_t		pid;
	int			status;

	assert_non_null(sh);
	assert_null(qbd_shared_read(sh, &gen));
	assert_int_equal(gen, 0);
	qbd_shared_publish(sh, "outbox: {}", 10);
	doc = qbd_shared_read(sh, &gen);
	assert_string_equal(doc, "outbox: {}");
	assert_int_equal(gen, 2);
	free(doc);
	qbd_shared_publish(sh, "zzzz", 4);	/* the child checks one letter a document */

	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
	{
		int			torn = 0;
		uint64_t	last = 0;

		for (int i = 0; i < 3000; i++)
		{
			char	   *d = qbd_shared_read(sh, &gen);
			size_t		len = strlen(d);

			for (size_t k = 1; k < len; k++)
				if (d[k] != d[0])
				{
					torn++;
					break;
				}
			if (gen < last || (gen & 1))
				torn++;
			last = gen;
			free(d);
		}
		free(big);				/* the parent's copy; valgrind counts it as the child's */
		_exit(torn == 0 ? 0 : 1);
	}
	for (int i = 0; i < 3000; i++)
	{
		size_t		len = 1000 + (size_t) (i * 7919) % 60000;

		memset(big, 'a' + i % 26, len);
		qbd_shared_publish(sh, big, len);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_true(qbd_shared_gen(sh) == 4 + 2 * 3000);
	free(big);
}

static char *
write_file(const char *text)
{
	static char path[64];
	FILE	   *f;

	snprintf(path, sizeof(path), "/tmp/qbd_test_%d.yaml", (int) getpid());
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

static void
expect_read_error(const char *text, const char *want)
{
	char	   *doc = NULL;
	QbConfig   *cfg = NULL;
	char		err[QB_ERRLEN] = "";
	char	   *path = write_file(text);

	assert_int_equal(qbd_config_read(path, &doc, &cfg, err, sizeof(err)), -1);
	assert_null(doc);
	assert_null(cfg);
	if (strstr(err, want) == NULL)
		fail_msg("message \"%s\" lacks \"%s\"", err, want);
	assert_null(strstr(err, "s3cret"));
	unlink(path);
}

static void
test_config_file(void **state)
{
	char	   *doc = NULL;
	QbConfig   *cfg = NULL;
	char		err[QB_ERRLEN] = "";
	char	   *path = write_file("database:\n  url: postgres://q:s3cret@localhost/db\n");

	assert_int_equal(qbd_config_read(path, &doc, &cfg, err, sizeof(err)), 0);
	assert_string_equal(cfg->database.url, "postgres://q:s3cret@localhost/db");
	assert_non_null(strstr(doc, "database:"));
	qb_config_free(cfg);
	free(doc);
	unlink(path);

	/* every form of libpq's URIs: a host list, a Unix socket in the query or in the host's place, none */
	{
		static const char *const libpq[] = {
			"postgres://q:s3cret@db1:5432,db2,[::1]:5433/app?target_session_attrs=read-write",
			"postgres://postgres@/app?host=/var/run/postgresql",
			"postgres://postgres@%2Fvar%2Frun%2Fpostgresql:5433/app",
			"postgresql:///app?host=/tmp&port=5433",
			"postgresql://",
			"postgres://db1,%2Ftmp/app?port=5432,5433",
		};

		for (size_t i = 0; i < sizeof(libpq) / sizeof(libpq[0]); i++)
		{
			char		text[256];

			snprintf(text, sizeof(text), "database: {url: '%s'}\n", libpq[i]);
			path = write_file(text);
			if (qbd_config_read(path, &doc, &cfg, err, sizeof(err)) != 0)
				fail_msg("%s is refused: %s", libpq[i], err);
			assert_string_equal(cfg->database.url, libpq[i]);
			qb_config_free(cfg);
			free(doc);
			unlink(path);
		}
	}

	path = write_file("database: {url: 'sqlserver://sa:s3cret@mssql:1433/app?encrypt=false'}\n");
	assert_int_equal(qbd_config_read(path, &doc, &cfg, err, sizeof(err)), 0);
	assert_string_equal(qbd_backend_for(cfg->database.url)->name, "sqlserver");
	qb_config_free(cfg);
	free(doc);
	unlink(path);

	expect_read_error("outbox: {}\n", "database.url: queuebox-mssqld needs the database it serves");
	/* SQL Server: the URL is checked at read time, and it has no LISTEN */
	expect_read_error("database: {url: 'sqlserver://sa:s3cret@mssql:1433/app', listen: true}\n",
					  "database.listen: SQL Server has no notification at commit");
	expect_read_error("database: {url: 'sqlserver://sa:s3cret@mssql:1433/app?ssl=1'}\n",
					  "database.url: unknown option \"ssl\"");
	expect_read_error("database: {url: 'sqlserver://sa:s3cret@mssql:1433'}\n",
					  "database.url: no database");
	expect_read_error("database: {url: 'mysql://q:s3cret@h/db'}\n", "database.url:");
	/* PostgreSQL: the hosts and ports as libpq reads them, each named by its place */
	expect_read_error("database: {url: 'postgres://q:s3cret@db:99999/app'}\n",
					  "database.url: the port must be a number from 1 to 65535");
	expect_read_error("database: {url: 'postgres://q:s3cret@db1:5432,db2:0/app'}\n",
					  "database.url: host 2 of the host list: the port must be a number from 1 to 65535");
	expect_read_error("database: {url: 'postgres://q:s3cret@db1,,db2/app'}\n",
					  "database.url: host 2 of the host list is empty; write postgres://host1[:port1],host2[:port2]/...");
	expect_read_error("database: {url: 'postgres://q:s3cret@db1:5432,/app'}\n",
					  "database.url: host 2 of the host list is empty");
	expect_read_error("database: {url: 'postgres://q:s3cret@db1,d!b/app'}\n",
					  "database.url: host 2 of the host list: invalid character in the host name");
	expect_read_error("database: {url: 'postgres://q:s3cret@db1,d%b/app'}\n",
					  "database.url: libpq cannot read it; check its %-escapes");
	expect_read_error("database: {url: 'postgres://q:s3cret@db/app?port=1,2'}\n",
					  "database.url: 2 ports for 1 host; give each host its port, or one port for all");
	/* a '/' in the password must be %2F: libpq would read a host and a port */
	expect_read_error("database: {url: 'postgres://q:s3/cret@db/app'}\n",
					  "database.url: the port must be a number from 1 to 65535");
	expect_read_error("database: {url: 'postgres://q:s3cret@h/db', lissten: true}\n",
					  "database.lissten: unknown key");
	expect_read_error("database: {url: 'postgres://q@h/db'}\ndaemon: {outboxWorkers: 0}\n",
					  "daemon.outboxWorkers");
	expect_read_error("database: {url: 'postgres://q@h/db'}\ndaemon: {logFormat: xml}\n",
					  "daemon.logFormat: expected text or json");

	assert_int_equal(qbd_config_read("/nonexistent/qb.yaml", &doc, &cfg, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "could not open the configuration file /nonexistent/qb.yaml"));
	{
		char	   *huge = malloc(QBD_DOC_MAX + 10);

		memset(huge, '#', QBD_DOC_MAX + 9);
		huge[QBD_DOC_MAX + 9] = '\0';
		expect_read_error(huge, "is larger than");
		free(huge);
	}
}

static void
test_threads(void **state)
{
	/* the supervisor checks this before each fork */
	assert_int_equal(qbd_thread_count(), 1);
}

/* ---- the role host: signals and idle polling ------------------------- */

/* one idle poll: a wait that times out, then the engine's look for work */
static void
idle_poll(QbHost *host, bool found)
{
	assert_int_equal(host->wait(host->ctx, -1, 10), QB_WAIT_TIMEOUT);
	host->polled(host->ctx, found);
}

static void
test_host_signals(void **state)
{
	char		err[256];
	QbdShared  *sh = qbd_shared_create(err, sizeof(err));
	QbdHost		dh;
	QbHost		host;
	QbConfig   *cfg = parse("database: {url: 'postgres://q@h/db', idlePollMaxMs: 80}\n"
							"outbox: {pollIntervalMs: 10}\n");

	assert_int_equal(qbd_host_start(&dh, sh, QB_ENGINE_OUTBOX, NULL, &host, NULL, err, sizeof(err)), 0);
	host.config_loaded(host.ctx, cfg);

	/* a plain timeout, then a SIGHUP (the supervisor's "reload") wakes */
	assert_int_equal(host.wait(host.ctx, -1, 10), QB_WAIT_TIMEOUT);
	raise(SIGHUP);
	assert_int_equal(host.wait(host.ctx, -1, 5000), QB_WAIT_WOKEN);
	assert_false(host.should_stop(host.ctx));

	/* a published document is a change until it is loaded */
	assert_true(host.config_changed(host.ctx));

	/* idle polling: each empty poll doubles the idle wait, up to the max */
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 10);
	idle_poll(&host, false);
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 20);
	idle_poll(&host, false);
	idle_poll(&host, false);
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 80);
	for (int i = 0; i < 20; i++)
		idle_poll(&host, false);
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 80);
	/* work in flight (an fd, a short timeout) is never stretched */
	assert_int_equal(qbd_host_idle_timeout(&dh, 3, 10), 10);
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 2), 2);
	/* a poll that found work, or a wake, starts again from the interval */
	idle_poll(&host, true);
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 10);
	/*
	 * a steady trickle: the poll finds rows, the look again after the
	 * batch (no wait timed out before it) finds none, and that does not
	 * stretch the next wait
	 */
	for (int i = 0; i < 5; i++)
	{
		idle_poll(&host, true);
		/* the batch's waits: an answer, then a settle delay that runs out */
		raise(SIGHUP);
		assert_int_equal(host.wait(host.ctx, -1, 5000), QB_WAIT_WOKEN);
		assert_int_equal(host.wait(host.ctx, -1, 2), QB_WAIT_TIMEOUT);
		host.polled(host.ctx, false);
	}
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 10);
	idle_poll(&host, false);
	raise(SIGHUP);
	assert_int_equal(host.wait(host.ctx, -1, 5000), QB_WAIT_WOKEN);
	assert_int_equal(qbd_host_idle_timeout(&dh, -1, 10), 10);

	/* SIGTERM: stop, and every wait returns at once */
	raise(SIGTERM);
	assert_true(host.should_stop(host.ctx));
	assert_int_equal(host.wait(host.ctx, -1, 60000), QB_WAIT_WOKEN);
	qb_config_free(cfg);
}

static int
backend_check(const void *table, char *err, size_t errlen)
{
	return qbd_backend_check_one(table, err, errlen);
}

static int
store_check(const void *table, char *err, size_t errlen)
{
	static const QbOpsField host_fields[] = {QB_HOST_OPS(QB_OPS_FIELD, QbHost)};
	QbHost		host = {0};

	ops_fill(&host, host_fields, sizeof(host_fields) / sizeof(host_fields[0]));
	return qb_engine_tables_check(&host, table, "outbox 0", err, errlen);
}

/*
 * The backends: sqlserver:// picks SQL Server, anything else libpq; both
 * tables are complete, and a table with any one field left out is refused,
 * naming the backend and the field; the same for the two stores' tables.
 */
static void
test_backends(void **state)
{
	static const QbOpsField fields[] = {QBD_BACKEND_OPS(QB_OPS_FIELD, QbdBackend)};
	static const QbOpsField store_fields[] = {QB_STORE_OPS(QB_OPS_FIELD, QbStore)};
	const QbdBackend *const all[] = {&qbd_backend_postgresql, &qbd_backend_sqlserver};
	char		err[QB_ERRLEN] = "";
	char		want[64];
	QbStore		store;

	assert_ptr_equal(qbd_backend_for("sqlserver://sa:pw@mssql:1433/app"), &qbd_backend_sqlserver);
	assert_ptr_equal(qbd_backend_for("postgres://q@h/db"), &qbd_backend_postgresql);
	assert_ptr_equal(qbd_backend_for("postgresql://q@h/db"), &qbd_backend_postgresql);
	assert_ptr_equal(qbd_backend_for("host=h dbname=db"), &qbd_backend_postgresql);
	assert_int_equal(qbd_backend_check(err, sizeof(err)), 0);

	for (size_t b = 0; b < sizeof(all) / sizeof(all[0]); b++)
	{
		snprintf(want, sizeof(want), "backend ops '%s'", all[b]->name);
		ops_expect_holes(all[b], sizeof(QbdBackend), fields, sizeof(fields) / sizeof(fields[0]),
						 backend_check, want);
	}

	/* the two stores' tables (filled without a connection) */
	qb_pq_store_ops(NULL, &store);
	ops_expect_holes(&store, sizeof(store), store_fields,
					 sizeof(store_fields) / sizeof(store_fields[0]), store_check,
					 "store ops of 'outbox 0'");
	qb_odbc_store_ops(NULL, &store);
	ops_expect_holes(&store, sizeof(store), store_fields,
					 sizeof(store_fields) / sizeof(store_fields[0]), store_check,
					 "store ops of 'outbox 0'");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_roles_wanted),
		cmocka_unit_test(test_restart_policy),
		cmocka_unit_test(test_database_changed),
		cmocka_unit_test(test_redact_url),
		cmocka_unit_test(test_log_format),
		cmocka_unit_test(test_shared_seqlock),
		cmocka_unit_test(test_config_file),
		cmocka_unit_test(test_threads),
		cmocka_unit_test(test_host_signals),
		cmocka_unit_test(test_backends),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
