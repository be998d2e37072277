/*-------------------------------------------------------------------------
 * qb_config_telemetry.c
 *	  Validate: the telemetry: section, where spans are exported
 *	  (telemetry.otlp, qb_otlp.h).  Both hosts read it.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <string.h>

#include "qb_config_int.h"

static const char *const qbcf_keys_telemetry[] = {"otlp", NULL};
static const char *const qbcf_keys_otlp[] =
{"endpoint", "headers", "serviceName", "timeoutMs", "queueSize", "batchSize", "flushIntervalMs", NULL};

/*
 * qbcf_otlp_url: the traces URL of an endpoint: as given when it has a
 * path, else with /v1/traces (what OTEL_EXPORTER_OTLP_ENDPOINT means).
 */
static bool
qbcf_otlp_url(QbcfCtx *cx, const QbcfNode *n, const char *endpoint, char **url)
{
	static const char *const http[] = {"http", "https", NULL};
	char		msg[QBCF_MSGLEN];
	QbUrl		u;
	bool		has_path;
	size_t		len = strlen(endpoint);

	if (!qb_url_read(endpoint, http, 0, &u, msg, sizeof(msg)))
		return qbcf_error(cx, "telemetry.otlp.endpoint", n,
						  "%s; e.g. http://otel-collector:4318 (OTLP over HTTP)", msg);
	has_path = strcmp(u.path, "/") != 0;
	qb_url_free(&u);
	if (has_path)
	{
		*url = qbcf_arena_strdup(cx->arena, endpoint);
		return *url != NULL || qbcf_error(cx, "telemetry.otlp.endpoint", n, "out of memory");
	}
	if (endpoint[len - 1] == '/')
		len--;					/* "http://h:4318/" */
	if ((*url = qbcf_arena_alloc(cx->arena, len + sizeof("/v1/traces"))) == NULL)
		return qbcf_error(cx, "telemetry.otlp.endpoint", n, "out of memory");
	memcpy(*url, endpoint, len);
	strcpy(*url + len, "/v1/traces");
	return true;
}

/* qbcf_telemetry: see qb_config_int.h. */
bool
qbcf_telemetry(QbcfCtx *cx, const QbcfNode *node, QbConfig *cfg)
{
	QbOtlpOptions *o = &cfg->otlp;
	const QbcfNode *m;
	const QbcfNode *om;
	const QbcfNode *n;
	char	   *endpoint = NULL;
	QbHeader   *headers = NULL;
	long		v;

	if (!qbcf_section(cx, "telemetry", node, QBCF_MAP, &m))
		return false;
	if (m == NULL)
		return true;
	if (!qbcf_check_keys(cx, "telemetry", m, qbcf_keys_telemetry, NULL) ||
		!qbcf_section(cx, "telemetry.otlp", qbcf_get(m, "otlp"), QBCF_MAP, &om))
		return false;
	if (om == NULL)
		return true;
	if (!qbcf_check_keys(cx, "telemetry.otlp", om, qbcf_keys_otlp, NULL) ||
		!qbcf_opt_string(cx, "telemetry.otlp", om, "endpoint", true, &endpoint) ||
		!qbcf_opt_string(cx, "telemetry.otlp", om, "serviceName", true, &o->service_name) ||
		!qbcf_opt_int(cx, "telemetry.otlp", om, "timeoutMs", 100, 600000, &o->timeout_ms) ||
		!qbcf_opt_int(cx, "telemetry.otlp", om, "flushIntervalMs", 10, 600000, &o->flush_interval_ms) ||
		!qbcf_pairs(cx, "telemetry.otlp.headers", qbcf_get(om, "headers"), true, &headers, &o->nheaders))
		return false;
	v = o->queue_size;
	if (!qbcf_opt_int(cx, "telemetry.otlp", om, "queueSize", 1, 1000000, &v))
		return false;
	o->queue_size = (int) v;
	v = o->batch_size;
	if (!qbcf_opt_int(cx, "telemetry.otlp", om, "batchSize", 1, 10000, &v))
		return false;
	o->batch_size = (int) v;
	if (o->batch_size > o->queue_size)
		return qbcf_error(cx, "telemetry.otlp.batchSize", qbcf_get(om, "batchSize"),
						  "a batch of %d spans cannot be more than queueSize (%d); lower batchSize or raise queueSize",
						  o->batch_size, o->queue_size);
	if (o->nheaders > 0)
	{
		if ((o->headers = qbcf_arena_alloc(cx->arena, o->nheaders * sizeof(QbOtlpHeader))) == NULL)
			return qbcf_error(cx, "telemetry.otlp.headers", NULL, "out of memory");
		for (int i = 0; i < o->nheaders; i++)
			o->headers[i] = (QbOtlpHeader) {.name = headers[i].name, .value = headers[i].value};
	}
	if (endpoint == NULL)
	{
		/* settings without an endpoint export nothing: say so */
		if (om->n > 0)
			return qbcf_error(cx, "telemetry.otlp.endpoint", om,
							  "required when telemetry.otlp is set: the OTLP/HTTP receiver, e.g. http://otel-collector:4318; remove telemetry.otlp to export no span");
		return true;
	}
	n = qbcf_get(om, "endpoint");
	return qbcf_otlp_url(cx, n, endpoint, &o->url);
}
