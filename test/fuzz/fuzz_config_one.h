/*-------------------------------------------------------------------------
 * fuzz_config_one.h
 *	  One document through qb_config_parse and the checks of what comes
 *	  back, for fuzz_config and fuzz_config_env.
 *
 * What must hold: 0 with a config or -1 with NULL and a message (never
 * empty, NUL-terminated); an accepted config is whole: every route names a
 * destination that exists, every webhook source's path starts with '/', the inbox has
 * a base path; routing and qb_config_free work on it.
 *-------------------------------------------------------------------------
 */
#ifndef QB_FUZZ_CONFIG_ONE_H
#define QB_FUZZ_CONFIG_ONE_H

#include <sys/stat.h>

#include "fuzz_common.h"
#include "qb_config.h"
#include "qb_route.h"

/* the variable ${QBF_SECRET} in a document expands to */
#define QBF_SECRET "fz-secret-9f3k"
/*
 * ${file:/tmp/qbf-secrets/token} reads QBF_FILE_SECRET: the only directory
 * file references may read (the extension's policy), so that no input reads
 * another file of the machine
 */
#define QBF_FILE_DIR "/tmp/qbf-secrets"
#define QBF_FILE_SECRET "fz-file-secret-7q2w"

static inline void
qbf_config_env_init(void)
{
	extern char **environ;

	/* the fuzzer's overrides are the only QUEUEBOX_* variables */
	for (int again = 1; again;)
	{
		again = 0;
		for (char **e = environ; e != NULL && *e != NULL; e++)
			if (strncmp(*e, "QUEUEBOX_", 9) == 0)
			{
				char		name[256];
				const char *eq = strchr(*e, '=');
				size_t		n = eq ? (size_t) (eq - *e) : strlen(*e);

				snprintf(name, sizeof(name), "%.*s", (int) n, *e);
				unsetenv(name);
				again = 1;
				break;
			}
	}
	setenv("QBF_SECRET", QBF_SECRET, 1);
	{
		FILE	   *f;

		mkdir(QBF_FILE_DIR, 0700);
		if ((f = fopen(QBF_FILE_DIR "/token", "w")) != NULL)
		{
			fputs(QBF_FILE_SECRET "\n", f);
			fclose(f);
		}
		setenv("QBF_FILE_DIR", QBF_FILE_DIR, 1);
	}
	setenv("QBF_NUMBER", "42", 1);
	setenv("QBF_URL", "http://user:pw@example.com:8080", 1);
}

/*
 * the whole input of the harness, when it holds more than the document
 * (fuzz_config_env's override lines): a secret's text the input itself
 * holds may come back in a message (a key or a value named as written)
 */
static const char *qbf_raw = NULL;
static size_t qbf_raw_len = 0;

/* qbf_holds: the len bytes at text (NULs included) hold s */
static inline bool
qbf_holds(const char *text, size_t len, const char *s)
{
	size_t		n = strlen(s);

	for (size_t i = 0; i + n <= len; i++)
		if (memcmp(text + i, s, n) == 0)
			return true;
	return false;
}

static inline void
qbf_config_one(const char *text, size_t len)
{
	/* the extension's secret files: the one the set-up writes */
	const QbConfigEnv env = {.file_dirs = QBF_FILE_DIR, .file_setting = "queuebox.secret_file_dirs"};
	QbConfig   *cfg = (QbConfig *) 0x1;
	char		err[QB_ERRLEN];
	int			rc;

	memset(err, 'x', sizeof(err));
	rc = qb_config_parse(text, len, &env, &cfg, err, sizeof(err));
	if (rc != 0)
	{
		if (rc != -1 || cfg != NULL)
			qbf_fail("qb_config_parse returned %d with config %p", rc, (void *) cfg);
		qbf_err_ok(err, sizeof(err), "qb_config_parse");
		/* (unless the document itself holds the text: a key is named as written) */
		if (strstr(err, QBF_FILE_SECRET) != NULL &&
			!qbf_holds(text, len, QBF_FILE_SECRET) &&
			!(qbf_raw != NULL && qbf_holds(qbf_raw, qbf_raw_len, QBF_FILE_SECRET)))
			qbf_fail("qb_config_parse repeats a secret file's content: %s", err);
		if (err[0] == '\0')
			qbf_fail("qb_config_parse refused the document with an empty message");
		return;
	}
	if (cfg == NULL || cfg == (QbConfig *) 0x1)
		qbf_fail("qb_config_parse returned 0 without a config");
	if (cfg->inbox.base_path == NULL)
		qbf_fail("accepted config without inbox.basePath");
	for (int i = 0; i < cfg->nroutes; i++)
	{
		const QbRoute *r = &cfg->routes[i];

		if (r->dest_index < 0 || r->dest_index >= cfg->ndestinations ||
			strcmp(cfg->destinations[r->dest_index].name, r->destination) != 0)
			qbf_fail("routes[%d] names destination %d of %d", i, r->dest_index, cfg->ndestinations);
		if (qb_config_destination(cfg, r->destination) == NULL)
			qbf_fail("routes[%d]: destination not found by name", i);
		(void) qb_config_route_find(cfg, r->topic_pattern);
	}
	for (int i = 0; i < cfg->nsources; i++)
	{
		const QbSource *s = &cfg->sources[i];

		if (s->type == QB_SOURCE_HTTP && (s->path == NULL || s->path[0] != '/'))
			qbf_fail("sources[%d] path %s", i, s->path ? s->path : "(null)");
		if (qb_config_source(cfg, s->name) == NULL)
			qbf_fail("sources[%d]: not found by name", i);
	}
	(void) qb_config_route_find(cfg, "orders.eu.created");
	(void) qb_config_broker_sources(cfg);
	(void) qb_config_relay_max_attempts(cfg);
	qb_config_free(cfg);
}

#endif							/* QB_FUZZ_CONFIG_ONE_H */
