/*-------------------------------------------------------------------------
 * qbi_worker.c
 *	  The pull worker of libqueuebox-inbox: claim, handle, complete, retry,
 *	  dead, with the lease renewed on a second connection.
 *
 * Wording (queuebox_inbox.h has the contract):
 *	- The claims' connection belongs to the caller's thread (qbi_worker_run),
 *	  which claims a batch whenever every message of the last one was taken
 *	  and a slot is free.  A slot is a thread with a connection of its own
 *	  that runs one handler at a time (max_concurrency slots); the renewal
 *	  connection belongs to the renewer thread, which renews every held
 *	  message every third of the lease.
 *	- Held: the messages claimed and not finished, a list under the
 *	  worker's mutex; queued ones wait for a slot.  The claim gives at most
 *	  one open message per (source, aggregate), so slots in parallel never
 *	  run two of one aggregate, and each aggregate keeps its order.
 *	- The renewer copies the held ids and tokens under the mutex, renews
 *	  without it, and marks a message lost (cancelled) when its renewal
 *	  changed no row.
 *	- The statements are the five of examples/pull/sql/postgresql, with
 *	  bound parameters.
 *
 * Transaction rules: a claim is committed before any handler starts; a
 * handler's writes and its completion commit together or not at all; a
 * retry or a dead letter is a transaction of its own after the rollback.
 * Nothing is left open across a wait.
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "queuebox_inbox.h"

typedef struct QbiHeld
{
	QbiMessage	msg;
	char	   *values[12];		/* the claim's columns, owned */
	volatile bool cancelled;
	bool		running;		/* a slot took it */
	struct QbiHeld *next;
} QbiHeld;

struct QbiWorker
{
	QbiOptions	opt;
	char	   *conninfo;
	char	   *source;
	volatile sig_atomic_t stop;
	int			wake[2];		/* stop writes a byte: waits end at once */
	pthread_mutex_t mu;
	pthread_cond_t cv;			/* a message queued, a slot free, a stop */
	QbiHeld    *held;			/* claimed and not finished, in claim order */
	int			nqueued;		/* of them, not taken by a slot yet */
	int			nrunning;
	QbiCounters counters;
	long		stop_seen_ms;	/* when the renewer first saw the stop, 0: not yet */
	bool		quit_renewer;
	PGconn	   *conn;			/* the claims' connection */
	QbiHandler	handler;
	void	   *handler_arg;
};

static long
qbi_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void
qbi_log(QbiWorker *w, QbiLogLevel level, const char *fmt,...)
{
	char		buf[QBI_ERRLEN * 2];
	va_list		ap;

	if (w->opt.logger == NULL)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	w->opt.logger(w->opt.logger_arg, level, buf);
}

/* ---- the policies ------------------------------------------------------- */

QbiDecision
qbi_retry_after(long delay_ms)
{
	return (QbiDecision) {.dead = false, .delay_ms = delay_ms < 0 ? 0 : delay_ms};
}

QbiDecision
qbi_dead_letter(void)
{
	return (QbiDecision) {.dead = true};
}

/* qbi_default_policy: see queuebox_inbox.h. */
QbiDecision
qbi_default_policy(void *arg, const QbiMessage *msg, const char *error)
{
	double		delay = 1000.0;
	double		jitter;

	if (msg->attempt + 1 >= 5)
		return qbi_dead_letter();
	for (int i = 0; i < msg->attempt && delay < 300000.0; i++)
		delay *= 2;
	if (delay > 300000.0)
		delay = 300000.0;
	/* +-20 %: a burst of failures does not come back as one burst */
	jitter = 0.8 + 0.4 * ((double) rand() / RAND_MAX);
	return qbi_retry_after((long) (delay * jitter));
}

/* ---- the worker ---------------------------------------------------------- */

QbiWorker *
qbi_worker_new(const QbiOptions *opt, char *err, size_t errlen)
{
	QbiWorker  *w;

	if (opt == NULL || opt->conninfo == NULL || opt->source == NULL || opt->source[0] == '\0')
	{
		snprintf(err, errlen, "qbi_worker_new: conninfo and source are required");
		return NULL;
	}
	if (opt->batch_size < 0 || opt->batch_size > 10000 || opt->lease_ms < 0 ||
		opt->max_concurrency < 0 || opt->max_concurrency > 256 ||
		(opt->lease_ms > 0 && opt->lease_ms < 100) || opt->shutdown_grace_ms < 0 || opt->idle_ms < 0)
	{
		snprintf(err, errlen,
				 "qbi_worker_new: batch_size is 1 to 10000, max_concurrency 1 to 256, lease_ms at least 100, shutdown_grace_ms and idle_ms 0 or more (0: the default)");
		return NULL;
	}
	if ((opt->span_start == NULL) != (opt->span_end == NULL))
	{
		snprintf(err, errlen, "qbi_worker_new: set span_start and span_end both, or neither");
		return NULL;
	}
	if ((w = calloc(1, sizeof(*w))) == NULL)
	{
		snprintf(err, errlen, "qbi_worker_new: out of memory");
		return NULL;
	}
	w->opt = *opt;
	w->conninfo = strdup(opt->conninfo);
	w->source = strdup(opt->source);
	w->opt.conninfo = w->conninfo;
	w->opt.source = w->source;
	if (w->opt.batch_size == 0)
		w->opt.batch_size = 10;
	if (w->opt.lease_ms == 0)
		w->opt.lease_ms = 30000;
	if (w->opt.shutdown_grace_ms == 0)
		w->opt.shutdown_grace_ms = 30000;
	if (w->opt.idle_ms == 0)
		w->opt.idle_ms = 500;
	if (w->opt.policy == NULL)
		w->opt.policy = qbi_default_policy;
	if (w->opt.max_concurrency == 0)
		w->opt.max_concurrency = 1;
	w->wake[0] = w->wake[1] = -1;
	if (w->conninfo == NULL || w->source == NULL || pipe2(w->wake, O_NONBLOCK | O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "qbi_worker_new: %s", w->conninfo && w->source ? strerror(errno) : "out of memory");
		qbi_worker_free(w);
		return NULL;
	}
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	return w;
}

void
qbi_worker_stop(QbiWorker *w)
{
	char		c = 1;

	/* a flag and a byte: both async-signal-safe; the waits see either */
	w->stop = 1;
	if (write(w->wake[1], &c, 1) < 0)
	{
		/* the pipe is full: a wake is pending already */
	}
}

void
qbi_worker_counters(const QbiWorker *w, QbiCounters *out)
{
	pthread_mutex_lock((pthread_mutex_t *) &w->mu);
	*out = w->counters;
	pthread_mutex_unlock((pthread_mutex_t *) &w->mu);
}

void
qbi_worker_free(QbiWorker *w)
{
	if (w == NULL)
		return;
	if (w->wake[0] >= 0)
		close(w->wake[0]);
	if (w->wake[1] >= 0)
		close(w->wake[1]);
	PQfinish(w->conn);
	free(w->conninfo);
	free(w->source);
	free(w);
}

/* qbi_wait: up to ms, or until a stop; true when stopping. */
static bool
qbi_wait(QbiWorker *w, long ms)
{
	struct pollfd p = {.fd = w->wake[0], .events = POLLIN};

	if (!w->stop)
		(void) poll(&p, 1, (int) ms);
	return w->stop;
}

static void
qbi_count(QbiWorker *w, long *counter)
{
	pthread_mutex_lock(&w->mu);
	(*counter)++;
	pthread_mutex_unlock(&w->mu);
}

/* qbi_exec: one statement with text parameters; the result when it went well, else NULL with err. */
static PGresult *
qbi_exec(PGconn *c, const char *sql, int n, const char *const *v, char *err, size_t errlen)
{
	PGresult   *r = PQexecParams(c, sql, n, NULL, v, NULL, NULL, 0);

	if (PQresultStatus(r) == PGRES_TUPLES_OK || PQresultStatus(r) == PGRES_COMMAND_OK)
		return r;
	snprintf(err, errlen, "%s", r ? PQresultErrorMessage(r) : PQerrorMessage(c));
	err[strcspn(err, "\n")] = '\0';
	PQclear(r);
	return NULL;
}

static bool
qbi_command(PGconn *c, const char *sql, char *err, size_t errlen)
{
	PGresult   *r = qbi_exec(c, sql, 0, NULL, err, errlen);

	PQclear(r);
	return r != NULL;
}

/* qbi_flag: the one boolean answer of a statement, false on failure too (err set) */
static bool
qbi_flag(PGconn *c, const char *sql, int n, const char *const *v, char *err, size_t errlen)
{
	PGresult   *r = qbi_exec(c, sql, n, v, err, errlen);
	bool		t = r != NULL && PQntuples(r) == 1 && strcmp(PQgetvalue(r, 0, 0), "t") == 0;

	PQclear(r);
	return t;
}

/* ---- the renewer ------------------------------------------------------------- */

static void *
qbi_renewer(void *arg)
{
	QbiWorker  *w = arg;
	PGconn	   *c = NULL;
	long		every = w->opt.lease_ms / 3;
	long		next = qbi_now_ms() + every;
	char		err[QBI_ERRLEN];

	for (;;)
	{
		bool		quit;
		long		now = qbi_now_ms();
		int			n = 0;
		int64_t    *ids = NULL;
		char	  **tokens = NULL;

		pthread_mutex_lock(&w->mu);
		quit = w->quit_renewer;
		/* past the shutdown grace the running handlers are cancelled */
		if (w->stop && w->stop_seen_ms == 0)
			w->stop_seen_ms = now;
		if (w->stop && now - w->stop_seen_ms >= w->opt.shutdown_grace_ms)
			for (QbiHeld *h = w->held; h; h = h->next)
				h->cancelled = true;
		if (!quit && now >= next)
		{
			for (QbiHeld *h = w->held; h; h = h->next)
				n++;
			ids = calloc(n + 1, sizeof(int64_t));
			tokens = calloc(n + 1, sizeof(char *));
			n = 0;
			for (QbiHeld *h = w->held; h && ids && tokens; h = h->next)
				if (!h->cancelled)
				{
					ids[n] = h->msg.id;
					tokens[n++] = strdup(h->msg.claim_token);
				}
		}
		pthread_mutex_unlock(&w->mu);
		if (quit)
			break;
		if (now >= next)
		{
			next = now + every;
			if (c == NULL || PQstatus(c) != CONNECTION_OK)
			{
				PQfinish(c);
				c = PQconnectdb(w->conninfo);
			}
			for (int i = 0; i < n && PQstatus(c) == CONNECTION_OK; i++)
			{
				char		id[24];
				char		lease[24];
				const char *v[3] = {id, tokens[i], lease};

				if (tokens[i] == NULL)
					continue;
				snprintf(id, sizeof(id), "%lld", (long long) ids[i]);
				snprintf(lease, sizeof(lease), "%ld", w->opt.lease_ms);
				err[0] = '\0';
				/* a failed statement is not a lost lease: the next round tries again */
				if (qbi_flag(c, "SELECT queuebox.inbox_renew($1, $2, $3)", 3, v, err, sizeof(err)) ||
					err[0] != '\0')
					continue;
				pthread_mutex_lock(&w->mu);
				for (QbiHeld *h = w->held; h; h = h->next)
					if (h->msg.id == ids[i] && strcmp(h->msg.claim_token, tokens[i]) == 0)
						h->cancelled = true;
				pthread_mutex_unlock(&w->mu);
			}
		}
		for (int i = 0; tokens && i < n; i++)
			free(tokens[i]);
		free(tokens);
		free(ids);
		usleep(20 * 1000);
	}
	PQfinish(c);
	return NULL;
}

/* ---- one message ------------------------------------------------------------- */

static void
qbi_handle(QbiWorker *w, PGconn *conn, QbiHeld *h)
{
	char		err[QBI_ERRLEN] = "";
	char		serr[QBI_ERRLEN];
	char		id[24];
	const char *v2[2] = {id, h->msg.claim_token};
	int			rc;

	snprintf(id, sizeof(id), "%lld", (long long) h->msg.id);
	if (!qbi_command(conn, "BEGIN", serr, sizeof(serr)))
	{
		qbi_log(w, QBI_LOG_WARNING, "message %s: could not begin: %s", id, serr);
		return;
	}
	{
		void	   *span = w->opt.span_start ? w->opt.span_start(w->opt.span_arg, &h->msg) : NULL;

		rc = w->handler(w->handler_arg, &h->msg, conn, &h->cancelled, err, sizeof(err));
		if (w->opt.span_end)
			w->opt.span_end(w->opt.span_arg, span, rc, rc == 0 ? "" : err);
	}
	if (rc == 0 && !h->cancelled)
	{
		if (qbi_flag(conn, "SELECT queuebox.inbox_complete($1, $2)", 2, v2, serr, sizeof(serr)) &&
			qbi_command(conn, "COMMIT", serr, sizeof(serr)))
		{
			qbi_count(w, &w->counters.completed);
			return;
		}
		/* another worker owns it: none of the handler's writes stay */
		qbi_command(conn, "ROLLBACK", serr, sizeof(serr));
		qbi_count(w, &w->counters.lease_lost);
		qbi_log(w, QBI_LOG_WARNING, "message %s: the completion changed no row (the lease was lost); rolled back", id);
		return;
	}
	qbi_command(conn, "ROLLBACK", serr, sizeof(serr));
	if (h->cancelled)
	{
		/* lost, or past the shutdown grace: nothing completed, no attempt spent */
		if (!w->stop)
			qbi_count(w, &w->counters.lease_lost);
		qbi_log(w, QBI_LOG_WARNING, "message %s: cancelled (%s); rolled back",
				id, w->stop ? "the shutdown grace ran out" : "the lease was lost");
		return;
	}
	{
		QbiDecision d = w->opt.policy(w->opt.policy_arg, &h->msg, err[0] ? err : "the handler failed");
		char		delay[24];
		const char *v4[4] = {id, h->msg.claim_token, delay, err[0] ? err : "the handler failed"};
		const char *v3[3] = {id, h->msg.claim_token, v4[3]};

		snprintf(delay, sizeof(delay), "%ld", d.delay_ms);
		if (d.dead ? qbi_flag(conn, "SELECT queuebox.inbox_dead($1, $2, $3)", 3, v3, serr, sizeof(serr)) :
			qbi_flag(conn, "SELECT queuebox.inbox_retry($1, $2, $3, $4)", 4, v4, serr, sizeof(serr)))
			qbi_count(w, d.dead ? &w->counters.dead : &w->counters.retried);
		else
			qbi_log(w, QBI_LOG_WARNING, "message %s: the %s changed no row (the lease was lost)", id,
					d.dead ? "dead letter" : "retry");
	}
}

/* ---- the held list ------------------------------------------------------------ */

static void
qbi_held_free_one(QbiHeld *h)
{
	for (int k = 0; k < 12; k++)
		free(h->values[k]);
	free(h);
}

/* qbi_unlink: take h out of the list (the mutex is held) */
static void
qbi_unlink(QbiWorker *w, QbiHeld *h)
{
	for (QbiHeld **p = &w->held; *p; p = &(*p)->next)
		if (*p == h)
		{
			*p = h->next;
			break;
		}
}

/* ---- the slots ------------------------------------------------------------------ */

typedef struct QbiSlot
{
	QbiWorker  *w;
	pthread_t	t;
	PGconn	   *conn;
} QbiSlot;

static void *
qbi_slot(void *arg)
{
	QbiSlot    *s = arg;
	QbiWorker  *w = s->w;

	for (;;)
	{
		QbiHeld    *h = NULL;

		pthread_mutex_lock(&w->mu);
		while (!w->stop && w->nqueued == 0)
			pthread_cond_wait(&w->cv, &w->mu);
		if (!w->stop)
			for (h = w->held; h && h->running; h = h->next)
				;
		if (h != NULL)
		{
			h->running = true;
			w->nqueued--;
			w->nrunning++;
		}
		pthread_mutex_unlock(&w->mu);
		/* a stop starts no new message: the queued ones are left to their lease */
		if (h == NULL)
			break;
		if (PQstatus(s->conn) != CONNECTION_OK)
			PQreset(s->conn);
		if (h->cancelled)
			qbi_count(w, &w->counters.lease_lost);
		else
			qbi_handle(w, s->conn, h);
		pthread_mutex_lock(&w->mu);
		qbi_unlink(w, h);
		w->nrunning--;
		pthread_cond_broadcast(&w->cv);
		pthread_mutex_unlock(&w->mu);
		qbi_held_free_one(h);
	}
	return NULL;
}

/* ---- the claim -------------------------------------------------------------------- */

/* qbi_claim: one claim of up to batch messages, committed, queued for the slots.  -1 with err. */
static int
qbi_claim(QbiWorker *w, int batch, char *err, size_t errlen)
{
	char		nb[16];
	char		lease[24];
	const char *v[3] = {w->source, nb, lease};
	PGresult   *r;
	QbiHeld    *first = NULL;
	QbiHeld   **tail = &first;
	int			n;

	snprintf(nb, sizeof(nb), "%d", batch);
	snprintf(lease, sizeof(lease), "%ld", w->opt.lease_ms);
	if (!qbi_command(w->conn, "BEGIN", err, errlen))
		return -1;
	if ((r = qbi_exec(w->conn,
					  "SELECT id, claim_token, source, idempotency_key, event_type, aggregate_id,"
					  " payload, headers, attempt, created_at,"
					  /* the trace context: the headers' names in any case, the value's form */
					  " (SELECT h.value FROM jsonb_each_text(c.headers) h WHERE lower(h.key) = 'traceparent'"
					  "   AND h.value ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-.*)?$'"
					  "   AND h.value !~ '^(ff-|00-.{52}.)' AND h.value !~ '^..-0{32}-|^.{36}0{16}-' LIMIT 1),"
					  " (SELECT h.value FROM jsonb_each_text(c.headers) h WHERE lower(h.key) = 'tracestate' LIMIT 1)"
					  " FROM queuebox.inbox_claim($1, $2, $3) c",
					  3, v, err, errlen)) == NULL ||
		!qbi_command(w->conn, "COMMIT", err, errlen))
	{
		char		ignored[QBI_ERRLEN];

		PQclear(r);
		qbi_command(w->conn, "ROLLBACK", ignored, sizeof(ignored));
		return -1;
	}
	n = PQntuples(r);
	for (int i = 0; i < n; i++)
	{
		QbiHeld    *h = calloc(1, sizeof(QbiHeld));

		if (h == NULL)
			break;				/* the ones not kept come back when their lease ends */
		for (int k = 0; k < 12; k++)
			h->values[k] = PQgetisnull(r, i, k) ? NULL : strdup(PQgetvalue(r, i, k));
		h->msg = (QbiMessage) {
			.id = strtoll(h->values[0], NULL, 10), .claim_token = h->values[1],
			.source = h->values[2], .idempotency_key = h->values[3], .event_type = h->values[4],
			.aggregate_id = h->values[5], .payload = h->values[6], .headers = h->values[7],
			.attempt = atoi(h->values[8]), .created_at = h->values[9],
			.traceparent = h->values[10], .tracestate = h->values[10] ? h->values[11] : NULL,
		};
		*tail = h;
		tail = &h->next;
	}
	PQclear(r);
	pthread_mutex_lock(&w->mu);
	{
		QbiHeld   **end = &w->held;

		while (*end)
			end = &(*end)->next;
		*end = first;
	}
	w->nqueued += n;
	w->counters.claimed += n;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return n;
}

/* qbi_worker_run: see queuebox_inbox.h. */
int
qbi_worker_run(QbiWorker *w, QbiHandler handler, void *arg, char *err, size_t errlen)
{
	pthread_t	renewer;
	int			nslots = w->opt.max_concurrency;
	QbiSlot    *slots = calloc(nslots, sizeof(QbiSlot));
	int			started = 0;

	w->handler = handler;
	w->handler_arg = arg;
	w->conn = PQconnectdb(w->conninfo);
	if (slots == NULL || PQstatus(w->conn) != CONNECTION_OK)
	{
		snprintf(err, errlen, "could not connect: %s", slots ? PQerrorMessage(w->conn) : "out of memory");
		err[strcspn(err, "\n")] = '\0';
		free(slots);
		return -1;
	}
	for (int i = 0; i < nslots; i++)
	{
		slots[i].w = w;
		slots[i].conn = PQconnectdb(w->conninfo);
		if (PQstatus(slots[i].conn) != CONNECTION_OK)
		{
			snprintf(err, errlen, "could not connect: %s", PQerrorMessage(slots[i].conn));
			err[strcspn(err, "\n")] = '\0';
			break;
		}
		if (pthread_create(&slots[i].t, NULL, qbi_slot, &slots[i]) != 0)
			break;
		started++;
	}
	w->quit_renewer = false;
	if (started < nslots || pthread_create(&renewer, NULL, qbi_renewer, w) != 0)
	{
		if (started == nslots)
			snprintf(err, errlen, "could not start the renewal thread");
		qbi_worker_stop(w);
		pthread_mutex_lock(&w->mu);
		pthread_cond_broadcast(&w->cv);
		pthread_mutex_unlock(&w->mu);
		for (int i = 0; i < started; i++)
			pthread_join(slots[i].t, NULL);
		for (int i = 0; i < nslots; i++)
			PQfinish(slots[i].conn);
		free(slots);
		return -1;
	}
	while (!w->stop)
	{
		char		cerr[QBI_ERRLEN] = "";
		int			n;

		/* claim when every claimed message was taken and a slot is free */
		pthread_mutex_lock(&w->mu);
		while (!w->stop && (w->nqueued > 0 || w->nrunning >= nslots))
		{
			struct timespec until;

			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_nsec += 100 * 1000000L;
			if (until.tv_nsec >= 1000000000L)
			{
				until.tv_sec++;
				until.tv_nsec -= 1000000000L;
			}
			pthread_cond_timedwait(&w->cv, &w->mu, &until);
		}
		pthread_mutex_unlock(&w->mu);
		if (w->stop)
			break;
		/*
		 * A whole batch: one slot runs it in claim order, several take its
		 * messages as they free up.  A claim never holds a message of an
		 * aggregate still running, so slots never run two of one.
		 */
		n = qbi_claim(w, w->opt.batch_size, cerr, sizeof(cerr));
		if (n < 0)
		{
			qbi_log(w, QBI_LOG_WARNING, "claim failed: %s; claiming again in %ld ms", cerr, w->opt.idle_ms);
			if (PQstatus(w->conn) != CONNECTION_OK)
				PQreset(w->conn);
			qbi_wait(w, w->opt.idle_ms);
		}
		else if (n == 0)
			qbi_wait(w, w->opt.idle_ms);
	}
	pthread_mutex_lock(&w->mu);
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	for (int i = 0; i < nslots; i++)
		pthread_join(slots[i].t, NULL);
	pthread_mutex_lock(&w->mu);
	w->quit_renewer = true;
	/* claimed and never started: left to their lease, no attempt spent */
	while (w->held)
	{
		QbiHeld    *h = w->held;

		w->held = h->next;
		qbi_held_free_one(h);
	}
	w->nqueued = 0;
	pthread_mutex_unlock(&w->mu);
	pthread_join(renewer, NULL);
	for (int i = 0; i < nslots; i++)
		PQfinish(slots[i].conn);
	free(slots);
	return 0;
}
