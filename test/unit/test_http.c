/*-------------------------------------------------------------------------
 * test_http.c
 *	  The HTTP publisher against a real loopback endpoint: the project's sink
 *	  (test/sink/qb_sink, built by `make sink`), started per test run.
 *
 * What it pins down: the headers a destination receives and which one wins,
 * 2xx vs other answers, connection refused, timeouts, rows whose headers
 * cannot be sent (refused before any byte leaves), and abort; a timed-out
 * request the receiver never took is reset, never sent later; the outcome's
 * details (410 gone, Retry-After of a 429 or 503, and the Retry-After
 * parser alone); the signature headers of a signed destination; what a
 * request on a kept connection costs in epoll_ctl and sigprocmask calls
 * (none: epoll_ctl and pthread_sigmask are wrapped, see the Makefile), a
 * kept connection whose peer hangs up, the signal mask of the threaded
 * resolver's thread (pthread_create is interposed for libcurl), and the
 * resolver's socket on the fd of a refused attempt.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <limits.h>
#include <netinet/in.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "qb_http.h"
#include "qb_http_int.h"
#include "qb_token.h"
#include "qb_publish.h"
#include "qb_sign.h"
#include "test_sink.h"

static TestSink sink;
static char sink_url[160];
static char log_path[256];

/* calls the publisher made, counted by the wrappers below */
static int	n_epoll_ctl;
static int	n_epoll_add;
static int	n_sigmask_block;
static int	n_threads;
static int	n_threads_unmasked;	/* threads started with a signal not blocked */

extern int	__real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);
extern int	__real_pthread_sigmask(int how, const sigset_t *set, sigset_t *old);
extern int	__wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);
extern int	__wrap_pthread_sigmask(int how, const sigset_t *set, sigset_t *old);

int
__wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	n_epoll_ctl++;
	if (op == EPOLL_CTL_ADD)
		n_epoll_add++;
	return __real_epoll_ctl(epfd, op, fd, ev);
}

int
__wrap_pthread_sigmask(int how, const sigset_t *set, sigset_t *old)
{
	if (how == SIG_BLOCK)
		n_sigmask_block++;
	return __real_pthread_sigmask(how, set, old);
}

/*
 * pthread_create, as libcurl's threaded resolver calls it: the mask the
 * new thread inherits is the caller's at this moment.
 */
int
pthread_create(pthread_t *thread, const pthread_attr_t *attr,
			   void *(*start) (void *), void *arg)
{
	static int	(*real) (pthread_t *, const pthread_attr_t *, void *(*) (void *), void *);
	sigset_t	now;

	if (real == NULL)
		*(void **) &real = dlsym(RTLD_NEXT, "pthread_create");
	__real_pthread_sigmask(SIG_SETMASK, NULL, &now);
	n_threads++;
	if (!sigismember(&now, SIGTERM) || !sigismember(&now, SIGHUP) ||
		!sigismember(&now, SIGUSR1) || !sigismember(&now, SIGURG) ||
		!sigismember(&now, SIGINT))
		n_threads_unmasked++;
	return real(thread, attr, start, arg);
}

typedef struct Outcome
{
	int			n;
	bool		ok[16];
	long		status[16];
	bool		gone[16];
	long		retry_after_ms[16];
	char		error[16][512];
} Outcome;

static void
record(void *arg, int tag, const QbHttpOutcome *o)
{
	Outcome    *out = arg;

	assert_true(tag >= 0 && tag < 16);
	out->n++;
	out->ok[tag] = o->ok;
	out->status[tag] = o->status;
	out->gone[tag] = o->gone;
	out->retry_after_ms[tag] = o->retry_after_ms;
	snprintf(out->error[tag], sizeof(out->error[tag]), "%s", o->error);
}

/*
 * post: qb_http_post with the row's headers as text, parsed as the engine
 * parses them (qb_message_headers): text that is not a JSON object is the
 * engine's ROW_INVALID before the publisher is called.
 */
static QbHttpStart
post(QbHttp *h, const QbDestination *d, const char *mid, const char *headers,
	 const char *body, size_t body_len, int tag, char *err, size_t errlen)
{
	json_t	   *obj;
	QbHttpStart r;

	if (!qb_message_headers(headers, &obj, err, errlen))
		return QB_HTTP_ROW_INVALID;
	r = qb_http_post(h, d, mid, obj, body, body_len, tag, err, errlen);
	json_decref(obj);
	return r;
}

/* drive: run the publisher until nothing is in flight (bounded). */
static void
drive(QbHttp *h, Outcome *out)
{
	for (int rounds = 0; qb_http_in_flight(h) > 0 && rounds < 10000; rounds++)
	{
		struct pollfd p = {.fd = qb_http_fd(h), .events = POLLIN};
		long		t = qb_http_timeout_ms(h);

		if (t < 0 || t > 200)
			t = 200;
		if (t > 0)
			poll(&p, 1, (int) t);
		qb_http_perform(h, record, out);
	}
	assert_int_equal(qb_http_in_flight(h), 0);
}

static int
start_sink(void **state)
{
	if (test_sink_start(&sink, "test-http", true) != 0)
		return -1;
	snprintf(sink_url, sizeof(sink_url), "%s/events", sink.base);
	snprintf(log_path, sizeof(log_path), "%s", sink.log);
	return 0;
}

static int
stop_sink(void **state)
{
	return test_sink_stop(&sink);
}

/* the sink's log line for a message id (a new reference), or NULL */
static json_t *
logged(const char *message_id)
{
	FILE	   *f = fopen(log_path, "r");
	char		line[65536];
	json_t	   *found = NULL;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL)
	{
		json_t	   *r = json_loads(line, 0, NULL);
		const char *mid;

		if (r == NULL)
			continue;
		mid = json_string_value(json_object_get(json_object_get(r, "headers"), "x-message-id"));
		if (mid != NULL && strcmp(mid, message_id) == 0)
		{
			json_decref(found);
			found = r;
		}
		else
			json_decref(r);
	}
	fclose(f);
	return found;
}

static const char *
header(json_t *rec, const char *name)
{
	return json_string_value(json_object_get(json_object_get(rec, "headers"), name));
}

static QbDestination
dest_for(const char *url, long timeout_ms)
{
	static QbHeader statics[] = {{"X-Static", "dest"}, {"X-Api-Key", "k-1"}};
	QbDestination d = {0};

	d.name = "sink";
	d.type = QB_DEST_HTTP;
	d.url = (char *) url;
	d.headers = statics;
	d.nheaders = 2;
	d.timeout_ms = timeout_ms;
	return d;
}

/* What the endpoint receives, and which header wins. */
static void
test_headers_and_body(void **state)
{
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	Outcome		out = {0};
	const char *mid = "11111111-2222-4333-8444-555555555555";
	const char *body = "{\"id\": 1}";
	json_t	   *rec;

	assert_non_null(h);
	assert_int_equal(post(h, &d, mid,
								  "{\"X-Correlation-Id\": \"c-1\", \"User-Agent\": \"evil\","
								  " \"Content-Type\": \"text/plain\", \"X-Static\": \"row\","
								  " \"X-Message-Id\": \"forged\", \"X-Num\": 7, \"X-Null\": null}",
								  body, strlen(body), 3, err, sizeof(err)),
					 QB_HTTP_STARTED);
	assert_int_equal(qb_http_in_flight(h), 1);
	drive(h, &out);
	assert_int_equal(out.n, 1);
	assert_true(out.ok[3]);
	assert_int_equal(out.status[3], 200);

	rec = logged(mid);
	assert_non_null(rec);
	assert_string_equal(json_string_value(json_object_get(rec, "method")), "POST");
	assert_string_equal(json_string_value(json_object_get(rec, "path")), "/events");
	assert_string_equal(json_string_value(json_object_get(rec, "body")), body);
	assert_string_equal(header(rec, "content-type"), "application/json");
	assert_string_equal(header(rec, "x-message-id"), mid);
	assert_string_equal(header(rec, "user-agent"), "queuebox/" QB_VERSION);
	assert_string_equal(header(rec, "x-correlation-id"), "c-1");
	assert_string_equal(header(rec, "x-static"), "dest");	/* the destination wins */
	assert_string_equal(header(rec, "x-api-key"), "k-1");
	assert_string_equal(header(rec, "x-num"), "7");	/* non-strings as JSON text */
	assert_null(header(rec, "x-null"));
	assert_null(header(rec, "expect"));	/* no 100-continue round trip */
	json_decref(rec);
	qb_http_free(h);
}

/* Non-2xx answers fail with the status and the start of the answer. */
static void
test_error_status(void **state)
{
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	Outcome		out = {0};
	const char *body = "{\"_sink\": {\"fail\": 1, \"status\": 503}}";

	assert_int_equal(post(h, &d, "21111111-2222-4333-8444-555555555555", NULL,
								  body, strlen(body), 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_false(out.ok[0]);
	assert_int_equal(out.status[0], 503);
	assert_non_null(strstr(out.error[0], "answered HTTP 503"));
	assert_non_null(strstr(out.error[0], sink_url));

	/* the same message again: the sink's script lets the second through */
	assert_int_equal(post(h, &d, "21111111-2222-4333-8444-555555555555", NULL,
								  body, strlen(body), 1, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_true(out.ok[1]);
	qb_http_free(h);
}

/*
 * loopback_port: socket s bound to an ephemeral loopback port (rcvbuf > 0:
 * its receive buffer first), and url the destination URL of that port
 */
static void
loopback_port(int s, int rcvbuf, char *url, size_t urllen)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t	len = sizeof(a);

	if (rcvbuf > 0)
		assert_int_equal(setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)), 0);
	assert_int_equal(bind(s, (struct sockaddr *) &a, sizeof(a)), 0);
	assert_int_equal(getsockname(s, (struct sockaddr *) &a, &len), 0);
	snprintf(url, urllen, "http://127.0.0.1:%d/x", ntohs(a.sin_port));
}

/* A port nobody listens on, and an answer slower than timeoutMs. */
static void
test_refused_and_timeout(void **state)
{
	char		err[512];
	char		url[128];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	Outcome		out = {0};
	int			s = socket(AF_INET, SOCK_STREAM, 0);
	QbDestination down,
				slow;
	const char *body = "{\"_sink\": {\"fail\": 1, \"status\": 200, \"delay_ms\": 2000}}";

	/* an ephemeral port that was free a moment ago, closed again */
	loopback_port(s, 0, url, sizeof(url));
	close(s);
	down = dest_for(url, 2000);
	slow = dest_for(sink_url, 300);

	assert_int_equal(post(h, &down, "31111111-2222-4333-8444-555555555555", NULL,
								  "{}", 2, 0, err, sizeof(err)), QB_HTTP_STARTED);
	assert_int_equal(post(h, &slow, "41111111-2222-4333-8444-555555555555", NULL,
								  body, strlen(body), 1, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_int_equal(out.n, 2);
	assert_false(out.ok[0]);
	assert_int_equal(out.status[0], 0);
	assert_non_null(strstr(out.error[0], "connect"));
	assert_false(out.ok[1]);
	assert_non_null(strstr(out.error[1], "timed out"));
	qb_http_free(h);
}

/*
 * drain: what a peer that starts reading late gets from socket c: the
 * bytes, and whether they ended in a reset (else the sender's close).
 */
static size_t
drain(int c, bool *reset)
{
	static char buf[65536];
	size_t		total = 0;

	*reset = false;
	for (;;)
	{
		struct pollfd p = {.fd = c, .events = POLLIN};
		ssize_t		n;

		if (poll(&p, 1, 5000) <= 0)
			break;
		n = recv(c, buf, sizeof(buf), 0);
		if (n > 0)
			total += (size_t) n;
		else
		{
			*reset = n < 0 && errno == ECONNRESET;
			break;
		}
	}
	return total;
}

/*
 * A request that timed out with bytes its receiver never took is reset,
 * not closed: closed, the kernel would go on sending it, and a receiver
 * that reads again later (a partition healed) would get the attempt after
 * its retry and after later rows of its key (bench/chaos, "Findings").
 * The receiver here accepts nothing and reads nothing until the attempt
 * timed out; the body is larger than the sockets' buffers.
 */
static void
test_timed_out_request_is_reset(void **state)
{
	char		err[512];
	char		url[128];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	Outcome		out = {0};
	int			l = socket(AF_INET, SOCK_STREAM, 0);
	size_t		body_len = 16 * 1024 * 1024;
	char	   *body = malloc(body_len);
	QbDestination d;
	bool		reset;
	size_t		got;
	int			c;

	assert_non_null(body);
	memset(body, 'x', body_len);
	loopback_port(l, 4096, url, sizeof(url));
	assert_int_equal(listen(l, 4), 0);
	d = dest_for(url, 300);
	assert_int_equal(post(h, &d, "51111111-2222-4333-8444-555555555555", NULL,
						  body, body_len, 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_int_equal(out.n, 1);
	assert_false(out.ok[0]);
	assert_non_null(strstr(out.error[0], "timed out"));
	/* the receiver starts reading only now */
	c = accept(l, NULL, NULL);
	assert_true(c >= 0);
	got = drain(c, &reset);
	assert_true(reset);
	assert_true(got < body_len);
	close(c);
	close(l);
	free(body);
	qb_http_free(h);
}

/* Headers that would corrupt the request: refused before sending. */
static void
test_invalid_row_headers(void **state)
{
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);

	assert_int_equal(post(h, &d, "51111111-2222-4333-8444-555555555555",
								  "{\"X-Evil\": \"a\\r\\nInjected: 1\"}", "{}", 2, 0,
								  err, sizeof(err)), QB_HTTP_ROW_INVALID);
	assert_non_null(strstr(err, "X-Evil"));
	assert_int_equal(post(h, &d, "51111111-2222-4333-8444-555555555555",
								  "{\"Bad Name\": \"v\"}", "{}", 2, 0, err, sizeof(err)),
					 QB_HTTP_ROW_INVALID);
	assert_int_equal(post(h, &d, "51111111-2222-4333-8444-555555555555",
								  "[1, 2]", "{}", 2, 0, err, sizeof(err)),
					 QB_HTTP_ROW_INVALID);
	assert_int_equal(qb_http_in_flight(h), 0);
	assert_null(logged("51111111-2222-4333-8444-555555555555"));
	qb_http_free(h);
}

/*
 * A row header of any length is sent: the ingress stores one of up to its
 * 64 KiB head, and fuzz_ingress found such a row refused here ("longer than
 * 8 KiB") and dead at its first publish.
 */
static void
test_long_row_header(void **state)
{
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	Outcome		out = {0};
	const char *mid = "61111111-2222-4333-8444-555555555555";
	size_t		n = 12000;
	char	   *value = malloc(n + 1);
	json_t	   *row = json_object();
	json_t	   *rec;
	struct curl_slist *list = NULL;

	assert_non_null(h);
	memset(value, 'v', n);
	value[n] = '\0';
	json_object_set_new(row, "X-Long", json_string(value));
	assert_int_equal(qbh_build_headers(&list, &d, mid, row, "{}", 2, err, sizeof(err)), QB_HDR_OK);
	curl_slist_free_all(list);
	assert_int_equal(qb_http_post(h, &d, mid, row, "{}", 2, 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_int_equal(out.n, 1);
	assert_true(out.ok[0]);
	rec = logged(mid);
	assert_non_null(rec);
	assert_string_equal(header(rec, "x-long"), value);
	json_decref(rec);
	json_decref(row);
	free(value);
	qb_http_free(h);
}

/* Many concurrent posts over kept-alive connections, then abort. */
static void
test_concurrency_and_abort(void **state)
{
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	Outcome		out = {0};
	const char *slow = "{\"_sink\": {\"fail\": 1, \"status\": 200, \"delay_ms\": 3000}}";

	for (int round = 0; round < 3; round++)
	{
		memset(&out, 0, sizeof(out));
		for (int i = 0; i < 16; i++)
		{
			char		mid[40];

			snprintf(mid, sizeof(mid), "6%07d-2222-4333-8444-555555555555", round * 100 + i);
			assert_int_equal(post(h, &d, mid, NULL, "{}", 2, i, err, sizeof(err)),
							 QB_HTTP_STARTED);
		}
		drive(h, &out);
		assert_int_equal(out.n, 16);
		for (int i = 0; i < 16; i++)
			assert_true(out.ok[i]);
	}

	memset(&out, 0, sizeof(out));
	assert_int_equal(post(h, &d, "71111111-2222-4333-8444-555555555555", NULL,
								  slow, strlen(slow), 0, err, sizeof(err)), QB_HTTP_STARTED);
	qb_http_perform(h, record, &out);
	qb_http_abort_all(h);
	assert_int_equal(qb_http_in_flight(h), 0);
	assert_int_equal(out.n, 0);	/* aborted posts are not reported */
	qb_http_free(h);
}

/*
 * A request on a kept connection changes nothing in the epoll set and
 * blocks no signal: the connection's socket stays in the set while it
 * idles in libcurl's cache, and only a name to resolve blocks signals.
 */
static void
test_kept_connection_costs_no_calls(void **state)
{
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	Outcome		out = {0};
	int			ctl,
				block;

	assert_int_equal(post(h, &d, "c1111111-2222-4333-8444-555555555555", NULL,
						  "{}", 2, 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_true(out.ok[0]);
	ctl = n_epoll_ctl;
	block = n_sigmask_block;
	for (int i = 1; i <= 10; i++)
	{
		char		mid[48];

		snprintf(mid, sizeof(mid), "c%07d-2222-4333-8444-555555555555", i);
		assert_int_equal(post(h, &d, mid, NULL, "{}", 2, i, err, sizeof(err)),
						 QB_HTTP_STARTED);
		drive(h, &out);
		assert_true(out.ok[i]);
	}
	assert_int_equal(out.n, 11);
	assert_int_equal(n_epoll_ctl - ctl, 0);
	assert_int_equal(n_sigmask_block - block, 0);
	qb_http_free(h);
}

/*
 * serve: answer one request on the listening socket ls (a keep-alive 200),
 * driving h while waiting; *c is the accepted connection, kept open.
 */
static void
serve(QbHttp *h, Outcome *out, int ls, int *c)
{
	char		req[4096];
	size_t		got = 0;
	static const char answer[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";

	for (int rounds = 0; rounds < 10000 && qb_http_in_flight(h) > 0; rounds++)
	{
		struct pollfd p[2] = {{.fd = qb_http_fd(h), .events = POLLIN},
		{.fd = *c >= 0 ? *c : ls, .events = POLLIN}};

		poll(p, 2, 100);
		qb_http_perform(h, record, out);
		if (*c < 0)
		{
			if ((*c = accept(ls, NULL, NULL)) >= 0)
				fcntl(*c, F_SETFL, O_NONBLOCK);
		}
		else if (got < sizeof(req) - 1)
		{
			ssize_t		n = recv(*c, req + got, sizeof(req) - 1 - got, 0);

			if (n > 0)
			{
				got += (size_t) n;
				req[got] = '\0';
				/* the body "{}" comes with the head (no Expect round trip) */
				if (strstr(req, "\r\n\r\n{}") != NULL)
					assert_int_equal(send(*c, answer, strlen(answer), 0), (ssize_t) strlen(answer));
			}
		}
	}
	assert_int_equal(qb_http_in_flight(h), 0);
}

/*
 * A kept connection whose peer hangs up while it idles wakes the publisher
 * once: the first event takes its socket out of the set (the publisher's
 * fd is quiet after one perform, no busy wait), and the next post to that
 * peer goes out on a new connection.
 */
static void
test_kept_connection_peer_closes(void **state)
{
	char		err[512];
	char		url[128];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	Outcome		out = {0};
	int			ls = socket(AF_INET, SOCK_STREAM, 0);
	int			c = -1;
	QbDestination d;
	struct pollfd p = {.fd = qb_http_fd(h), .events = POLLIN};

	loopback_port(ls, 0, url, sizeof(url));
	assert_int_equal(listen(ls, 4), 0);
	fcntl(ls, F_SETFL, O_NONBLOCK);
	d = dest_for(url, 5000);
	assert_int_equal(post(h, &d, "d1111111-2222-4333-8444-555555555555", NULL,
						  "{}", 2, 0, err, sizeof(err)), QB_HTTP_STARTED);
	serve(h, &out, ls, &c);
	assert_int_equal(out.n, 1);
	assert_true(out.ok[0]);

	/* the peer hangs up: the kept socket reports it, once */
	close(c);
	c = -1;
	assert_int_equal(poll(&p, 1, 10000), 1);
	qb_http_perform(h, record, &out);
	assert_int_equal(poll(&p, 1, 0), 0);
	assert_int_equal(out.n, 1);

	assert_int_equal(post(h, &d, "d2222222-2222-4333-8444-555555555555", NULL,
						  "{}", 2, 1, err, sizeof(err)), QB_HTTP_STARTED);
	serve(h, &out, ls, &c);
	assert_int_equal(out.n, 2);
	assert_true(out.ok[1]);
	close(c);
	close(ls);
	qb_http_free(h);
}

/*
 * A name to resolve: the threaded resolver's thread starts with every
 * signal blocked (PostgreSQL's handlers must run on the worker's thread
 * only), and the caller's mask is as it was once the post is done.
 */
static void
test_resolver_thread_signals(void **state)
{
	char		err[512];
	char		name[256];
	char		url[300];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	Outcome		out = {0};
	QbDestination d;
	sigset_t	before,
				after;

	/* this machine's name: resolved by the system, not by libcurl itself */
	assert_int_equal(gethostname(name, sizeof(name)), 0);
	snprintf(url, sizeof(url), "http://%s:1/x", name);
	d = dest_for(url, 5000);
	pthread_sigmask(SIG_SETMASK, NULL, &before);
	n_threads = n_threads_unmasked = 0;
	assert_int_equal(post(h, &d, "e1111111-2222-4333-8444-555555555555", NULL,
						  "{}", 2, 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_int_equal(out.n, 1);
	assert_false(out.ok[0]);	/* nobody listens on port 1 */
	assert_true(n_threads >= 1);
	assert_int_equal(n_threads_unmasked, 0);
	pthread_sigmask(SIG_SETMASK, NULL, &after);
	for (int sig = 1; sig < NSIG; sig++)
		assert_int_equal(sigismember(&before, sig), sigismember(&after, sig));
	qb_http_free(h);
}

/*
 * A socket libcurl closes itself (7.88 closes a socket that is still
 * connecting, here one whose attempt timed out, without the close
 * callback) leaves its fd free; the threaded resolver's socket that takes
 * that fd is watched as libcurl says, so a later resolve on the same fd is
 * heard (each resolve's socket is added to the set: the egress rules
 * refuse the address, so no other socket is opened).  Fails before: the
 * resolver's socket was taken for a kept connection, left "in" the set
 * after its close, and the next resolve's socket on that fd was never
 * added (libcurl 7.88 then finds the answer only by its own polling
 * timer, up to 250 ms later).
 */
static void
test_fd_of_unconnected_socket_reused(void **state)
{
	char		err[512];
	char		name[256];
	char		url[300];
	QbHttp	   *h;
	Outcome		out = {0};
	int			ls;
	int			fill[2];
	int			add;
	QbEgress   *rules = NULL;
	QbDestination d;
	const char *preload = getenv("LD_PRELOAD");

	/*
	 * Under valgrind the resolver's thread runs at once and has answered
	 * before libcurl asks for its socket, so no socket is asked for and the
	 * count below would be 0 either way: the check needs threads that run
	 * side by side (plain and SANITIZE runs).
	 */
	if (preload != NULL && strstr(preload, "vgpreload") != NULL)
		skip();
	h = qb_http_new(err, sizeof(err));
	ls = socket(AF_INET, SOCK_STREAM, 0);

	/* a listener whose accept queue is full: a new connect hangs (SYN dropped) */
	loopback_port(ls, 0, url, sizeof(url));
	assert_int_equal(listen(ls, 0), 0);
	for (int i = 0; i < 2; i++)
	{
		struct sockaddr_in a;
		socklen_t	len = sizeof(a);

		assert_int_equal(getsockname(ls, (struct sockaddr *) &a, &len), 0);
		fill[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		(void) connect(fill[i], (struct sockaddr *) &a, len);
	}
	d = dest_for(url, 300);
	assert_int_equal(post(h, &d, "f1111111-2222-4333-8444-555555555555", NULL,
						  "{}", 2, 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_false(out.ok[0]);
	assert_non_null(strstr(out.error[0], "timed out"));

	/* a name (to resolve) whose address the rules refuse, at two ports */
	assert_true(qb_egress_parse("10.0.0.0/8", "egress.allow", &rules, err, sizeof(err)));
	assert_int_equal(gethostname(name, sizeof(name)), 0);
	for (int i = 1; i <= 2; i++)
	{
		char		mid[48];

		snprintf(url, sizeof(url), "http://%s:%d/x", name, i);
		snprintf(mid, sizeof(mid), "f%07d-2222-4333-8444-555555555555", i);
		d = dest_for(url, 3000);
		d.egress = rules;
		add = n_epoll_add;
		assert_int_equal(post(h, &d, mid, NULL, "{}", 2, i, err, sizeof(err)),
						 QB_HTTP_STARTED);
		drive(h, &out);
		assert_false(out.ok[i]);
		assert_non_null(strstr(out.error[i], "egress refused"));
		/* the resolver's socket went into the set (its only socket) */
		assert_int_equal(n_epoll_add - add, 1);
	}
	qb_egress_free(rules);
	close(fill[0]);
	close(fill[1]);
	close(ls);
	qb_http_free(h);
}

/* http_date: an IMF-fixdate t seconds from now. */
static void
http_date(long long t, char *buf, size_t len)
{
	time_t		when = (time_t) t;
	struct tm	tm;

	gmtime_r(&when, &tm);
	strftime(buf, len, "%a, %d %b %Y %H:%M:%S GMT", &tm);
}

/* The Retry-After parser alone: both forms, absent, garbage. */
static void
test_retry_after_values(void **state)
{
	long long	now = 1764460800;	/* Sun, 30 Nov 2025 00:00:00 GMT */
	char		date[64];

	assert_int_equal(qb_http_retry_after_ms("120", now), 120000);
	/* a date in year 1111111112 (fuzz_publish): the largest delay, no overflow */
	assert_true(qb_http_retry_after_ms("Wed, 21 Oct 1111111112", now) == (LONG_MAX / 10000) * 1000);
	assert_int_equal(qb_http_retry_after_ms(" 5 ", now), 5000);
	assert_int_equal(qb_http_retry_after_ms("0", now), 0);
	http_date(now + 90, date, sizeof(date));
	assert_int_equal(qb_http_retry_after_ms(date, now), 90000);
	assert_int_equal(qb_http_retry_after_ms("Sun, 30 Nov 2025 00:01:00 GMT", now), 60000);
	/* the obsolete forms HTTP still allows, through the same parser */
	assert_int_equal(qb_http_retry_after_ms("Sunday, 30-Nov-25 00:00:30 GMT", now), 30000);
	assert_int_equal(qb_http_retry_after_ms("Sun Nov 30 00:00:10 2025", now), 10000);
	/* a date already past: now */
	assert_int_equal(qb_http_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", now), 0);
	/* absent, empty, garbage */
	assert_int_equal(qb_http_retry_after_ms(NULL, now), -1);
	assert_int_equal(qb_http_retry_after_ms("", now), -1);
	assert_int_equal(qb_http_retry_after_ms("soon", now), -1);
	assert_int_equal(qb_http_retry_after_ms("12abc", now), -1);
	assert_int_equal(qb_http_retry_after_ms("-5", now), -1);
	assert_int_equal(qb_http_retry_after_ms("1.5", now), -1);
	/* absurdly large: clamped, not overflowed */
	assert_true(qb_http_retry_after_ms("99999999999999999999999", now) > 0);
}

/* post_scripted: one post of a _sink script, driven to its outcome. */
static void
post_scripted(QbHttp *h, QbDestination *d, int tag, const char *script, Outcome *out)
{
	char		mid[64];
	char		body[256];
	char		err[512];

	snprintf(mid, sizeof(mid), "a%07d-2222-4333-8444-555555555555", tag);
	snprintf(body, sizeof(body), "{\"_sink\": %s}", script);
	assert_int_equal(post(h, d, mid, NULL, body, strlen(body), tag, err, sizeof(err)),
					 QB_HTTP_STARTED);
	drive(h, out);
}

/* Status, gone and Retry-After as the publisher reports them. */
static void
test_outcome_details(void **state)
{
	char		err[512];
	char		script[160];
	char		date[64];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	Outcome		out = {0};

	post_scripted(h, &d, 0, "{\"status\": 429, \"retry_after\": \"7\"}", &out);
	assert_false(out.ok[0]);
	assert_int_equal(out.status[0], 429);
	assert_false(out.gone[0]);
	assert_int_equal(out.retry_after_ms[0], 7000);
	assert_non_null(strstr(out.error[0], "answered HTTP 429 (Retry-After: 7000 ms)"));

	http_date((long long) time(NULL) + 120, date, sizeof(date));
	snprintf(script, sizeof(script), "{\"status\": 503, \"retry_after\": \"%s\"}", date);
	post_scripted(h, &d, 1, script, &out);
	assert_int_equal(out.status[1], 503);
	assert_in_range(out.retry_after_ms[1], 115000, 121000);

	post_scripted(h, &d, 2, "{\"status\": 429}", &out);
	assert_int_equal(out.status[2], 429);
	assert_int_equal(out.retry_after_ms[2], -1);

	post_scripted(h, &d, 3, "{\"status\": 503, \"retry_after\": \"whenever\"}", &out);
	assert_int_equal(out.retry_after_ms[3], -1);

	/* only 429 and 503 carry a delay */
	post_scripted(h, &d, 4, "{\"status\": 500, \"retry_after\": \"7\"}", &out);
	assert_int_equal(out.status[4], 500);
	assert_int_equal(out.retry_after_ms[4], -1);

	post_scripted(h, &d, 5, "{\"status\": 410}", &out);
	assert_false(out.ok[5]);
	assert_int_equal(out.status[5], 410);
	assert_true(out.gone[5]);
	assert_int_equal(out.retry_after_ms[5], -1);
	assert_non_null(strstr(out.error[5], "answered HTTP 410 (Gone"));

	post_scripted(h, &d, 6, "{\"delay_ms\": 0}", &out);
	assert_true(out.ok[6]);
	assert_int_equal(out.status[6], 200);
	assert_false(out.gone[6]);
	assert_int_equal(out.retry_after_ms[6], -1);

	/* no answer at all: status 0 */
	d.url = "http://127.0.0.1:1/events";
	post_scripted(h, &d, 7, "{}", &out);
	assert_false(out.ok[7]);
	assert_int_equal(out.status[7], 0);
	assert_int_equal(out.retry_after_ms[7], -1);
	qb_http_free(h);
}

/* rec_get: a logged request's header, as qb_auth_verify asks for one. */
static const char *
rec_get(void *rec, const char *name)
{
	return header(rec, name);
}

/* A signed destination: the signature headers, over the body sent. */
static void
test_signed_request(void **state)
{
	static const char *const secrets[] = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
	char		err[512];
	QbHttp	   *h = qb_http_new(err, sizeof(err));
	QbDestination d = dest_for(sink_url, 5000);
	QbSignKey	key;
	Outcome		out = {0};
	const char *mid = "b1111111-2222-4333-8444-555555555555";
	const char *body = "{\"signed\": true}";
	QbAuth		verify = {.type = QB_AUTH_STANDARD_WEBHOOKS, .secrets = secrets, .nsecrets = 1};
	json_t	   *rec;
	long long	ts;

	assert_true(qb_sign_key(QB_AUTH_STANDARD_WEBHOOKS, secrets[0], &key, err, sizeof(err)));
	d.signing.type = QB_AUTH_STANDARD_WEBHOOKS;
	d.signing.keys = &key;
	d.signing.nkeys = 1;
	/* a row cannot forge or replace a signature header */
	assert_int_equal(post(h, &d, mid, "{\"webhook-signature\": \"v1,forged\", \"Webhook-Id\": \"x\"}",
								  body, strlen(body), 0, err, sizeof(err)), QB_HTTP_STARTED);
	drive(h, &out);
	assert_true(out.ok[0]);
	rec = logged(mid);
	assert_non_null(rec);
	assert_string_equal(header(rec, "webhook-id"), mid);
	ts = atoll(header(rec, "webhook-timestamp"));
	assert_in_range(ts, (long long) time(NULL) - 30, (long long) time(NULL) + 1);
	assert_non_null(strstr(header(rec, "webhook-signature"), "v1,"));
	assert_null(strstr(header(rec, "webhook-signature"), "forged"));
	if (!qb_auth_verify(&verify, rec_get, rec, (const unsigned char *) body,
						strlen(body), (time_t) ts, err, sizeof(err)))
		fail_msg("the signed request does not verify: %s", err);
	json_decref(rec);
	free(key.bytes);
	qb_http_free(h);
}

/* qb_token: header names are tokens, values hold no control character but tab */
static void
test_field_syntax(void **state)
{
	char		buf[64];

	assert_int_equal(qb_token_invalid_at("X-Custom_1.a~b"), -1);
	assert_int_equal(qb_token_invalid_at("!#$%&'*+-.^_`|~"), -1);
	assert_int_equal(qb_token_invalid_at(""), 0);
	assert_int_equal(qb_token_invalid_at("Bad Header\x01"), 3);
	assert_int_equal(qb_token_invalid_at("X:y"), 1);
	assert_int_equal(qb_token_invalid_at("caf\xc3\xa9"), 3);
	assert_int_equal(qb_token_invalid_at("a(b)"), 1);
	assert_int_equal(qb_field_value_invalid_at("tab\tok, \"quoted\" caf\xc3\xa9"), -1);
	assert_int_equal(qb_field_value_invalid_at("line\r\nX-Injected: 1"), 4);
	assert_int_equal(qb_field_value_invalid_at("del\x7f"), 3);
	assert_true(qb_header_valid("X-A", "b"));
	assert_false(qb_header_valid("X A", "b"));
	assert_false(qb_header_valid("X-A", "b\x01"));
	qb_token_printable(buf, sizeof(buf), "Bad Header\x01\"\\", 100);
	assert_string_equal(buf, "Bad Header\\x01\\x22\\x5c");
	qb_token_printable(buf, sizeof(buf), "abcdef", 3);
	assert_string_equal(buf, "abc");
	qb_token_printable(buf, 8, "\x01\x02\x03\x04", 100);
	assert_string_equal(buf, "\\x01");		/* cut before a \xNN would not fit */
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_headers_and_body),
		cmocka_unit_test(test_field_syntax),
		cmocka_unit_test(test_error_status),
		cmocka_unit_test(test_refused_and_timeout),
		cmocka_unit_test(test_timed_out_request_is_reset),
		cmocka_unit_test(test_invalid_row_headers),
		cmocka_unit_test(test_long_row_header),
		cmocka_unit_test(test_concurrency_and_abort),
		cmocka_unit_test(test_kept_connection_costs_no_calls),
		cmocka_unit_test(test_kept_connection_peer_closes),
		cmocka_unit_test(test_resolver_thread_signals),
		cmocka_unit_test(test_fd_of_unconnected_socket_reused),
		cmocka_unit_test(test_retry_after_values),
		cmocka_unit_test(test_outcome_details),
		cmocka_unit_test(test_signed_request),
	};

	return cmocka_run_group_tests(tests, start_sink, stop_sink);
}
