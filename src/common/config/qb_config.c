/*-------------------------------------------------------------------------
 * qb_config.c
 *	  Load, override and validate a configuration document: the entry point
 *	  of the qb_config_* family (the files are listed in qb_config_int.h),
 *	  the defaults, the free and the lookups.
 *
 * A document goes through three steps, so that a value from the document
 * and a value from an override meet exactly one validator:
 *
 *	1. load	  libyaml's event stream becomes a tree of nodes (mapping,
 *			  sequence, scalar), each with the 1-based line and column where
 *			  it starts.  Scalars are kept raw: ${NAME} is not expanded yet.
 *			  (qb_config_tree.c)
 *	2. override  QUEUEBOX_* variables replace or add scalar nodes in the tree
 *			  (qb_config_override.c, whose banner has the rules).
 *	3. validate  the tree is checked key by key into a QbConfig.  Each scalar
 *			  of the document is expanded (qb_expand_env) when it is read,
 *			  then type-checked; an override's value is taken as it is.
 *			  (qb_config_check.c, qb_config_value.c and one file per type)
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_config_int.h"
#include "qb_route.h"

/* qb_config_defaults: see qb_config.h; the table of defaults is there. */
void
qb_config_defaults(QbConfig *out)
{
	memset(out, 0, sizeof(QbConfig));
	out->outbox.poll_interval_ms = 500;
	out->outbox.batch_size = 100;
	out->outbox.max_attempts = 10;
	out->outbox.claim_timeout_ms = 300000;
	out->outbox.takeover = true;
	out->outbox.backoff.initial_ms = 1000;
	out->outbox.backoff.max_ms = 3600000;
	out->outbox.backoff.multiplier = 2.0;
	out->outbox.backoff.jitter = 0.2;
	out->outbox.retention_sec = 7L * 86400L;
	out->inbox.relay.enabled = true;
	out->inbox.relay.poll_interval_ms = 100;
	out->inbox.relay.batch_size = 100;
	out->inbox.relay.claim_timeout_ms = 300000;
	out->inbox.relay.takeover = true;
	out->http.max_connections = 256;
	out->http.connection_timeout_ms = 10000;
	out->http.store_timeout_ms = 5000;
	out->database.listen = false;
	out->database.statement_timeout_ms = 30000;
	out->database.connect_timeout_ms = 10000;
	out->database.idle_poll_max_ms = 2000;
	out->daemon.outbox_workers = 2;
	out->daemon.shutdown_grace_ms = 10000;
	out->daemon.log_json = false;
	out->otlp.service_name = "queuebox";
	out->otlp.timeout_ms = 10000;
	out->otlp.queue_size = 2048;
	out->otlp.batch_size = 512;
	out->otlp.flush_interval_ms = 1000;
}

/* qbcf_env_default: see qb_config_int.h. */
const QbConfigEnv qbcf_env_default = {0};

/*
 * qb_config_parse: load, override, validate; see qb_config.h.  The tree
 * lives in a scratch arena freed here; the config in its own.
 */
int
qb_config_parse(const char *text, size_t len, const QbConfigEnv *env, QbConfig **out,
				char *err, size_t errlen)
{
	QbcfArena  *scratch = qbcf_arena_new();
	QbcfArena  *arena = qbcf_arena_new();
	QbcfNode   *root = NULL;
	QbConfig   *cfg = NULL;
	QbcfCtx		cx = {arena, err, errlen, NULL, env != NULL ? env : &qbcf_env_default};

	*out = NULL;
	if (errlen > 0)
		err[0] = '\0';
	if (scratch == NULL || arena == NULL ||
		(cfg = qbcf_arena_alloc(arena, sizeof(QbConfig))) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	qb_config_defaults(cfg);
	if (qbcf_load(scratch, text ? text : "", text ? len : 0, &root, err, errlen) != 0 ||
		qbcf_overrides(scratch, &root, err, errlen) != 0)
		goto fail;
	cfg->arena = arena;
	if (!qbcf_document(&cx, root, cfg))
		goto fail;
	cfg->reads_files = cx.file_values != NULL;
	qbcf_arena_free(scratch);
	*out = cfg;
	return 0;

fail:
	if (cfg != NULL)
		qb_egress_free(cfg->egress);	/* malloc'd: the egress rules outlive no arena */
	qbcf_arena_free(scratch);
	qbcf_arena_free(arena);
	return -1;
}

/* qb_config_broker_sources: see qb_config.h. */
int
qb_config_broker_sources(const QbConfig *cfg)
{
	int			n = 0;

	for (int i = 0; cfg != NULL && i < cfg->nsources; i++)
		n += cfg->sources[i].type != QB_SOURCE_HTTP;
	return n;
}

/*
 * qb_config_free: the arena, and with it everything the config holds; the
 * handles it owns (compiled jq transforms, the only ones: qbcf_transform)
 * are released first.  NULL is fine.
 */
void
qb_config_free(QbConfig *cfg)
{
	if (cfg != NULL)
	{
		qb_egress_free(cfg->egress);
		qbcf_arena_free(cfg->arena);
	}
}

/* qb_config_destination: see qb_config.h. */
const QbDestination *
qb_config_destination(const QbConfig *cfg, const char *name)
{
	int			i;

	for (i = 0; cfg != NULL && i < cfg->ndestinations; i++)
		if (strcmp(cfg->destinations[i].name, name) == 0)
			return &cfg->destinations[i];
	return NULL;
}

/* qb_config_source: see qb_config.h. */
const QbSource *
qb_config_source(const QbConfig *cfg, const char *name)
{
	int			i;

	for (i = 0; cfg != NULL && i < cfg->nsources; i++)
		if (strcmp(cfg->sources[i].name, name) == 0)
			return &cfg->sources[i];
	return NULL;
}

/* qb_config_route_find: see qb_config.h.  Routes are few; a linear scan is enough. */
int
qb_config_route_find(const QbConfig *cfg, const char *topic)
{
	int			i;

	for (i = 0; cfg != NULL && i < cfg->nroutes; i++)
		if (qb_topic_match(cfg->routes[i].topic_pattern, topic))
			return i;
	return -1;
}

/* qb_config_relay_max_attempts: inbox.relay.maxAttempts, else outbox.maxAttempts. */
int
qb_config_relay_max_attempts(const QbConfig *cfg)
{
	return cfg->inbox.relay.max_attempts > 0 ? cfg->inbox.relay.max_attempts
		: cfg->outbox.max_attempts;
}

/* qb_dest_type_name: the type as written in the document. */
const char *
qb_dest_type_name(QbDestType t)
{
	for (int i = 0; qbcf_dest_types[i] != NULL; i++)
		if (i == (int) t)
			return qbcf_dest_types[i]->type;
	return "unknown";
}
