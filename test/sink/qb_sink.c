/*-------------------------------------------------------------------------
 * qb_sink.c
 *	  A loopback HTTP sink for QueueBox's tests, the demo and the benchmarks.
 *
 * Build:  make sink            (libmicrohttpd + jansson; no PostgreSQL header)
 *
 * Usage:
 *	qb_sink --port N [--bind 127.0.0.1] [--port-file F] [--log FILE]
 *			[--status CODE] [--delay-ms MS] [--threads N] [--print] [--quiet]
 *
 *	--port N		port to listen on; 0 picks a free (ephemeral) port
 *	--bind ADDR		IPv4 address to bind (default 127.0.0.1)
 *	--port-file F	write the bound port (decimal + newline) to F, atomically
 *					(written to F.tmp.PID, then renamed)
 *	--log FILE		append one JSON line per request, flushed per line:
 *					{"t_us": <CLOCK_REALTIME us when the full body was read>,
 *					 "method": "POST", "path": "/events",
 *					 "headers": {"x-message-id": "...", ...},  (names lowercased;
 *					            a repeated header's values are joined by ", ")
 *					 "body": "<raw body as a string>",  (invalid UTF-8 -> U+FFFD)
 *					 "status": <the status answered>}
 *					The line is written when the answer is queued (after any delay).
 *	--status CODE	default answer status (default 200)
 *	--delay-ms MS	delay every answer by MS (suspend/resume + a timer thread;
 *					the MHD thread never sleeps)
 *	--threads N		MHD thread pool size (default 2)
 *					The threads poll(): with epoll (edge-triggered) libmicrohttpd
 *					0.9.75 left requests on kept-alive connections unread until the
 *					client timed out: ~0.1-0.2 % of them with one thread, and once
 *					in a while a whole burst (TAP 020: 128 requests, resent after
 *					timeoutMs, counted as duplicates).  QB_SINK_EPOLL=1 brings
 *					epoll back, for comparison only.  Reproducer:
 *					test/sink/keepalive_burst.py PORT /events 128 50 (a POST on
 *					each of 128 kept-alive connections at once, 50 times) against
 *					QB_SINK_EPOLL=1 qb_sink --threads 1 leaves whole bursts of 128
 *					unanswered (896 of 6,400 on 2026-12-02); with poll, none.  The
 *					ingress (external epoll, one thread) answered every request of
 *					the same bursts (test/t/inbox/049_ingress_keepalive.pl).
 *	--print			print each request on stdout as it is answered, two lines:
 *					"sink: POST /events -> 200  x-message-id=...  x-correlation-id=..."
 *					(the ids only when sent), then the body indented (the demo)
 *	--quiet			no informational output on stderr (the "listening" line
 *					on stdout is always printed: it is the readiness signal)
 *
 * Once listening it prints "listening ADDR:PORT" on stdout (flushed).
 *
 * Answers: every request (any method, any path) gets the default status with
 * body {"ok":true} (2xx) or {"ok":false} (otherwise), Content-Type
 * application/json, HTTP/1.1 keep-alive.  Bodies up to 1 MiB; larger -> 413.
 *
 * Scripted behaviour, per message, from the JSON body:
 *	{"_sink": {"fail": N, "status": S, "delay_ms": D, "retry_after": "R"}, ...}
 *	- "fail" given: the first N requests carrying the same X-Message-Id value
 *	  are answered with S (default 500) after D ms; later ones get 200 at
 *	  once.  Counted per X-Message-Id in a hash table (requests without the
 *	  header share the counter of the empty id).
 *	- "fail" absent, "status" given: every such request is answered S after D.
 *	- only "delay_ms": every such request is answered with the default status
 *	  after D ms (a slow endpoint).
 *	A per-request delay_ms replaces --delay-ms for that request.
 *	- "hold": true: every such request is answered (as above, no delay)
 *	  only once POST /_sink/release is called, however long that takes
 *	  (a request the test holds in flight while it changes the world).
 *	- "retry_after" (a string, sent as it is: "30", an HTTP-date, or garbage
 *	  to test a client): every answer with the scripted status S carries
 *	  "Retry-After: R"; the 200s after the "fail" ones do not.  A value with
 *	  a control character is ignored.
 *
 * Control endpoints (not logged, not counted):
 *	GET  /_sink/stats  -> {"requests": n, "ok": n, "failed": n,   (ok = 2xx)
 *						   "aborted": n, "slow": n, "max_answer_ms": x}
 *		diagnostics: aborted = answers queued whose connection ended before
 *		the answer was fully sent; slow = answers fully sent more than 1 s
 *		after the body was received (scripted delays excluded); max_answer_ms
 *		= the longest such time.
 *		held = requests held now ("hold": true), not yet released
 *		concurrent = requests received (whole body read) whose answer is
 *		not queued yet, now; max_concurrent = the most there were at once
 *		(a client's concurrency limit, seen from the sink: a request is
 *		counted from its receipt to its answer, so a slow answer, from
 *		--delay-ms or "delay_ms", keeps it counted that long)
 *	POST /_sink/reset  -> zeroes the counters and the fail table
 *	POST /_sink/release -> answers every held request now: {"released": n}
 *	POST /_sink/fault  -> a fault for every later request until the next one
 *		(the chaos runner's nemesis, bench/chaos): the body is
 *		{"status": S, "delay_ms": D, "cut": true, "retry_after": "R"}, each
 *		key optional; {} ends the fault.  It stands in for --status and
 *		--delay-ms; a message's own "_sink" script still wins.  "cut": the
 *		answer's head and half its body are sent, then the connection is
 *		closed (a receiver that dies mid-answer); its log line has
 *		"cut": true.  Answers {"ok":true}, or 400 for a body that is not
 *		such an object.
 *
 * SIGTERM / SIGINT: pending delayed answers are released, the daemon is
 * stopped, exit 0.
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#if MHD_VERSION < 0x00097002
typedef int MHD_Result_t;
#else
typedef enum MHD_Result MHD_Result_t;
#endif

#define MAX_BODY	(1024 * 1024)
#define HTTP_TOO_LARGE	413		/* MHD renamed its constant across releases */

/* ------------------------------------------------------------------ options */

static int	opt_port = -1;
static const char *opt_bind = "127.0.0.1";
static const char *opt_port_file = NULL;
static const char *opt_log = NULL;
static int	opt_status = 200;
static long opt_delay_ms = 0;
static int	opt_threads = 2;
static bool opt_quiet = false;
static bool opt_print = false;

/* ------------------------------------------------------------------ state */

static atomic_ulong n_requests;
static atomic_ulong n_ok;
static atomic_ulong n_failed;
static atomic_ulong n_aborted;	/* answer queued, connection ended before it was sent */
static atomic_ulong n_slow;		/* answers fully sent more than 1 s after receipt */
static atomic_ulong max_answer_us;	/* receipt -> answer fully sent, delays excluded */
static atomic_long n_open;		/* requests received whose answer is not queued yet */
static atomic_long max_open;	/* the most n_open has been */

static FILE *log_fp = NULL;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static struct MHD_Response *resp_ok;	/* {"ok":true}, shared */
static struct MHD_Response *resp_fail;	/* {"ok":false}, shared */
static struct MHD_Response *resp_big;	/* 413 body, shared */

static const char BODY_OK[] = "{\"ok\":true}";
static const char BODY_FAIL[] = "{\"ok\":false}";
static const char BODY_BIG[] = "{\"ok\":false,\"error\":\"body too large\"}";

typedef struct Req
{
	char	   *body;
	size_t		len;
	size_t		cap;
	bool		too_large;
	bool		decided;		/* status/delay decided (final call seen) */
	bool		suspended;		/* waiting in the timer heap */
	bool		held;			/* "hold": waits for POST /_sink/release */
	bool		control;		/* /_sink/... */
	int			status;
	long		delay_ms;
	int64_t		t_us;
	uint64_t	t_mono_ns;		/* full body received (CLOCK_MONOTONIC) */
	bool		answered;		/* a counted answer was queued */
	char		retry_after[128];	/* scripted Retry-After, "" none */
	bool		cut;			/* close the connection mid-answer */
} Req;

/* ------------------------------------------------------------------ fault */

/*
 * The fault POST /_sink/fault set: read by decide() for every request, under
 * fault_mu (a copy is taken; the control request that changes it is rare).
 */
typedef struct Fault
{
	int			status;			/* 0: the default status */
	long		delay_ms;		/* -1: the default delay */
	bool		cut;
	char		retry_after[128];
} Fault;

static pthread_mutex_t fault_mu = PTHREAD_MUTEX_INITIALIZER;
static Fault fault_now = {0, -1, false, ""};

/* ------------------------------------------------------------------ fail table */

typedef struct FailEnt
{
	struct FailEnt *next;
	long		count;
	char		id[];
} FailEnt;

static pthread_mutex_t fail_mu = PTHREAD_MUTEX_INITIALIZER;
static FailEnt **fail_buckets = NULL;
static size_t fail_nbuckets = 0;
static size_t fail_count = 0;

static uint64_t
fnv1a(const char *s)
{
	uint64_t	h = 1469598103934665603ULL;

	for (; *s; s++)
	{
		h ^= (unsigned char) *s;
		h *= 1099511628211ULL;
	}
	return h;
}

static void
fail_grow(void)
{
	size_t		nb = fail_nbuckets ? fail_nbuckets * 2 : 1024;
	FailEnt   **b = calloc(nb, sizeof(*b));

	if (!b)
		return;					/* keep the old table; chains just get longer */
	for (size_t i = 0; i < fail_nbuckets; i++)
	{
		FailEnt    *e = fail_buckets[i];

		while (e)
		{
			FailEnt    *nx = e->next;
			size_t		j = fnv1a(e->id) & (nb - 1);

			e->next = b[j];
			b[j] = e;
			e = nx;
		}
	}
	free(fail_buckets);
	fail_buckets = b;
	fail_nbuckets = nb;
}

/* Count one more request for id; returns the count including this one. */
static long
fail_bump(const char *id)
{
	long		c = 1;

	pthread_mutex_lock(&fail_mu);
	if (fail_nbuckets == 0 || fail_count >= 2 * fail_nbuckets)
		fail_grow();
	if (fail_nbuckets == 0)
	{
		pthread_mutex_unlock(&fail_mu);
		return 1;
	}
	size_t		i = fnv1a(id) & (fail_nbuckets - 1);
	FailEnt    *e;

	for (e = fail_buckets[i]; e; e = e->next)
		if (strcmp(e->id, id) == 0)
			break;
	if (e)
		c = ++e->count;
	else
	{
		size_t		l = strlen(id);

		e = malloc(sizeof(*e) + l + 1);
		if (e)
		{
			memcpy(e->id, id, l + 1);
			e->count = 1;
			e->next = fail_buckets[i];
			fail_buckets[i] = e;
			fail_count++;
		}
	}
	pthread_mutex_unlock(&fail_mu);
	return c;
}

static void
fail_reset(void)
{
	pthread_mutex_lock(&fail_mu);
	for (size_t i = 0; i < fail_nbuckets; i++)
	{
		FailEnt    *e = fail_buckets[i];

		while (e)
		{
			FailEnt    *nx = e->next;

			free(e);
			e = nx;
		}
		fail_buckets[i] = NULL;
	}
	fail_count = 0;
	pthread_mutex_unlock(&fail_mu);
}

/* ------------------------------------------------------------------ delay timer */

typedef struct TimerEnt
{
	uint64_t	deadline_ns;	/* CLOCK_MONOTONIC */
	struct MHD_Connection *conn;
} TimerEnt;

static pthread_mutex_t timer_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cv;
static TimerEnt *heap = NULL;
static size_t heap_n = 0;
static size_t heap_cap = 0;
static bool timer_stop = false;
static pthread_t timer_thread;
static bool timer_started = false;
static atomic_ulong n_held;		/* held requests not yet released */

#define HELD_DEADLINE UINT64_MAX	/* a held request's place in the heap */

static uint64_t
mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t) ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static int64_t
real_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void
heap_swap(size_t a, size_t b)
{
	TimerEnt	t = heap[a];

	heap[a] = heap[b];
	heap[b] = t;
}

/* Called with timer_mu held.  Returns false when out of memory. */
static bool
heap_push(uint64_t deadline, struct MHD_Connection *c)
{
	if (heap_n == heap_cap)
	{
		size_t		nc = heap_cap ? heap_cap * 2 : 256;
		TimerEnt   *nh = realloc(heap, nc * sizeof(*nh));

		if (!nh)
			return false;
		heap = nh;
		heap_cap = nc;
	}
	size_t		i = heap_n++;

	heap[i].deadline_ns = deadline;
	heap[i].conn = c;
	while (i > 0)
	{
		size_t		p = (i - 1) / 2;

		if (heap[p].deadline_ns <= heap[i].deadline_ns)
			break;
		heap_swap(p, i);
		i = p;
	}
	return true;
}

/* heap_sift_down: entry i moves down to its place. */
static void
heap_sift_down(size_t i)
{
	for (;;)
	{
		size_t		l = 2 * i + 1,
					r = l + 1,
					m = i;

		if (l < heap_n && heap[l].deadline_ns < heap[m].deadline_ns)
			m = l;
		if (r < heap_n && heap[r].deadline_ns < heap[m].deadline_ns)
			m = r;
		if (m == i)
			break;
		heap_swap(i, m);
		i = m;
	}
}

static TimerEnt
heap_pop(void)
{
	TimerEnt	top = heap[0];

	heap[0] = heap[--heap_n];
	heap_sift_down(0);
	return top;
}

static void *
timer_main(void *arg)
{
	pthread_mutex_lock(&timer_mu);
	for (;;)
	{
		if (timer_stop)
		{
			/* release every delayed answer now */
			while (heap_n > 0)
			{
				TimerEnt	t = heap_pop();

				MHD_resume_connection(t.conn);
			}
			break;
		}
		if (heap_n == 0)
		{
			pthread_cond_wait(&timer_cv, &timer_mu);
			continue;
		}
		uint64_t	now = mono_ns();

		if (heap[0].deadline_ns <= now)
		{
			TimerEnt	t = heap_pop();

			/* MHD_resume_connection is thread-safe (it signals the ITC) */
			MHD_resume_connection(t.conn);
			continue;
		}
		struct timespec ts;
		uint64_t	d = heap[0].deadline_ns;

		ts.tv_sec = d / 1000000000ULL;
		ts.tv_nsec = d % 1000000000ULL;
		pthread_cond_timedwait(&timer_cv, &timer_mu, &ts);
	}
	pthread_mutex_unlock(&timer_mu);
	return NULL;
}

/*
 * Suspend c and schedule its resumption (ms < 0: held until release_held);
 * false if it could not be queued.
 */
static bool
delay_connection(struct MHD_Connection *c, long ms)
{
	bool		ok;

	pthread_mutex_lock(&timer_mu);
	if (timer_stop)
		ok = false;
	else
	{
		ok = heap_push(ms < 0 ? HELD_DEADLINE : mono_ns() + (uint64_t) ms * 1000000ULL, c);
		if (ok)
		{
			/* suspend under the lock so the timer cannot resume it first */
			MHD_suspend_connection(c);
			pthread_cond_signal(&timer_cv);
		}
	}
	pthread_mutex_unlock(&timer_mu);
	return ok;
}

/*
 * release_held: every held request's deadline becomes now (the heap is
 * rebuilt: they sat at its bottom); returns how many.
 */
static unsigned long
release_held(void)
{
	unsigned long n = 0;
	uint64_t	now = mono_ns();

	pthread_mutex_lock(&timer_mu);
	for (size_t i = 0; i < heap_n; i++)
		if (heap[i].deadline_ns == HELD_DEADLINE)
		{
			heap[i].deadline_ns = now;
			n++;
		}
	for (size_t k = heap_n / 2; k-- > 0;)
		heap_sift_down(k);
	atomic_fetch_sub(&n_held, n);
	pthread_cond_signal(&timer_cv);
	pthread_mutex_unlock(&timer_mu);
	return n;
}

/* ------------------------------------------------------------------ logging */

/* A copy of s[0..len) with every invalid UTF-8 sequence replaced by U+FFFD. */
static char *
utf8_sanitize(const char *s, size_t len, size_t *outlen)
{
	char	   *o = malloc(len * 3 + 1);
	size_t		j = 0;

	if (!o)
		return NULL;
	for (size_t i = 0; i < len;)
	{
		unsigned char c = (unsigned char) s[i];
		size_t		n = 0;
		uint32_t	cp = 0;

		if (c < 0x80)
		{
			o[j++] = (char) c;
			i++;
			continue;
		}
		else if ((c & 0xE0) == 0xC0)
			n = 2, cp = c & 0x1F;
		else if ((c & 0xF0) == 0xE0)
			n = 3, cp = c & 0x0F;
		else if ((c & 0xF8) == 0xF0)
			n = 4, cp = c & 0x07;
		bool		valid = n > 0 && i + n <= len;

		for (size_t k = 1; valid && k < n; k++)
		{
			unsigned char cc = (unsigned char) s[i + k];

			if ((cc & 0xC0) != 0x80)
				valid = false;
			else
				cp = (cp << 6) | (cc & 0x3F);
		}
		if (valid)
		{
			if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
				(n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
				(cp >= 0xD800 && cp <= 0xDFFF))
				valid = false;
		}
		if (valid)
		{
			memcpy(o + j, s + i, n);
			j += n;
			i += n;
		}
		else
		{
			o[j++] = (char) 0xEF;
			o[j++] = (char) 0xBF;
			o[j++] = (char) 0xBD;
			i++;
		}
	}
	o[j] = '\0';
	*outlen = j;
	return o;
}

static json_t *
json_string_any(const char *s, size_t len)
{
	json_t	   *j = json_stringn(s, len);

	if (!j)
	{
		size_t		l2;
		char	   *t = utf8_sanitize(s, len, &l2);

		if (t)
		{
			j = json_stringn(t, l2);
			free(t);
		}
	}
	return j ? j : json_string("");
}

static MHD_Result_t
collect_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
	json_t	   *h = cls;
	char		name[256];
	size_t		i;

	if (!key)
		return MHD_YES;
	for (i = 0; key[i] && i < sizeof(name) - 1; i++)
		name[i] = (char) tolower((unsigned char) key[i]);
	name[i] = '\0';
	if (!value)
		value = "";

	json_t	   *old = json_object_get(h, name);

	if (old && json_is_string(old))
	{
		const char *ov = json_string_value(old);
		size_t		l = strlen(ov) + 2 + strlen(value) + 1;
		char	   *buf = malloc(l);

		if (buf)
		{
			snprintf(buf, l, "%s, %s", ov, value);
			json_object_set_new(h, name, json_string_any(buf, strlen(buf)));
			free(buf);
		}
	}
	else
		json_object_set_new(h, name, json_string_any(value, strlen(value)));
	return MHD_YES;
}

static void
log_request(struct MHD_Connection *c, const char *method, const char *url, Req *r)
{
	json_t	   *o = json_object();
	json_t	   *h = json_object();

	MHD_get_connection_values(c, MHD_HEADER_KIND, collect_header, h);
	json_object_set_new(o, "t_us", json_integer(r->t_us));
	json_object_set_new(o, "method", json_string_any(method, strlen(method)));
	json_object_set_new(o, "path", json_string_any(url, strlen(url)));
	json_object_set_new(o, "headers", h);
	json_object_set_new(o, "body", r->too_large ? json_string("") :
						json_string_any(r->body ? r->body : "", r->len));
	json_object_set_new(o, "status", json_integer(r->status));
	if (r->cut)
		json_object_set_new(o, "cut", json_true());

	char	   *line = log_fp ? json_dumps(o, JSON_COMPACT) : NULL;

	pthread_mutex_lock(&log_mu);
	if (line)
	{
		fputs(line, log_fp);
		fputc('\n', log_fp);
		fflush(log_fp);
	}
	if (opt_print)
	{
		const char *mid = json_string_value(json_object_get(h, "x-message-id"));
		const char *cid = json_string_value(json_object_get(h, "x-correlation-id"));

		printf("sink: %s %s -> %d%s%s%s%s\n      %s\n", method, url, r->status,
			   mid ? "  x-message-id=" : "", mid ? mid : "",
			   cid ? "  x-correlation-id=" : "", cid ? cid : "",
			   json_string_value(json_object_get(o, "body")));
		fflush(stdout);
	}
	pthread_mutex_unlock(&log_mu);
	json_decref(o);
	free(line);
}

/* ------------------------------------------------------------------ handler */

static void
decide(struct MHD_Connection *c, Req *r)
{
	Fault		f;

	r->status = opt_status;
	r->delay_ms = opt_delay_ms;
	if (r->too_large)
	{
		r->status = HTTP_TOO_LARGE;
		return;
	}
	pthread_mutex_lock(&fault_mu);
	f = fault_now;
	pthread_mutex_unlock(&fault_mu);
	if (f.status != 0)
	{
		r->status = f.status;
		snprintf(r->retry_after, sizeof(r->retry_after), "%s", f.retry_after);
	}
	if (f.delay_ms >= 0)
		r->delay_ms = f.delay_ms;
	r->cut = f.cut;
	if (!r->body || r->len < 8 || !memmem(r->body, r->len, "\"_sink\"", 7))
		return;

	json_t	   *doc = json_loadb(r->body, r->len, 0, NULL);
	json_t	   *sk;

	if (doc && json_is_object(doc) && (sk = json_object_get(doc, "_sink")) && json_is_object(sk))
	{
		json_t	   *jf = json_object_get(sk, "fail");
		json_t	   *js = json_object_get(sk, "status");
		json_t	   *jd = json_object_get(sk, "delay_ms");
		json_t	   *jr = json_object_get(sk, "retry_after");
		json_t	   *jh = json_object_get(sk, "hold");
		const char *ra = json_is_string(jr) ? json_string_value(jr) : "";
		int			st = 500;
		long		delay = -1;

		for (const char *p = ra; *p != '\0'; p++)
			if ((unsigned char) *p < ' ' || *p == 0x7f)
				ra = "";

		if (json_is_integer(js))
		{
			json_int_t	v = json_integer_value(js);

			if (v >= 100 && v <= 599)
				st = (int) v;
		}
		if (json_is_integer(jd) && json_integer_value(jd) >= 0)
			delay = (long) json_integer_value(jd);
		r->held = json_is_true(jh);

		if (json_is_integer(jf))
		{
			const char *mid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Message-Id");
			long		n = fail_bump(mid ? mid : "");

			if (n <= (long) json_integer_value(jf))
			{
				r->status = st;
				snprintf(r->retry_after, sizeof(r->retry_after), "%s", ra);
				if (delay >= 0)
					r->delay_ms = delay;
			}
			else
			{
				r->status = 200;
				r->delay_ms = 0;
			}
		}
		else
		{
			if (js)
			{
				r->status = st;
				snprintf(r->retry_after, sizeof(r->retry_after), "%s", ra);
			}
			if (delay >= 0)
				r->delay_ms = delay;
		}
	}
	json_decref(doc);
}

/* answer_json: a fresh answer, with a Retry-After header when given one. */
static MHD_Result_t
answer_json(struct MHD_Connection *c, int status, const char *text, const char *retry_after)
{
	struct MHD_Response *resp =
		MHD_create_response_from_buffer(strlen(text), (void *) text, MHD_RESPMEM_MUST_COPY);
	MHD_Result_t ret;

	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	if (retry_after != NULL)
		MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry_after);
	ret = MHD_queue_response(c, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

/* answer_fault: POST /_sink/fault, the fault for every later request. */
static MHD_Result_t
answer_fault(struct MHD_Connection *c, Req *r)
{
	json_t	   *doc = json_loadb(r->body ? r->body : "{}", r->body ? r->len : 2, 0, NULL);
	Fault		f = {0, -1, false, ""};
	json_t	   *js,
			   *jd,
			   *jr;

	if (!doc || !json_is_object(doc))
	{
		json_decref(doc);
		return answer_json(c, 400, "{\"ok\":false,\"error\":\"expected a JSON object\"}", NULL);
	}
	js = json_object_get(doc, "status");
	jd = json_object_get(doc, "delay_ms");
	jr = json_object_get(doc, "retry_after");
	if (json_is_integer(js) && json_integer_value(js) >= 100 && json_integer_value(js) <= 599)
		f.status = (int) json_integer_value(js);
	if (json_is_integer(jd) && json_integer_value(jd) >= 0)
		f.delay_ms = (long) json_integer_value(jd);
	f.cut = json_is_true(json_object_get(doc, "cut"));
	if (json_is_string(jr))
	{
		snprintf(f.retry_after, sizeof(f.retry_after), "%s", json_string_value(jr));
		for (const char *p = f.retry_after; *p != '\0'; p++)
			if ((unsigned char) *p < ' ' || *p == 0x7f)
				f.retry_after[0] = '\0';
	}
	json_decref(doc);
	pthread_mutex_lock(&fault_mu);
	fault_now = f;
	pthread_mutex_unlock(&fault_mu);
	return answer_json(c, 200, "{\"ok\":true}", NULL);
}

/*
 * cut_reader: the body of a cut answer: its first half, then an error, which
 * makes MHD close the connection with the answer unfinished.
 */
static ssize_t
cut_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
	const char *text = cls;
	size_t		half = strlen(text) / 2;

	if (pos >= half || max == 0)
		return MHD_CONTENT_READER_END_WITH_ERROR;
	if (max > half - pos)
		max = half - pos;
	memcpy(buf, text + pos, max);
	return (ssize_t) max;
}

/* answer_cut: the head of an answer with status, half its body, then close. */
static MHD_Result_t
answer_cut(struct MHD_Connection *c, int status)
{
	const char *text = status >= 200 && status < 300 ? BODY_OK : BODY_FAIL;
	struct MHD_Response *resp =
		MHD_create_response_from_callback(strlen(text), 64, cut_reader, (void *) text, NULL);
	MHD_Result_t ret;

	if (!resp)
		return MHD_NO;
	MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	ret = MHD_queue_response(c, status, resp);
	MHD_destroy_response(resp);
	return ret;
}

static MHD_Result_t
answer_control(struct MHD_Connection *c, const char *method, const char *url, Req *r)
{
	char		buf[256];

	if (strcmp(url, "/_sink/stats") == 0 && strcmp(method, "GET") == 0)
	{
		snprintf(buf, sizeof(buf),
				 "{\"requests\":%lu,\"ok\":%lu,\"failed\":%lu,"
				 "\"aborted\":%lu,\"slow\":%lu,\"max_answer_ms\":%.3f,\"held\":%lu,"
				 "\"concurrent\":%ld,\"max_concurrent\":%ld}",
				 atomic_load(&n_requests), atomic_load(&n_ok), atomic_load(&n_failed),
				 atomic_load(&n_aborted), atomic_load(&n_slow),
				 atomic_load(&max_answer_us) / 1000.0, atomic_load(&n_held),
				 atomic_load(&n_open), atomic_load(&max_open));
		return answer_json(c, 200, buf, NULL);
	}
	if (strcmp(url, "/_sink/reset") == 0 && strcmp(method, "POST") == 0)
	{
		atomic_store(&n_requests, 0);
		atomic_store(&n_ok, 0);
		atomic_store(&n_failed, 0);
		atomic_store(&n_aborted, 0);
		atomic_store(&n_slow, 0);
		atomic_store(&max_answer_us, 0);
		atomic_store(&max_open, atomic_load(&n_open));
		fail_reset();
		return answer_json(c, 200, "{\"ok\":true}", NULL);
	}
	if (strcmp(url, "/_sink/release") == 0 && strcmp(method, "POST") == 0)
	{
		snprintf(buf, sizeof(buf), "{\"released\":%lu}", release_held());
		return answer_json(c, 200, buf, NULL);
	}
	if (strcmp(url, "/_sink/fault") == 0 && strcmp(method, "POST") == 0)
		return answer_fault(c, r);
	return answer_json(c, 404, "{\"ok\":false,\"error\":\"unknown control endpoint\"}", NULL);
}

static MHD_Result_t
handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
		const char *version, const char *upload_data, size_t *upload_data_size,
		void **con_cls)
{
	Req		   *r = *con_cls;

	if (!r)
	{
		r = calloc(1, sizeof(*r));
		if (!r)
			return MHD_NO;
		r->control = strncmp(url, "/_sink/", 7) == 0;
		*con_cls = r;

		/* A declared oversize body: answer 413 now, MHD skips the body. */
		const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
													 MHD_HTTP_HEADER_CONTENT_LENGTH);

		if (cl && strtoull(cl, NULL, 10) > MAX_BODY)
		{
			r->too_large = true;
			r->decided = true;
			r->status = HTTP_TOO_LARGE;
			r->t_us = real_us();
			atomic_fetch_add(&n_requests, 1);
			atomic_fetch_add(&n_failed, 1);
			if (log_fp || opt_print)
				log_request(c, method, url, r);
			return MHD_queue_response(c, HTTP_TOO_LARGE, resp_big);
		}
		return MHD_YES;
	}

	if (*upload_data_size > 0)
	{
		size_t		n = *upload_data_size;

		*upload_data_size = 0;
		if (r->too_large)
			return MHD_YES;
		if (r->len + n > MAX_BODY)
		{
			r->too_large = true;
			free(r->body);
			r->body = NULL;
			r->len = r->cap = 0;
			return MHD_YES;
		}
		if (r->len + n > r->cap)
		{
			size_t		nc = r->cap ? r->cap : 1024;

			while (nc < r->len + n)
				nc *= 2;
			if (nc > MAX_BODY)
				nc = MAX_BODY;
			char	   *nb = realloc(r->body, nc);

			if (!nb)
				return MHD_NO;
			r->body = nb;
			r->cap = nc;
		}
		memcpy(r->body + r->len, upload_data, n);
		r->len += n;
		return MHD_YES;
	}

	/* final call: the whole body is here (or we were resumed) */
	if (r->control)
		return answer_control(c, method, url, r);

	if (!r->decided)
	{
		long		open = atomic_fetch_add(&n_open, 1) + 1;
		long		most = atomic_load(&max_open);

		while (open > most && !atomic_compare_exchange_weak(&max_open, &most, open))
			;
		r->t_us = real_us();
		r->t_mono_ns = mono_ns();
		r->decided = true;
		decide(c, r);
		if (r->held)
			r->delay_ms = 0;
		if (r->delay_ms > 0 || r->held)
		{
			r->suspended = true;
			if (r->held)
				atomic_fetch_add(&n_held, 1);
			if (delay_connection(c, r->held ? -1 : r->delay_ms))
				return MHD_YES;
			if (r->held)
				atomic_fetch_sub(&n_held, 1);
			r->suspended = false;	/* shutting down: answer now */
		}
	}

	r->answered = true;
	atomic_fetch_sub(&n_open, 1);	/* its answer is queued now */
	atomic_fetch_add(&n_requests, 1);
	if (r->status >= 200 && r->status < 300)
		atomic_fetch_add(&n_ok, 1);
	else
		atomic_fetch_add(&n_failed, 1);
	if (log_fp || opt_print)
		log_request(c, method, url, r);

	struct MHD_Response *resp;

	if (r->cut)
		return answer_cut(c, r->status);
	if (r->retry_after[0] != '\0')		/* the scripted status with its header */
		return answer_json(c, r->status,
						   r->status >= 200 && r->status < 300 ? BODY_OK : BODY_FAIL,
						   r->retry_after);
	if (r->status == HTTP_TOO_LARGE && r->too_large)
		resp = resp_big;
	else if (r->status >= 200 && r->status < 300)
		resp = resp_ok;
	else
		resp = resp_fail;
	return MHD_queue_response(c, r->status, resp);
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls,
		  enum MHD_RequestTerminationCode toe)
{
	Req		   *r = *con_cls;

	/* received, never answered (the client went away while it waited) */
	if (r && r->decided && !r->answered && r->t_mono_ns)
		atomic_fetch_sub(&n_open, 1);
	if (r && r->answered && r->t_mono_ns && !r->held)
	{
		if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
			atomic_fetch_add(&n_aborted, 1);
		else
		{
			uint64_t	us = (mono_ns() - r->t_mono_ns) / 1000;
			uint64_t	delay_us = r->delay_ms > 0 ? (uint64_t) r->delay_ms * 1000 : 0;

			us = us > delay_us ? us - delay_us : 0;
			if (us > 1000000)
				atomic_fetch_add(&n_slow, 1);
			unsigned long cur = atomic_load(&max_answer_us);

			while (us > cur && !atomic_compare_exchange_weak(&max_answer_us, &cur, us))
				;
		}
	}
	if (r)
	{
		free(r->body);
		free(r);
		*con_cls = NULL;
	}
}

static void
mhd_log(void *cls, const char *fmt, va_list ap)
{
	if (opt_quiet)
		return;
	fputs("qb_sink: mhd: ", stderr);
	vfprintf(stderr, fmt, ap);
}

/* ------------------------------------------------------------------ main */

static void
usage(FILE *f)
{
	fprintf(f,
			"usage: qb_sink --port N [--bind 127.0.0.1] [--port-file F] [--log FILE]\n"
			"               [--status CODE] [--delay-ms MS] [--threads N] [--print] [--quiet]\n");
}

static long
parse_long(const char *s, const char *what, long lo, long hi)
{
	char	   *end;
	long		v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *s == '\0' || *end != '\0' || v < lo || v > hi)
	{
		fprintf(stderr, "qb_sink: %s: expected an integer from %ld to %ld, got \"%s\"\n",
				what, lo, hi, s);
		exit(2);
	}
	return v;
}

static int
write_port_file(const char *path, int port)
{
	size_t		l = strlen(path) + 32;
	char	   *tmp = malloc(l);
	FILE	   *f;

	if (!tmp)
		return -1;
	snprintf(tmp, l, "%s.tmp.%d", path, (int) getpid());
	f = fopen(tmp, "w");
	if (!f)
	{
		fprintf(stderr, "qb_sink: %s: %s\n", tmp, strerror(errno));
		free(tmp);
		return -1;
	}
	fprintf(f, "%d\n", port);
	if (fclose(f) != 0 || rename(tmp, path) != 0)
	{
		fprintf(stderr, "qb_sink: %s: %s\n", path, strerror(errno));
		unlink(tmp);
		free(tmp);
		return -1;
	}
	free(tmp);
	return 0;
}

int
main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"port", required_argument, NULL, 'p'},
		{"bind", required_argument, NULL, 'b'},
		{"port-file", required_argument, NULL, 'f'},
		{"log", required_argument, NULL, 'l'},
		{"status", required_argument, NULL, 's'},
		{"delay-ms", required_argument, NULL, 'd'},
		{"threads", required_argument, NULL, 't'},
		{"quiet", no_argument, NULL, 'q'},
		{"print", no_argument, NULL, 'P'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}
	};
	int			ch;

	while ((ch = getopt_long(argc, argv, "p:b:f:l:s:d:t:qPh", longopts, NULL)) != -1)
	{
		switch (ch)
		{
			case 'p':
				opt_port = (int) parse_long(optarg, "--port", 0, 65535);
				break;
			case 'b':
				opt_bind = optarg;
				break;
			case 'f':
				opt_port_file = optarg;
				break;
			case 'l':
				opt_log = optarg;
				break;
			case 's':
				opt_status = (int) parse_long(optarg, "--status", 100, 599);
				break;
			case 'd':
				opt_delay_ms = parse_long(optarg, "--delay-ms", 0, 3600000);
				break;
			case 't':
				opt_threads = (int) parse_long(optarg, "--threads", 1, 64);
				break;
			case 'q':
				opt_quiet = true;
				break;
			case 'P':
				opt_print = true;
				break;
			case 'h':
				usage(stdout);
				return 0;
			default:
				usage(stderr);
				return 2;
		}
	}
	if (opt_port < 0 || optind != argc)
	{
		usage(stderr);
		return 2;
	}

	struct sockaddr_in sa;

	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t) opt_port);
	if (inet_pton(AF_INET, opt_bind, &sa.sin_addr) != 1)
	{
		fprintf(stderr, "qb_sink: --bind: not an IPv4 address: \"%s\"\n", opt_bind);
		return 2;
	}

	if (opt_log)
	{
		log_fp = fopen(opt_log, "a");
		if (!log_fp)
		{
			fprintf(stderr, "qb_sink: %s: %s\n", opt_log, strerror(errno));
			return 1;
		}
	}

	resp_ok = MHD_create_response_from_buffer(sizeof(BODY_OK) - 1, (void *) BODY_OK,
											  MHD_RESPMEM_PERSISTENT);
	resp_fail = MHD_create_response_from_buffer(sizeof(BODY_FAIL) - 1, (void *) BODY_FAIL,
												MHD_RESPMEM_PERSISTENT);
	resp_big = MHD_create_response_from_buffer(sizeof(BODY_BIG) - 1, (void *) BODY_BIG,
											   MHD_RESPMEM_PERSISTENT);
	if (!resp_ok || !resp_fail || !resp_big)
	{
		fprintf(stderr, "qb_sink: out of memory\n");
		return 1;
	}
	MHD_add_response_header(resp_ok, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(resp_fail, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
	MHD_add_response_header(resp_big, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");

	/* Block the stop signals in every thread; main waits for them with sigwait. */
	sigset_t	stopset;

	sigemptyset(&stopset);
	sigaddset(&stopset, SIGTERM);
	sigaddset(&stopset, SIGINT);
	pthread_sigmask(SIG_BLOCK, &stopset, NULL);
	signal(SIGPIPE, SIG_IGN);

	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&timer_cv, &ca);
	pthread_condattr_destroy(&ca);

	/*
	 * No MHD_USE_TURBO: its "potentially unsafe optimizations" are not worth
	 * the doubt in a sink whose job is to be trusted by the tests.
	 * QB_SINK_TURBO=1 turns it on (for comparison only).
	 */
	unsigned int flags = MHD_USE_POLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME |
		MHD_USE_ERROR_LOG;

	if (getenv("QB_SINK_EPOLL") && strcmp(getenv("QB_SINK_EPOLL"), "1") == 0)
		flags = (flags & ~MHD_USE_POLL_INTERNAL_THREAD) | MHD_USE_EPOLL_INTERNAL_THREAD;

	if (getenv("QB_SINK_TURBO") && strcmp(getenv("QB_SINK_TURBO"), "1") == 0)
		flags |= MHD_USE_TURBO;
	struct MHD_Daemon *d;

	struct MHD_OptionItem opts[16];
	int			no = 0;

	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_SOCK_ADDR, 0, &sa};
	if (opt_threads > 1)
		opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_THREAD_POOL_SIZE, opt_threads, NULL};
	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_CONNECTION_LIMIT, 4096, NULL};
	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0, NULL};
	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_CONNECTION_TIMEOUT, 0, NULL};
	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_LISTEN_BACKLOG_SIZE, 1024, NULL};
	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_CONNECTION_MEMORY_LIMIT, 64 * 1024, NULL};
	opts[no++] = (struct MHD_OptionItem) {MHD_OPTION_END, 0, NULL};

	d = MHD_start_daemon(flags, (uint16_t) opt_port, NULL, NULL, handler, NULL,
						 MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
						 MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
						 MHD_OPTION_ARRAY, opts,
						 MHD_OPTION_END);
	if (!d)
	{
		fprintf(stderr, "qb_sink: cannot listen on %s:%d\n", opt_bind, opt_port);
		return 1;
	}

	const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
	int			port = info ? (int) info->port : opt_port;

	if (port == 0)
	{
		fprintf(stderr, "qb_sink: could not learn the bound port\n");
		MHD_stop_daemon(d);
		return 1;
	}

	if (pthread_create(&timer_thread, NULL, timer_main, NULL) != 0)
	{
		fprintf(stderr, "qb_sink: cannot start the timer thread\n");
		MHD_stop_daemon(d);
		return 1;
	}
	timer_started = true;

	if (opt_port_file && write_port_file(opt_port_file, port) != 0)
	{
		MHD_stop_daemon(d);
		return 1;
	}
	printf("listening %s:%d\n", opt_bind, port);
	fflush(stdout);

	int			sig = 0;

	sigwait(&stopset, &sig);

	/* release delayed answers, then stop */
	pthread_mutex_lock(&timer_mu);
	timer_stop = true;
	pthread_cond_signal(&timer_cv);
	pthread_mutex_unlock(&timer_mu);
	if (timer_started)
		pthread_join(timer_thread, NULL);
	MHD_stop_daemon(d);

	if (!opt_quiet)
		fprintf(stderr, "qb_sink: signal %d, exiting: requests=%lu ok=%lu failed=%lu\n",
				sig, atomic_load(&n_requests), atomic_load(&n_ok), atomic_load(&n_failed));
	MHD_destroy_response(resp_ok);
	MHD_destroy_response(resp_fail);
	MHD_destroy_response(resp_big);
	if (log_fp)
		fclose(log_fp);
	fail_reset();
	free(fail_buckets);
	free(heap);
	return 0;
}
