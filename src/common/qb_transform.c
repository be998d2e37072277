/*-------------------------------------------------------------------------
 * qb_transform.c
 *	  jq transforms: compile at configure time, run in a forked helper.
 *
 * Wording (see qb_transform.h): a transform, a chain, a rejection, a
 * failure.  The helper is the child process of one run.
 *
 * The program is compiled wrapped, so that the per-message values can be
 * bound without recompiling (jq_compile_args binds constants only):
 *
 *	<prelude> . as [$__qb_in, $topic, $key, $headers, $source, $eventType]
 *	  | $__qb_in | (<program>
 *	)
 *
 * The prelude shadows two libjq 1.6 traps (clibs.md §8): halt and
 * halt_error leave the jq_state corrupt (a double free on the next start),
 * so they become errors; error(null) behaves like empty, so it becomes a
 * rejection with a message of its own.  input and inputs (no stream here)
 * are errors, and env and $ENV are empty: a program must not read the
 * worker's environment; ${NAME} in the configured text is the way to put a
 * value in.  The shadows are lexical: libjq's builtins keep the originals.
 *
 * The run protocol, child to parent over a pipe: one byte 'S' as each
 * transform of the chain starts (so a stage that never ends is known), then
 * one byte 'O' or 'R', one byte the index in the chain (255: none), then the
 * output JSON text or the reason.  Anything else (no answer, a child killed)
 * is classified from the wait status.
 *-------------------------------------------------------------------------
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE				/* pipe2 */
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <jq.h>
#include <jv.h>

#include "qb_transform.h"

#define QBT_NO_INDEX	255

struct QbTransform
{
	jq_state   *jq;
	char	   *text;
};

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
	char		buf[512];
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

const char *
qb_transform_text(const QbTransform *t)
{
	return t->text;
}

/* ---- the helper (child) ------------------------------------------------- */

static void
qbt_write_all(int fd, const char *p, size_t n)
{
	while (n > 0)
	{
		ssize_t		w = write(fd, p, n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			_exit(3);
		p += w;
		n -= w;
	}
}

/* qbt_send writes one answer and ends the child. */
static void
qbt_send(int fd, char kind, int index, const char *text, size_t len)
{
	char		head[2];

	head[0] = kind;
	head[1] = (char) (index < 0 || index >= QBT_NO_INDEX ? QBT_NO_INDEX : index);
	qbt_write_all(fd, head, 2);
	qbt_write_all(fd, text, len);
	_exit(0);
}

static void
qbt_reject(int fd, int index, const char *fmt,...) __attribute__((format(printf, 3, 4), noreturn));

static void
qbt_reject(int fd, int index, const char *fmt,...)
{
	char		buf[1024];
	va_list		ap;
	int			n;

	va_start(ap, fmt);
	n = vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	if ((size_t) n >= sizeof(buf))
		n = sizeof(buf) - 1;
	qbt_send(fd, 'R', index, buf, n);
	_exit(0);
}

/* qbt_error_text: an error value as text (a string as is, else compact JSON). */
static void
qbt_reject_value(int fd, int index, const char *what, jv v)
{
	if (jv_get_kind(v) == JV_KIND_STRING)
		qbt_reject(fd, index, "%s%.900s", what, jv_string_value(v));
	v = jv_dump_string(v, 0);
	qbt_reject(fd, index, "%s%.900s", what, jv_string_value(v));
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

static void qbt_child(const QbTransform *const *chain, int n, const char *payload, size_t len,
					  const QbTransformVars *vars, long max_memory, int fd, pid_t parent)
			__attribute__((noreturn));

static void
qbt_child(const QbTransform *const *chain, int n, const char *payload, size_t len,
		  const QbTransformVars *vars, long max_memory, int fd, pid_t parent)
{
	static const int ignored[] = {SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM};
	static const int fatal[] = {SIGQUIT, SIGABRT, SIGSEGV, SIGBUS, SIGFPE};
	sigset_t	none;
	jv			cur;
	jv			headers;
	jv			s;

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
		_exit(3);
	qbt_limit_memory(max_memory);

	cur = jv_parse_sized(payload, (int) len);
	if (!jv_is_valid(cur))
		qbt_reject_value(fd, QBT_NO_INDEX, "the payload is not valid JSON: ",
						 jv_invalid_get_msg(cur));
	headers = vars && vars->headers ? jv_parse(vars->headers) : jv_null();
	if (jv_get_kind(headers) != JV_KIND_OBJECT)
	{
		jv_free(headers);
		headers = jv_null();
	}
	for (int i = 0; i < n; i++)
	{
		jq_state   *jq = chain[i]->jq;
		jv			in = jv_array();
		jv			r;
		jv			more;

		qbt_write_all(fd, "S", 1);	/* this stage is running */
		in = jv_array_append(in, cur);
		in = jv_array_append(in, qbt_opt_string(vars ? vars->topic : NULL));
		in = jv_array_append(in, qbt_opt_string(vars ? vars->key : NULL));
		in = jv_array_append(in, jv_copy(headers));
		in = jv_array_append(in, qbt_opt_string(vars ? vars->source : NULL));
		in = jv_array_append(in, qbt_opt_string(vars ? vars->event_type : NULL));
		jq_start(jq, in, 0);
		r = jq_next(jq);
		if (!jv_is_valid(r))
		{
			if (jq_halted(jq))
				qbt_reject(fd, i, "the program halted");
			if (jv_invalid_has_msg(jv_copy(r)))
				qbt_reject_value(fd, i, "", jv_invalid_get_msg(r));
			qbt_reject(fd, i, "the program produced no output (empty); a transform must output exactly one value");
		}
		more = jq_next(jq);
		if (jv_is_valid(more))
			qbt_reject(fd, i, "the program produced more than one output; a transform must output exactly one value (collect several with [...])");
		if (jv_invalid_has_msg(jv_copy(more)))
			qbt_reject_value(fd, i, "", jv_invalid_get_msg(more));
		cur = r;
	}
	jv_free(headers);
	s = jv_dump_string(cur, 0);
	qbt_send(fd, 'O', QBT_NO_INDEX, jv_string_value(s), jv_string_length_bytes(jv_copy(s)));
	_exit(0);
}

/* ---- the run (parent) --------------------------------------------------- */

static long
qbt_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

QbTransformResult
qb_transform_run_chain(const QbTransform *const *chain, int n, const char *payload, size_t len,
					   const QbTransformVars *vars, const QbTransformLimits *limits,
					   char **out, size_t *outlen, int *at, char *err, size_t errlen)
{
	QbTransformLimits lim = {QB_TRANSFORM_TIMEOUT_MS, QB_TRANSFORM_MAX_OUTPUT,
	QB_TRANSFORM_MAX_MEMORY};
	int			fds[2];
	pid_t		pid;
	pid_t		parent = getpid();
	char	   *buf = NULL;
	size_t		got = 0;
	size_t		cap = 0;
	size_t		stages = 0;
	long		deadline;
	bool		timed_out = false;
	bool		too_big = false;
	int			status = 0;
	bool		waited;
	QbTransformResult res;

	*out = NULL;
	*outlen = 0;
	if (at)
		*at = -1;
	if (limits != NULL)
		lim = *limits;
	if (n <= 0)
	{
		if ((*out = malloc(len + 1)) == NULL)
			goto nomem;
		memcpy(*out, payload, len);
		(*out)[len] = '\0';
		*outlen = len;
		return QB_TRANSFORM_OK;
	}
	if (pipe2(fds, O_CLOEXEC) != 0)
	{
		snprintf(err, errlen, "could not start the transform helper: pipe: %s", strerror(errno));
		return QB_TRANSFORM_FAILED;
	}
	pid = fork();
	if (pid < 0)
	{
		snprintf(err, errlen, "could not start the transform helper: fork: %s", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return QB_TRANSFORM_FAILED;
	}
	if (pid == 0)
	{
		close(fds[0]);
		qbt_child(chain, n, payload, len, vars, lim.max_memory, fds[1], parent);
	}
	close(fds[1]);

	/* read the answer until EOF, the deadline or the output cap */
	deadline = qbt_now_ms() + lim.timeout_ms;
	for (;;)
	{
		struct pollfd pfd = {fds[0], POLLIN, 0};
		long		left = deadline - qbt_now_ms();
		ssize_t		r;
		int			pr;

		if (left <= 0)
		{
			timed_out = true;
			break;
		}
		pr = poll(&pfd, 1, (int) left);
		if (pr < 0 && errno != EINTR)
			break;
		if (pr <= 0)
			continue;
		if (got == cap)
		{
			size_t		ncap = cap ? cap * 2 : 65536;
			char	   *nb;

			if (ncap > (size_t) lim.max_output + n + 3)
				ncap = (size_t) lim.max_output + n + 3;
			if (ncap <= got)
			{
				too_big = true;
				break;
			}
			if ((nb = realloc(buf, ncap)) == NULL)
				break;
			buf = nb;
			cap = ncap;
		}
		r = read(fds[0], buf + got, cap - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += r;
	}
	close(fds[0]);
	if (timed_out || too_big)
		kill(pid, SIGKILL);
	waited = true;
	while (waitpid(pid, &status, 0) < 0)
	{
		/* ECHILD: SIGCHLD is ignored here and the child was reaped for us */
		if (errno != EINTR)
		{
			waited = false;
			break;
		}
	}

	/* the stages that started: the last one is where a limit was hit */
	while (stages < got && buf[stages] == 'S')
		stages++;
	if (at && stages > 0)
		*at = (int) stages - 1;
	if (stages > 0)
	{
		memmove(buf, buf + stages, got - stages);
		got -= stages;
	}

	if (timed_out)
	{
		snprintf(err, errlen, "the transform ran longer than %ld ms and was stopped (an endless loop?)",
				 lim.timeout_ms);
		res = QB_TRANSFORM_REJECTED;
	}
	else if (too_big)
	{
		snprintf(err, errlen, "the transform's output is over %ld bytes", lim.max_output);
		res = QB_TRANSFORM_REJECTED;
	}
	else if (got >= 2 && (buf[0] == 'O' || buf[0] == 'R') &&
			 (!waited || (WIFEXITED(status) && WEXITSTATUS(status) == 0)))
	{
		if (buf[0] == 'R')
		{
			if (at)
				*at = (unsigned char) buf[1] == QBT_NO_INDEX ? -1 : (unsigned char) buf[1];
			snprintf(err, errlen, "%.*s", (int) (got - 2), buf + 2);
			res = QB_TRANSFORM_REJECTED;
		}
		else
		{
			/* reuse the buffer: drop the two header bytes, add a NUL */
			memmove(buf, buf + 2, got - 2);
			if (got - 2 + 1 > cap)
			{
				char	   *nb = realloc(buf, got - 1);

				if (nb == NULL)
					goto nomem;
				buf = nb;
			}
			buf[got - 2] = '\0';
			*out = buf;
			*outlen = got - 2;
			return QB_TRANSFORM_OK;
		}
	}
	else if (waited && WIFSIGNALED(status) &&
			 (WTERMSIG(status) == SIGKILL || WTERMSIG(status) == SIGQUIT))
	{
		/* killed from outside (a shutdown, the OOM killer): not the message's fault */
		snprintf(err, errlen, "the transform helper was killed by signal %d", WTERMSIG(status));
		res = QB_TRANSFORM_FAILED;
	}
	else if (buf == NULL && got == 0 && cap == 0 && !waited)
	{
		snprintf(err, errlen, "the transform helper vanished");
		res = QB_TRANSFORM_FAILED;
	}
	else
	{
		snprintf(err, errlen,
				 "the transform crashed or ran out of memory (a run may use %ld MB more than the worker)",
				 lim.max_memory / (1024 * 1024));
		res = QB_TRANSFORM_REJECTED;
	}
	free(buf);
	return res;

nomem:
	free(buf);
	snprintf(err, errlen, "out of memory for the transform's output");
	return QB_TRANSFORM_FAILED;
}

QbTransformResult
qb_transform_run(const QbTransform *t, const char *payload, size_t len,
				 const QbTransformVars *vars, const QbTransformLimits *limits,
				 char **out, size_t *outlen, char *err, size_t errlen)
{
	const QbTransform *chain[1] = {t};

	return qb_transform_run_chain(chain, 1, payload, len, vars, limits, out, outlen, NULL,
								  err, errlen);
}
