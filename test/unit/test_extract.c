/*-------------------------------------------------------------------------
 * test_extract.c
 *	  JSONPath subset, topic templates, header redaction.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "qb_extract.h"

static const char *DOC =
	"{\"id\": \"evt_1\", \"type\": \"invoice.paid\", \"n\": 42, \"ok\": true, \"r\": 1.5,"
	" \"data\": {\"object\": {\"customer\": \"cus_9\", \"items\": [{\"sku\": \"a\"}, {\"sku\": \"b\"}]}},"
	" \"odd key.with dots\": {\"it's\": \"x\"}, \"nothing\": null}";

static void
expect_text(json_t *doc, const char *path, const char *want)
{
	char	   *got = qb_jsonpath_text(doc, path);

	if (want == NULL)
	{
		if (got != NULL)
			fail_msg("%s: expected nothing, got \"%s\"", path, got);
	}
	else
	{
		if (got == NULL)
			fail_msg("%s: expected \"%s\", got nothing", path, want);
		assert_string_equal(got, want);
	}
	free(got);
}

static void
test_jsonpath(void **state)
{
	json_t	   *doc = json_loads(DOC, 0, NULL);
	char		err[256];

	assert_non_null(doc);
	expect_text(doc, "$.id", "evt_1");
	expect_text(doc, "$.data.object.customer", "cus_9");
	expect_text(doc, "$.data.object.items[1].sku", "b");
	expect_text(doc, "$['odd key.with dots']['it\\'s']", "x");
	expect_text(doc, "$.n", "42");
	expect_text(doc, "$.ok", "true");
	/* not a key: missing, null, real, object, array, index out of range */
	expect_text(doc, "$.missing", NULL);
	expect_text(doc, "$.nothing", NULL);
	expect_text(doc, "$.r", NULL);
	expect_text(doc, "$.data", NULL);
	expect_text(doc, "$.data.object.items", NULL);
	expect_text(doc, "$.data.object.items[5].sku", NULL);
	expect_text(doc, "$.id.deeper", NULL);
	assert_ptr_equal(qb_jsonpath_get(doc, "$"), doc);

	assert_true(qb_jsonpath_check("$.a['b c'][0].d", err, sizeof(err)));
	assert_false(qb_jsonpath_check("data.id", err, sizeof(err)));
	assert_non_null(strstr(err, "starts with \"$\""));
	assert_false(qb_jsonpath_check("$..id", err, sizeof(err)));
	assert_non_null(strstr(err, "offset 2"));
	assert_false(qb_jsonpath_check("$.items[*]", err, sizeof(err)));
	assert_false(qb_jsonpath_check("$['open", err, sizeof(err)));
	assert_false(qb_jsonpath_check("$.a[1", err, sizeof(err)));
	assert_null(qb_jsonpath_get(doc, "$..id"));
	json_decref(doc);
}

static void
test_templates(void **state)
{
	const char *const names[] = {"source", "eventType", NULL};
	const char *values[] = {"stripe", "invoice.paid"};
	char		err[256];
	char	   *s;

	assert_true(qb_template_check("stripe.{{ eventType }}", names, err, sizeof(err)));
	assert_true(qb_template_check("{{source}}.{{  eventType  }}", names, err, sizeof(err)));
	assert_true(qb_template_check("plain", names, err, sizeof(err)));
	assert_false(qb_template_check("{{ topic }}", names, err, sizeof(err)));
	assert_non_null(strstr(err, "unknown placeholder \"{{ topic }}\""));
	assert_non_null(strstr(err, "{{ source }}, {{ eventType }}"));
	assert_false(qb_template_check("a.{{ source", names, err, sizeof(err)));
	assert_non_null(strstr(err, "offset 2"));

	s = qb_template_render("stripe.{{ eventType }}", names, values);
	assert_string_equal(s, "stripe.invoice.paid");
	free(s);
	s = qb_template_render("{{source}}/{{source}}/{{ eventType }}", names, values);
	assert_string_equal(s, "stripe/stripe/invoice.paid");
	free(s);
	/* no event type: the placeholder renders empty (the relay then dead-letters) */
	values[1] = NULL;
	s = qb_template_render("{{ eventType }}", names, values);
	assert_string_equal(s, "");
	free(s);
}

static void
test_redaction(void **state)
{
	assert_true(qb_header_redacted("authorization", NULL));
	assert_true(qb_header_redacted("Cookie", NULL));
	assert_true(qb_header_redacted("X-HUB-SIGNATURE-256", NULL));
	assert_true(qb_header_redacted("Stripe-Signature", NULL));
	assert_true(qb_header_redacted("webhook-signature", NULL));
	assert_true(qb_header_redacted("X-Acme-Sig", "x-acme-sig"));
	assert_false(qb_header_redacted("X-Correlation-Id", NULL));
	assert_false(qb_header_redacted("webhook-id", NULL));
	assert_false(qb_header_redacted("Content-Type", "X-Acme-Sig"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_jsonpath),
		cmocka_unit_test(test_templates),
		cmocka_unit_test(test_redaction),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
