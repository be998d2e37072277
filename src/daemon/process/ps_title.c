/*-------------------------------------------------------------------------
 * ps_title.c
 *	  The title each process of the daemon shows in ps and top:
 *	  "queuebox-mssqld: supervisor", "queuebox-mssqld: outbox 0", ...
 *
 * As PostgreSQL's ps_status.c does on Linux: the argv strings and the
 * environment strings after them are one contiguous area of memory, which
 * /proc/<pid>/cmdline shows.  qbd_ps_init moves argv and environ into heap
 * copies before anything reads them; a title is then written over the
 * area, padded with NULs.  The 15-byte comm top shows by default is set
 * apart (prctl(PR_SET_NAME), role.c: "qb outbox 0").
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qbd.h"

extern char **environ;

/* the area a title may use; NULL: titles are off (not contiguous, no memory) */
static char *qbd_ps_area = NULL;
static size_t qbd_ps_size = 0;
/* the moved argv, kept reachable for the process's life (as environ is) */
static char **volatile qbd_ps_argv = NULL;	/* volatile: a store the compiler keeps */

/* qbd_ps_init: see qbd.h. */
char	  **
qbd_ps_init(int argc, char **argv)
{
	char	   *end = NULL;
	char	  **new_argv;
	char	  **new_env;
	int			nenv = 0;

	if (argc <= 0 || argv[0] == NULL)
		return argv;
	/* the area: argv's strings, then environ's, as long as they follow each other */
	for (int i = 0; i < argc; i++)
		if (i == 0 || argv[i] == end + 1)
			end = argv[i] + strlen(argv[i]);
	for (char **e = environ; e != NULL && *e != NULL; e++, nenv++)
		if (*e == end + 1)
			end = *e + strlen(*e);

	new_argv = malloc(sizeof(char *) * (argc + 1));
	new_env = malloc(sizeof(char *) * (nenv + 1));
	if (new_argv == NULL || new_env == NULL)
		goto off;
	for (int i = 0; i < argc; i++)
		if ((new_argv[i] = strdup(argv[i])) == NULL)
			goto off;
	new_argv[argc] = NULL;
	for (int i = 0; i < nenv; i++)
		if ((new_env[i] = strdup(environ[i])) == NULL)
			goto off;
	new_env[nenv] = NULL;
	environ = new_env;
	qbd_ps_argv = new_argv;
	qbd_ps_area = argv[0];
	qbd_ps_size = end - argv[0];	/* the last NUL stays */
	return qbd_ps_argv;

off:
	/* no title, and the copies leak: this runs once, before anything else */
	return argv;
}

/* qbd_ps_set: see qbd.h. */
void
qbd_ps_set(const char *role)
{
	int			n;

	if (qbd_ps_area == NULL || qbd_ps_size < 2)
		return;
	n = snprintf(qbd_ps_area, qbd_ps_size, "queuebox-mssqld: %s", role);
	if (n >= 0 && (size_t) n < qbd_ps_size)
		memset(qbd_ps_area + n, 0, qbd_ps_size - n);
}
