/*-------------------------------------------------------------------------
 * fuzz_jsonpath.c
 *	  libFuzzer harness: the JSONPath subset of qb_extract.h.
 *
 * Input: the first line is a path, the rest a JSON document (any value).
 * qb_jsonpath_check on the path; qb_jsonpath_get and qb_jsonpath_text on
 * the document when it parses (and on NULL-free documents built from it:
 * the object {"a": doc} and the array [doc], so an index or a key step
 * always has something to walk).
 *
 * What must hold: a path the check refuses names nothing (get and text
 * NULL) and the message is set; text is non-NULL only for a string,
 * integer or boolean get returns, and is that value's text; a string's
 * text is the string itself.
 *-------------------------------------------------------------------------
 */
#include <jansson.h>

#include "fuzz_common.h"
#include "qb_extract.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
qbf_walk(json_t *doc, const char *path, bool valid)
{
	json_t	   *v = qb_jsonpath_get(doc, path);
	char	   *text = qb_jsonpath_text(doc, path);

	if (!valid && (v != NULL || text != NULL))
		qbf_fail("path \"%s\" is refused by qb_jsonpath_check but names a value", path);
	if (text != NULL)
	{
		if (v == NULL)
			qbf_fail("qb_jsonpath_text is set where qb_jsonpath_get is NULL");
		if (json_is_string(v))
		{
			if (strlen(json_string_value(v)) == json_string_length(v) &&
				strcmp(text, json_string_value(v)) != 0)
				qbf_fail("text of a string differs from the string");
		}
		else if (json_is_integer(v))
		{
			char		buf[32];

			snprintf(buf, sizeof(buf), "%" JSON_INTEGER_FORMAT, json_integer_value(v));
			if (strcmp(text, buf) != 0)
				qbf_fail("text of integer %s is \"%s\"", buf, text);
		}
		else if (json_is_true(v) || json_is_false(v))
		{
			if (strcmp(text, json_is_true(v) ? "true" : "false") != 0)
				qbf_fail("text of a boolean is \"%s\"", text);
		}
		else
			qbf_fail("text is set for a value that is not a string, an integer or a boolean");
	}
	free(text);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *path = qbf_line(&data, &size);
	char		err[256];
	bool		valid;
	json_t	   *doc;

	memset(err, 'x', sizeof(err));
	valid = qb_jsonpath_check(path, err, sizeof(err));
	if (!valid)
	{
		qbf_err_ok(err, sizeof(err), "qb_jsonpath_check");
		if (err[0] == '\0')
			qbf_fail("qb_jsonpath_check refused \"%s\" with an empty message", path);
	}
	doc = json_loadb((const char *) data, size, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
	if (doc != NULL)
	{
		json_t	   *wrap = json_pack("{s:O}", "a", doc);
		json_t	   *arr = json_pack("[O]", doc);

		qbf_walk(doc, path, valid);
		if (wrap != NULL)
			qbf_walk(wrap, path, valid);
		if (arr != NULL)
			qbf_walk(arr, path, valid);
		json_decref(wrap);
		json_decref(arr);
		json_decref(doc);
	}
	free(path);
	return 0;
}
