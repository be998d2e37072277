/*-------------------------------------------------------------------------
 * qb_gauges.c
 *	  The /metrics gauges read through the store (qb_gauges.h).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "qb_gauges.h"

/* qbga_names: the configured names (out of memory: none, every slot rendered as it is) */
static void
qbga_names(const QbConfig *cfg, QbGauges *g)
{
	const char **dests = calloc(cfg->ndestinations + 1, sizeof(char *));
	const char **sources = calloc(cfg->nsources + 1, sizeof(char *));
	const QbLimitSpec **limits = calloc(cfg->ndestinations + 1, sizeof(QbLimitSpec *));

	if (dests != NULL && sources != NULL && limits != NULL)
	{
		for (int i = 0; i < cfg->ndestinations; i++)
		{
			dests[i] = cfg->destinations[i].name;
			limits[i] = &cfg->destinations[i].limit;
		}
		g->dest_limits = limits;
		for (int i = 0; i < cfg->nsources; i++)
			sources[i] = cfg->sources[i].name;
		g->ndests = cfg->ndestinations;
		g->dest_names = dests;
		g->nsources = cfg->nsources;
		g->source_names = sources;
	}
	else
	{
		free(dests);
		free(sources);
		free(limits);
	}
}

/* qb_gauges_read: see qb_gauges.h. */
void
qb_gauges_read(const QbStore *store, const QbConfig *cfg, QbGauges *g)
{
	char		err[QB_ERRLEN];
	char	   *text = NULL;
	json_t	   *o;

	memset(g, 0, sizeof(*g));
	g->outbox_pending = g->outbox_processing = g->outbox_oldest_pending_sec = -1;
	g->inbox_pending = g->inbox_processing = g->inbox_oldest_pending_sec = -1;
	qbga_names(cfg, g);
	if (store->query_text(store->ctx, QB_Q_GAUGES, NULL, cfg->http.store_timeout_ms,
						  &text, err, sizeof(err)) != 0 ||
		text == NULL || (o = json_loads(text, 0, NULL)) == NULL)
	{
		free(text);
		return;
	}
	g->database_up = true;
	g->outbox_pending = json_number_value(json_object_get(o, "outbox_pending"));
	g->outbox_processing = json_number_value(json_object_get(o, "outbox_processing"));
	g->outbox_oldest_pending_sec = json_number_value(json_object_get(o, "outbox_oldest"));
	g->inbox_pending = json_number_value(json_object_get(o, "inbox_pending"));
	g->inbox_processing = json_number_value(json_object_get(o, "inbox_processing"));
	g->inbox_oldest_pending_sec = json_number_value(json_object_get(o, "inbox_oldest"));
	if (g->dest_names != NULL &&
		(g->dest_circuits = calloc(g->ndests + 1, sizeof(int))) != NULL)
		for (int i = 0; i < g->ndests; i++)
			g->dest_circuits[i] = qb_circuit_parse(json_string_value(
				json_object_get(json_object_get(o, "circuits"), g->dest_names[i])));
	json_decref(o);
	free(text);
}

void
qb_gauges_free(QbGauges *g)
{
	free(g->dest_circuits);
	free((void *) g->dest_limits);
	free((void *) g->dest_names);
	free((void *) g->source_names);
}
