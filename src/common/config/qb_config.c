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

/* qb_config_defaults: see qb_config.h; the table of defaults is there. */
void
qb_config_defaults(QbConfig *out)
{
	memset(out, 0, sizeof(QbConfig));
	out->outbox.poll_interval_ms = 500;
	out->outbox.batch_size = 100;
	out->outbox.max_attempts = 10;
	out->outbox.claim_timeout_ms = 300000;
	out->outbox.backoff.initial_ms = 1000;
	out->outbox.backoff.max_ms = 3600000;
	out->outbox.backoff.multiplier = 2.0;
	out->outbox.backoff.jitter = 0.2;
	out->outbox.retention_sec = 7L * 86400L;
	out->inbox.relay.enabled = true;
	out->inbox.relay.poll_interval_ms = 100;
	out->inbox.relay.batch_size = 100;
	out->inbox.relay.claim_timeout_ms = 300000;
	out->http.max_connections = 256;
	out->http.connection_timeout_ms = 10000;
	out->http.store_timeout_ms = 5000;
}

/* qb_config_parse: load, override, validate; see qb_config.h. */
int
qb_config_parse(const char *text, size_t len, QbConfig **out, char *err,
				size_t errlen)
{
	QbcfNode	   *root = NULL;
	QbConfig   *cfg = NULL;
	QbcfCtx		cx = {err, errlen};

	*out = NULL;
	if (errlen > 0)
		err[0] = '\0';
	if (qbcf_load(text ? text : "", text ? len : 0, &root, err, errlen) != 0)
		goto fail;
	if (qbcf_overrides(&root, err, errlen) != 0)
		goto fail;
	if ((cfg = malloc(sizeof(QbConfig))) == NULL)
	{
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	qb_config_defaults(cfg);
	if (!qbcf_document(&cx, root, cfg))
		goto fail;
	qbcf_node_free(root);
	*out = cfg;
	return 0;

fail:
	qbcf_node_free(root);
	qb_config_free(cfg);
	return -1;
}

/* qbcf_pairs_free: a headers or props array and its strings. */
static void
qbcf_pairs_free(QbHeader *pairs, int n)
{
	int			i;

	for (i = 0; pairs != NULL && i < n; i++)
	{
		free(pairs[i].name);
		free(pairs[i].value);
	}
	free(pairs);
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

/* qb_config_free: also takes a half-built config (the parser's error path). */
void
qb_config_free(QbConfig *cfg)
{
	int			i;

	if (cfg == NULL)
		return;
	for (i = 0; cfg->destinations != NULL && i < cfg->ndestinations; i++)
	{
		QbDestination *d = &cfg->destinations[i];

		free(d->name);
		free(d->base_url);
		free(d->path);
		free(d->url);
		qbcf_pairs_free(d->headers, d->nheaders);
		qb_signing_free(&d->signing);
		free(d->broker_url);
		free(d->target);
		free(d->routing_key);
		qbcf_pairs_free(d->props, d->nprops);
		qb_transform_free(d->transform);
	}
	free(cfg->destinations);
	for (i = 0; cfg->routes != NULL && i < cfg->nroutes; i++)
	{
		free(cfg->routes[i].topic_pattern);
		free(cfg->routes[i].destination);
		qb_transform_free(cfg->routes[i].transform);
	}
	free(cfg->routes);
	for (i = 0; cfg->sources != NULL && i < cfg->nsources; i++)
	{
		QbSource   *src = &cfg->sources[i];

		free(src->name);
		free(src->path);
		free(src->idempotency_key_path);
		free(src->idempotency_key_header);
		free(src->event_type_path);
		free(src->event_type_header);
		free(src->aggregate_id_path);
		free(src->topic);
		free(src->broker_url);
		free(src->queue);
		for (int k = 0; src->topics != NULL && k < src->ntopics; k++)
			free(src->topics[k]);
		free(src->topics);
		free(src->group);
		qbcf_pairs_free(src->props, src->nprops);
		free(src->subject);
		free(src->stream);
		free(src->durable);
		for (int k = 0; src->auth.secrets != NULL && k < src->auth.nsecrets; k++)
			free((char *) src->auth.secrets[k]);
		free((char **) src->auth.secrets);
		free((char *) src->auth.header);
		free((char *) src->auth.prefix);
		free((char *) src->auth.token);
		qb_transform_free(src->transform);
	}
	free(cfg->sources);
	free(cfg->inbox.base_path);
	free(cfg->http.listen);
	free(cfg->http.host);
	free(cfg->admin_token);
	free(cfg);
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
	if ((int) t < 0 || (int) t > QB_DEST_NATS || qbcf_dest_types[t] == NULL)
		return "unknown";
	return qbcf_dest_types[t]->type;
}
