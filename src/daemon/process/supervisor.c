/*-------------------------------------------------------------------------
 * supervisor.c
 *	  The daemon's first process: the configuration file, the schema, and
 *	  one process per role, restarted when it exits.
 *
 * Wording (qbd.h has the rest; the database is reached through its
 * backend's ops, qbd_backend.h):
 *	- Wanted roles come from the configuration (qbd_roles_wanted); the role
 *	  table holds every role the supervisor runs or will run again, and a
 *	  retired one until its process is gone.
 *	- A reload is a SIGHUP: the file is read and validated again (an invalid
 *	  one is logged with its key path and changes nothing), published in the
 *	  shared block, written to the database's config tables, and the role
 *	  table follows it.  Each load, good or not, is noted in the shared
 *	  metrics (queuebox_config_last_reload_successful and its kin).  A
 *	  changed database: section restarts every role.
 *	- A stop is a SIGTERM or SIGINT: every role gets SIGTERM and
 *	  daemon.shutdownGraceMs to finish its rows in flight, then SIGKILL
 *	  (its rows come back through their lease).
 *
 * Processes, not threads: a crash or a leak in an engine's libraries ends
 * one role, which is restarted (qbds_fork warns when this process has more
 * than one thread).  The supervisor's database connection is short-lived
 * (migrate, the config tables), so no role inherits its socket.
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "qbd.h"
#include "qbd_backend.h"
#include "role.h"
#include "supervisor.h"

#define QBD_MAX_ROLES	(64 + 2 + 256)
/* retries of the database at start and of the config tables' write */
#define QBD_DB_RETRY_MIN_MS	1000L
#define QBD_DB_RETRY_MAX_MS	30000L

static int	qbds_pipe[2] = {-1, -1};

/* LeakSanitizer's check, present in sanitizer builds only (a role ends with _exit) */
extern void __lsan_do_leak_check(void) __attribute__((weak));

static void
qbds_signal(int sig)
{
	int			save = errno;
	char		c = (char) sig;

	if (write(qbds_pipe[1], &c, 1) < 0)
	{
		/* full: the loop will look anyway */
	}
	errno = save;
}

/* ---------------------------------------------------------------------
 * The policy: pure functions, unit-tested (test/unit/test_daemon.c)
 * ---------------------------------------------------------------------
 */

/*
 * qbd_roles_wanted: see supervisor.h.  The registry counts; the daemon has
 * no switch for the relay and the ingress (the extension's GUCs) and no cap
 * on the consumers: one per broker source.
 */
int
qbd_roles_wanted(const QbConfig *cfg, QbdRole *roles, int max)
{
	QbEngineWant want = {
		.outbox_workers = cfg->daemon.outbox_workers,
		.relay = true,
		.ingress = true,
		.broker_sources = qb_config_broker_sources(cfg),
		.max_consumers = INT_MAX,
	};
	int			n = 0;

	for (int k = 0; k < QB_ENGINE_NKINDS; k++)
	{
		int			count = qb_engine((QbEngineKind) k)->wanted(&want);

		for (int i = 0; i < count && n < max; i++)
			roles[n++] = (QbdRole) {.kind = (QbEngineKind) k, .index = i};
	}
	return n;
}

/* qbd_restart_delay: see supervisor.h. */
long
qbd_restart_delay(int crashes)
{
	long		d = QBD_RESTART_MIN_MS;

	if (crashes <= 0)
		return 0;
	for (int i = 1; i < crashes && d < QBD_RESTART_MAX_MS; i++)
		d *= 2;
	return d < QBD_RESTART_MAX_MS ? d : QBD_RESTART_MAX_MS;
}

/* qbd_role_exited: see supervisor.h. */
void
qbd_role_exited(QbdRole *r, long now_ms)
{
	if (now_ms - r->started_ms >= QBD_RESTART_STABLE_MS)
		r->crashes = 0;
	else
		r->crashes++;
	r->pid = 0;
	r->restart_at_ms = now_ms + qbd_restart_delay(r->crashes);
}

static bool
qbds_same(const char *a, const char *b)
{
	return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* qbd_database_changed: see supervisor.h. */
bool
qbd_database_changed(const QbConfig *a, const QbConfig *b)
{
	return !qbds_same(a->database.url, b->database.url) ||
		a->database.listen != b->database.listen ||
		a->database.statement_timeout_ms != b->database.statement_timeout_ms ||
		a->database.connect_timeout_ms != b->database.connect_timeout_ms;
}

/* qbd_thread_count: see supervisor.h. */
int
qbd_thread_count(void)
{
	FILE	   *f = fopen("/proc/self/status", "r");
	char		line[256];
	int			n = -1;

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		if (sscanf(line, "Threads: %d", &n) == 1)
			break;
	fclose(f);
	return n;
}

/* qbd_config_read: see supervisor.h. */
int
qbd_config_read(const char *path, char **text, QbConfig **cfg, char *err, size_t errlen)
{
	FILE	   *f;
	char	   *buf = NULL;
	size_t		len;
	char		why[QB_ERRLEN];

	*text = NULL;
	*cfg = NULL;
	if ((f = fopen(path, "r")) == NULL)
	{
		snprintf(err, errlen, "could not open the configuration file %s: %s", path, strerror(errno));
		return -1;
	}
	if ((buf = malloc(QBD_DOC_MAX + 2)) == NULL)
	{
		fclose(f);
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	len = fread(buf, 1, QBD_DOC_MAX + 1, f);
	if (ferror(f))
	{
		snprintf(err, errlen, "could not read the configuration file %s: %s", path, strerror(errno));
		goto fail;
	}
	if (len > QBD_DOC_MAX)
	{
		snprintf(err, errlen, "the configuration file %s is larger than %d bytes; move large transforms into fewer, shorter programs",
				 path, QBD_DOC_MAX);
		goto fail;
	}
	buf[len] = '\0';
	fclose(f);
	f = NULL;
	if (qb_config_parse(buf, len, &qbd_config_env, cfg, why, sizeof(why)) != 0)
	{
		snprintf(err, errlen, "%s: %s", path, why);
		goto fail;
	}
	if (qbd_config_check_daemon(*cfg, why, sizeof(why)) != 0)
	{
		snprintf(err, errlen, "%s: %s", path, why);
		qb_config_free(*cfg);
		*cfg = NULL;
		goto fail;
	}
	*text = buf;
	return 0;

fail:
	if (f != NULL)
		fclose(f);
	free(buf);
	return -1;
}

/* qbd_config_check_daemon: see supervisor.h. */
int
qbd_config_check_daemon(const QbConfig *cfg, char *err, size_t errlen)
{
	const char *u = cfg->database.url;

	if (u == NULL)
	{
		snprintf(err, errlen,
				 "database.url: queuebox-mssqld needs the database it serves, e.g. "
				 "database: {url: \"postgres://queuebox:${PGPASSWORD}@db.internal:5432/app\"}");
		return -1;
	}
	return qbd_backend_for(u)->check_config(cfg, err, errlen);
}

/* ---------------------------------------------------------------------
 * The database: migrate at start, write the config tables at each load
 * ---------------------------------------------------------------------
 */
/*
 * qbds_probe: the probe at start and after a change of the database:
 * section, before the roles (re)start; its answer goes to them in the
 * shared block.
 */
static void
qbds_probe(QbdShared *sh, const QbConfig *cfg)
{
	char		err[QB_ERRLEN];
	QbdProbe	rc = qbd_backend_for(cfg->database.url)->probe_notify(cfg, err, sizeof(err));

	sh->pooled = rc == QBD_PROBE_LOST;
	if (rc == QBD_PROBE_NONE)
		return;					/* no notification to miss: the roles poll */
	if (rc == QBD_PROBE_FAILED)
		qbd_log(QB_LOG_WARNING, "could not check that notifications arrive (%s); the roles go on as if they do", err);
	else if (rc == QBD_PROBE_LOST && cfg->database.listen)
		qbd_log(QB_LOG_WARNING,
				"database.listen: a NOTIFY sent to check it did not arrive within %d ms: database.url goes through "
				"a connection pooler in transaction or statement mode (PgBouncer, RDS Proxy, ...), which does not pass "
				"notifications on; the roles poll instead (idle polls stretch to database.idlePollMaxMs), prepare no "
				"statement by name, and hold no claimer lock (a crashed role's rows wait for their lease). Connect the daemon to the database directly or through a pooler in session mode, "
				"or set database.listen: false: the NOTIFY triggers cost every inserting transaction for nothing",
				QBD_PROBE_MS);
	else if (rc == QBD_PROBE_LOST)
		qbd_log(QB_LOG_INFO,
				"a NOTIFY sent to check the connection did not arrive within %d ms: database.url goes through a "
				"connection pooler in transaction or statement mode; the roles prepare no statement by name and hold "
				"no claimer lock (a crashed role's rows wait for their lease)",
				QBD_PROBE_MS);
	else
		qbd_log(QB_LOG_DEBUG, "notifications arrive through database.url");
}

/* qbds_prepare_db: migrate (when asked) and write the config tables, on one short connection. */
static int
qbds_prepare_db(const QbConfig *cfg, bool migrate, char *err, size_t errlen)
{
	const QbdBackend *be = qbd_backend_for(cfg->database.url);
	void	   *conn = be->connect(cfg, "queuebox-mssqld supervisor", err, errlen);
	char		done[256];
	int			rc = -1;

	if (conn == NULL)
		return -1;
	if (migrate)
	{
		if (be->migrate(conn, done, sizeof(done), err, errlen) != 0)
			goto out;
		if (done[0] != '\0')
			qbd_log(QB_LOG_INFO, "%s", done);
	}
	rc = be->publish_config(conn, cfg, err, errlen);
out:
	be->disconnect(conn);
	return rc;
}

/* qbd_migrate_only: --migrate (main.c). */
int
qbd_migrate_only(const QbConfig *cfg, char *err, size_t errlen)
{
	return qbds_prepare_db(cfg, true, err, errlen);
}

/* ---------------------------------------------------------------------
 * The loop
 * ---------------------------------------------------------------------
 */
typedef struct QbdSup
{
	const QbdOptions *opt;
	QbdShared  *sh;
	char	   *text;
	QbConfig   *cfg;
	QbdRole		roles[QBD_MAX_ROLES];
	bool		restart_asked[QBD_MAX_ROLES];	/* SIGTERM sent to restart it */
	int			nroles;
	bool		db_ready;		/* migrated: roles may start */
	bool		publish_pending;	/* the config tables are behind the file */
	bool		probe_pending;	/* check that notifications arrive (PostgreSQL) */
	long		db_retry_at;
	long		db_retry_ms;
	bool		stopping;
	long		stop_deadline;
	bool		warned_threads;
} QbdSup;

static int
qbds_find(QbdSup *s, QbEngineKind kind, int index)
{
	for (int i = 0; i < s->nroles; i++)
		if (s->roles[i].kind == kind && s->roles[i].index == index && !s->roles[i].retired)
			return i;
	return -1;
}

/* qbds_follow: make the role table what the configuration wants. */
static void
qbds_follow(QbdSup *s)
{
	QbdRole		want[QBD_MAX_ROLES];
	int			n = qbd_roles_wanted(s->cfg, want, QBD_MAX_ROLES);

	for (int i = 0; i < s->nroles; i++)
	{
		bool		keep = false;

		for (int j = 0; j < n; j++)
			keep |= want[j].kind == s->roles[i].kind && want[j].index == s->roles[i].index;
		if (!keep && !s->roles[i].retired)
		{
			char		name[64];

			qb_engine_name(s->roles[i].kind, s->roles[i].index, name, sizeof(name));
			s->roles[i].retired = true;
			if (s->roles[i].pid > 0)
			{
				qbd_log(QB_LOG_INFO, "stopping %s: the configuration no longer needs it", name);
				kill(s->roles[i].pid, SIGTERM);
			}
		}
	}
	for (int j = 0; j < n; j++)
		if (qbds_find(s, want[j].kind, want[j].index) < 0 && s->nroles < QBD_MAX_ROLES)
		{
			s->restart_asked[s->nroles] = false;
			s->roles[s->nroles++] = want[j];
		}
	/* drop retired roles whose process is gone */
	for (int i = 0; i < s->nroles;)
		if (s->roles[i].retired && s->roles[i].pid == 0)
		{
			s->roles[i] = s->roles[s->nroles - 1];
			s->restart_asked[i] = s->restart_asked[s->nroles - 1];
			s->nroles--;
		}
		else
			i++;
}

static void
qbds_fork(QbdSup *s, QbdRole *r)
{
	char		name[64];
	int			threads = qbd_thread_count();
	pid_t		pid;

	qb_engine_name(r->kind, r->index, name, sizeof(name));
	if (threads > 1 && !s->warned_threads)
	{
		qbd_log(QB_LOG_WARNING, "the supervisor has %d threads; forking %s anyway (a library started a thread it should not have)",
				threads, name);
		s->warned_threads = true;
	}
	pid = fork();
	if (pid < 0)
	{
		qbd_log(QB_LOG_ERROR, "could not fork %s: %s; trying again in %ld ms", name,
				strerror(errno), QBD_RESTART_MIN_MS);
		r->restart_at_ms = qb_now_ms() + QBD_RESTART_MIN_MS;
		return;
	}
	if (pid == 0)
	{
		struct sigaction sa = {.sa_handler = SIG_DFL};

		close(qbds_pipe[0]);
		close(qbds_pipe[1]);
		sigemptyset(&sa.sa_mask);
		sigaction(SIGCHLD, &sa, NULL);
		sigaction(SIGHUP, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		sigaction(SIGINT, &sa, NULL);
		{
			int			rc = qbd_role_main(s->sh, r->kind, r->index);

			if (__lsan_do_leak_check)
				__lsan_do_leak_check();
			_exit(rc);
		}
	}
	r->pid = pid;
	r->started_ms = qb_now_ms();
	qbd_log(QB_LOG_DEBUG, "forked %s (pid %d)", name, (int) pid);
}

static void
qbds_reap(QbdSup *s)
{
	int			status;
	pid_t		pid;
	bool		reaped = false;

	while ((pid = waitpid(-1, &status, WNOHANG)) > 0)
	{
		reaped = true;
		for (int i = 0; i < s->nroles; i++)
		{
			QbdRole    *r = &s->roles[i];
			char		name[64];
			char		how[64];

			if (r->pid != pid)
				continue;
			/* the maxConcurrent places it held: its requests died with it */
			qb_limits_pid_end(&s->sh->limits, (int) pid);
			qb_engine_name(r->kind, r->index, name, sizeof(name));
			if (WIFSIGNALED(status))
				snprintf(how, sizeof(how), "was killed by signal %d", WTERMSIG(status));
			else
				snprintf(how, sizeof(how), "exited with status %d", WEXITSTATUS(status));
			if (s->stopping || r->retired)
			{
				qbd_log(QB_LOG_INFO, "%s (pid %d) %s", name, (int) pid, how);
				r->pid = 0;
			}
			else if (s->restart_asked[i])
			{
				s->restart_asked[i] = false;
				r->pid = 0;
				r->restart_at_ms = qb_now_ms();
				qbd_log(QB_LOG_INFO, "%s (pid %d) %s; starting it again with the new database settings",
						name, (int) pid, how);
			}
			else
			{
				qbd_role_exited(r, qb_now_ms());
				qbd_log(WIFEXITED(status) && WEXITSTATUS(status) == 0 ? QB_LOG_WARNING : QB_LOG_ERROR,
						"%s (pid %d) %s; restarting it in %ld ms", name, (int) pid, how,
						r->restart_at_ms - qb_now_ms());
			}
			break;
		}
	}
	/* a retired role that is gone leaves the table */
	if (reaped)
		qbds_follow(s);
}

static void
qbds_reload(QbdSup *s)
{
	char		err[QB_ERRLEN];
	char	   *text;
	QbConfig   *cfg;
	bool		restart;

	if (qbd_config_read(s->opt->config_path, &text, &cfg, err, sizeof(err)) != 0)
	{
		qbd_log(QB_LOG_ERROR, "configuration not reloaded, the running one stays: %s", err);
		qb_config_load_note(&s->sh->metrics, QB_CONFIG_SOURCE_FILE, s->opt->config_path, false,
							NULL, 0, err);
		return;
	}
	restart = qbd_database_changed(s->cfg, cfg);
	/* the roles restart, so they learn again whether notifications arrive */
	s->probe_pending |= restart;
	qb_config_free(s->cfg);
	free(s->text);
	s->cfg = cfg;
	s->text = text;
	qbd_log_set_json(cfg->daemon.log_json);
	qbd_shared_publish(s->sh, text, strlen(text));
	qb_config_load_note(&s->sh->metrics, QB_CONFIG_SOURCE_FILE, s->opt->config_path, true,
						text, strlen(text), NULL);
	s->publish_pending = true;
	s->db_retry_at = 0;
	qbds_follow(s);
	for (int i = 0; i < s->nroles; i++)
		if (s->roles[i].pid > 0 && !s->roles[i].retired)
		{
			if (restart)
				s->restart_asked[i] = true;
			kill(s->roles[i].pid, restart ? SIGTERM : SIGHUP);
		}
	qbd_log(QB_LOG_INFO, "configuration reloaded from %s%s", s->opt->config_path,
			restart ? "; the database settings changed, so every role restarts" : "");
}

static void
qbds_begin_stop(QbdSup *s, int sig)
{
	if (s->stopping)
		return;
	s->stopping = true;
	s->stop_deadline = qb_now_ms() + s->cfg->daemon.shutdown_grace_ms;
	qbd_log(QB_LOG_INFO, "received signal %d: stopping every role (grace %ld ms)", sig,
			s->cfg->daemon.shutdown_grace_ms);
	for (int i = 0; i < s->nroles; i++)
		if (s->roles[i].pid > 0)
			kill(s->roles[i].pid, SIGTERM);
}

/* qbds_db_step: migrate or write the config tables when due; retried with a backoff. */
static void
qbds_db_step(QbdSup *s, long now)
{
	char		err[QB_ERRLEN];

	if ((s->db_ready && !s->publish_pending) || now < s->db_retry_at)
		return;
	if (qbds_prepare_db(s->cfg, !s->db_ready, err, sizeof(err)) != 0)
	{
		s->db_retry_ms = s->db_retry_ms ? s->db_retry_ms * 2 : QBD_DB_RETRY_MIN_MS;
		if (s->db_retry_ms > QBD_DB_RETRY_MAX_MS)
			s->db_retry_ms = QBD_DB_RETRY_MAX_MS;
		s->db_retry_at = now + s->db_retry_ms;
		qbd_log(QB_LOG_ERROR, "%s; trying again in %ld ms", err, s->db_retry_ms);
		return;
	}
	if (!s->db_ready)
		qbd_log(QB_LOG_INFO, "schema queuebox is at version %s; starting the roles", qbd_schema_version);
	s->db_ready = true;
	s->publish_pending = false;
	s->db_retry_ms = 0;
	if (s->probe_pending)
		qbds_probe(s->sh, s->cfg);
	s->probe_pending = false;
}

/*
 * qbds_setup: the shared block with the configuration published in it, the
 * signal pipe and the handlers that write to it.  -1, logged.
 */
static int
qbds_setup(QbdSup *s)
{
	struct sigaction sa;
	char		err[QB_ERRLEN];

	if ((s->sh = qbd_shared_create(err, sizeof(err))) == NULL)
	{
		qbd_log(QB_LOG_ERROR, "%s", err);
		return -1;
	}
	qbd_shared_publish(s->sh, s->text, strlen(s->text));
	qb_config_load_note(&s->sh->metrics, QB_CONFIG_SOURCE_FILE, s->opt->config_path, true,
						s->text, strlen(s->text), NULL);
	if (pipe2(qbds_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		qbd_log(QB_LOG_ERROR, "could not make the signal pipe: %s", strerror(errno));
		return -1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = qbds_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

/*
 * qbds_start_due: fork each role whose restart is due, once the schema is
 * migrated and unless stopping; *timeout shrinks to the next restart.
 * Whether any role runs.
 */
static bool
qbds_start_due(QbdSup *s, long now, long *timeout)
{
	bool		running = false;

	for (int i = 0; i < s->nroles; i++)
	{
		QbdRole    *r = &s->roles[i];

		if (r->pid > 0)
			running = true;
		else if (!s->stopping && s->db_ready && !r->retired)
		{
			if (r->restart_at_ms <= now)
			{
				qbds_fork(s, r);
				running |= r->pid > 0;
			}
			else if (r->restart_at_ms - now < *timeout)
				*timeout = r->restart_at_ms - now;
		}
	}
	return running;
}

/*
 * qbds_stop_step: while stopping, true once no role runs.  Past the grace,
 * each role left is killed (again every second); before it, *timeout
 * shrinks to the grace's end.
 */
static bool
qbds_stop_step(QbdSup *s, bool running, long now, long *timeout)
{
	if (!running)
		return true;
	if (now >= s->stop_deadline)
	{
		for (int i = 0; i < s->nroles; i++)
			if (s->roles[i].pid > 0)
			{
				char		name[64];

				qb_engine_name(s->roles[i].kind, s->roles[i].index, name, sizeof(name));
				qbd_log(QB_LOG_WARNING, "%s (pid %d) did not stop within daemon.shutdownGraceMs; killing it (its rows come back when their lease ends)",
						name, (int) s->roles[i].pid);
				kill(s->roles[i].pid, SIGKILL);
			}
		s->stop_deadline = now + 1000;
	}
	else if (s->stop_deadline - now < *timeout)
		*timeout = s->stop_deadline - now;
	return false;
}

/* qbds_read_signals: what the handler wrote to the pipe, in order: SIGHUP reloads, SIGTERM and SIGINT stop. */
static void
qbds_read_signals(QbdSup *s)
{
	char		buf[64];
	ssize_t		n;

	while ((n = read(qbds_pipe[0], buf, sizeof(buf))) > 0)
		for (ssize_t k = 0; k < n; k++)
		{
			if (buf[k] == SIGHUP && !s->stopping)
				qbds_reload(s);
			else if (buf[k] == SIGTERM || buf[k] == SIGINT)
				qbds_begin_stop(s, buf[k]);
		}
}

/* qbd_supervise: see supervisor.h.  Takes text and cfg. */
int
qbd_supervise(const QbdOptions *opt, char *text, QbConfig *cfg)
{
	static QbdSup s;
	char		safe[512];

	memset(&s, 0, sizeof(s));
	s.opt = opt;
	s.text = text;
	s.cfg = cfg;
	s.probe_pending = true;
	qbd_log_init("supervisor", cfg->daemon.log_json);
	qbd_ps_set("supervisor");
	if (qbds_setup(&s) != 0)
		return 1;
	qbd_redact_url(cfg->database.url, safe, sizeof(safe));
	qbd_log(QB_LOG_INFO, "queuebox-mssqld %s starting: configuration %s, database %s",
			QB_VERSION, opt->config_path, safe);
	qbds_follow(&s);

	for (;;)
	{
		long		now = qb_now_ms();
		long		timeout = 1000;
		struct pollfd p = {.fd = qbds_pipe[0], .events = POLLIN};
		bool		running;

		if (!s.stopping)
			qbds_db_step(&s, now);
		running = qbds_start_due(&s, now, &timeout);
		if (s.stopping && qbds_stop_step(&s, running, now, &timeout))
		{
			qbd_log(QB_LOG_INFO, "stopped");
			return 0;
		}
		/* a database step waiting for its retry */
		if ((!s.db_ready || s.publish_pending) && s.db_retry_at > now && s.db_retry_at - now < timeout)
			timeout = s.db_retry_at - now;
		if (poll(&p, 1, (int) (timeout > 0 ? timeout : 0)) > 0)
			qbds_read_signals(&s);
		qbds_reap(&s);
	}
}
