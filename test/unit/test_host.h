/*-------------------------------------------------------------------------
 * test_host.h
 *	  The fake host (QbHost) of the engine unit tests: a stop condition with
 *	  a deadline, a wait that counts the time asked for and sleeps at most a
 *	  cap (0: returns at once; it polls the fd it is given), a configuration
 *	  change to report, and counts of what the engine told it (polled,
 *	  config_loaded, rows_wake, warnings).
 *
 * Header-only (static functions; the helpers a test may not call are
 * inline): each unit test is one .c file linked
 * with the core library.
 *
 * Threads: the engine calls the host on its own thread.  A test that runs
 * the engine in a second thread sets config_changes and reads the counts
 * with __atomic builtins (test_host_change, test_host_get); the host's own
 * updates of them are atomic too.
 *-------------------------------------------------------------------------
 */
#ifndef TEST_HOST_H
#define TEST_HOST_H

#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "qb_host.h"

typedef struct TestHost
{
	QbHost		host;			/* host.ctx is this TestHost */
	bool		(*done) (void *arg);	/* the stop condition; NULL: stop at the deadline */
	void	   *arg;			/* done's and loaded's argument */
	void		(*loaded) (void *arg, const QbConfig *cfg);	/* config_loaded, or NULL */
	long		deadline_ms;	/* stop here anyway (timed_out: a failure) */
	bool		timed_out;
	long		wait_cap_ms;	/* sleep (or poll) at most this; 0: return at once */
	bool		quiet;			/* keep warnings off stderr (a test that expects them) */
	/* counts, atomic */
	int			config_changes; /* config_changed answers true this many more times */
	int			nwaits;
	long		clock_ms;		/* the time the engine asked to wait, summed */
	long		last_wait_ms;
	int			npolled;		/* polled(found) calls ... */
	int			nfound;			/* ... with found true */
	int			nloaded;		/* config_loaded calls ... */
	int			nloaded_null;	/* ... with no configuration */
	int			warnings;
	char		warned[4096];	/* the warnings, one a line (as many as fit) */
	int			nrows_wake;		/* rows_wake(want) calls ... */
	int			nrows_wake_on;	/* ... with want true */
} TestHost;

/* the process's runtime, as a host keeps it: one for every TestHost */
static QbRuntime test_runtime;

static inline long
test_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

#define test_host_get(field) __atomic_load_n(&(field), __ATOMIC_SEQ_CST)

/* test_host_change: report a configuration change at the next look. */
static inline void
test_host_change(TestHost *t)
{
	__atomic_add_fetch(&t->config_changes, 1, __ATOMIC_SEQ_CST);
}

static void
test_host_log(void *ctx, QbLogLevel level, const char *msg)
{
	TestHost   *t = ctx;

	if (level < QB_LOG_WARNING)
		return;
	__atomic_add_fetch(&t->warnings, 1, __ATOMIC_SEQ_CST);
	{
		size_t		used = strlen(t->warned);

		snprintf(t->warned + used, sizeof(t->warned) - used, "%s\n", msg);
	}
	if (!t->quiet)
		fprintf(stderr, "engine: %s\n", msg);
}

static int
test_host_wait(void *ctx, int fd, long timeout_ms)
{
	TestHost   *t = ctx;
	long		ms = timeout_ms < 0 || timeout_ms > t->wait_cap_ms ? t->wait_cap_ms : timeout_ms;

	__atomic_add_fetch(&t->nwaits, 1, __ATOMIC_SEQ_CST);
	__atomic_store_n(&t->last_wait_ms, timeout_ms, __ATOMIC_SEQ_CST);
	if (timeout_ms > 0)
		__atomic_add_fetch(&t->clock_ms, timeout_ms, __ATOMIC_SEQ_CST);
	if (fd >= 0)
	{
		struct pollfd p = {.fd = fd, .events = POLLIN};

		return poll(&p, 1, (int) ms) > 0 ? QB_WAIT_FD : QB_WAIT_TIMEOUT;
	}
	if (ms > 0)
		usleep(ms * 1000);
	return QB_WAIT_TIMEOUT;
}

/* Stop once done says so, or at the deadline (timed_out: a failure). */
static bool
test_host_should_stop(void *ctx)
{
	TestHost   *t = ctx;

	if (t->done != NULL && t->done(t->arg))
		return true;
	if (test_now_ms() > t->deadline_ms)
		t->timed_out = true;
	return t->timed_out;
}

static bool
test_host_config_changed(void *ctx)
{
	TestHost   *t = ctx;
	int			n = __atomic_load_n(&t->config_changes, __ATOMIC_SEQ_CST);

	while (n > 0 && !__atomic_compare_exchange_n(&t->config_changes, &n, n - 1, false,
												 __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
		;
	return n > 0;
}

static void
test_host_polled(void *ctx, bool found)
{
	TestHost   *t = ctx;

	__atomic_add_fetch(&t->npolled, 1, __ATOMIC_SEQ_CST);
	if (found)
		__atomic_add_fetch(&t->nfound, 1, __ATOMIC_SEQ_CST);
}

static void
test_host_config_loaded(void *ctx, const QbConfig *cfg)
{
	TestHost   *t = ctx;

	__atomic_add_fetch(&t->nloaded, 1, __ATOMIC_SEQ_CST);
	if (cfg == NULL)
		__atomic_add_fetch(&t->nloaded_null, 1, __ATOMIC_SEQ_CST);
	if (t->loaded != NULL)
		t->loaded(t->arg, cfg);
}

/* test_host_rows_wake counts what the engine says before each wait */
static void
test_host_rows_wake(void *ctx, bool want)
{
	TestHost   *t = ctx;

	__atomic_add_fetch(&t->nrows_wake, 1, __ATOMIC_SEQ_CST);
	if (want)
		__atomic_add_fetch(&t->nrows_wake_on, 1, __ATOMIC_SEQ_CST);
}

/*
 * test_host_init: a host that reports one configuration change (the first
 * look), stops when done(arg) is true or after timeout_ms, and sleeps at
 * most wait_cap_ms per wait.  polled, config_loaded and rows_wake are set;
 * a test may clear them.
 */
static inline void
test_host_init(TestHost *t, bool (*done) (void *arg), void *arg, long timeout_ms,
			   long wait_cap_ms)
{
	memset(t, 0, sizeof(*t));
	t->done = done;
	t->arg = arg;
	t->deadline_ms = test_now_ms() + timeout_ms;
	t->wait_cap_ms = wait_cap_ms;
	t->config_changes = 1;
	t->host.ctx = t;
	t->host.runtime = &test_runtime;
	t->host.log = test_host_log;
	t->host.wait = test_host_wait;
	t->host.should_stop = test_host_should_stop;
	t->host.config_changed = test_host_config_changed;
	t->host.polled = test_host_polled;
	t->host.config_loaded = test_host_config_loaded;
	t->host.rows_wake = test_host_rows_wake;
}

#endif							/* TEST_HOST_H */
