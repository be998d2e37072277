/*-------------------------------------------------------------------------
 * qb_config_check.c
 *	  Validate, the document: the tree is checked key by key into a
 *	  QbConfig that holds the defaults.  Each scalar of the document is
 *	  expanded (qb_expand_env) when it is read, then type-checked; an
 *	  override's value is taken as it is.
 *
 * Here: the fixed sections (outbox, inbox, http, admin, and database and
 * daemon, which only the daemon uses: validated here all the same, so a
 * document is valid or not whoever loads it), egress: (the daemon's
 * rules; the extension refuses the section, its rules are a superuser
 * setting), routes, the leases check, the egress check (every
 * destination's hosts and the span exporter's against the rules, at
 * load), and what every destination and every source shares (type:,
 * transform:, maxInFlight and circuitBreaker; consumption, the JSONPaths and
 * headers, topic).  A type's own keys are its file's (qb_config_<type>.c),
 * reached through the two tables below.
 *-------------------------------------------------------------------------
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "qb_config_int.h"
#include "qb_extract.h"
#include "qb_route.h"

/* ---------------------------------------------------------------------
 * The types, by QbDestType and QbSourceType: a new type is a line here
 * ---------------------------------------------------------------------
 */
const QbcfDestType *const qbcf_dest_types[] =
{
	[QB_DEST_HTTP] = &qbcf_dest_http,
	[QB_DEST_RABBITMQ] = &qbcf_dest_rabbitmq,
	[QB_DEST_KAFKA] = &qbcf_dest_kafka,
	[QB_DEST_NATS] = &qbcf_dest_nats,
	NULL
};

const QbcfSourceType *const qbcf_source_types[] =
{
	[QB_SOURCE_HTTP] = &qbcf_source_http,
	[QB_SOURCE_RABBITMQ] = &qbcf_source_rabbitmq,
	[QB_SOURCE_KAFKA] = &qbcf_source_kafka,
	[QB_SOURCE_NATS] = &qbcf_source_nats,
	NULL
};

/* the lists made from the tables have room for QBCF_MAX_TYPES */
_Static_assert(sizeof(qbcf_dest_types) / sizeof(qbcf_dest_types[0]) <= QBCF_MAX_TYPES + 1,
			   "raise QBCF_MAX_TYPES");
_Static_assert(sizeof(qbcf_source_types) / sizeof(qbcf_source_types[0]) <= QBCF_MAX_TYPES + 1,
			   "raise QBCF_MAX_TYPES");

/* ---------------------------------------------------------------------
 * The fixed sections' keys
 * ---------------------------------------------------------------------
 */
static const char *const qbcf_keys_top[] =
{"outbox", "destinations", "routes", "sources", "inbox", "http", "admin", "database", "daemon", "egress",
"telemetry", NULL};
static const char *const qbcf_keys_outbox[] =
{"pollIntervalMs", "batchSize", "maxAttempts", "claimTimeoutMs", "takeover", "backoff", "retention", NULL};
const char *const qbcf_scalars_outbox[] =
{"pollIntervalMs", "batchSize", "maxAttempts", "claimTimeoutMs", "takeover", "retention", NULL};
const char *const qbcf_keys_backoff[] =
{"initialMs", "maxMs", "multiplier", "jitter", NULL};
const char *const qbcf_keys_breaker[] =
{"failures", "cooldownMs", NULL};
const char *const qbcf_keys_rate_limit[] =
{"perSecond", "burst", NULL};
const char *const qbcf_keys_route[] =
{"topicPattern", "destination", "destinations", "transform", "onDead", NULL};
static const char *const qbcf_keys_inbox[] =
{"basePath", "relay", NULL};
const char *const qbcf_scalars_inbox[] =
{"basePath", NULL};
const char *const qbcf_keys_relay[] =
{"enabled", "pollIntervalMs", "batchSize", "claimTimeoutMs", "takeover", "maxAttempts", NULL};
const char *const qbcf_keys_http_section[] =
{"listen", "maxConnections", "connectionTimeoutMs", "storeTimeoutMs", NULL};
const char *const qbcf_keys_admin[] =
{"token", NULL};
/* the daemon's (queuebox-mssqld); the extension reads and ignores them */
const char *const qbcf_keys_database[] =
{"url", "listen", "statementTimeoutMs", "connectTimeoutMs", "idlePollMaxMs", NULL};
static const char *const qbcf_keys_egress[] = {"allow", NULL};
const char *const qbcf_keys_daemon[] =
{"outboxWorkers", "shutdownGraceMs", "logFormat", NULL};

#define QBCF_RETENTION_MAX	(36500L * 86400L)

/* ---------------------------------------------------------------------
 * outbox
 * ---------------------------------------------------------------------
 */
/* qbcf_duration: "<n>d", "<n>h", "<n>m", "<n>s" or plain seconds, in seconds. */
static bool
qbcf_duration(QbcfCtx *cx, const char *path, const QbcfNode *n, long *out)
{
	static const char what[] =
		"a duration like \"7d\", \"12h\", \"30m\", \"45s\" or a number of seconds, from 1s to 36500d";
	char		echo[64];
	char	   *s;
	const char *p;
	long		v = 0;
	long		unit = 1;
	bool		ok;

	if (!qbcf_text(cx, path, n, what, &s))
		return false;
	for (p = s; isdigit((unsigned char) *p) && v <= QBCF_RETENTION_MAX; p++)
		v = v * 10 + (*p - '0');
	ok = p > s;
	if (ok && *p != '\0')
	{
		switch (*p)
		{
			case 'd':
				unit = 86400;
				break;
			case 'h':
				unit = 3600;
				break;
			case 'm':
				unit = 60;
				break;
			case 's':
				unit = 1;
				break;
			default:
				ok = false;
		}
		ok = ok && p[1] == '\0';
	}
	ok = ok && v >= 1 && v <= QBCF_RETENTION_MAX / unit;
	if (ok)
		*out = v * unit;
	else
		qbcf_error(cx, path, n, "expected %s, got %s", what, qbcf_echo(cx, echo, sizeof(echo), s));
	return ok;
}

/* qbcf_outbox: the outbox: section onto the defaults already in *o. */
static bool
qbcf_outbox(QbcfCtx *cx, const QbcfNode *node, QbOutboxConf *o)
{
	const QbcfNode *m;
	const QbcfNode *b;
	const QbcfNode *n;
	const QbcfNode *max_node;
	long		v;

	if (!qbcf_section(cx, "outbox", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qbcf_check_keys(cx, "outbox", m, qbcf_keys_outbox, NULL))
		return false;
	if ((n = qbcf_get(m, "pollIntervalMs")) != NULL)
	{
		if (!qbcf_int(cx, "outbox.pollIntervalMs", n, 10, 3600000, &v))
			return false;
		o->poll_interval_ms = (int) v;
	}
	if ((n = qbcf_get(m, "batchSize")) != NULL)
	{
		if (!qbcf_int(cx, "outbox.batchSize", n, 1, 10000, &v))
			return false;
		o->batch_size = (int) v;
	}
	if ((n = qbcf_get(m, "maxAttempts")) != NULL)
	{
		if (!qbcf_int(cx, "outbox.maxAttempts", n, 1, 1000000, &v))
			return false;
		o->max_attempts = (int) v;
	}
	if ((n = qbcf_get(m, "claimTimeoutMs")) != NULL &&
		!qbcf_int(cx, "outbox.claimTimeoutMs", n, 1000, 86400000, &o->claim_timeout_ms))
		return false;
	if (!qbcf_flag(cx, "outbox", m, "takeover", &o->takeover))
		return false;
	if ((n = qbcf_get(m, "retention")) != NULL &&
		!qbcf_duration(cx, "outbox.retention", n, &o->retention_sec))
		return false;

	if (!qbcf_section(cx, "outbox.backoff", qbcf_get(m, "backoff"), QBCF_MAP, &b))
		return false;
	if (b == NULL)
		return true;
	if (!qbcf_check_keys(cx, "outbox.backoff", b, qbcf_keys_backoff, NULL))
		return false;
	if ((n = qbcf_get(b, "initialMs")) != NULL &&
		!qbcf_int(cx, "outbox.backoff.initialMs", n, 1, QBCF_MS_MAX, &o->backoff.initial_ms))
		return false;
	if ((max_node = qbcf_get(b, "maxMs")) != NULL &&
		!qbcf_int(cx, "outbox.backoff.maxMs", max_node, 1, QBCF_MS_MAX, &o->backoff.max_ms))
		return false;
	if ((n = qbcf_get(b, "multiplier")) != NULL &&
		!qbcf_number(cx, "outbox.backoff.multiplier", n, 1.0, INFINITY,
					 "a number >= 1 (1 keeps the delay constant)", &o->backoff.multiplier))
		return false;
	if ((n = qbcf_get(b, "jitter")) != NULL &&
		!qbcf_number(cx, "outbox.backoff.jitter", n, 0.0, 1.0,
					 "a number from 0 to 1", &o->backoff.jitter))
		return false;
	if (o->backoff.max_ms < o->backoff.initial_ms)
	{
		if (max_node != NULL)
			return qbcf_error(cx, "outbox.backoff.maxMs", max_node,
							  "must be at least initialMs (%ld), got %ld; raise maxMs or lower initialMs",
							  o->backoff.initial_ms, o->backoff.max_ms);
		return qbcf_error(cx, "outbox.backoff.initialMs", qbcf_get(b, "initialMs"),
						  "is larger than maxMs (%ld, the default); lower it or set outbox.backoff.maxMs",
						  o->backoff.max_ms);
	}
	return true;
}

/* ---------------------------------------------------------------------
 * Destinations and routes
 * ---------------------------------------------------------------------
 */
/* qbcf_transform_release: a compiled transform, at the config's free. */
static void
qbcf_transform_release(void *t)
{
	qb_transform_free(t);
}

/*
 * qbcf_transform: an optional transform: key of mapping m, compiled into *out;
 * a program libjq refuses is refused with its message.  The compiled
 * program is libjq's memory, not the arena's: the arena owns it (releases
 * it when it is freed).
 */
static bool
qbcf_transform(QbcfCtx *cx, const char *path, const QbcfNode *m, QbTransform **out)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	char	   *text = NULL;
	const QbcfNode *n = qbcf_get(m, "transform");

	if (n == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, "transform");
	if (!qbcf_string(cx, sub, n, true, &text))
		return false;
	if ((*out = qb_transform_compile(text, msg, sizeof(msg))) == NULL)
		return qbcf_error(cx, sub, n, "%s", msg);
	if (!qbcf_arena_own(cx->arena, qbcf_transform_release, *out))
	{
		*out = NULL;
		return qbcf_error(cx, sub, n, "out of memory");
	}
	return true;
}

/*
 * qbcf_on_dead: the optional onDead of mapping m (a destination, a route
 * or a source) into *out, left as it is when absent: release or holdKey.
 * unit names what a dead row holds: "key" (the outbox) or "aggregate" (a
 * source's rows, in the relay's order).
 */
static bool
qbcf_on_dead(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *unit, QbOnDead *out)
{
	char		sub[QBCF_PATHLEN];
	char		echo[64];
	char	   *v = NULL;

	if (!qbcf_opt_string(cx, path, m, "onDead", false, &v))
		return false;
	if (v == NULL)
		return true;
	if (strcmp(v, "release") == 0)
		*out = QB_ON_DEAD_RELEASE;
	else if (strcmp(v, "holdKey") == 0)
		*out = QB_ON_DEAD_HOLD_KEY;
	else
	{
		qbcf_path_key(sub, sizeof(sub), path, "onDead");
		return qbcf_error(cx, sub, qbcf_get(m, "onDead"),
						  "expected release (a dead row's %s goes on without it) or holdKey "
						  "(its later rows wait until it is requeued or skipped), got %s",
						  unit, qbcf_echo(cx, echo, sizeof(echo), v));
	}
	return true;
}

/*
 * qbcf_opt_map: the optional mapping under key of m into *out (NULL:
 * absent), its keys checked; sub (QBCF_PATHLEN) gets its path.  example
 * shows one in the error for a value that is not a mapping.
 */
static bool
qbcf_opt_map(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key,
			 const char *example, const char *const *keys, char *sub, const QbcfNode **out)
{
	const QbcfNode *n = qbcf_get(m, key);
	char		in[64];

	*out = NULL;
	if (n == NULL)
		return true;
	qbcf_path_key(sub, QBCF_PATHLEN, path, key);
	if (n->kind != QBCF_MAP)
		return qbcf_error(cx, sub, n, "expected a mapping such as %s, got %s", example,
						  qbcf_kind_name(n));
	snprintf(in, sizeof(in), "in %s", key);
	if (!qbcf_check_keys(cx, sub, n, keys, in))
		return false;
	*out = n;
	return true;
}

/*
 * qbcf_limits: rateLimit {perSecond, burst} and maxConcurrent into d->limit
 * (docs/delivery.md, "Limits"); burst defaults to perSecond's ceiling.
 */
static bool
qbcf_limits(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	char		sub[QBCF_PATHLEN];
	char		key[QBCF_PATHLEN];
	const QbcfNode *rl;
	const QbcfNode *n;
	long		v = 0;
	long		burst = 0;

	memset(&d->limit, 0, sizeof(d->limit));
	if (!qbcf_opt_int(cx, path, m, "maxConcurrent", 1, 10000, &v))
		return false;
	d->limit.max_concurrent = (int) v;
	if (!qbcf_opt_map(cx, path, m, "rateLimit", "{ perSecond: 50, burst: 50 }",
					  qbcf_keys_rate_limit, sub, &rl))
		return false;
	if (rl == NULL)
		return true;
	if ((n = qbcf_required(cx, sub, rl, "perSecond",
						   "the publishes a second the destination allows, for example perSecond: 50")) == NULL)
		return false;
	qbcf_path_key(key, sizeof(key), sub, "perSecond");
	if (!qbcf_number(cx, key, n, 0.001, 1000000,
					 "a number of publishes a second from 0.001 to 1000000", &d->limit.rate.per_sec) ||
		!qbcf_opt_int(cx, sub, rl, "burst", 1, 1000000, &burst))
		return false;
	d->limit.rate.burst = burst > 0 ? (int) burst : qb_ratelimit_default_burst(d->limit.rate.per_sec);
	return true;
}

/*
 * qbcf_delivery_control: the keys every destination type has that shape how
 * the engine feeds it: maxInFlight, circuitBreaker {failures, cooldownMs},
 * onDead, rateLimit and maxConcurrent.
 */
static bool
qbcf_delivery_control(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *cb;
	long		v = d->max_in_flight;
	long		failures = d->breaker_failures;

	if (!qbcf_opt_int(cx, path, m, "maxInFlight", 1, 10000, &v))
		return false;
	d->max_in_flight = (int) v;
	d->on_dead = QB_ON_DEAD_RELEASE;
	if (!qbcf_on_dead(cx, path, m, "key", &d->on_dead) || !qbcf_limits(cx, path, m, d))
		return false;
	if (!qbcf_opt_map(cx, path, m, "circuitBreaker", "{ failures: 10, cooldownMs: 30000 }",
					  qbcf_keys_breaker, sub, &cb))
		return false;
	if (cb == NULL)
		return true;
	if (!qbcf_opt_int(cx, sub, cb, "failures", 1, 1000000, &failures) ||
		!qbcf_opt_int(cx, sub, cb, "cooldownMs", 100, 86400000, &d->breaker_cooldown_ms))
		return false;
	d->breaker_failures = (int) failures;
	return true;
}

/*
 * qbcf_type_words: the names of a table's types as messages spell them:
 * "one of a, b, c" into one, "a, b or c" into alternatives.
 */
static void
qbcf_type_words(const char *const *names, char *one, size_t onelen, char *alternatives,
				size_t altlen)
{
	char		list[128];

	qbcf_list(list, sizeof(list), names, ", ");
	snprintf(one, onelen, "one of %s", list);
	qbcf_list(alternatives, altlen, names, " or ");
}

/*
 * qbcf_destination: one entry of destinations: into *d (d->name already
 * set): the keys every type shares here, then the type's own check.
 */
static bool
qbcf_destination(QbcfCtx *cx, const char *path, const QbcfNode *node, QbDestination *d)
{
	const char *types[QBCF_MAX_TYPES + 1] = {NULL};
	const QbcfDestType *type;
	char		sub[QBCF_PATHLEN];
	char		forwhat[48];
	char		one[160];
	char		alternatives[128];
	char		empty[224];
	const QbcfNode *m;
	const QbcfNode *n;
	int			t;

	d->path = NULL;
	d->timeout_ms = 10000;
	d->persistent = true;
	d->mandatory = true;
	d->max_in_flight = QB_DEFAULT_MAX_IN_FLIGHT;
	d->breaker_failures = QB_DEFAULT_BREAKER_FAILURES;
	d->breaker_cooldown_ms = QB_DEFAULT_BREAKER_COOLDOWN_MS;
	for (t = 0; qbcf_dest_types[t] != NULL; t++)
		types[t] = qbcf_dest_types[t]->type;
	qbcf_type_words(types, one, sizeof(one), alternatives, sizeof(alternatives));
	snprintf(empty, sizeof(empty),
			 "expected a mapping with at least type: (%s), got an empty value", alternatives);
	if (!qbcf_typed(cx, path, node, types, one, empty, one, &m, &t))
		return false;
	d->type = (QbDestType) t;
	type = qbcf_dest_types[t];
	snprintf(forwhat, sizeof(forwhat), "for a%s %s destination",
			 d->type == QB_DEST_HTTP ? "n" : "", type->type);
	if (d->type != QB_DEST_HTTP && (n = qbcf_get(m, "signing")) != NULL)
	{
		qbcf_path_key(sub, sizeof(sub), path, "signing");
		return qbcf_error(cx, sub, n,
						  "signing is for http destinations only (it signs the HTTP request); remove it, or sign the payload in a transform");
	}
	return qbcf_check_keys(cx, path, m, type->keys, forwhat) &&
		qbcf_transform(cx, path, m, &d->transform) &&
		qbcf_delivery_control(cx, path, m, d) &&
		type->check(cx, path, m, d);
}
/* qbcf_target: an optional or required exchange/topic/subject into d->target. */
bool
qbcf_target(QbcfCtx *cx, const char *path, const QbcfNode *m, QbDestination *d,
			const char *key, const char *why, bool nonempty)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *n;

	if (why != NULL)
	{
		if ((n = qbcf_required(cx, path, m, key, why)) == NULL)
			return false;
	}
	else if ((n = qbcf_get(m, key)) == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	return qbcf_string(cx, sub, n, nonempty, &d->target);
}

/*
 * qbcf_target_template: a broker destination's target (at key: a kafka
 * topic, a nats subject) is a template over the row's topic and key; check
 * it now so a typo fails the document, not every delivery.
 */
bool
qbcf_target_template(QbcfCtx *cx, const char *path, const QbcfNode *m,
					 const QbDestination *d, const char *key)
{
	static const char *const names[] = {"topic", "key", NULL};
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];

	if (d->target == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	if (!qb_template_check(d->target, names, msg, sizeof(msg)))
		return qbcf_error(cx, sub, qbcf_get(m, key), "%s", msg);
	return true;
}
/*
 * qbcf_named_section: a mapping of named entries (destinations:, sources:)
 * into a zeroed array of n elements of size each; n stays 0 when the
 * section is absent or empty.
 */
static bool
qbcf_named_section(QbcfCtx *cx, const char *path, const QbcfNode *node, size_t size,
				   void **arr, int *n, const QbcfNode **m)
{
	if (!qbcf_section(cx, path, node, QBCF_MAP, m))
		return false;
	if (*m == NULL || (*m)->n == 0)
		return true;
	if (!qbcf_check_keys(cx, path, *m, NULL, NULL))
		return false;
	if ((*arr = qbcf_arena_alloc(cx->arena, (*m)->n * size)) == NULL)
		return qbcf_error(cx, path, *m, "out of memory");
	*n = (*m)->n;
	return true;
}

/* qbcf_name: an entry's name: letters, digits, '_' and '-'; copied to *out. */
static bool
qbcf_name(QbcfCtx *cx, const char *path, const QbcfNode *key, const char *what, char **out)
{
	const char *p;

	for (p = key->text; *p != '\0'; p++)
		if (!isalnum((unsigned char) *p) && *p != '_' && *p != '-')
			break;
	if (*p != '\0' || key->text[0] == '\0')
		return qbcf_error(cx, path, key, "%s name may use only letters, digits, '_' and '-'", what);
	if ((*out = qbcf_arena_strdup(cx->arena, key->text)) == NULL)
		return qbcf_error(cx, path, key, "out of memory");
	return true;
}

/* qbcf_destinations: the destinations: section. */
static bool
qbcf_destinations(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *m;
	int			i;

	if (!qbcf_named_section(cx, "destinations", node, sizeof(QbDestination),
							(void **) &cfg->destinations, &cfg->ndestinations, &m))
		return false;
	for (i = 0; i < cfg->ndestinations; i++)
	{
		qbcf_path_key(sub, sizeof(sub), "destinations", m->keys[i]->text);
		if (!qbcf_name(cx, sub, m->keys[i], "a destination", &cfg->destinations[i].name) ||
			!qbcf_destination(cx, sub, m->kids[i], &cfg->destinations[i]))
			return false;
	}
	return true;
}

/* qbcf_dest_lookup: the index of destination name (at path, node n), or an error. */
static bool
qbcf_dest_lookup(QbcfCtx *cx, const char *path, const QbcfNode *n, const QbConfig *cfg,
				 const char *name, int *index)
{
	char		echo[64];
	char		names[256];
	size_t		o = 0;

	for (int j = 0; j < cfg->ndestinations; j++)
		if (strcmp(cfg->destinations[j].name, name) == 0)
		{
			*index = j;
			return true;
		}
	names[0] = '\0';
	for (int j = 0; j < cfg->ndestinations && o < sizeof(names); j++)
		o += snprintf(names + o, sizeof(names) - o, "%s%s", j ? ", " : "",
					  cfg->destinations[j].name);
	if (cfg->ndestinations == 0)
		return qbcf_error(cx, path, n,
						  "unknown destination %s (no destination is defined; add it under destinations:)",
						  qbcf_echo(cx, echo, sizeof(echo), name));
	return qbcf_error(cx, path, n, "unknown destination %s (defined: %s)",
					  qbcf_echo(cx, echo, sizeof(echo), name), names);
}

/*
 * qbcf_copies_json: r->dests[1..] as a JSON array (jansson), and every
 * destination joined by ", ", in the arena.
 */
static bool
qbcf_copies_json(QbcfCtx *cx, const char *path, const QbcfNode *n, QbRoute *r)
{
	json_t	   *a = json_array();
	char	   *text = NULL;
	size_t		len = 1;

	for (int i = 0; i < r->ndests; i++)
		len += strlen(r->dests[i]) + 2;
	if ((r->dest_list = qbcf_arena_alloc(cx->arena, len)) == NULL)
		return qbcf_error(cx, path, n, "out of memory");
	r->dest_list[0] = '\0';
	for (int i = 0; i < r->ndests; i++)
	{
		if (i > 0)
			strcat(r->dest_list, ", ");
		strcat(r->dest_list, r->dests[i]);
	}

	for (int i = 1; a != NULL && i < r->ndests; i++)
		if (json_array_append_new(a, json_string(r->dests[i])) != 0)
		{
			json_decref(a);
			a = NULL;
		}
	if (a != NULL)
		text = json_dumps(a, JSON_COMPACT);
	json_decref(a);
	if (text != NULL)
	{
		r->copies = qbcf_arena_strdup(cx->arena, text);
		free(text);
	}
	if (r->copies == NULL)
		return qbcf_error(cx, path, n, "out of memory");
	return true;
}

/*
 * qbcf_route_dests: a route's destination: (one) or destinations: (a list
 * of two or more, fan-out: each row is delivered to every one of them).
 */
static bool
qbcf_route_dests(QbcfCtx *cx, const char *path, const QbcfNode *m, const QbConfig *cfg,
				 QbRoute *r)
{
	char		sub[QBCF_PATHLEN];
	char		item[QBCF_PATHLEN];
	const QbcfNode *one = qbcf_get(m, "destination");
	const QbcfNode *list = qbcf_get(m, "destinations");

	qbcf_path_key(sub, sizeof(sub), path, "destinations");
	if (one != NULL && list != NULL)
		return qbcf_error(cx, sub, list,
						  "a route has destination (one) or destinations (a list: each row goes to every one of them), not both; keep one of the two");
	if (list == NULL)
	{
		if ((one = qbcf_required(cx, path, m, "destination",
								 "the name of an entry under destinations: (or destinations: [a, b] to send each row to several)")) == NULL)
			return false;
		qbcf_path_key(sub, sizeof(sub), path, "destination");
		if (!qbcf_string(cx, sub, one, false, &r->destination))
			return false;
		r->ndests = 1;
		r->dests = qbcf_arena_alloc(cx->arena, sizeof(char *));
		r->dest_indexes = qbcf_arena_alloc(cx->arena, sizeof(int));
		if (r->dests == NULL || r->dest_indexes == NULL)
			return qbcf_error(cx, sub, one, "out of memory");
		r->dests[0] = r->dest_list = r->destination;
		if (!qbcf_dest_lookup(cx, sub, one, cfg, r->destination, &r->dest_indexes[0]))
			return false;
		r->dest_index = r->dest_indexes[0];
		return true;
	}
	qbcf_path_key(sub, sizeof(sub), path, "destinations");
	if (list->kind != QBCF_SEQ || list->n < 2)
		return qbcf_error(cx, sub, list,
						  "expected a list of two or more destination names, e.g. destinations: [billing, analytics]; for one, write destination: billing");
	r->ndests = list->n;
	r->dests = qbcf_arena_alloc(cx->arena, list->n * sizeof(char *));
	r->dest_indexes = qbcf_arena_alloc(cx->arena, list->n * sizeof(int));
	if (r->dests == NULL || r->dest_indexes == NULL)
		return qbcf_error(cx, sub, list, "out of memory");
	for (int i = 0; i < list->n; i++)
	{
		qbcf_path_index(item, sizeof(item), sub, i);
		if (!qbcf_string(cx, item, list->kids[i], false, &r->dests[i]) ||
			!qbcf_dest_lookup(cx, item, list->kids[i], cfg, r->dests[i], &r->dest_indexes[i]))
			return false;
		for (int j = 0; j < i; j++)
			if (r->dest_indexes[j] == r->dest_indexes[i])
				return qbcf_error(cx, item, list->kids[i],
								  "destination %s is listed twice; a row goes to each destination once",
								  r->dests[i]);
	}
	r->destination = r->dests[0];
	r->dest_index = r->dest_indexes[0];
	return qbcf_copies_json(cx, sub, list, r);
}

/* qbcf_routes: the routes: section, after the destinations it names. */
static bool
qbcf_routes(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg)
{
	char		path[QBCF_PATHLEN];
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	const QbcfNode *seq;
	int			i;

	if (!qbcf_section(cx, "routes", node, QBCF_SEQ, &seq))
		return false;
	if (seq == NULL || seq->n == 0)
		return true;
	if ((cfg->routes = qbcf_arena_alloc(cx->arena, seq->n * sizeof(QbRoute))) == NULL)
		return qbcf_error(cx, "routes", seq, "out of memory");
	cfg->nroutes = seq->n;
	for (i = 0; i < seq->n; i++)
	{
		QbRoute    *r = &cfg->routes[i];
		const QbcfNode *m;
		const QbcfNode *n;

		qbcf_path_index(path, sizeof(path), "routes", i);
		if (!qbcf_section(cx, path, seq->kids[i], QBCF_MAP, &m))
			return false;
		if (m == NULL)
			return qbcf_error(cx, path, seq->kids[i],
							  "expected a mapping with topicPattern and destination, got an empty value");
		if (!qbcf_check_keys(cx, path, m, qbcf_keys_route, NULL))
			return false;

		if ((n = qbcf_required(cx, path, m, "topicPattern",
							   "the topics this route takes, e.g. topicPattern: \"orders.**\"")) == NULL)
			return false;
		qbcf_path_key(sub, sizeof(sub), path, "topicPattern");
		if (!qbcf_string(cx, sub, n, false, &r->topic_pattern))
			return false;
		if (!qb_pattern_check(r->topic_pattern, msg, sizeof(msg)))
			return qbcf_error(cx, sub, n, "%s", msg);

		if (!qbcf_route_dests(cx, path, m, cfg, r))
			return false;
		if (!qbcf_transform(cx, path, m, &r->transform))
			return false;
		r->on_dead = QB_ON_DEAD_UNSET;
		if (!qbcf_on_dead(cx, path, m, "key", &r->on_dead))
			return false;
	}
	return true;
}

/* ---------------------------------------------------------------------
 * Sources, inbox, http, admin
 * ---------------------------------------------------------------------
 */
/* qbcf_opt_jsonpath: an optional JSONPath key, checked. */
static bool
qbcf_opt_jsonpath(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *key, char **out)
{
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];

	if (!qbcf_opt_string(cx, path, m, key, true, out))
		return false;
	if (*out == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, key);
	if (!qb_jsonpath_check(*out, msg, sizeof(msg)))
		return qbcf_error(cx, sub, qbcf_get(m, key), "%s", msg);
	return true;
}

/*
 * qbcf_one_of: at most one of two keys (a JSONPath and a header) is set; with
 * required, exactly one.
 */
static bool
qbcf_one_of(QbcfCtx *cx, const char *path, const QbcfNode *m, const char *a, const char *b)
{
	char		sub[QBCF_PATHLEN];

	if (qbcf_get(m, a) == NULL || qbcf_get(m, b) == NULL)
		return true;
	qbcf_path_key(sub, sizeof(sub), path, b);
	return qbcf_error(cx, sub, qbcf_get(m, b),
					  "set %s or %s, not both: the value must come from one place", a, b);
}

/*
 * qbcf_topic: the topic template of a source.  A push source whose template
 * reads {{ eventType }} with no way to find an event type would send every
 * message to dead, so it is refused here.
 */
static bool
qbcf_topic(QbcfCtx *cx, const char *path, const QbcfNode *m, QbSource *s)
{
	static const char *const names[] = {"source", "eventType", NULL};
	const char *with[] = {"s", "e"};
	const char *without[] = {"s", NULL};
	char		sub[QBCF_PATHLEN];
	char		msg[QBCF_MSGLEN];
	const QbcfNode *n = qbcf_get(m, "topic");
	char	   *a,
			   *b;
	bool		reads_event,
				empty;

	qbcf_path_key(sub, sizeof(sub), path, "topic");
	if (n != NULL)
	{
		if (!qbcf_string(cx, sub, n, true, &s->topic))
			return false;
		if (!qb_template_check(s->topic, names, msg, sizeof(msg)))
			return qbcf_error(cx, sub, n, "%s", msg);
	}
	else if ((s->topic = qbcf_arena_strdup(cx->arena, s->type == QB_SOURCE_HTTP ?
											"{{ eventType }}" : "{{ source }}")) == NULL)
		return qbcf_error(cx, path, m, "out of memory");
	if (s->consumption == QB_CONSUME_PULL)
		return true;
	a = qb_template_render(s->topic, names, with);
	b = qb_template_render(s->topic, names, without);
	if (a == NULL || b == NULL)
	{
		free(a);
		free(b);
		return qbcf_error(cx, sub, n ? n : m, "out of memory");
	}
	reads_event = strcmp(a, b) != 0;
	empty = a[0] == '\0';
	free(a);
	free(b);
	if (empty)
		return qbcf_error(cx, sub, n ? n : m,
						  "the template renders an empty topic, so no route could match; write text or {{ source }} in it");
	if (reads_event && s->event_type_path == NULL && s->event_type_header == NULL &&
		!s->event_type_from_header)
		return qbcf_error(cx, sub, n ? n : m,
						  "%s {{ eventType }} but the source sets neither eventTypePath nor %s, so every message would render an empty topic and go dead; set one of them, or use {{ source }}",
						  n ? "the template reads" : "the default topic is",
						  s->type == QB_SOURCE_RABBITMQ ? "eventTypeFromHeader: true" : "eventTypeHeader");
	return true;
}

/*
 * qbcf_source: one entry of sources: into *s (s->name already set): the
 * type's own keys (its check), then the keys every type shares.
 */
static bool
qbcf_source(QbcfCtx *cx, const char *path, const QbcfNode *node, QbSource *s)
{
	const char *types[QBCF_MAX_TYPES + 1] = {NULL};
	const QbcfSourceType *type;
	char		sub[QBCF_PATHLEN];
	char		echo[64];
	char		forwhat[48];
	char		one[160];
	char		alternatives[128];
	char		empty[224];
	char	   *text = NULL;
	const QbcfNode *m;
	const QbcfNode *n;
	int			t;
	long		v;

	s->consumption = QB_CONSUME_PUSH;
	s->max_body_bytes = 1048576;
	s->auth.tolerance_sec = 300;
	s->prefetch = 100;
	s->batch_size = 100;
	for (t = 0; qbcf_source_types[t] != NULL; t++)
		types[t] = qbcf_source_types[t]->type;
	qbcf_type_words(types, one, sizeof(one), alternatives, sizeof(alternatives));
	snprintf(empty, sizeof(empty),
			 "expected a mapping with at least type: (%s), got an empty value", alternatives);
	if (!qbcf_typed(cx, path, node, types, one, empty,
					"the kind of source: http receives webhooks; rabbitmq, kafka and nats consume a broker",
					&m, &t))
		return false;
	s->type = (QbSourceType) t;
	type = qbcf_source_types[t];
	snprintf(forwhat, sizeof(forwhat), "for a%s %s source",
			 t == QB_SOURCE_HTTP ? "n" : "", type->type);
	if (!qbcf_check_keys(cx, path, m, type->keys, forwhat) ||
		!type->check(cx, path, m, s))
		return false;

	if ((n = qbcf_get(m, "consumption")) != NULL)
	{
		qbcf_path_key(sub, sizeof(sub), path, "consumption");
		if (!qbcf_text(cx, sub, n, "push or pull", &text))
			return false;
		if (strcmp(text, "pull") == 0)
			s->consumption = QB_CONSUME_PULL;
		else if (strcmp(text, "push") != 0)
			return qbcf_error(cx, sub, n, "expected push (the relay forwards the rows) or pull (your workers claim them), got %s",
							  qbcf_echo(cx, echo, sizeof(echo), text));
	}
	v = s->batch_size;
	if (!qbcf_one_of(cx, path, m, "idempotencyKeyPath", "idempotencyKeyHeader") ||
		!qbcf_opt_jsonpath(cx, path, m, "idempotencyKeyPath", &s->idempotency_key_path) ||
		!qbcf_opt_header(cx, path, m, "idempotencyKeyHeader", &s->idempotency_key_header) ||
		!qbcf_one_of(cx, path, m, "eventTypePath", "eventTypeHeader") ||
		!qbcf_one_of(cx, path, m, "eventTypePath", "eventTypeFromHeader") ||
		!qbcf_opt_jsonpath(cx, path, m, "eventTypePath", &s->event_type_path) ||
		!qbcf_opt_header(cx, path, m, "eventTypeHeader", &s->event_type_header) ||
		!qbcf_flag(cx, path, m, "eventTypeFromHeader", &s->event_type_from_header) ||
		!qbcf_opt_jsonpath(cx, path, m, "aggregateIdPath", &s->aggregate_id_path) ||
		!qbcf_opt_int(cx, path, m, "maxBodyBytes", 1, 67108864, &s->max_body_bytes) ||
		!qbcf_opt_int(cx, path, m, "batchSize", 1, 10000, &v) ||
		!qbcf_transform(cx, path, m, &s->transform))
		return false;
	s->batch_size = (int) v;
	s->on_dead = QB_ON_DEAD_RELEASE;
	if (!qbcf_on_dead(cx, path, m, "aggregate", &s->on_dead))
		return false;
	if (s->type == QB_SOURCE_HTTP && s->idempotency_key_path == NULL &&
		s->idempotency_key_header == NULL)
	{
		/* Standard Webhooks names each message in webhook-id */
		if (s->auth.type != QB_AUTH_STANDARD_WEBHOOKS)
			return qbcf_error(cx, path, m,
							  "missing idempotencyKeyPath or idempotencyKeyHeader: the value that makes a repeat a duplicate, e.g. idempotencyKeyPath: $.id");
		if ((s->idempotency_key_header = qbcf_arena_strdup(cx->arena, "webhook-id")) == NULL)
			return qbcf_error(cx, path, m, "out of memory");
	}
	return qbcf_topic(cx, path, m, s);
}

/* qbcf_sources: the sources: section. */
static bool
qbcf_sources(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg)
{
	char		sub[QBCF_PATHLEN];
	const QbcfNode *m;
	int			i,
				j;

	if (!qbcf_named_section(cx, "sources", node, sizeof(QbSource),
							(void **) &cfg->sources, &cfg->nsources, &m))
		return false;
	for (i = 0; i < cfg->nsources; i++)
	{
		qbcf_path_key(sub, sizeof(sub), "sources", m->keys[i]->text);
		if (!qbcf_name(cx, sub, m->keys[i], "a source", &cfg->sources[i].name) ||
			!qbcf_source(cx, sub, m->kids[i], &cfg->sources[i]))
			return false;
		for (j = 0; j < i; j++)
			if (cfg->sources[i].type == QB_SOURCE_HTTP && cfg->sources[j].type == QB_SOURCE_HTTP &&
				strcmp(cfg->sources[j].path, cfg->sources[i].path) == 0)
			{
				char		at[QBCF_PATHLEN];

				qbcf_path_key(at, sizeof(at), sub, "path");
				return qbcf_error(cx, at, qbcf_get(m->kids[i], "path"),
								  "the same path as source %s: each source needs a path of its own",
								  cfg->sources[j].name);
			}
	}
	return true;
}

/* qbcf_inbox: the inbox: section (basePath, relay). */
static bool
qbcf_inbox(QbcfCtx *cx, const QbcfNode *node, QbInboxConf *in)
{
	const QbcfNode *m;
	const QbcfNode *r;
	const QbcfNode *n;
	char	   *base = NULL;
	size_t		len;
	long		v;

	if (!qbcf_section(cx, "inbox", node, QBCF_MAP, &m))
		return false;
	if (m != NULL && !qbcf_check_keys(cx, "inbox", m, qbcf_keys_inbox, NULL))
		return false;
	if (m != NULL && (n = qbcf_get(m, "basePath")) != NULL)
	{
		if (!qbcf_string(cx, "inbox.basePath", n, false, &base))
			return false;
		if (base[0] != '\0' && !qbcf_url_path(cx, "inbox.basePath", n, base, "basePath: /inbox"))
			return false;
		len = strlen(base);
		while (len > 0 && base[len - 1] == '/')
			base[--len] = '\0';
	}
	else if ((base = qbcf_arena_strdup(cx->arena, "/inbox")) == NULL)
		return qbcf_error(cx, "inbox", m, "out of memory");
	in->base_path = base;

	if (m == NULL)
		return true;
	if (!qbcf_section(cx, "inbox.relay", qbcf_get(m, "relay"), QBCF_MAP, &r))
		return false;
	if (r == NULL)
		return true;
	if (!qbcf_check_keys(cx, "inbox.relay", r, qbcf_keys_relay, NULL) ||
		!qbcf_flag(cx, "inbox.relay", r, "enabled", &in->relay.enabled))
		return false;
	v = in->relay.poll_interval_ms;
	if (!qbcf_opt_int(cx, "inbox.relay", r, "pollIntervalMs", 10, 3600000, &v))
		return false;
	in->relay.poll_interval_ms = (int) v;
	v = in->relay.batch_size;
	if (!qbcf_opt_int(cx, "inbox.relay", r, "batchSize", 1, 10000, &v))
		return false;
	in->relay.batch_size = (int) v;
	if (!qbcf_opt_int(cx, "inbox.relay", r, "claimTimeoutMs", 1000, 86400000,
					  &in->relay.claim_timeout_ms) ||
		!qbcf_flag(cx, "inbox.relay", r, "takeover", &in->relay.takeover))
		return false;
	v = in->relay.max_attempts;
	if (!qbcf_opt_int(cx, "inbox.relay", r, "maxAttempts", 1, 1000000, &v))
		return false;
	in->relay.max_attempts = (int) v;
	return true;
}

/*
 * qbcf_listen: http.listen into host and port.  A port alone binds loopback:
 * listening on every interface must be asked for (0.0.0.0:8080).
 */
static bool
qbcf_listen(QbcfCtx *cx, const QbcfNode *n, QbHttpConf *h)
{
	static const char what[] =
		"expected host:port with an IP address (127.0.0.1:8080, [::1]:8080, 0.0.0.0:8080 for every interface) or a port alone (8080 listens on 127.0.0.1)";
	unsigned char addr[16];
	char	   *colon;
	char	   *host;
	char	   *end;
	long		port;
	bool		v6 = false;

	if (!qbcf_string(cx, "http.listen", n, true, &h->listen))
		return false;
	host = h->listen;
	if (host[0] == '[')
	{
		if ((end = strchr(host, ']')) == NULL || end[1] != ':')
			return qbcf_error(cx, "http.listen", n, "%s", what);
		host = qbcf_arena_strndup(cx->arena, host + 1, end - host - 1);
		colon = end + 1;
		v6 = true;
	}
	else
	{
		colon = strrchr(host, ':');
		host = qbcf_arena_strndup(cx->arena, host, colon ? (size_t) (colon - host) : 0);
	}
	if (host == NULL)
		return qbcf_error(cx, "http.listen", n, "out of memory");
	h->host = host;
	errno = 0;
	port = strtol(colon ? colon + 1 : h->listen, &end, 10);
	if (errno != 0 || *end != '\0' || end == (colon ? colon + 1 : h->listen) || port < 1 || port > 65535)
		return qbcf_error(cx, "http.listen", n, "%s; the port must be 1 to 65535", what);
	h->port = (int) port;
	if (host[0] == '\0' || strcmp(host, "localhost") == 0)
	{
		if ((h->host = qbcf_arena_strdup(cx->arena, "127.0.0.1")) == NULL)
			return qbcf_error(cx, "http.listen", n, "out of memory");
		return true;
	}
	if (inet_pton(v6 ? AF_INET6 : AF_INET, host, addr) != 1)
		return qbcf_error(cx, "http.listen", n, "%s; %s is not an IP%s address", what,
						  v6 ? "the part in brackets" : "the host", v6 ? "v6" : "v4");
	return true;
}

/* qbcf_http_section: the http: section (the ingress, health, metrics, admin). */
static bool
qbcf_http_section(QbcfCtx *cx, const QbcfNode *node, QbHttpConf *h)
{
	const QbcfNode *m;
	const QbcfNode *n;
	long		v;

	if (!qbcf_section(cx, "http", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qbcf_check_keys(cx, "http", m, qbcf_keys_http_section, NULL))
		return false;
	if ((n = qbcf_get(m, "listen")) != NULL && !qbcf_is_null(n) && !qbcf_listen(cx, n, h))
		return false;
	v = h->max_connections;
	if (!qbcf_opt_int(cx, "http", m, "maxConnections", 1, 10000, &v))
		return false;
	h->max_connections = (int) v;
	return qbcf_opt_int(cx, "http", m, "connectionTimeoutMs", 1000, 3600000,
						&h->connection_timeout_ms) &&
		qbcf_opt_int(cx, "http", m, "storeTimeoutMs", 100, 600000, &h->store_timeout_ms);
}

/* qbcf_admin: the admin: section. */
static bool
qbcf_admin(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg)
{
	const QbcfNode *m;
	const QbcfNode *n;

	if (!qbcf_section(cx, "admin", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qbcf_check_keys(cx, "admin", m, qbcf_keys_admin, NULL))
		return false;
	if ((n = qbcf_get(m, "token")) == NULL || qbcf_is_null(n))
		return true;
	if (!qbcf_string(cx, "admin.token", n, true, &cfg->admin_token))
		return false;
	if (strlen(cfg->admin_token) < 16)
		return qbcf_error(cx, "admin.token", n,
						  "an admin token needs at least 16 characters; generate one with: openssl rand -hex 32");
	return true;
}

/*
 * qbcf_database: the database: section (daemon only).  The url is not
 * required here: the extension needs none, and the daemon checks that it
 * has one.  Credentials and a query (driver options) are allowed in it;
 * no message repeats it, because it holds the password.  A postgres:// URL's
 * hosts are libpq's to read (a list, a Unix-socket directory, none): the
 * daemon checks them with libpq; a sqlserver:// URL has one host.
 */
static bool
qbcf_database(QbcfCtx *cx, const QbcfNode *node, QbDatabaseConf *db)
{
	static const char *const schemes[] = {"postgres", "postgresql", "sqlserver", NULL};
	char		msg[QBCF_MSGLEN];
	const QbcfNode *m;
	const QbcfNode *n;

	if (!qbcf_section(cx, "database", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qbcf_check_keys(cx, "database", m, qbcf_keys_database, NULL))
		return false;
	if (cx->env->daemon_sections_unread)
		return true;			/* the extension's: keys only, nothing expanded */
	if ((n = qbcf_get(m, "url")) != NULL && !qbcf_is_null(n))
	{
		if (!qbcf_string(cx, "database.url", n, true, &db->url))
			return false;
		if (!qb_url_check_scheme(db->url, schemes,
								 QB_URL_USERINFO | QB_URL_QUERY |
								 (strncasecmp(db->url, "sqlserver:", 10) == 0 ? 0 : QB_URL_ANY_AUTHORITY),
								 msg, sizeof(msg)))
			return qbcf_error(cx, "database.url", n, "%s", msg);
	}
	return qbcf_flag(cx, "database", m, "listen", &db->listen) &&
		qbcf_opt_int(cx, "database", m, "statementTimeoutMs", 100, 3600000,
					 &db->statement_timeout_ms) &&
		qbcf_opt_int(cx, "database", m, "connectTimeoutMs", 1000, 600000,
					 &db->connect_timeout_ms) &&
		qbcf_opt_int(cx, "database", m, "idlePollMaxMs", 10, 3600000, &db->idle_poll_max_ms);
}

/* qbcf_daemon: the daemon: section (daemon only). */
static bool
qbcf_daemon(QbcfCtx *cx, const QbcfNode *node, QbDaemonConf *d)
{
	char		echo[64];
	char	   *format;
	const QbcfNode *m;
	const QbcfNode *n;
	long		v;

	if (!qbcf_section(cx, "daemon", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qbcf_check_keys(cx, "daemon", m, qbcf_keys_daemon, NULL))
		return false;
	if (cx->env->daemon_sections_unread)
		return true;			/* the extension's: keys only, nothing expanded */
	v = d->outbox_workers;
	if (!qbcf_opt_int(cx, "daemon", m, "outboxWorkers", 1, 64, &v) ||
		!qbcf_opt_int(cx, "daemon", m, "shutdownGraceMs", 0, 3600000, &d->shutdown_grace_ms))
		return false;
	d->outbox_workers = (int) v;
	if ((n = qbcf_get(m, "logFormat")) == NULL)
		return true;
	if (!qbcf_text(cx, "daemon.logFormat", n, "text or json", &format))
		return false;
	if (strcmp(format, "json") == 0)
		d->log_json = true;
	else if (strcmp(format, "text") != 0)
		return qbcf_error(cx, "daemon.logFormat", n, "expected text or json, got %s",
						  qbcf_echo(cx, echo, sizeof(echo), format));
	return true;
}

/*
 * qbcf_leases: a request must end before its row's lease does, or the reclaim
 * step hands the row to another worker while the first is still waiting for
 * the answer, and the message goes out twice.
 */
static bool
qbcf_leases(QbcfCtx *cx, const QbcfNode *root, const QbConfig *cfg)
{
	const QbcfNode *dests = root ? qbcf_get(root, "destinations") : NULL;
	const QbcfNode *outbox = root ? qbcf_get(root, "outbox") : NULL;
	int			i;

	for (i = 0; i < cfg->ndestinations; i++)
	{
		const QbDestination *d = &cfg->destinations[i];
		const QbcfNode *dn = dests ? qbcf_get(dests, d->name) : NULL;
		bool		kafka = d->type == QB_DEST_KAFKA;
		/* kafka: the wait is librdkafka's message.timeout.ms, under config: */
		const QbcfNode *cf = kafka && dn ? qbcf_get(dn, "config") : NULL;
		const char *what = kafka ? "config[\"message.timeout.ms\"]" : "timeoutMs";
		const QbcfNode *at = kafka ? (cf && cf->kind == QBCF_MAP ? qbcf_get(cf, "message.timeout.ms") : NULL)
			: dn ? qbcf_get(dn, "timeoutMs") : NULL;
		char		path[QBCF_PATHLEN];

		if ((d->type != QB_DEST_HTTP && !kafka) || d->timeout_ms < cfg->outbox.claim_timeout_ms)
			continue;
		if (at == NULL && outbox != NULL && qbcf_get(outbox, "claimTimeoutMs") != NULL)
		{
			at = qbcf_get(outbox, "claimTimeoutMs");
			snprintf(path, sizeof(path), "outbox.claimTimeoutMs");
		}
		else
		{
			char		parent[QBCF_PATHLEN];

			qbcf_path_key(parent, sizeof(parent), "destinations", d->name);
			if (kafka)
			{
				char		conf[QBCF_PATHLEN];

				qbcf_path_key(conf, sizeof(conf), parent, "config");
				qbcf_path_key(path, sizeof(path), conf, "message.timeout.ms");
			}
			else
				qbcf_path_key(path, sizeof(path), parent, "timeoutMs");
			if (at == NULL)
				at = dn;
		}
		return qbcf_error(cx, path, at,
						  "destination %s waits up to %ld ms for an answer (%s), which is not less than outbox.claimTimeoutMs (%ld ms): the lease would expire mid-request and the row be delivered twice; lower %s or raise claimTimeoutMs",
						  d->name, d->timeout_ms, what, cfg->outbox.claim_timeout_ms, what);
	}
	return true;
}

/*
 * qbcf_egress: the egress: section (daemon only), a list of CIDRs and host
 * names under allow:.  The extension takes its rules from a superuser
 * setting, queuebox.allowed_destinations, and refuses the section: whoever
 * may store a document must not widen them.
 */
static bool
qbcf_egress(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg)
{
	const QbcfNode *m;
	const QbcfNode *list;
	char	   *joined;
	size_t		len = 1;
	char		msg[QBCF_MSGLEN];

	if (!qbcf_section(cx, "egress", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (qb_egress_policy_rules(cx->env->egress) != NULL)
		return qbcf_error(cx, "egress", node,
						  "this host takes its egress rules from %s, not from the document; remove the egress: section",
						  qb_egress_policy_rules(cx->env->egress)->setting);
	if (!qbcf_check_keys(cx, "egress", m, qbcf_keys_egress, NULL))
		return false;
	if ((list = qbcf_get(m, "allow")) == NULL || qbcf_is_null(list))
		return true;
	if (list->kind != QBCF_SEQ)
		return qbcf_error(cx, "egress.allow", list,
						  "expected a list of CIDRs and host names, e.g. [\"10.0.0.0/8\", \"hooks.example.com\"]");
	for (int i = 0; i < list->n; i++)
	{
		char		path[64];

		snprintf(path, sizeof(path), "egress.allow[%d]", i);
		if (list->kids[i]->kind != QBCF_SCALAR)
			return qbcf_error(cx, path, list->kids[i], "expected a CIDR or a host name");
		len += list->kids[i]->len + 1;
	}
	joined = qbcf_arena_alloc(cx->arena, len);
	if (joined == NULL)
		return qbcf_error(cx, "egress.allow", list, "out of memory");
	joined[0] = '\0';
	for (int i = 0; i < list->n; i++)
	{
		strcat(joined, list->kids[i]->text);
		strcat(joined, ",");
	}
	if (!qb_egress_parse(joined, "egress.allow", &cfg->egress, msg, sizeof(msg)))
		return qbcf_error(cx, "egress.allow", list, "%s", msg);
	return true;
}

/*
 * qbcf_egress_check: every destination's hosts against the rules (the
 * document's, else the host's); each destination keeps the document's
 * rules and the host's policy for the checks at connect time.
 */
static bool
qbcf_egress_check(QbcfCtx *cx, QbConfig *cfg)
{
	const QbEgressPolicy *host = cx->env->egress;
	const QbEgress *rules;
	char		why[QBCF_MSGLEN];

	/* the daemon without egress.allow: the default rules, named by its key */
	if (cfg->egress == NULL && qb_egress_policy_rules(host) == NULL &&
		!qb_egress_parse("", "egress.allow", &cfg->egress, why, sizeof(why)))
		return qbcf_error(cx, "egress.allow", NULL, "%s", why);
	rules = qb_egress_in_force(cfg->egress, host);
	for (int i = 0; i < cfg->nsources; i++)
		cfg->sources[i].host_egress = host;
	for (int i = 0; i < cfg->ndestinations; i++)
	{
		QbDestination *d = &cfg->destinations[i];
		const char *hosts = d->type == QB_DEST_HTTP ? d->base_url : d->broker_url;
		char		path[QBCF_MSGLEN];

		d->egress = cfg->egress;
		d->host_egress = host;
		if (hosts == NULL || qb_egress_hosts_ok(rules, hosts, why, sizeof(why)))
			continue;
		snprintf(path, sizeof(path), "destinations.%s.%s", d->name,
				 d->type == QB_DEST_HTTP ? "baseUrl" : d->type == QB_DEST_KAFKA ? "brokers" : "url");
		return qbcf_error(cx, path, NULL, "%s", why);
	}
	/* the span exporter connects too */
	cfg->otlp.egress = cfg->egress;
	cfg->otlp.host_egress = host;
	if (cfg->otlp.url != NULL && !qb_egress_hosts_ok(rules, cfg->otlp.url, why, sizeof(why)))
		return qbcf_error(cx, "telemetry.otlp.endpoint", NULL, "%s", why);
	return true;
}

/* qbcf_document: the whole tree into cfg, which holds the defaults. */
bool
qbcf_document(QbcfCtx *cx, const QbcfNode *root, QbConfig *cfg)
{
	if (qbcf_is_null(root))
		return qbcf_inbox(cx, NULL, &cfg->inbox);
	if (root->kind != QBCF_MAP)
	{
		char		keys[256];

		qbcf_list(keys, sizeof(keys), qbcf_keys_top, " and ");
		snprintf(cx->err, cx->errlen,
				 "the document must be a mapping with the keys %s, got %s (line %d, column %d)",
				 keys, qbcf_kind_name(root), root->line, root->column);
		return false;
	}
	return qbcf_check_keys(cx, "", root, qbcf_keys_top, NULL) &&
		qbcf_outbox(cx, qbcf_get(root, "outbox"), &cfg->outbox) &&
		qbcf_destinations(cx, qbcf_get(root, "destinations"), cfg) &&
		qbcf_routes(cx, qbcf_get(root, "routes"), cfg) &&
		qbcf_leases(cx, root, cfg) &&
		qbcf_sources(cx, qbcf_get(root, "sources"), cfg) &&
		qbcf_inbox(cx, qbcf_get(root, "inbox"), &cfg->inbox) &&
		qbcf_http_section(cx, qbcf_get(root, "http"), &cfg->http) &&
		qbcf_admin(cx, qbcf_get(root, "admin"), cfg) &&
		qbcf_database(cx, qbcf_get(root, "database"), &cfg->database) &&
		qbcf_daemon(cx, qbcf_get(root, "daemon"), &cfg->daemon) &&
		qbcf_egress(cx, qbcf_get(root, "egress"), cfg) &&
		qbcf_telemetry(cx, qbcf_get(root, "telemetry"), cfg) &&
		qbcf_egress_check(cx, cfg);
}
