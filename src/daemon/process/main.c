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

/* what the command line asks for */
typedef enum QbdMode
{
	QBD_MODE_RUN,
	QBD_MODE_CHECK,
	QBD_MODE_MIGRATE
} QbdMode;

/*
 * qbd_args: the command line into opt and *mode.  -1 to go on, or the
 * exit status: 0 after --version or --help, 2 for a wrong command line.
 */
static int
qbd_args(int argc, char **argv, QbdOptions *opt, QbdMode *mode)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"check", no_argument, NULL, 't'},
		{"migrate", no_argument, NULL, 'm'},
		{"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0}
	};
	bool		check = false;
	bool		migrate = false;
	int			c;

	while ((c = getopt_long(argc, argv, "c:tVh", opts, NULL)) != -1)
	{
		switch (c)
		{
			case 'c':
				opt->config_path = optarg;
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
	if (optind < argc || opt->config_path == NULL || (check && migrate))
	{
		if (optind < argc)
			fprintf(stderr, "queuebox-mssqld: unexpected argument \"%s\"\n", argv[optind]);
		else if (opt->config_path == NULL)
			fprintf(stderr, "queuebox-mssqld: --config FILE is required\n");
		else
			fprintf(stderr, "queuebox-mssqld: --check and --migrate do not go together\n");
		qbd_usage(stderr);
		return 2;
	}
	*mode = check ? QBD_MODE_CHECK : migrate ? QBD_MODE_MIGRATE : QBD_MODE_RUN;
	return -1;
}

/* qbd_say_valid: --check's answer for a valid file (safe: the redacted database.url) */
static void
qbd_say_valid(const char *path, const QbConfig *cfg, const char *safe)
{
	printf("queuebox-mssqld: configuration file %s is valid: %d destination%s, %d route%s, %d source%s "
		   "(%d broker source%s), %d outbox worker%s; database %s\n",
		   path, cfg->ndestinations, cfg->ndestinations == 1 ? "" : "s",
		   cfg->nroutes, cfg->nroutes == 1 ? "" : "s", cfg->nsources, cfg->nsources == 1 ? "" : "s",
		   qb_config_broker_sources(cfg), qb_config_broker_sources(cfg) == 1 ? "" : "s",
		   cfg->daemon.outbox_workers, cfg->daemon.outbox_workers == 1 ? "" : "s", safe);
}

/* qbd_migrate_now: --migrate; the exit status */
static int
qbd_migrate_now(const QbConfig *cfg, const char *safe)
{
	char		err[QB_ERRLEN];
	int			rc = qbd_migrate_only(cfg, err, sizeof(err));

	/* err says what failed and what to do (the backend's migrate and connect) */
	if (rc != 0)
		fprintf(stderr, "queuebox-mssqld: %s\n", err);
	else
		printf("queuebox-mssqld: schema queuebox in %s is at version %s\n", safe, qbd_schema_version);
	return rc == 0 ? 0 : 1;
}

int
main(int argc, char **argv)
{
	QbdOptions	opt = {0};
	QbdMode		mode = QBD_MODE_RUN;
	char		err[QB_ERRLEN];
	char		safe[512];
	char	   *text = NULL;
	QbConfig   *cfg = NULL;
	int			rc;

	/* before getopt: a process title is later written where argv was */
	argv = qbd_ps_init(argc, argv);
	/* an ops table or the engine table with a hole is this build's fault: say which, before any work */
	if (qbd_backend_check(err, sizeof(err)) != 0 || qb_engines_check(err, sizeof(err)) != 0)
	{
		fprintf(stderr, "queuebox-mssqld: %s: this build is broken\n", err);
		return 1;
	}
	if ((rc = qbd_args(argc, argv, &opt, &mode)) >= 0)
		return rc;

	if (qbd_config_read(opt.config_path, &text, &cfg, err, sizeof(err)) != 0)
	{
		fprintf(stderr, "queuebox-mssqld: %s%s\n", mode == QBD_MODE_CHECK ? "configuration test failed: " : "",
				err);
		return 1;
	}
	qbd_redact_url(cfg->database.url, safe, sizeof(safe));
	if (mode == QBD_MODE_RUN)
		return qbd_supervise(&opt, text, cfg);
	if (mode == QBD_MODE_CHECK)
	{
		qbd_say_valid(opt.config_path, cfg, safe);
		rc = 0;
	}
	else
		rc = qbd_migrate_now(cfg, safe);
	qb_config_free(cfg);
	free(text);
	return rc;
}
