/*-------------------------------------------------------------------------
 * qb_answer.c
 *	  The JSON body of every answer the HTTP routes give (ingress, admin).
 *
 * jansson: never call json_object() here: the postgres executable exports
 * a json_object symbol (the SQL function), which wins over jansson's inside
 * a backend; json_pack("{}") makes an empty object.
 *-------------------------------------------------------------------------
 */
#include <jansson.h>

#include "qb_answer.h"

char *
qb_answer(const char *status, const char *reason)
{
	json_t	   *o = json_pack("{}");
	char	   *text;

	json_object_set_new(o, "status", json_string(status));
	if (reason != NULL)
	{
		json_t	   *r = json_string(reason);

		/* a reason quoting bad input may not be UTF-8: say so plainly */
		json_object_set_new(o, "reason", r ? r : json_string("(reason not printable)"));
	}
	text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return text;
}
