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
#include "qb_ops.h"
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

QB_OPS_LISTED(QbdBackend, 1, QBD_BACKEND_OPS, QB_OPS_NONE);

/* qbd_backend_check_one: see qbd_backend.h. */
int
qbd_backend_check_one(const QbdBackend *be, char *err, size_t errlen)
{
	static const QbOpsField fields[] = {QBD_BACKEND_OPS(QB_OPS_FIELD, QbdBackend)};

	if (be->name == NULL)
	{
		snprintf(err, errlen, "backend ops '(unnamed)' lacks 'name'");
		return -1;
	}
	return qb_ops_check("backend ops", be->name, be, fields, sizeof(fields) / sizeof(fields[0]),
						err, errlen);
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
