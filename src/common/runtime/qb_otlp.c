/*-------------------------------------------------------------------------
 * qb_otlp.c
 *	  The OTLP/HTTP span exporter: a bounded queue and one thread.
 *
 * See qb_otlp.h for the vocabulary and the concurrency rules.  The body of
 * a post is the OTLP JSON encoding (opentelemetry-proto's JSON mapping:
 * trace and span ids in hex, 64-bit times as decimal strings, enums as
 * numbers) of one ExportTraceServiceRequest: one resource, one scope, the
 * batch's spans.  A post that fails (no connection, a status other than
 * 2xx) drops its spans, counted: the exporter keeps no backlog that could
 * grow while the receiver is away, and never retries at delivery's
 * expense.
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE				/* pthread_timedjoin_np */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/rand.h>

#include "qb_clock.h"
#include "qb_crypto.h"
#include "qb_errlen.h"
#include "qb_otlp.h"

typedef struct QbOtlp
{
	pthread_t	thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;			/* spans queued, or stop */
	char	  **queue;			/* rendered spans, a ring */
	char	  **batch;			/* the thread's: one post's spans */
	int			head;
	int			n;
	int			stop;			/* 1: flush until stop_at, 2: at once (atomic
								 * reads outside mu: the progress callback) */
	int64_t		stop_at_ns;
	char		error[QB_ERRLEN];		/* the last failure not taken (under mu) */
	bool		error_new;
	/* read only, after the start */
	QbOtlpOptions o;			/* deep copy */
	char	   *fingerprint;	/* the options, as text, to compare */
	char	   *resource;		/* the JSON before the spans */
	QbEgress   *egress;			/* a copy of the rules at start */
	QbMetrics  *m;
} QbOtlp;

int64_t
qb_otlp_now_ns(void)
{
	return qb_wall_ns();
}

bool
qb_otlp_on(const QbOtlpExporter *ex)
{
	return ex != NULL && ex->running != NULL;
}

/* ---- spans ------------------------------------------------------------ */

bool
qb_span_start(QbSpan *s, const char *name, QbSpanKind kind, const QbTraceContext *parent)
{
	memset(s, 0, sizeof(*s));
	s->name = name;
	s->kind = kind;
	s->start_ns = qb_otlp_now_ns();
	if (parent != NULL)
	{
		/* parent-based sampling: a parent not sampled exports nothing */
		if ((parent->flags & 1) == 0)
			return false;
		if (!qb_trace_child(parent, &s->ctx))
			return false;
		memcpy(s->parent_id, parent->span_id, sizeof(s->parent_id));
		s->has_parent = true;
		return true;
	}
	/* a new trace, sampled: its root */
	if (RAND_bytes(s->ctx.trace_id, sizeof(s->ctx.trace_id)) != 1 ||
		RAND_bytes(s->ctx.span_id, sizeof(s->ctx.span_id)) != 1)
		return false;
	s->ctx.flags = 1;
	return true;
}

bool
qb_span_start_tp(QbSpan *s, const char *name, QbSpanKind kind, const char *traceparent,
				 const char *tracestate)
{
	QbTraceContext parent;

	if (!qb_span_start(s, name, kind,
					   traceparent != NULL && qb_trace_parse(traceparent, &parent) ? &parent : NULL))
		return false;
	qb_span_tracestate(s, tracestate);
	return true;
}

void
qb_span_tracestate(QbSpan *s, const char *tracestate)
{
	if (s->has_parent && tracestate != NULL && tracestate[0] != '\0' && qb_tracestate_ok(tracestate))
		s->trace_state = tracestate;
}

void
qb_span_str(QbSpan *s, const char *key, const char *value)
{
	if (s->nattrs < QB_SPAN_MAX_ATTRS && value != NULL)
		s->attrs[s->nattrs++] = (QbSpanAttr) {.key = key, .str = value};
}

void
qb_span_int(QbSpan *s, const char *key, long long value)
{
	if (s->nattrs < QB_SPAN_MAX_ATTRS)
		s->attrs[s->nattrs++] = (QbSpanAttr) {.key = key, .num = value};
}

/* qbot_span_json: the span as OTLP JSON (malloc'd), or NULL */
static char *
qbot_span_json(const QbSpan *s)
{
	char		trace[33],
				span[17],
				parent[17],
				t0[24],
				t1[24];
	json_t	   *attrs = json_array();
	json_t	   *j;
	char	   *out;

	qb_hex_encode(s->ctx.trace_id, 16, trace);
	qb_hex_encode(s->ctx.span_id, 8, span);
	qb_hex_encode(s->parent_id, 8, parent);
	snprintf(t0, sizeof(t0), "%lld", (long long) s->start_ns);
	snprintf(t1, sizeof(t1), "%lld", (long long) s->end_ns);
	for (int i = 0; attrs != NULL && i < s->nattrs; i++)
	{
		char		num[24];

		snprintf(num, sizeof(num), "%lld", s->attrs[i].num);
		json_array_append_new(attrs, s->attrs[i].str != NULL ?
							  json_pack("{s:s, s:{s:s}}", "key", s->attrs[i].key,
										"value", "stringValue", s->attrs[i].str) :
							  json_pack("{s:s, s:{s:s}}", "key", s->attrs[i].key,
										"value", "intValue", num));
	}
	j = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:o, s:{s:i}}",
				  "traceId", trace, "spanId", span, "name", s->name, "kind", (int) s->kind,
				  "startTimeUnixNano", t0, "endTimeUnixNano", t1,
				  "attributes", attrs ? attrs : json_array(),
				  "status", "code", s->error ? 2 : 1);
	if (j == NULL)
		return NULL;
	if (s->has_parent)
		json_object_set_new(j, "parentSpanId", json_string(parent));
	if (s->trace_state != NULL)
		json_object_set_new(j, "traceState", json_string(s->trace_state));
	if (s->message != NULL)
		json_object_set_new(json_object_get(j, "status"), "message",
							json_stringn_nocheck(s->message, strnlen(s->message, 512)));
	out = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	return out;
}

void
qb_otlp_emit(QbOtlpExporter *ex, QbSpan *s)
{
	QbOtlp	   *x = ex != NULL ? ex->running : NULL;
	char	   *js;
	bool		queued = false;

	if (x == NULL)
		return;
	if (s->end_ns == 0)
		s->end_ns = qb_otlp_now_ns();
	if ((js = qbot_span_json(s)) == NULL)
	{
		qb_metrics_add(&x->m->otlp_dropped, 1);
		return;
	}
	pthread_mutex_lock(&x->mu);
	if (x->n < x->o.queue_size && !x->stop)
	{
		x->queue[(x->head + x->n++) % x->o.queue_size] = js;
		queued = true;
		if (x->n >= x->o.batch_size)
			pthread_cond_signal(&x->cv);
	}
	pthread_mutex_unlock(&x->mu);
	if (!queued)
	{
		free(js);
		qb_metrics_add(&x->m->otlp_dropped, 1);
	}
}

void
qb_otlp_receipt(QbOtlpExporter *ex, const QbReceipt *r)
{
	QbSpan		span;
	char		name[160];

	if (!qb_otlp_on(ex))
		return;
	snprintf(name, sizeof(name), "receive %s", r->source);
	if (!qb_span_start_tp(&span, name, r->kind, r->traceparent, r->tracestate))
		return;
	span.start_ns = r->start_ns;
	qb_span_str(&span, "queuebox.source", r->source);
	qb_span_str(&span, "queuebox.result", qb_receive_result_name(r->result));
	if (r->http_status > 0)
	{
		qb_span_int(&span, "http.response.status_code", r->http_status);
		qb_span_str(&span, "http.request.method", "POST");
	}
	if (r->key != NULL)
		qb_span_str(&span, "messaging.message.id", r->key);
	if (r->inbox_id > 0)
		qb_span_int(&span, "queuebox.inbox.id", r->inbox_id);
	span.error = r->http_status >= 500;
	qb_otlp_emit(ex, &span);
}

bool
qb_otlp_take_error(QbOtlpExporter *ex, char *buf, size_t len)
{
	QbOtlp	   *x = ex != NULL ? ex->running : NULL;
	bool		had;

	if (x == NULL)
		return false;
	pthread_mutex_lock(&x->mu);
	had = x->error_new;
	if (had)
		snprintf(buf, len, "%s", x->error);
	x->error_new = false;
	pthread_mutex_unlock(&x->mu);
	return had;
}

/* ---- the thread --------------------------------------------------------- */

typedef struct QbotPost
{
	QbOtlp	   *x;
	char		refused[QB_ERRLEN];	/* an egress refusal, for the error */
} QbotPost;

/* the egress rules judge each address the post connects to (as deliveries') */
static curl_socket_t
qbot_open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a)
{
	QbotPost   *p = arg;
	const QbEgress *e = qb_egress_in_force(p->x->egress, p->x->o.host_egress);

	if (purpose == CURLSOCKTYPE_IPCXN &&
		!qb_egress_addr_ok(e, p->x->o.url, &a->addr, p->refused, sizeof(p->refused)))
		return CURL_SOCKET_BAD;
	return socket(a->family, a->socktype, a->protocol);
}

/* a stop at once cuts a post short */
static int
qbot_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	QbotPost   *p = arg;

	return __atomic_load_n(&p->x->stop, __ATOMIC_RELAXED) == 2 ? 1 : 0;
}

static size_t
qbot_discard(char *ptr, size_t size, size_t n, void *arg)
{
	return size * n;
}

static void
qbot_fail(QbOtlp *x, const char *fmt,...) __attribute__((format(printf, 2, 3)));

static void
qbot_fail(QbOtlp *x, const char *fmt,...)
{
	va_list		ap;

	pthread_mutex_lock(&x->mu);
	va_start(ap, fmt);
	vsnprintf(x->error, sizeof(x->error), fmt, ap);
	va_end(ap);
	x->error_new = true;
	pthread_mutex_unlock(&x->mu);
}

/* qbot_post: one batch; its spans are counted exported or dropped */
static void
qbot_post(QbOtlp *x, char **spans, int n)
{
	static const char tail[] = "]}]}]}";
	size_t		len = strlen(x->resource) + sizeof(tail);
	char	   *body;
	char	   *p;
	CURL	   *c;
	struct curl_slist *h = NULL;
	QbotPost	post = {.x = x};
	CURLcode	rc;
	long		status = 0;
	char		errbuf[CURL_ERROR_SIZE] = "";

	for (int i = 0; i < n; i++)
		len += strlen(spans[i]) + 1;
	if ((body = malloc(len)) == NULL || (c = curl_easy_init()) == NULL)
	{
		free(body);
		qb_metrics_add(&x->m->otlp_dropped, n);
		qbot_fail(x, "out of memory");
		return;
	}
	p = body + sprintf(body, "%s", x->resource);
	for (int i = 0; i < n; i++)
		p += sprintf(p, "%s%s", i ? "," : "", spans[i]);
	strcpy(p, tail);

	h = curl_slist_append(h, "Content-Type: application/json");
	for (int i = 0; i < x->o.nheaders; i++)
	{
		char	   *line = NULL;

		/* a header of any length (a long API token): its own allocation */
		if (asprintf(&line, "%s: %s", x->o.headers[i].name, x->o.headers[i].value) >= 0)
		{
			h = curl_slist_append(h, line);
			free(line);
		}
	}
	curl_easy_setopt(c, CURLOPT_URL, x->o.url);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
	curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long) strlen(body));
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, x->o.timeout_ms);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
	curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, qbot_discard);
	curl_easy_setopt(c, CURLOPT_OPENSOCKETFUNCTION, qbot_open_socket);
	curl_easy_setopt(c, CURLOPT_OPENSOCKETDATA, &post);
	curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, qbot_progress);
	curl_easy_setopt(c, CURLOPT_XFERINFODATA, &post);
	curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
	rc = curl_easy_perform(c);
	curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
	if (rc == CURLE_OK && status >= 200 && status < 300)
		qb_metrics_add(&x->m->otlp_exported, n);
	else
	{
		qb_metrics_add(&x->m->otlp_dropped, n);
		if (rc != CURLE_OK)
			qbot_fail(x, "POST %s failed: %s; %d spans dropped", x->o.url,
					  post.refused[0] ? post.refused : errbuf[0] ? errbuf : curl_easy_strerror(rc), n);
		else
			qbot_fail(x, "POST %s answered HTTP %ld; %d spans dropped", x->o.url, status, n);
	}
	curl_slist_free_all(h);
	curl_easy_cleanup(c);
	free(body);
}

static void *
qbot_main(void *arg)
{
	QbOtlp	   *x = arg;
	char	  **batch = x->batch;

	pthread_mutex_lock(&x->mu);
	for (;;)
	{
		int			k = 0;

		if (x->stop == 2 || (x->stop == 1 && (x->n == 0 || qb_otlp_now_ns() >= x->stop_at_ns)))
			break;
		if (x->n < x->o.batch_size && !x->stop)
		{
			struct timespec until;

			clock_gettime(CLOCK_REALTIME, &until);
			until.tv_sec += x->o.flush_interval_ms / 1000;
			until.tv_nsec += (x->o.flush_interval_ms % 1000) * 1000000;
			if (until.tv_nsec >= 1000000000)
			{
				until.tv_sec++;
				until.tv_nsec -= 1000000000;
			}
			/* a full batch, a stop, or the interval */
			while (x->n < x->o.batch_size && !x->stop &&
				   pthread_cond_timedwait(&x->cv, &x->mu, &until) != ETIMEDOUT)
				;
		}
		while (k < x->o.batch_size && x->n > 0)
		{
			batch[k++] = x->queue[x->head];
			x->head = (x->head + 1) % x->o.queue_size;
			x->n--;
		}
		if (k == 0)
			continue;
		pthread_mutex_unlock(&x->mu);
		qbot_post(x, batch, k);
		for (int i = 0; i < k; i++)
			free(batch[i]);
		pthread_mutex_lock(&x->mu);
	}
	pthread_mutex_unlock(&x->mu);
	return NULL;
}

/* ---- start and stop ----------------------------------------------------- */

static void
qbot_free(QbOtlp *x)
{
	if (x == NULL)
		return;
	for (int i = 0; x->queue != NULL && i < x->n; i++)
		free(x->queue[(x->head + i) % x->o.queue_size]);
	if (x->m != NULL && x->n > 0)
		qb_metrics_add(&x->m->otlp_dropped, x->n);
	free(x->queue);
	free(x->batch);
	for (int i = 0; x->o.headers != NULL && i < x->o.nheaders; i++)
	{
		free(x->o.headers[i].name);
		free(x->o.headers[i].value);
	}
	free(x->o.headers);
	free(x->o.url);
	free(x->o.service_name);
	free(x->fingerprint);
	free(x->resource);
	qb_egress_free(x->egress);
	pthread_mutex_destroy(&x->mu);
	pthread_cond_destroy(&x->cv);
	free(x);
}

/* qbot_fingerprint: the options as text (malloc'd), to tell a change */
static char *
qbot_fingerprint(const QbOtlpOptions *o)
{
	json_t	   *j = json_pack("{s:s, s:s, s:I, s:i, s:i, s:I, s:s?}", "url", o->url,
							  "service", o->service_name ? o->service_name : "",
							  "timeout", (json_int_t) o->timeout_ms, "queue", o->queue_size,
							  "batch", o->batch_size, "interval", (json_int_t) o->flush_interval_ms,
							  "egress", o->egress ? o->egress->list : NULL);
	json_t	   *hs = json_array();
	char	   *out;

	for (int i = 0; i < o->nheaders; i++)
		json_array_append_new(hs, json_pack("[s, s]", o->headers[i].name, o->headers[i].value));
	json_object_set_new(j, "headers", hs);
	out = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(j);
	return out;
}

/* qbot_stop: the running exporter posts for up to flush_ms, then is gone */
static void
qbot_stop(QbOtlpExporter *ex, long flush_ms)
{
	QbOtlp	   *x = ex->running;

	if (x == NULL)
		return;
	ex->running = NULL;
	pthread_mutex_lock(&x->mu);
	__atomic_store_n(&x->stop, flush_ms > 0 ? 1 : 2, __ATOMIC_RELAXED);
	x->stop_at_ns = qb_otlp_now_ns() + (int64_t) flush_ms * 1000000;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->mu);
	if (flush_ms > 0)
	{
		struct timespec until;

		/* past the flush, the post in flight is cut */
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += flush_ms / 1000 + 1;
		if (pthread_timedjoin_np(x->thread, NULL, &until) == 0)
		{
			qbot_free(x);
			return;
		}
		__atomic_store_n(&x->stop, 2, __ATOMIC_RELAXED);
	}
	/* stop == 2: a post in flight ends at its next progress callback */
	pthread_join(x->thread, NULL);
	qbot_free(x);
}

static void
qbot_at_exit(int status, void *arg)
{
	/* before OpenSSL's own exit handlers (registered earlier, run later) */
	qbot_stop(arg, 0);
}

/* qbot_copy: x's deep copy of o (NULL fields: out of memory) */
static void
qbot_copy(QbOtlp *x, const QbOtlpOptions *o)
{
	x->o = *o;
	x->o.url = strdup(o->url);
	x->o.service_name = strdup(o->service_name ? o->service_name : "queuebox");
	x->o.headers = o->nheaders > 0 ? calloc(o->nheaders, sizeof(QbOtlpHeader)) : NULL;
	for (int i = 0; x->o.headers != NULL && i < o->nheaders; i++)
	{
		x->o.headers[i].name = strdup(o->headers[i].name);
		x->o.headers[i].value = strdup(o->headers[i].value);
	}
	x->o.egress = NULL;
	x->egress = o->egress != NULL ? qb_egress_copy(o->egress) : NULL;
	x->queue = calloc(o->queue_size, sizeof(char *));
	x->batch = calloc(o->batch_size, sizeof(char *));
}

/*
 * qbot_resource: the JSON every post begins with, the resource (service
 * name, instance, version) and the scope, up to the spans; NULL: out of
 * memory.  instance NULL: this process, among the replicas and workers,
 * as host:pid.
 */
static char *
qbot_resource(const char *service_name, const char *instance)
{
	char		inst[320];
	json_t	   *res;
	char	   *rs;
	char	   *out = NULL;

	if (instance == NULL)
	{
		char		host[256] = "";

		gethostname(host, sizeof(host) - 1);
		snprintf(inst, sizeof(inst), "%s:%d", host, (int) getpid());
		instance = inst;
	}
	res = json_pack("{s:[{s:s, s:{s:s}}, {s:s, s:{s:s}}, {s:s, s:{s:s}}]}", "attributes",
					"key", "service.name", "value", "stringValue", service_name ? service_name : "queuebox",
					"key", "service.instance.id", "value", "stringValue", instance,
					"key", "service.version", "value", "stringValue", QB_VERSION);
	rs = res ? json_dumps(res, JSON_COMPACT) : NULL;
	json_decref(res);
	if (rs != NULL && (out = malloc(strlen(rs) + 128)) != NULL)
		sprintf(out, "{\"resourceSpans\":[{\"resource\":%s,\"scopeSpans\":[{\"scope\":"
				"{\"name\":\"queuebox\",\"version\":\"%s\"},\"spans\":[", rs, QB_VERSION);
	free(rs);
	return out;
}

/* qbot_start: x's thread, which takes no signal: the process's handlers run on its main thread */
static int
qbot_start(QbOtlp *x)
{
	sigset_t	all,
				old;
	int			rc;

	curl_global_init(CURL_GLOBAL_DEFAULT);
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&x->thread, NULL, qbot_main, x);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return rc;
}

bool
qb_otlp_configure(QbOtlpExporter *ex, const QbOtlpOptions *o, QbMetrics *m, const char *instance,
				  char *err, size_t errlen)
{
	static QbMetrics none;		/* a host that keeps no metrics */
	QbOtlp	   *x;
	char	   *fp;
	int			rc;

	if (o == NULL || o->url == NULL)
	{
		qbot_stop(ex, 0);
		return true;
	}
	if ((fp = qbot_fingerprint(o)) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		return false;
	}
	if (ex->running != NULL && strcmp(ex->running->fingerprint, fp) == 0)
	{
		free(fp);
		return true;
	}
	qbot_stop(ex, 0);
	if ((x = calloc(1, sizeof(QbOtlp))) == NULL)
	{
		free(fp);
		snprintf(err, errlen, "out of memory");
		return false;
	}
	pthread_mutex_init(&x->mu, NULL);
	pthread_cond_init(&x->cv, NULL);
	x->fingerprint = fp;
	x->m = m != NULL ? m : &none;
	qbot_copy(x, o);
	x->resource = qbot_resource(x->o.service_name, instance);
	if (x->o.url == NULL || x->o.service_name == NULL || x->queue == NULL || x->batch == NULL ||
		x->resource == NULL ||
		(o->nheaders > 0 && x->o.headers == NULL) || (o->egress != NULL && x->egress == NULL))
	{
		qbot_free(x);
		snprintf(err, errlen, "out of memory");
		return false;
	}
	if ((rc = qbot_start(x)) != 0)
	{
		qbot_free(x);
		snprintf(err, errlen, "could not start the span exporter's thread: %s", strerror(rc));
		return false;
	}
	/* ex outlives the process's exit handlers (qb_otlp.h) */
	if (!ex->exit_hooked)
		ex->exit_hooked = on_exit(qbot_at_exit, ex) == 0;
	ex->running = x;
	return true;
}

void
qb_otlp_shutdown(QbOtlpExporter *ex, long flush_ms)
{
	if (ex != NULL)
		qbot_stop(ex, flush_ms);
}
