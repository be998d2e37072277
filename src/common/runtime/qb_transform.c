/*-------------------------------------------------------------------------
 * qb_transform.c
 *	  jq transforms: compile at configure time, run in a forked helper.
 *
 * Wording (see qb_transform.h): a transform, a chain, a rejection, a
 * failure, the helper.
 *
 * The program is compiled wrapped, "<prelude> . as [$__qb_in, $topic, ...]
 * | $__qb_in | (<program>\n)", so the per-message values are bound without
 * recompiling (jq_compile_args binds constants only); the prelude
 * (qbt_prelude) shadows libjq 1.6's traps.  The helper holds copies of the
 * compiled states and is replaced after a deadline, a crash, a reload and
 * every QBT_HELPER_RUNS runs; the parent's jq_state never runs, so nothing
 * a program does can corrupt it.  The run protocol: "the helper: wire
 * format" below, one request per run, one answer; the stage running is
 * posted in a page shared with the helper, and no answer is classified
 * from the wait status.
 *-------------------------------------------------------------------------
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE				/* close_range */
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <jq.h>
#include <jv.h>

#include "qb_clock.h"
#include "qb_errlen.h"
#include "qb_transform.h"

#define QBT_NO_INDEX	255

struct QbTransform
{
	jq_state   *jq;
	char	   *text;
	unsigned long serial;		/* when it was compiled (qbt_serial) */
};

/*
 * qbt_serial: now on the monotonic clock, in ns: a transform's serial and a
 * helper's fork are stamped with it, so that a transform compiled after the
 * fork has a larger serial than the helper's (a compile takes milliseconds)
 * and no counter is kept for the process.
 */
static unsigned long
qbt_serial(void)
{
	return (unsigned long) qb_now_ns();
}

/*
 * The prelude shadows two libjq 1.6 traps (clibs.md §8): halt and
 * halt_error leave the jq_state corrupt (a double free on the next start),
 * so they become errors; error(null) behaves like empty, so it becomes a
 * rejection with a message of its own.  input and inputs (no stream here)
 * are errors, and env and $ENV are empty: a program must not read the
 * worker's environment (${NAME} in the configured text puts a value in).
 * The shadows are lexical: libjq's builtins keep the originals.
 */
static const char qbt_prelude[] =
	"def _qb_raise: error(.); "
	"def error($m): if $m == null then \"error(null): a rejection needs a value, e.g. error(\\\"why\\\")\" else $m end | _qb_raise; "
	"def error: error(.); "
	"def halt: error(\"halt is not allowed in a transform; use error(\\\"why\\\") to reject\"); "
	"def halt_error: error(.); "
	"def halt_error($c): error(.); "
	"def input: error(\"input and inputs are not available in a transform\"); "
	"def inputs: input; "
	"def env: {}; "
	"{} as $ENV | "
	". as [$__qb_in, $topic, $key, $headers, $source, $eventType] | $__qb_in | (";
static const char qbt_postlude[] = "\n)";

/* ---- compile ------------------------------------------------------------ */

typedef struct QbtErrs
{
	char		buf[QB_ERRLEN];
	size_t		len;
} QbtErrs;

/*
 * qbt_collect_cb gathers compile messages: each one's first line without
 * the "jq: error: " prefix and the shell hint; the closing "jq: N compile
 * error(s)" count is dropped.
 */
static void
qbt_collect_cb(void *data, jv msg)
{
	QbtErrs    *e = data;
	const char *s;
	const char *hint = " (Unix shell quoting issues?)";
	const char *h;
	size_t		n;

	msg = jq_format_error(msg);
	if (jv_get_kind(msg) != JV_KIND_STRING)
	{
		jv_free(msg);
		return;
	}
	s = jv_string_value(msg);
	if (strncmp(s, "jq: error: ", 11) == 0)
		s += 11;
	else if (strncmp(s, "jq: ", 4) == 0 && strstr(s, "compile error") != NULL)
	{
		jv_free(msg);
		return;
	}
	n = strcspn(s, "\n");
	while (n > 0 && s[n - 1] == ':')
		n--;
	if (e->len + 3 < sizeof(e->buf))
	{
		if (e->len > 0)
			e->len += snprintf(e->buf + e->len, sizeof(e->buf) - e->len, "; ");
		if ((h = strstr(s, hint)) != NULL && (size_t) (h - s) < n)
		{
			e->len += snprintf(e->buf + e->len, sizeof(e->buf) - e->len, "%.*s%.*s",
							   (int) (h - s), s, (int) (n - (h - s) - strlen(hint)),
							   h + strlen(hint));
		}
		else
			e->len += snprintf(e->buf + e->len, sizeof(e->buf) - e->len, "%.*s", (int) n, s);
		if (e->len >= sizeof(e->buf))
			e->len = sizeof(e->buf) - 1;
	}
	jv_free(msg);
}

/* qbt_quiet_cb: runtime messages go nowhere; jq_next returns the errors. */
static void
qbt_quiet_cb(void *data, jv msg)
{
	jv_free(msg);
}

/*
 * qbt_no_modules gives import and include an empty search path: without
 * one, libjq 1.6 fails an assertion (an abort of the whole process).
 */
static void
qbt_no_modules(jq_state *jq)
{
	jq_set_attr(jq, jv_string("JQ_LIBRARY_PATH"), jv_array());
}

/*
 * qbt_explain compiles the program as written, with the variables declared,
 * to word a refusal without the wrapper; returns false if that compiles.
 */
static bool
qbt_explain(const char *program, QbtErrs *e)
{
	jq_state   *jq = jq_init();
	jv			args;
	int			ok;

	if (jq == NULL)
		return false;
	e->len = 0;
	e->buf[0] = '\0';
	jq_set_error_cb(jq, qbt_collect_cb, e);
	qbt_no_modules(jq);
	args = jv_object();
	args = jv_object_set(args, jv_string("topic"), jv_null());
	args = jv_object_set(args, jv_string("key"), jv_null());
	args = jv_object_set(args, jv_string("headers"), jv_null());
	args = jv_object_set(args, jv_string("source"), jv_null());
	args = jv_object_set(args, jv_string("eventType"), jv_null());
	ok = jq_compile_args(jq, program, args);
	jq_teardown(&jq);
	return !ok;
}

QbTransform *
qb_transform_compile(const char *program, char *err, size_t errlen)
{
	QbTransform *t;
	QbtErrs		e = {"", 0};
	char	   *wrapped;
	size_t		len = strlen(program);

	if (len == 0 || strspn(program, " \t\r\n") == len)
	{
		snprintf(err, errlen, "the program is empty; write a jq filter, e.g. transform: '{id: .id}'");
		return NULL;
	}
	t = calloc(1, sizeof(QbTransform));
	wrapped = malloc(sizeof(qbt_prelude) + len + sizeof(qbt_postlude));
	if (t == NULL || wrapped == NULL || (t->text = strdup(program)) == NULL ||
		(t->jq = jq_init()) == NULL)
	{
		free(wrapped);
		qb_transform_free(t);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	memcpy(wrapped, qbt_prelude, sizeof(qbt_prelude) - 1);
	memcpy(wrapped + sizeof(qbt_prelude) - 1, program, len);
	memcpy(wrapped + sizeof(qbt_prelude) - 1 + len, qbt_postlude, sizeof(qbt_postlude));

	jq_set_error_cb(t->jq, qbt_collect_cb, &e);
	qbt_no_modules(t->jq);
	if (!jq_compile_args(t->jq, wrapped, jv_object()))
	{
		free(wrapped);
		qb_transform_free(t);
		if (qbt_explain(program, &e))
			snprintf(err, errlen, "not a valid jq program: %s",
					 e.buf[0] ? e.buf : "(libjq gave no reason)");
		else
			snprintf(err, errlen,
					 "not a valid jq program: a transform is one jq expression (definitions then a filter; no import or include)");
		return NULL;
	}
	free(wrapped);
	/* e lives on this stack: runs must not call back into it */
	jq_set_error_cb(t->jq, qbt_quiet_cb, NULL);
	t->serial = qbt_serial();
	return t;
}

void
qb_transform_free(QbTransform *t)
{
	if (t == NULL)
		return;
	if (t->jq != NULL)
		jq_teardown(&t->jq);
	free(t->text);
	free(t);
}

/* ---- the helper: wire format -------------------------------------------- */

/*
 * A request, parent to helper: this header, then the strings it counts
 * (payload, topic, key, headers, source, event type; QBT_NULL_LEN: NULL)
 * back to back.  The chain travels as pointers: the helper is a fork of the
 * parent, and qb_transform_run_chain makes sure every one existed at the fork
 * (serials only grow, and a transform alive now and older than the fork was
 * alive at the fork).
 */
#define QBT_MAX_CHAIN	8
#define QBT_NSTR		6
#define QBT_NULL_LEN	UINT32_MAX

typedef struct QbtRequest
{
	uint32_t	n;
	uint32_t	len[QBT_NSTR];
	long		max_output;
	const QbTransform *chain[QBT_MAX_CHAIN];
	unsigned long serial[QBT_MAX_CHAIN];
} QbtRequest;

/* The answer, helper to parent: this header, then len bytes of text. */
typedef struct QbtFinal
{
	char		kind;			/* 'O' output, 'R' rejection */
	unsigned char index;		/* in the chain; QBT_NO_INDEX: none */
	unsigned char bye;			/* the helper exits after this answer */
	uint32_t	len;			/* bytes of text that follow */
} QbtFinal;

/* ---- the helper (child) ------------------------------------------------- */

/*
 * How the helper ends when it cannot answer.  These are ours: QBT_EXIT_NOMEM
 * (the request does not fit its memory) is the message's doing, the rest
 * are failures (the message is tried again).  A signal other than SIGKILL
 * or SIGQUIT, or an exit code not listed here (libjq, a sanitizer), is a
 * crash on the message.
 */
#define QBT_EXIT_GONE	0		/* the parent closed the socket */
#define QBT_EXIT_NOMEM	3
#define QBT_EXIT_BUG	4		/* a request that cannot be */
#define QBT_EXIT_IO		5		/* the socket broke, or the setup failed */

/* qbt_io_full reads or writes all n bytes; false on EOF or an error. */
static bool
qbt_io_full(int fd, void *p, size_t n, bool writing)
{
	char	   *c = p;

	while (n > 0)
	{
		ssize_t		r = writing ? send(fd, c, n, MSG_NOSIGNAL) : read(fd, c, n);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		c += r;
		n -= r;
	}
	return true;
}

/* qbt_answer sends the final frame of one run; a broken socket ends the helper. */
static void
qbt_answer(int fd, char kind, int index, bool bye, const char *text, size_t len)
{
	QbtFinal	f;
	struct iovec iov[2] = {{&f, sizeof(f)}, {(void *) text, len}};
	ssize_t		w;

	memset(&f, 0, sizeof(f));
	f.kind = kind;
	f.index = (unsigned char) (index < 0 || index >= QBT_NO_INDEX ? QBT_NO_INDEX : index);
	f.bye = bye;
	f.len = (uint32_t) len;
	/* one write when it fits the socket's buffer: the parent wakes once */
	do
		w = writev(fd, iov, 2);
	while (w < 0 && errno == EINTR);
	if (w < 0)
		_exit(QBT_EXIT_IO);
	if ((size_t) w < sizeof(f) &&
		!qbt_io_full(fd, (char *) &f + w, sizeof(f) - w, true))
		_exit(QBT_EXIT_IO);
	w = (size_t) w < sizeof(f) ? 0 : w - (ssize_t) sizeof(f);
	if (!qbt_io_full(fd, (char *) text + w, len - w, true))
		_exit(QBT_EXIT_IO);
}

static void
qbt_reject(int fd, int index, bool bye, const char *fmt,...) __attribute__((format(printf, 4, 5)));

static void
qbt_reject(int fd, int index, bool bye, const char *fmt,...)
{
	char		buf[QB_ERRLEN];
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t) n >= sizeof(buf))
		n = sizeof(buf) - 1;
	qbt_answer(fd, 'R', index, bye, buf, n);
}

/* qbt_reject_value rejects with an error value as text (a string as is, else compact JSON). */
static void
qbt_reject_value(int fd, int index, const char *what, jv v)
{
	if (jv_get_kind(v) != JV_KIND_STRING)
		v = jv_dump_string(v, 0);
	qbt_reject(fd, index, false, "%s%.900s", what, jv_string_value(v));
	jv_free(v);
}

static jv
qbt_opt_string(const char *s)
{
	return s ? jv_string(s) : jv_null();
}

/* qbt_limit_memory caps the heap at what this process has plus extra bytes. */
static void
qbt_limit_memory(long extra)
{
	struct rlimit rl;
	unsigned long size,
				resident,
				shared,
				text,
				lib,
				data;
	FILE	   *f;

	rl.rlim_cur = rl.rlim_max = 0;
	setrlimit(RLIMIT_CORE, &rl);
	if (extra <= 0 || (f = fopen("/proc/self/statm", "r")) == NULL)
		return;
	if (fscanf(f, "%lu %lu %lu %lu %lu %lu", &size, &resident, &shared, &text, &lib, &data) == 6)
	{
		rl.rlim_cur = rl.rlim_max = data * (unsigned long) sysconf(_SC_PAGESIZE) + extra;
		setrlimit(RLIMIT_DATA, &rl);
	}
	fclose(f);
}

/*
 * qbt_child_run runs one request's chain and answers it.  s holds the
 * request's strings (NULL for a NULL one).
 */
static void
qbt_child_run(int fd, const QbtRequest *rq, char *const *s, volatile int *stage)
{
	jv			cur;
	jv			headers;
	jv			out;

	cur = jv_parse_sized(s[0], (int) rq->len[0]);
	if (!jv_is_valid(cur))
	{
		qbt_reject_value(fd, QBT_NO_INDEX, "the payload is not valid JSON: ", jv_invalid_get_msg(cur));
		return;
	}
	headers = s[3] ? jv_parse(s[3]) : jv_null();
	if (jv_get_kind(headers) != JV_KIND_OBJECT)
	{
		jv_free(headers);
		headers = jv_null();
	}
	for (uint32_t i = 0; i < rq->n; i++)
	{
		jq_state   *jq = rq->chain[i]->jq;
		jv			in = jv_array();
		jv			r;
		jv			more;
		*stage = (int) i;
		in = jv_array_append(in, cur);
		in = jv_array_append(in, qbt_opt_string(s[1]));
		in = jv_array_append(in, qbt_opt_string(s[2]));
		in = jv_array_append(in, jv_copy(headers));
		in = jv_array_append(in, qbt_opt_string(s[4]));
		in = jv_array_append(in, qbt_opt_string(s[5]));
		jq_start(jq, in, 0);
		r = jq_next(jq);
		if (!jv_is_valid(r))
		{
			jv_free(headers);
			/* a halted jq_state is corrupt (the prelude should make this unreachable) */
			if (jq_halted(jq))
			{
				jv_free(r);
				qbt_reject(fd, i, true, "the program halted");
			}
			else if (jv_invalid_has_msg(jv_copy(r)))
				qbt_reject_value(fd, i, "", jv_invalid_get_msg(r));
			else
			{
				jv_free(r);
				qbt_reject(fd, i, false, "the program produced no output (empty); a transform must output exactly one value");
			}
			return;
		}
		more = jq_next(jq);
		if (jv_is_valid(more) || jv_invalid_has_msg(jv_copy(more)))
		{
			jv_free(headers);
			jv_free(r);
			if (jv_is_valid(more))
			{
				jv_free(more);
				qbt_reject(fd, i, false, "the program produced more than one output; a transform must output exactly one value (collect several with [...])");
			}
			else
				qbt_reject_value(fd, i, "", jv_invalid_get_msg(more));
			return;
		}
		jv_free(more);
		cur = r;
	}
	jv_free(headers);
	out = jv_dump_string(cur, 0);
	if ((long) jv_string_length_bytes(jv_copy(out)) > rq->max_output)
		qbt_reject(fd, (int) rq->n - 1, false, "the transform's output is over %ld bytes", rq->max_output);
	else
		qbt_answer(fd, 'O', QBT_NO_INDEX, false, jv_string_value(out),
				   jv_string_length_bytes(jv_copy(out)));
	jv_free(out);
}

static void qbt_child(int fd, pid_t parent, long max_memory, volatile int *stage)
			__attribute__((noreturn));

/*
 * qbt_child serves requests until the parent goes away (EOF) or a run
 * leaves its jq_state unusable.
 */
static void
qbt_child(int fd, pid_t parent, long max_memory, volatile int *stage)
{
	static const int ignored[] = {SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGCHLD};
	static const int fatal[] = {SIGQUIT, SIGABRT, SIGSEGV, SIGBUS, SIGFPE};
	sigset_t	none;

	/*
	 * The host's handlers are not ours to run: a reload's SIGHUP or a stop's
	 * SIGTERM sent to the process group is the parent's business.  Die with
	 * the parent, and never dump core.
	 */
	for (size_t i = 0; i < sizeof(ignored) / sizeof(ignored[0]); i++)
		signal(ignored[i], SIG_IGN);
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
		signal(fatal[i], SIG_DFL);
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(QBT_EXIT_GONE);

	/*
	 * Keep only our socket: a copy of the parent's connections (database,
	 * brokers, the listening socket) would hold them open after the parent
	 * closes them.
	 */
	if (fd != 3)
	{
		if (dup2(fd, 3) < 0)
			_exit(QBT_EXIT_IO);
		fd = 3;
	}
	if (close_range(4, ~0U, 0) != 0)
	{
		/* before Linux 5.9: every descriptor the process may have */
		long		max = sysconf(_SC_OPEN_MAX);

		for (long i = 4; i < (max > 0 && max < 65536 ? max : 65536); i++)
			close((int) i);
	}
	qbt_limit_memory(max_memory);

	for (;;)
	{
		QbtRequest	rq;
		char	   *s[QBT_NSTR] = {NULL};
		char	   *buf;
		size_t		total = 0;
		size_t		off = 0;

		if (!qbt_io_full(fd, &rq, sizeof(rq), false))
			_exit(QBT_EXIT_GONE);
		for (int i = 0; i < QBT_NSTR; i++)
			if (rq.len[i] != QBT_NULL_LEN)
				total += rq.len[i] + 1;
		if ((buf = malloc(total + 1)) == NULL)
			_exit(QBT_EXIT_NOMEM);
		for (int i = 0; i < QBT_NSTR; i++)
		{
			if (rq.len[i] == QBT_NULL_LEN)
				continue;
			s[i] = buf + off;
			if (!qbt_io_full(fd, s[i], rq.len[i], false))
				_exit(QBT_EXIT_GONE);
			s[i][rq.len[i]] = '\0';
			off += rq.len[i] + 1;
		}
		/* the parent checked; a mismatch here is a bug, not the message's fault */
		for (uint32_t i = 0; i < rq.n; i++)
			if (rq.chain[i]->serial != rq.serial[i])
				_exit(QBT_EXIT_BUG);
		qbt_child_run(fd, &rq, s, stage);
		free(buf);
	}
}

/* ---- the helper (parent) ------------------------------------------------ */

/*
 * One helper per process (its host's QbTransformHelper, named by every
 * run), started at the first run and kept: a fork costs a millisecond or
 * more (it grows with the worker's memory), a run on a kept helper costs a
 * round trip.  It is replaced when a chain holds a
 * transform compiled after it was forked (a reload), when the memory limit
 * changes, after a run that hit a limit or killed it, and every
 * QBT_HELPER_RUNS runs (so a slow leak in libjq cannot grow without end).
 */
#define QBT_HELPER_RUNS		10000

/*
 * qbt_helper_stop ends the helper; kill says whether it may be mid-run.
 * Returns the wait status in *status (false: none, it was reaped for us).
 */
static bool
qbt_helper_stop(QbTransformHelper *h, bool kill_it, int *status)
{
	bool		waited = true;
	int			st = 0;

	if (h->pid <= 0)
		return false;
	if (kill_it)
		kill(h->pid, SIGKILL);
	close(h->fd);		/* an idle helper sees EOF and exits */
	while (waitpid(h->pid, &st, 0) < 0)
	{
		/* ECHILD: SIGCHLD is ignored here and the child was reaped for us */
		if (errno != EINTR)
		{
			waited = false;
			break;
		}
	}
	h->pid = 0;
	h->fd = -1;
	munmap((void *) h->stage, sizeof(int));
	h->stage = NULL;
	if (status)
		*status = st;
	return waited;
}

static bool
qbt_helper_start(QbTransformHelper *h, long max_memory, char *err, size_t errlen)
{
	int			sv[2];
	pid_t		pid;
	pid_t		parent = getpid();

	void	   *page = mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	if (page == MAP_FAILED)
	{
		snprintf(err, errlen, "could not start the transform helper: mmap: %s", strerror(errno));
		return false;
	}
	h->stage = page;
	*h->stage = -1;
	/* before the fork: every transform compiled until now is in the child */
	h->serial = qbt_serial();
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
	{
		snprintf(err, errlen, "could not start the transform helper: socketpair: %s", strerror(errno));
		goto fail;
	}
	pid = fork();
	if (pid < 0)
	{
		snprintf(err, errlen, "could not start the transform helper: fork: %s", strerror(errno));
		close(sv[0]);
		close(sv[1]);
		goto fail;
	}
	if (pid == 0)
	{
		close(sv[0]);
		qbt_child(sv[1], parent, max_memory, h->stage);
	}
	close(sv[1]);
	h->pid = pid;
	h->fd = sv[0];
	h->max_memory = max_memory;
	h->runs = 0;
	return true;

fail:
	munmap(page, sizeof(int));
	h->stage = NULL;
	return false;
}

pid_t
qb_transform_helper_pid(const QbTransformHelper *h)
{
	return h->pid > 0 ? h->pid : -1;
}

/*
 * qbt_io_deadline sends (writing) or receives the bytes of iov[0..cnt) on
 * the helper's socket by the deadline; iov is consumed.  It tries first and
 * polls only when the socket is not ready: most answers are there at once.
 * Returns 1 done, 0 deadline passed, -1 EOF or a broken socket.
 */
static int
qbt_io_deadline(QbTransformHelper *h, struct iovec *iov, int cnt, bool writing, long deadline)
{
	while (cnt > 0)
	{
		struct msghdr msg;
		ssize_t		r;

		if (iov->iov_len == 0)
		{
			iov++;
			cnt--;
			continue;
		}
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov;
		msg.msg_iovlen = cnt;
		r = writing ? sendmsg(h->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT)
			: recvmsg(h->fd, &msg, MSG_DONTWAIT);
		if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		{
			struct pollfd pfd = {h->fd, writing ? POLLOUT : POLLIN, 0};
			long		left = deadline - qb_now_ms();

			if (left <= 0)
				return 0;
			if (poll(&pfd, 1, (int) left) < 0 && errno != EINTR)
				return -1;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		/* consume r bytes of the vector */
		while (r > 0)
		{
			size_t		k = (size_t) r < iov->iov_len ? (size_t) r : iov->iov_len;

			iov->iov_base = (char *) iov->iov_base + k;
			iov->iov_len -= k;
			r -= k;
			if (iov->iov_len == 0)
			{
				iov++;
				cnt--;
			}
		}
	}
	return 1;
}

/*
 * qbt_send: one request to the helper (starting one if needed; a kept
 * helper that died while idle, by the OOM killer, is replaced once).
 * QB_TRANSFORM_OK when it took the message; FAILED, with err, when not:
 * the helper's trouble, not the message's.
 */
static QbTransformResult
qbt_send(QbTransformHelper *h, QbtRequest *rq, const char *const *s,
		 const QbTransformLimits *lim, char *err, size_t errlen)
{
	struct iovec iov[1 + QBT_NSTR];
	int			iovcnt;
	int			rc = -1;
	/* the deadline covers only the run, from when it is sent */
	long		deadline = qb_now_ms() + lim->timeout_ms;

	for (int attempt = 0; attempt < 2 && rc < 0; attempt++)
	{
		iovcnt = 0;
		iov[iovcnt++] = (struct iovec) {rq, sizeof(*rq)};
		for (int i = 0; i < QBT_NSTR; i++)
			if (rq->len[i] != QBT_NULL_LEN)
				iov[iovcnt++] = (struct iovec) {(void *) s[i], rq->len[i]};

		if (attempt > 0)
			qbt_helper_stop(h, true, NULL);
		if (h->pid <= 0 && !qbt_helper_start(h, lim->max_memory, err, errlen))
			return QB_TRANSFORM_FAILED;
		*h->stage = -1;
		rc = qbt_io_deadline(h, iov, iovcnt, true, deadline);
	}
	if (rc != 1)
	{
		qbt_helper_stop(h, true, NULL);
		snprintf(err, errlen, "the transform helper did not take the message (%s)",
				 rc == 0 ? "timed out" : "its socket broke");
		return QB_TRANSFORM_FAILED;
	}
	h->runs++;
	return QB_TRANSFORM_OK;
}

/*
 * qbt_read_answer: the answer's text after its header fin, the output or
 * the rejection.  *rc: qbt_io_deadline's, 1 when the answer was whole
 * (the result is then the answer's); else the caller finds out why.
 */
static QbTransformResult
qbt_read_answer(QbTransformHelper *h, const QbtRequest *rq, const QbtFinal *fin,
				const QbTransformLimits *lim, long deadline, char **out, size_t *outlen, int *at, int *rc,
				char *err, size_t errlen)
{
	struct iovec iov[1];
	char	   *buf;

	if (fin->kind == 'O' && (long) fin->len > lim->max_output)
	{
		qbt_helper_stop(h, true, NULL);
		if (at)
			*at = (int) rq->n - 1;
		snprintf(err, errlen, "the transform's output is over %ld bytes", lim->max_output);
		return QB_TRANSFORM_REJECTED;
	}
	if ((buf = malloc((size_t) fin->len + 1)) == NULL)
	{
		qbt_helper_stop(h, true, NULL);	/* its answer is still on the socket */
		snprintf(err, errlen, "out of memory for the transform's output");
		return QB_TRANSFORM_FAILED;
	}
	iov[0] = (struct iovec) {buf, fin->len};
	if ((*rc = qbt_io_deadline(h, iov, 1, false, deadline)) != 1)
	{
		free(buf);
		return QB_TRANSFORM_FAILED;
	}
	buf[fin->len] = '\0';
	if (fin->bye)
		qbt_helper_stop(h, false, NULL);
	if (fin->kind == 'O')
	{
		*out = buf;
		*outlen = fin->len;
		return QB_TRANSFORM_OK;
	}
	if (at)
		*at = fin->index == QBT_NO_INDEX ? -1 : fin->index;
	snprintf(err, errlen, "%s", buf);
	free(buf);
	return QB_TRANSFORM_REJECTED;
}

/*
 * qbt_no_answer: no (whole) answer, rc 0: the deadline passed, else the
 * helper died on this run.  Killed either way (a helper stuck in a loop
 * would never see the EOF; killing a dead one keeps its wait status); its
 * end says whose fault it was.
 */
static QbTransformResult
qbt_no_answer(QbTransformHelper *h, int rc, const QbTransformLimits *lim, bool *crashed,
			  char *err, size_t errlen)
{
	int			status = 0;
	bool		waited = qbt_helper_stop(h, true, &status);

	if (rc == 0)
	{
		snprintf(err, errlen, "the transform ran longer than %ld ms and was stopped (an endless loop?)",
				 lim->timeout_ms);
		return QB_TRANSFORM_REJECTED;
	}
	if (waited && WIFSIGNALED(status) && WTERMSIG(status) != SIGKILL && WTERMSIG(status) != SIGQUIT)
	{
		*crashed = true;
		snprintf(err, errlen,
				 "the transform crashed or ran out of memory (signal %d; a run may use %ld MB more than the worker)",
				 WTERMSIG(status), lim->max_memory / (1024 * 1024));
		return QB_TRANSFORM_REJECTED;
	}
	if (waited && WIFEXITED(status) && WEXITSTATUS(status) == QBT_EXIT_NOMEM)
	{
		*crashed = true;
		snprintf(err, errlen, "the message does not fit the transform helper's memory (%ld MB more than the worker)",
				 lim->max_memory / (1024 * 1024));
		return QB_TRANSFORM_REJECTED;
	}
	if (waited && WIFEXITED(status) && WEXITSTATUS(status) != QBT_EXIT_GONE &&
		WEXITSTATUS(status) != QBT_EXIT_BUG && WEXITSTATUS(status) != QBT_EXIT_IO)
	{
		/* an exit of libjq's or a runtime's own (ASan's out of memory exits 1) */
		*crashed = true;
		snprintf(err, errlen,
				 "the transform crashed or ran out of memory (exit code %d; a run may use %ld MB more than the worker)",
				 WEXITSTATUS(status), lim->max_memory / (1024 * 1024));
		return QB_TRANSFORM_REJECTED;
	}
	/* killed from outside (a shutdown, the OOM killer), or gone: not the message's fault */
	if (!waited)
		snprintf(err, errlen, "the transform helper vanished");
	else if (WIFSIGNALED(status))
		snprintf(err, errlen, "the transform helper was killed by signal %d", WTERMSIG(status));
	else
		snprintf(err, errlen, "the transform helper exited with code %d", WEXITSTATUS(status));
	return QB_TRANSFORM_FAILED;
}

/*
 * qbt_run_once sends one request to the helper (starting one if needed) and
 * reads its answer.  *crashed says a rejection is the helper's death on
 * this message (a crash, or no memory), which the caller may retry once.
 */
static QbTransformResult
qbt_run_once(QbTransformHelper *h, QbtRequest *rq, const char *const *s,
			 const QbTransformLimits *lim, char **out, size_t *outlen, int *at, bool *crashed, char *err, size_t errlen)
{
	QbtFinal	fin;
	struct iovec iov[1] = {{&fin, sizeof(fin)}};
	QbTransformResult res;
	long		deadline;
	int			rc;

	if (qbt_send(h, rq, s, lim, err, errlen) != QB_TRANSFORM_OK)
		return QB_TRANSFORM_FAILED;
	deadline = qb_now_ms() + lim->timeout_ms;

	/* the answer's header */
	rc = qbt_io_deadline(h, iov, 1, false, deadline);
	if (at && *h->stage >= 0)
		*at = *h->stage;
	if (rc == 1 && (fin.kind == 'O' || fin.kind == 'R'))
	{
		res = qbt_read_answer(h, rq, &fin, lim, deadline, out, outlen, at, &rc, err, errlen);
		if (rc == 1 || res != QB_TRANSFORM_FAILED)
			return res;
	}
	return qbt_no_answer(h, rc, lim, crashed, err, errlen);
}

/*
 * qbt_request: the request for a chain of n on payload and vars, and the
 * strings it sends (s, QBT_NSTR of them; one too long to send goes as
 * none).  Returns the newest transform's serial, for the helper's check.
 */
static unsigned long
qbt_request(QbtRequest *rq, const char **s, const QbTransform *const *chain, int n,
			const char *payload, size_t len, const QbTransformVars *vars, long max_output)
{
	unsigned long newest = 0;

	memset(rq, 0, sizeof(*rq));
	rq->n = n;
	rq->max_output = max_output;
	s[0] = payload;
	s[1] = vars ? vars->topic : NULL;
	s[2] = vars ? vars->key : NULL;
	s[3] = vars ? vars->headers : NULL;
	s[4] = vars ? vars->source : NULL;
	s[5] = vars ? vars->event_type : NULL;
	for (int i = 0; i < QBT_NSTR; i++)
	{
		size_t		l = i == 0 ? len : s[i] ? strlen(s[i]) : 0;

		if (s[i] != NULL && l >= QBT_NULL_LEN)
			s[i] = NULL;
		rq->len[i] = s[i] ? (uint32_t) l : QBT_NULL_LEN;
	}
	for (int i = 0; i < n; i++)
	{
		rq->chain[i] = chain[i];
		rq->serial[i] = chain[i]->serial;
		if (chain[i]->serial > newest)
			newest = chain[i]->serial;
	}
	return newest;
}

QbTransformResult
qb_transform_run_chain(QbTransformHelper *h, const QbTransform *const *chain, int n,
					   const char *payload, size_t len, const QbTransformVars *vars, const QbTransformLimits *limits,
					   char **out, size_t *outlen, int *at, char *err, size_t errlen)
{
	QbTransformLimits lim = {QB_TRANSFORM_TIMEOUT_MS, QB_TRANSFORM_MAX_OUTPUT,
	QB_TRANSFORM_MAX_MEMORY};
	QbtRequest	rq;
	const char *s[QBT_NSTR];
	unsigned long newest;

	*out = NULL;
	*outlen = 0;
	if (at)
		*at = -1;
	if (limits != NULL)
		lim = *limits;
	if (n <= 0)
	{
		if ((*out = malloc(len + 1)) == NULL)
		{
			snprintf(err, errlen, "out of memory for the transform's output");
			return QB_TRANSFORM_FAILED;
		}
		memcpy(*out, payload, len);
		(*out)[len] = '\0';
		*outlen = len;
		return QB_TRANSFORM_OK;
	}
	if (h == NULL)
	{
		snprintf(err, errlen, "this process has no transform helper (its host keeps no runtime)");
		return QB_TRANSFORM_FAILED;
	}
	if (n > QBT_MAX_CHAIN || len >= QBT_NULL_LEN)
	{
		snprintf(err, errlen, "the transform chain (%d) or the payload (%zu bytes) is too long", n, len);
		return QB_TRANSFORM_FAILED;
	}

	newest = qbt_request(&rq, s, chain, n, payload, len, vars, lim.max_output);

	/* a helper forked before one of these transforms existed cannot run it */
	if (h->pid > 0 &&
		(h->serial < newest || h->max_memory != lim.max_memory ||
		 h->runs >= QBT_HELPER_RUNS))
		qbt_helper_stop(h, false, NULL);

	/*
	 * A crash on a helper that ran other messages before may be theirs (a
	 * heap grown and fragmented by them): the message gets a fresh helper
	 * before it is blamed.
	 */
	for (int attempt = 0;; attempt++)
	{
		bool		crashed = false;
		bool		fresh = h->pid <= 0 || h->runs == 0;
		QbTransformResult res = qbt_run_once(h, &rq, s, &lim, out, outlen, at, &crashed, err, errlen);

		if (res != QB_TRANSFORM_REJECTED || !crashed || fresh || attempt > 0)
			return res;
	}
}

QbTransformResult
qb_transform_run(QbTransformHelper *h, const QbTransform *t, const char *payload, size_t len,
				 const QbTransformVars *vars, const QbTransformLimits *limits,
				 char **out, size_t *outlen, char *err, size_t errlen)
{
	const QbTransform *chain[1] = {t};

	return qb_transform_run_chain(h, chain, 1, payload, len, vars, limits, out, outlen, NULL,
								  err, errlen);
}
