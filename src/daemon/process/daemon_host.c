/*-------------------------------------------------------------------------
 * daemon_host.c
 *	  The daemon's QbHost: what a role process gives its engine.
 *
 * Wording:
 *	- The wake pipe is the role's self-pipe: its signal handlers write a
 *	  byte, wait() polls the read end beside the engine's fd and, when the
 *	  role listens, the database connection's socket.
 *	- A wake is any of: a signal (SIGTERM to stop, SIGHUP after the
 *	  supervisor published a document), a NOTIFY the connection received.
 *	- Idle polling: a role that does not listen has no wake at commit, so
 *	  it polls.  An engine waiting out its poll interval (no fd, a timeout
 *	  of at least its configured interval) after polls that found nothing
 *	  (the engine says so through polled(); a poll is a look right after an
 *	  idle wait that ran out) waits twice as long for each,
 *	  up to database.idlePollMaxMs; a poll that finds work, a wake or an fd
 *	  event, or a wait of another kind (work in flight) starts again from
 *	  the interval.  A role that listens is woken at commit and keeps
 *	  the interval as its safety net, so idle waits stretch for it too.
 *
 * Signals: the handlers only set flags and write to the pipe (both
 * async-signal-safe); everything else happens in wait().  One role per
 * process, so the state is per process.
 *-------------------------------------------------------------------------
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon_host.h"
#include "qb_admin_gate.h"

static int	qbdh_pipe[2] = {-1, -1};
/* the role's host: the store's config_load has only the store's ctx */
static QbdHost *qbdh_current = NULL;
static volatile sig_atomic_t qbdh_stop = 0;

/* qbd_config_env: see qbd.h. */
const QbConfigEnv qbd_config_env = {.files_anywhere = true};

/* this process's runtime (a role's copy of the supervisor's, zeroed: none runs there) */
static QbRuntime qbdh_runtime;

/* qbd_runtime: see qbd.h. */
QbRuntime *
qbd_runtime(void)
{
	return &qbdh_runtime;
}

static void
qbdh_signal(int sig)
{
	int			save = errno;
	char		c = (char) sig;

	if (sig == SIGTERM || sig == SIGINT)
		qbdh_stop = 1;
	if (qbdh_pipe[1] >= 0 && write(qbdh_pipe[1], &c, 1) < 0)
	{
		/* the pipe is full: a wake is already pending */
	}
	errno = save;
}

/* qbdh_drain: empty the wake pipe; true when it held a byte. */
static bool
qbdh_drain(void)
{
	char		buf[64];
	bool		any = false;

	while (read(qbdh_pipe[0], buf, sizeof(buf)) > 0)
		any = true;
	return any;
}

static void
qbdh_log(void *ctx, QbLogLevel level, const char *msg)
{
	qbd_log(level, "%s", msg);
}

/* qbdh_idle_wait: the engine waits out its poll interval, nothing in flight */
static bool
qbdh_idle_wait(const QbdHost *h, int fd, long timeout_ms)
{
	return fd < 0 && h->poll_base_ms > 0 && timeout_ms >= h->poll_base_ms;
}

/* qbd_host_idle_timeout: the timeout an idle wait really takes (the banner). */
long
qbd_host_idle_timeout(QbdHost *h, int fd, long timeout_ms)
{
	long		t = timeout_ms;

	if (!qbdh_idle_wait(h, fd, timeout_ms))
		return timeout_ms;
	for (int i = 0; i < h->idle_streak && t < h->idle_max_ms; i++)
		t *= 2;
	if (t > h->idle_max_ms)
		t = h->idle_max_ms > timeout_ms ? h->idle_max_ms : timeout_ms;
	return t;
}

static int
qbdh_wait(void *ctx, int fd, long timeout_ms)
{
	QbdHost    *h = ctx;
	struct pollfd p[3];
	int			np = 0;
	int			ifd = -1;
	int			idb = -1;
	int			result = QB_WAIT_TIMEOUT;
	long		t = qbd_host_idle_timeout(h, fd, timeout_ms);
	int			dbfd = h->db.store ? h->db.ops->store_socket(h->db.store) : -1;

	if (qbdh_stop)
		return QB_WAIT_WOKEN;
	p[np].fd = qbdh_pipe[0];
	p[np].events = POLLIN;
	np++;
	if (fd >= 0)
	{
		ifd = np;
		p[np].fd = fd;
		p[np].events = POLLIN;
		np++;
	}
	if (h->listening && dbfd >= 0)
	{
		idb = np;
		p[np].fd = dbfd;
		p[np].events = POLLIN;
		np++;
	}
	if (poll(p, np, t < 0 ? -1 : (int) (t > 2000000000L ? 2000000000L : t)) < 0 && errno != EINTR)
		qbd_log(QB_LOG_WARNING, "poll failed: %s", strerror(errno));
	if (p[0].revents & POLLIN)
		if (qbdh_drain())
			result |= QB_WAIT_WOKEN;
	if (ifd >= 0 && p[ifd].revents)
		result |= QB_WAIT_FD;
	if (idb >= 0 && p[idb].revents && h->db.ops->store_notified(h->db.store) > 0)
		result |= QB_WAIT_WOKEN;
	if (result != QB_WAIT_TIMEOUT)
		h->idle_streak = 0;
	h->last_timed_out = result == QB_WAIT_TIMEOUT && qbdh_idle_wait(h, fd, timeout_ms);
	return result;
}

/* qbdh_polled: an idle poll stretches the next idle wait (the banner). */
static void
qbdh_polled(void *ctx, bool found)
{
	QbdHost    *h = ctx;

	/*
	 * Only a poll, a look right after an idle wait that ran out, counts: the
	 * engine's look again after a batch (to drain) finds nothing whenever
	 * the batch took everything, and must not stretch a steady trickle.
	 */
	if (found)
		h->idle_streak = 0;
	else if (h->last_timed_out)
		h->idle_streak++;
}

static bool
qbdh_should_stop(void *ctx)
{
	return qbdh_stop != 0;
}

static bool
qbdh_config_changed(void *ctx)
{
	QbdHost    *h = ctx;
	uint64_t	g = qbd_shared_gen(h->shared);

	if (g == h->loaded_gen && h->loaded_once)
		return false;
	return true;
}

static void
qbdh_config_loaded(void *ctx, const QbConfig *cfg)
{
	QbdHost    *h = ctx;

	if (h->db.store != NULL)
		h->db.ops->store_set_config(h->db.store, cfg);
	if (cfg != NULL)
	{
		h->idle_max_ms = cfg->database.idle_poll_max_ms;
		h->poll_base_ms = h->kind == QB_ENGINE_RELAY ? cfg->inbox.relay.poll_interval_ms :
			h->kind == QB_ENGINE_OUTBOX ? cfg->outbox.poll_interval_ms : 0;
		qbd_log_set_json(cfg->daemon.log_json);
	}
}

/*
 * qbdh_config_load: the store's config_load, replaced: the document is the
 * one the supervisor published, not a row of the database.
 */
static int
qbdh_config_load(void *ctx, char **text, char *err, size_t errlen)
{
	QbdHost    *h = qbdh_current;
	uint64_t	gen = 0;

	*text = qbd_shared_read(h->shared, &gen);
	h->loaded_gen = gen;
	h->loaded_once = true;
	return 0;
}

/* qbd_host_start: see daemon_host.h. */
int
qbd_host_start(QbdHost *h, QbdShared *sh, QbEngineKind kind, const QbdDb *db,
			   QbHost *host, QbStore *store, char *err, size_t errlen)
{
	struct sigaction sa;

	memset(h, 0, sizeof(*h));
	h->shared = sh;
	h->kind = kind;
	if (db != NULL)
		h->db = *db;
	h->idle_max_ms = 2000;
	if (pipe2(qbdh_pipe, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "could not make the wake pipe: %s", strerror(errno));
		return -1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = qbdh_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	*host = (QbHost) {
		.ctx = h,
		.log = qbdh_log,
		.wait = qbdh_wait,
		.should_stop = qbdh_should_stop,
		.config_changed = qbdh_config_changed,
		.metrics = &sh->metrics,
		.limits = &sh->limits,
		.limit_holder = -1,		/* qbd_role_main takes it, by the role's name */
		.routes = &qb_admin_routes,
		.runtime = qbd_runtime(),
		.config_env = &qbd_config_env,
		.config_loaded = qbdh_config_loaded,
		/* no commit hook tells the daemon of late commits: full intake reads */
		.late_floor = NULL,
		.polled = qbdh_polled,
	};
	if (store != NULL)
	{
		qbdh_current = h;
		store->config_load = qbdh_config_load;
	}
	return 0;
}

/* qbd_host_listen: see daemon_host.h. */
int
qbd_host_listen(QbdHost *h, const char *channel, char *err, size_t errlen)
{
	if (h->db.store == NULL)
		return 0;
	/* the store keeps the channel and LISTENs again at each new connection */
	h->listening = true;
	return h->db.ops->store_listen(h->db.store, channel, err, errlen);
}
