/*-------------------------------------------------------------------------
 * backend.c
 *	  The daemon's backends: which one serves a URL, and that each ops
 *	  table is complete.
 *
 * The scheme of database.url is read here and nowhere else: sqlserver://
 * is SQL Server (the ODBC store); anything else is for libpq, which takes
 * a postgres:// or postgresql:// URI or a key=value conninfo.
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <string.h>

#include "odbc_store.h"
#include "pq_store.h"
#include "qbd_backend.h"

/* every backend, for qbd_backend_check */
static const QbdBackend *const qbd_backends[] = {
	&qbd_backend_postgresql,
	&qbd_backend_sqlserver,
};

/* qbd_backend_for: see qbd_backend.h. */
const QbdBackend *
qbd_backend_for(const char *url)
{
	if (url != NULL && strncmp(url, "sqlserver://", 12) == 0)
		return &qbd_backend_sqlserver;
	return &qbd_backend_postgresql;
}

/* qbd_backend_check_one: see qbd_backend.h. */
int
qbd_backend_check_one(const QbdBackend *be, char *err, size_t errlen)
{
	const char *missing = be->name == NULL ? "name" : NULL;

#define QBD_CHECK_OP(f) if (missing == NULL && be->f == NULL) missing = #f;
	QBD_BACKEND_OPS(QBD_CHECK_OP)
#undef QBD_CHECK_OP
	if (missing == NULL)
		return 0;
	snprintf(err, errlen, "the %s backend's ops table has no %s: this build of queuebox-mssqld is broken",
			 be->name ? be->name : "(unnamed)", missing);
	return -1;
}

/* qbd_backend_check: see qbd_backend.h. */
int
qbd_backend_check(char *err, size_t errlen)
{
	for (size_t i = 0; i < sizeof(qbd_backends) / sizeof(qbd_backends[0]); i++)
		if (qbd_backend_check_one(qbd_backends[i], err, errlen) != 0)
			return -1;
	return 0;
}

/* a function field added to QbdBackend but not to QBD_BACKEND_OPS would go unchecked */
#define QBD_COUNT_OP(f) + 1
_Static_assert(sizeof(QbdBackend) == sizeof(const char *) + (0 QBD_BACKEND_OPS(QBD_COUNT_OP)) * sizeof(void (*) (void)),
			   "QBD_BACKEND_OPS lists every function field of QbdBackend");
#undef QBD_COUNT_OP
