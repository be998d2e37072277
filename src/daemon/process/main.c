/*-------------------------------------------------------------------------
 * main.c
 *	  queuebox-mssqld's command line.
 *
 *	queuebox-mssqld --config FILE			run: the supervisor and its roles
 *	queuebox-mssqld --config FILE --check	validate the file and exit (nginx -t)
 *	queuebox-mssqld --config FILE --migrate	create or upgrade the schema and exit
 *	queuebox-mssqld --version
 *
 * Exit status: 0 when done (or stopped by SIGTERM), 1 for a configuration
 * or database error (the message says which key or what to do), 2 for a
 * wrong command line.
 *-------------------------------------------------------------------------
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qb_engines.h"
#include "qbd.h"
#include "qbd_backend.h"
#include "supervisor.h"

static void
qbd_usage(FILE *f)
{
	fprintf(f,
			"Usage: queuebox-mssqld --config FILE [--check | --migrate]\n"
			"       queuebox-mssqld --version\n"
			"\n"
			"  -c, --config FILE  the YAML configuration (docs/configuration.md, docs/daemon.md)\n"
			"  -t, --check        validate the file, print what it configures, and exit\n"
			"      --migrate      create or upgrade the schema in database.url, and exit\n"
			"  -V, --version      print the version and exit\n");
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"check", no_argument, NULL, 't'},
		{"migrate", no_argument, NULL, 'm'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}
	};
	QbdOptions	opt = {0};
	bool		check = false;
	bool		migrate = false;
	char		err[QB_ERRLEN];
	char		safe[512];
	char	   *text = NULL;
	QbConfig   *cfg = NULL;
	int			c;

	/* before getopt: a process title is later written where argv was */
	argv = qbd_ps_init(argc, argv);
	/* an ops table or the engine table with a hole is this build's fault: say which, before any work */
	if (qbd_backend_check(err, sizeof(err)) != 0 || qb_engines_check(err, sizeof(err)) != 0)
	{
		fprintf(stderr, "queuebox-mssqld: %s: this build is broken\n", err);
		return 1;
	}
	while ((c = getopt_long(argc, argv, "c:tVh", opts, NULL)) != -1)
	{
		switch (c)
		{
			case 'c':
				opt.config_path = optarg;
				break;
			case 't':
				check = true;
				break;
			case 'm':
				migrate = true;
				break;
			case 'V':
				printf("queuebox-mssqld %s (schema %s)\n", QB_VERSION, qbd_schema_version);
				return 0;
			case 'h':
				qbd_usage(stdout);
				return 0;
			default:
				qbd_usage(stderr);
				return 2;
		}
	}
	if (optind < argc || opt.config_path == NULL || (check && migrate))
	{
		if (optind < argc)
			fprintf(stderr, "queuebox-mssqld: unexpected argument \"%s\"\n", argv[optind]);
		else if (opt.config_path == NULL)
			fprintf(stderr, "queuebox-mssqld: --config FILE is required\n");
		else
			fprintf(stderr, "queuebox-mssqld: --check and --migrate do not go together\n");
		qbd_usage(stderr);
		return 2;
	}

	if (qbd_config_read(opt.config_path, &text, &cfg, err, sizeof(err)) != 0)
	{
		fprintf(stderr, "queuebox-mssqld: %s%s\n", check ? "configuration test failed: " : "", err);
		return 1;
	}
	qbd_redact_url(cfg->database.url, safe, sizeof(safe));
	if (check)
	{
		printf("queuebox-mssqld: configuration file %s is valid: %d destination%s, %d route%s, %d source%s "
			   "(%d broker source%s), %d outbox worker%s; database %s\n",
			   opt.config_path, cfg->ndestinations, cfg->ndestinations == 1 ? "" : "s",
			   cfg->nroutes, cfg->nroutes == 1 ? "" : "s", cfg->nsources, cfg->nsources == 1 ? "" : "s",
			   qb_config_broker_sources(cfg), qb_config_broker_sources(cfg) == 1 ? "" : "s",
			   cfg->daemon.outbox_workers, cfg->daemon.outbox_workers == 1 ? "" : "s", safe);
		qb_config_free(cfg);
		free(text);
		return 0;
	}
	if (migrate)
	{
		int			rc = qbd_migrate_only(cfg, err, sizeof(err));

		/* err says what failed and what to do (the backend's migrate and connect) */
		if (rc != 0)
			fprintf(stderr, "queuebox-mssqld: %s\n", err);
		else
			printf("queuebox-mssqld: schema queuebox in %s is at version %s\n", safe, qbd_schema_version);
		qb_config_free(cfg);
		free(text);
		return rc == 0 ? 0 : 1;
	}
	return qbd_supervise(&opt, text, cfg);
}
