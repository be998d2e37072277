/*-------------------------------------------------------------------------
 * qb_metrics.c
 *	  Shared counters and the Prometheus text exposition.
 *
 * See qb_metrics.h for the vocabulary and the concurrency rules.  The
 * histogram keeps one count per bucket (not cumulative) so that an
 * observation is a single atomic add; the renderer accumulates.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "qb_clock.h"
#include "qb_crypto.h"
#include "qb_limits.h"
#include "qb_metrics.h"

static const double qbm_bounds[QB_METRICS_NBUCKETS] =
{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};

static const char *const qbm_results[QB_NRESULTS] =
{"accepted", "duplicate", "bad_request", "unauthorized", "too_large", "unprocessable",
"unavailable"};

void
qb_metrics_init(QbMetrics *m)
{
	memset(m, 0, sizeof(QbMetrics));
}

void
qb_metrics_add(uint64_t *counter, uint64_t n)
{
	__atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/*
 * qbm_slot: the slot counting for name: an existing one, else a free one
 * taken now, else "_other" (the last slot, kept for overflow).
 */
static QbMetricSlot *
qbm_slot(QbMetricSlot *slots, const char *name)
{
	QbMetricSlot *other = &slots[QB_METRICS_SLOTS - 1];
	int			i;

	for (i = 0; i < QB_METRICS_SLOTS - 1; i++)
	{
		QbMetricSlot *s = &slots[i];
		uint32_t	state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);

		if (state == QB_SLOT_IN_USE && strncmp(s->name, name, QB_METRICS_NAMELEN - 1) == 0)
			return s;
		if (state == QB_SLOT_FREE)
		{
			uint32_t	expect = QB_SLOT_FREE;

			if (!__atomic_compare_exchange_n(&s->state, &expect, QB_SLOT_NAMING, false,
											 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
				continue;		/* taken under us: look at it again next time */
			snprintf(s->name, sizeof(s->name), "%s", name);
			__atomic_store_n(&s->state, QB_SLOT_IN_USE, __ATOMIC_RELEASE);
			return s;
		}
	}
	if (__atomic_load_n(&other->state, __ATOMIC_ACQUIRE) != QB_SLOT_IN_USE)
	{
		uint32_t	expect = QB_SLOT_FREE;

		if (__atomic_compare_exchange_n(&other->state, &expect, QB_SLOT_NAMING, false,
										__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		{
			snprintf(other->name, sizeof(other->name), "_other");
			__atomic_store_n(&other->state, QB_SLOT_IN_USE, __ATOMIC_RELEASE);
		}
	}
	return other;
}

/* ---- worker slots ---------------------------------------------------- */

/* qbm_wall_ms: the wall clock, ms since the epoch (the overview shows times) */
static int64_t
qbm_wall_ms(void)
{
	return qb_wall_ms();
}

/* ---- the configuration's last load ------------------------------------ */

static void
qbm_config_lock(QbConfigLoad *c)
{
	while (__atomic_exchange_n(&c->lock, 1, __ATOMIC_ACQUIRE) != 0)
		;
}

static void
qbm_config_unlock(QbConfigLoad *c)
{
	__atomic_store_n(&c->lock, 0, __ATOMIC_RELEASE);
}

/* qb_config_load_note: see qb_metrics.h. */
void
qb_config_load_note(QbMetrics *m, QbConfigSource source, const char *path,
					bool ok, const char *text, size_t len, const char *error)
{
	char		sha[QB_HMAC_HEX_LEN + 1] = "";
	QbConfigLoad *c;

	if (m == NULL)
		return;
	c = &m->config;
	/* the digest before the lock: the lock is held only to copy */
	if (text != NULL)
		qb_sha256_hex(text, len, sha);
	qbm_config_lock(c);
	if (ok)
	{
		c->source = (uint32_t) source;
		snprintf(c->path, sizeof(c->path), "%s", path ? path : "");
		memcpy(c->sha256, sha, sizeof(c->sha256));
		c->loaded_at_ms = qbm_wall_ms();
		c->loads++;
		c->last_failed = 0;
	}
	else if (!c->last_failed || strcmp(c->failed_sha256, sha) != 0 ||
			 strncmp(c->error, error ? error : "", sizeof(c->error) - 1) != 0)
	{
		/* a new failure: not the one in the record, noted by another worker */
		c->failed_at_ms = qbm_wall_ms();
		c->failures++;
		c->last_failed = 1;
		snprintf(c->error, sizeof(c->error), "%s", error ? error : "");
		memcpy(c->failed_sha256, sha, sizeof(c->failed_sha256));
	}
	qbm_config_unlock(c);
}

/* qb_config_load_read: see qb_metrics.h. */
void
qb_config_load_read(const QbMetrics *m, QbConfigLoad *out)
{
	QbConfigLoad *c;

	memset(out, 0, sizeof(*out));
	if (m == NULL)
		return;
	/* the lock is taken to read too: a reader must not see half a write */
	c = (QbConfigLoad *) &m->config;
	qbm_config_lock(c);
	*out = *c;
	qbm_config_unlock(c);
	out->lock = 0;
}

const char *
qb_receive_result_name(QbReceiveResult r)
{
	return r >= 0 && r < QB_NRESULTS ? qbm_results[r] : "unknown";
}

const char *
qb_config_source_name(QbConfigSource s)
{
	return s == QB_CONFIG_SOURCE_FILE ? "file" : s == QB_CONFIG_SOURCE_TABLE ? "table" : "none";
}

/* qb_metrics_worker: see qb_metrics.h. */
QbActivitySlot *
qb_metrics_worker(QbMetrics *m, const char *name, int pid)
{
	QbActivitySlot *w = NULL;

	for (int pass = 0; m != NULL && pass < 2 && w == NULL; pass++)
		for (int i = 0; i < QB_METRICS_WORKERS && w == NULL; i++)
		{
			QbActivitySlot *s = &m->workers[i];
			uint32_t	state = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
			uint32_t	expect = QB_SLOT_FREE;

			/* the first pass finds the name's slot, the second takes a free one */
			if (pass == 0 && state == QB_SLOT_IN_USE && strncmp(s->name, name, QB_METRICS_WORKERLEN - 1) == 0)
				w = s;
			else if (pass == 1 && state == QB_SLOT_FREE &&
					 __atomic_compare_exchange_n(&s->state, &expect, QB_SLOT_NAMING, false,
												 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			{
				snprintf(s->name, sizeof(s->name), "%s", name);
				__atomic_store_n(&s->state, QB_SLOT_IN_USE, __ATOMIC_RELEASE);
				w = s;
			}
		}
	if (w == NULL)
		return NULL;
	__atomic_store_n(&w->pid, pid, __ATOMIC_RELAXED);
	__atomic_store_n(&w->cycles, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&w->last_cycle_ms, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&w->since_ms, qbm_wall_ms(), __ATOMIC_RELAXED);
	__atomic_store_n(&w->activity, QB_W_STARTING, __ATOMIC_RELAXED);
	return w;
}

/* qb_worker_set: see qb_metrics.h. */
void
qb_worker_set(QbActivitySlot *w, QbWorkerActivity a)
{
	if (w == NULL || __atomic_load_n(&w->activity, __ATOMIC_RELAXED) == (uint32_t) a)
		return;
	__atomic_store_n(&w->since_ms, qbm_wall_ms(), __ATOMIC_RELAXED);
	__atomic_store_n(&w->activity, a, __ATOMIC_RELAXED);
}

/* qb_worker_cycle: see qb_metrics.h. */
void
qb_worker_cycle(QbActivitySlot *w)
{
	if (w == NULL)
		return;
	__atomic_store_n(&w->last_cycle_ms, qbm_wall_ms(), __ATOMIC_RELAXED);
	__atomic_add_fetch(&w->cycles, 1, __ATOMIC_RELAXED);
}

/* qb_worker_activity_name: see qb_metrics.h. */
const char *
qb_worker_activity_name(QbWorkerActivity a)
{
	static const char *const names[QB_W_NACTIVITIES] = {
		[QB_W_STARTING] = "starting",
		[QB_W_IDLE] = "idle",
		[QB_W_CLAIMING] = "claiming",
		[QB_W_DELIVERING] = "delivering",
		[QB_W_STORING] = "storing",
		[QB_W_SERVING] = "serving",
		[QB_W_BACKING_OFF] = "backing off",
		[QB_W_STOPPED] = "stopped",
	};

	return (unsigned) a < QB_W_NACTIVITIES ? names[a] : "unknown";
}

void
qb_metrics_delivery(QbMetrics *m, const char *destination, QbDeliveryOutcome outcome,
					double latency_sec)
{
	QbMetricSlot *s;
	int			b;

	if (m == NULL)
		return;
	s = qbm_slot(m->destinations, destination ? destination : "_none");
	qb_metrics_add(&s->count[outcome], 1);
	if (outcome != QB_DELIVERED || latency_sec < 0)
		return;
	for (b = 0; b < QB_METRICS_NBUCKETS && latency_sec > qbm_bounds[b]; b++)
		;
	qb_metrics_add(&s->bucket[b], 1);
	qb_metrics_add(&s->latency_sum_us, (uint64_t) (latency_sec * 1e6));
}

void
qb_metrics_received(QbMetrics *m, const char *source, QbReceiveResult result)
{
	if (m == NULL)
		return;
	qb_metrics_add(&qbm_slot(m->sources, source)->count[result], 1);
}

/* ---- rendering ------------------------------------------------------ */

typedef struct QbmBuf
{
	char	   *data;
	size_t		len;
	size_t		cap;
	bool		oom;
} QbmBuf;

static void
qbm_printf(QbmBuf *b, const char *fmt,...)
__attribute__((format(printf, 2, 3)));

static void
qbm_printf(QbmBuf *b, const char *fmt,...)
{
	va_list		ap;
	int			n;

	if (b->oom)
		return;
	for (;;)
	{
		va_start(ap, fmt);
		n = vsnprintf(b->data + b->len, b->cap - b->len, fmt, ap);
		va_end(ap);
		if (n >= 0 && (size_t) n < b->cap - b->len)
		{
			b->len += n;
			return;
		}
		{
			size_t		cap = b->cap * 2 + (n > 0 ? n : 0);
			char	   *d = realloc(b->data, cap);

			if (d == NULL)
			{
				b->oom = true;
				return;
			}
			b->data = d;
			b->cap = cap;
		}
	}
}

/* qb_metrics_counts: see qb_metrics.h. */
void
qb_metrics_counts(const QbMetrics *m, bool sources, const char *name, uint64_t count[QB_NRESULTS])
{
	const QbMetricSlot *slots;

	memset(count, 0, sizeof(uint64_t) * QB_NRESULTS);
	if (m == NULL)
		return;
	slots = sources ? m->sources : m->destinations;
	for (int i = 0; i < QB_METRICS_SLOTS; i++)
	{
		const QbMetricSlot *s = &slots[i];

		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != QB_SLOT_IN_USE ||
			strncmp(s->name, name, QB_METRICS_NAMELEN - 1) != 0)
			continue;
		for (int k = 0; k < QB_NRESULTS; k++)
			count[k] += __atomic_load_n(&s->count[k], __ATOMIC_RELAXED);
	}
}

/* A snapshot of the slots summed by name (two slots may share one). */
typedef struct QbmRow
{
	char		name[QB_METRICS_NAMELEN];
	uint64_t	count[QB_NRESULTS];
	uint64_t	bucket[QB_METRICS_NBUCKETS + 1];
	uint64_t	latency_sum_us;
} QbmRow;

/* QueueBox's own buckets: rendered though no configuration names them */
static const char *const qbm_own[] = {"_unrouted", "_other", "_none", NULL};

/* qbm_row: the row of name, or NULL. */
static QbmRow *
qbm_row(QbmRow *rows, int n, const char *name)
{
	for (int j = 0; j < n; j++)
		if (strncmp(rows[j].name, name, QB_METRICS_NAMELEN - 1) == 0)
			return &rows[j];
	return NULL;
}

/* qbm_add_row: a zero row for name at rows[*n]. */
static QbmRow *
qbm_add_row(QbmRow *rows, int *n, const char *name)
{
	QbmRow	   *r = &rows[(*n)++];

	memset(r, 0, sizeof(*r));
	snprintf(r->name, sizeof(r->name), "%s", name);
	return r;
}

/*
 * qbm_snapshot: a row per configured name (zero until its slot exists), in
 * the configuration's order, then one per slot of QueueBox's own buckets;
 * the slots summed into them.  names NULL: a row per slot in use.  rows has
 * room for nnames + QB_METRICS_SLOTS.
 */
static int
qbm_snapshot(const QbMetricSlot *slots, const char *const *names, int nnames, QbmRow *rows)
{
	int			n = 0;

	for (int i = 0; names != NULL && i < nnames; i++)
		if (qbm_row(rows, n, names[i]) == NULL)
			qbm_add_row(rows, &n, names[i]);
	for (int i = 0; i < QB_METRICS_SLOTS; i++)
	{
		const QbMetricSlot *s = &slots[i];
		QbmRow	   *r;
		bool		own = false;

		if (__atomic_load_n(&s->state, __ATOMIC_ACQUIRE) != QB_SLOT_IN_USE)
			continue;
		if ((r = qbm_row(rows, n, s->name)) == NULL)
		{
			for (int k = 0; qbm_own[k] != NULL; k++)
				own |= strcmp(s->name, qbm_own[k]) == 0;
			if (names != NULL && !own)
				continue;		/* no longer configured */
			r = qbm_add_row(rows, &n, s->name);
		}
		for (int k = 0; k < QB_NRESULTS; k++)
			r->count[k] += __atomic_load_n(&s->count[k], __ATOMIC_RELAXED);
		for (int k = 0; k <= QB_METRICS_NBUCKETS; k++)
			r->bucket[k] += __atomic_load_n(&s->bucket[k], __ATOMIC_RELAXED);
		r->latency_sum_us += __atomic_load_n(&s->latency_sum_us, __ATOMIC_RELAXED);
	}
	return n;
}

/* qbm_counter: one counter family over the rows, labelled by label. */
static void
qbm_family(QbmBuf *b, const char *metric, const char *help, const char *label,
		   const QbmRow *rows, int n, int index)
{
	qbm_printf(b, "# HELP %s %s\n# TYPE %s counter\n", metric, help, metric);
	for (int i = 0; i < n; i++)
		qbm_printf(b, "%s{%s=\"%s\"} %llu\n", metric, label, rows[i].name,
				   (unsigned long long) rows[i].count[index]);
}

static void
qbm_gauge(QbmBuf *b, const char *metric, const char *help, double v)
{
	if (v < 0)
		return;
	qbm_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.6g\n", metric, help, metric, metric, v);
}

/* qbm_deliveries: the destinations' counters and their latency histogram */
static void
qbm_deliveries(QbmBuf *b, const QbMetrics *m, const QbGauges *g, QbmRow *rows)
{
	int			n = qbm_snapshot(m->destinations, g ? g->dest_names : NULL, g ? g->ndests : 0, rows);

	qbm_family(b, "queuebox_outbox_delivered_total",
			   "Outbox messages the destination acknowledged.", "destination", rows, n, QB_DELIVERED);
	qbm_family(b, "queuebox_outbox_failed_total",
			   "Failed delivery attempts that scheduled a retry.", "destination", rows, n, QB_FAILED);
	qbm_family(b, "queuebox_outbox_dead_total",
			   "Outbox messages moved to dead.", "destination", rows, n, QB_DEAD);
	qbm_family(b, "queuebox_outbox_limit_waits_total",
			   "Times the destination's rows waited in the table for its rateLimit or maxConcurrent: claims it cut short, rows sent back for want of a token or place.",
			   "destination", rows, n, QB_LIMITED);
	qbm_printf(b, "# HELP queuebox_delivery_latency_seconds From the outbox row's created_at to the destination's acknowledgement.\n"
			   "# TYPE queuebox_delivery_latency_seconds histogram\n");
	for (int i = 0; i < n; i++)
	{
		uint64_t	cum = 0;

		for (int k = 0; k < QB_METRICS_NBUCKETS; k++)
		{
			cum += rows[i].bucket[k];
			qbm_printf(b, "queuebox_delivery_latency_seconds_bucket{destination=\"%s\",le=\"%g\"} %llu\n",
					   rows[i].name, qbm_bounds[k], (unsigned long long) cum);
		}
		cum += rows[i].bucket[QB_METRICS_NBUCKETS];
		qbm_printf(b, "queuebox_delivery_latency_seconds_bucket{destination=\"%s\",le=\"+Inf\"} %llu\n"
				   "queuebox_delivery_latency_seconds_sum{destination=\"%s\"} %.6f\n"
				   "queuebox_delivery_latency_seconds_count{destination=\"%s\"} %llu\n",
				   rows[i].name, (unsigned long long) cum,
				   rows[i].name, rows[i].latency_sum_us / 1e6,
				   rows[i].name, (unsigned long long) cum);
	}
}

/* qbm_receipts: the sources' answers by result */
static void
qbm_receipts(QbmBuf *b, const QbMetrics *m, const QbGauges *g, QbmRow *rows)
{
	int			n = qbm_snapshot(m->sources, g ? g->source_names : NULL, g ? g->nsources : 0, rows);

	qbm_printf(b, "# HELP queuebox_inbox_received_total Ingress answers by source and result.\n"
			   "# TYPE queuebox_inbox_received_total counter\n");
	for (int i = 0; i < n; i++)
		for (int k = 0; k < QB_NRESULTS; k++)
			qbm_printf(b, "queuebox_inbox_received_total{source=\"%s\",result=\"%s\"} %llu\n",
					   rows[i].name, qbm_results[k], (unsigned long long) rows[i].count[k]);
}

/* qbm_counters: the counters of one number each (relay, HTTP, OTLP) */
static void
qbm_counters(QbmBuf *b, const QbMetrics *m)
{
	qbm_printf(b, "# HELP queuebox_relay_forwarded_total Inbox rows the relay wrote into the outbox.\n"
			   "# TYPE queuebox_relay_forwarded_total counter\nqueuebox_relay_forwarded_total %llu\n"
			   "# HELP queuebox_relay_dead_total Inbox rows the relay marked dead (empty topic).\n"
			   "# TYPE queuebox_relay_dead_total counter\nqueuebox_relay_dead_total %llu\n"
			   "# HELP queuebox_http_not_found_total Requests answered 404 or 405.\n"
			   "# TYPE queuebox_http_not_found_total counter\nqueuebox_http_not_found_total %llu\n"
			   "# HELP queuebox_admin_unauthorized_total Admin requests refused for a missing or wrong token.\n"
			   "# TYPE queuebox_admin_unauthorized_total counter\nqueuebox_admin_unauthorized_total %llu\n"
			   "# HELP queuebox_http_closed_total Connections and requests that ended without an answer of the ingress, by reason.\n"
			   "# TYPE queuebox_http_closed_total counter\n"
			   "queuebox_http_closed_total{reason=\"no_request\"} %llu\n"
			   "queuebox_http_closed_total{reason=\"incomplete\"} %llu\n",
			   (unsigned long long) __atomic_load_n(&m->relay_forwarded, __ATOMIC_RELAXED),
			   (unsigned long long) __atomic_load_n(&m->relay_dead, __ATOMIC_RELAXED),
			   (unsigned long long) __atomic_load_n(&m->http_not_found, __ATOMIC_RELAXED),
			   (unsigned long long) __atomic_load_n(&m->admin_unauthorized, __ATOMIC_RELAXED),
			   (unsigned long long) __atomic_load_n(&m->http_no_request, __ATOMIC_RELAXED),
			   (unsigned long long) __atomic_load_n(&m->http_incomplete, __ATOMIC_RELAXED));

	qbm_printf(b, "# HELP queuebox_otlp_spans_exported_total Spans the OTLP receiver accepted.\n"
			   "# TYPE queuebox_otlp_spans_exported_total counter\nqueuebox_otlp_spans_exported_total %llu\n"
			   "# HELP queuebox_otlp_spans_dropped_total Spans dropped: the export queue was full, or a post to the receiver failed.\n"
			   "# TYPE queuebox_otlp_spans_dropped_total counter\nqueuebox_otlp_spans_dropped_total %llu\n",
			   (unsigned long long) __atomic_load_n(&m->otlp_exported, __ATOMIC_RELAXED),
			   (unsigned long long) __atomic_load_n(&m->otlp_dropped, __ATOMIC_RELAXED));
}

/* qbm_config_load: the configuration's loads (qb_config_load_read) */
static void
qbm_config_load(QbmBuf *b, const QbConfigLoad *c)
{
	/* as Prometheus says of its own: successful, and when */
	qbm_printf(b, "# HELP queuebox_config_last_reload_successful 1 when the last load of the configuration succeeded; 0 when it failed and the previous one stays.\n"
			   "# TYPE queuebox_config_last_reload_successful gauge\n"
			   "queuebox_config_last_reload_successful %d\n"
			   "# HELP queuebox_config_last_reload_success_timestamp_seconds When the configuration in force was loaded (0: none yet).\n"
			   "# TYPE queuebox_config_last_reload_success_timestamp_seconds gauge\n"
			   "queuebox_config_last_reload_success_timestamp_seconds %.3f\n"
			   "# HELP queuebox_config_reload_failures_total Loads of the configuration that failed (an invalid file or document).\n"
			   "# TYPE queuebox_config_reload_failures_total counter\n"
			   "queuebox_config_reload_failures_total %llu\n",
			   c->last_failed ? 0 : 1, c->loaded_at_ms / 1000.0,
			   (unsigned long long) c->failures);
	if (c->loads > 0)
		qbm_printf(b, "# HELP queuebox_config_info The configuration in force: where it came from and its SHA-256.\n"
				   "# TYPE queuebox_config_info gauge\n"
				   "queuebox_config_info{source=\"%s\",sha256=\"%s\"} 1\n",
				   qb_config_source_name((QbConfigSource) c->source), c->sha256);
}

/* qbm_limit: one gauge family over the limited destinations (v < 0: not rendered) */
static void
qbm_limit(QbmBuf *b, const QbGauges *g, const char *metric, const char *help, int what)
{
	bool		head = false;

	for (int i = 0; i < g->ndests; i++)
	{
		const QbLimitSpec *l = g->dest_limits[i];
		double		v = what == 0 ? (l->rate.per_sec > 0 ? l->rate.per_sec : -1) :
			what == 1 ? (l->rate.per_sec > 0 ? l->rate.burst : -1) :
			what == 2 ? (l->max_concurrent > 0 ? l->max_concurrent : -1) :
			(l->max_concurrent > 0 && g->limits != NULL ?
			 qb_limits_in_use(g->limits, g->dest_names[i]) : -1);

		if (v < 0)
			continue;
		if (!head)
			qbm_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", metric, help, metric);
		head = true;
		qbm_printf(b, "%s{destination=\"%s\"} %.6g\n", metric, g->dest_names[i], v);
	}
}

/* qbm_limits: the limited destinations' limits, and the places in use now */
static void
qbm_limits(QbmBuf *b, const QbGauges *g)
{
	if (g->dest_limits == NULL || g->dest_names == NULL)
		return;
	qbm_limit(b, g, "queuebox_destination_rate_limit_per_second",
			  "The destination's rateLimit.perSecond (destinations with a rateLimit).", 0);
	qbm_limit(b, g, "queuebox_destination_rate_limit_burst",
			  "The destination's rateLimit.burst.", 1);
	qbm_limit(b, g, "queuebox_destination_max_concurrent",
			  "The destination's maxConcurrent (destinations with one).", 2);
	qbm_limit(b, g, "queuebox_destination_concurrent",
			  "Publishes to the destination in flight now, every worker of this server (destinations with a maxConcurrent).", 3);
}

/* qbm_gauges: what the store said at this scrape (qb_gauges.h) */
static void
qbm_gauges(QbmBuf *b, const QbGauges *g)
{
	qbm_gauge(b, "queuebox_database_up", "1 when the last scrape could read the queue tables.",
			  g->database_up ? 1 : 0);
	qbm_gauge(b, "queuebox_outbox_pending", "Outbox rows in state pending.", g->outbox_pending);
	qbm_gauge(b, "queuebox_outbox_processing", "Outbox rows claimed and in flight.", g->outbox_processing);
	qbm_gauge(b, "queuebox_outbox_oldest_pending_age_seconds",
			  "Age of the oldest pending outbox row (0 when none).", g->outbox_oldest_pending_sec);
	qbm_gauge(b, "queuebox_inbox_pending", "Inbox rows in state pending.", g->inbox_pending);
	qbm_gauge(b, "queuebox_inbox_processing", "Inbox rows claimed and in flight.", g->inbox_processing);
	qbm_gauge(b, "queuebox_inbox_oldest_pending_age_seconds",
			  "Age of the oldest pending inbox row (0 when none).", g->inbox_oldest_pending_sec);
	if (g->dest_circuits != NULL && g->ndests > 0)
	{
		static const char *const states[] = {"closed", "open", "half-open", "disabled"};

		qbm_printf(b, "# HELP queuebox_destination_state 1 for the state each destination's circuit is in.\n"
				   "# TYPE queuebox_destination_state gauge\n");
		for (int i = 0; i < g->ndests; i++)
			for (int k = 0; k < 4; k++)
				qbm_printf(b, "queuebox_destination_state{destination=\"%s\",state=\"%s\"} %d\n",
						   g->dest_names[i], states[k], g->dest_circuits[i] == k ? 1 : 0);
	}
}

char *
qb_metrics_render(const QbMetrics *m, const QbGauges *g)
{
	static const QbMetrics none;	/* m NULL: nothing counted */
	QbmBuf		b = {malloc(4096), 0, 4096, false};
	int			nnames = g == NULL ? 0 : (g->ndests > g->nsources ? g->ndests : g->nsources);
	QbmRow	   *rows = malloc(sizeof(QbmRow) * (nnames + QB_METRICS_SLOTS));
	QbConfigLoad c;

	/* read before m may become none, whose (read-only) lock cannot be taken */
	qb_config_load_read(m, &c);

	if (b.data == NULL || rows == NULL)
	{
		free(b.data);
		free(rows);
		return NULL;
	}
	b.data[0] = '\0';
	if (m == NULL)
		m = &none;
	qbm_deliveries(&b, m, g, rows);
	qbm_receipts(&b, m, g, rows);
	qbm_counters(&b, m);
	qbm_config_load(&b, &c);
	if (g != NULL)
	{
		qbm_gauges(&b, g);
		qbm_limits(&b, g);
	}
	free(rows);
	if (b.oom)
	{
		free(b.data);
		return NULL;
	}
	return b.data;
}
