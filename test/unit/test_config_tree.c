/*-------------------------------------------------------------------------
 * test_config_tree.c
 *	  Unit tests of qb_config_tree.c, the load: YAML syntax errors where
 *	  they are (invalid UTF-8, control characters, a BOM), a document that
 *	  is not a mapping or is two, aliases refused, nesting bounded.
 *-------------------------------------------------------------------------
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "qb_config.h"
#include "test_config.h"

/* ---- refusals: the YAML itself ------------------------------------ */

static void
test_yaml_errors(void **state)
{
	char		err[QB_ERRLEN];

	refuse("outbox: [1, 2\n", "YAML syntax error at line ", NULL);
	refuse("outbox:\n  batchSize: 1\n bad: 2\n", "YAML syntax error at line 3, column 2: ", NULL);
	refuse("a: b: c\n", "YAML syntax error at line 1, column 5: mapping values are not allowed in this context", NULL);
	refuse("outbox:\n\tbatchSize: 1\n", "YAML syntax error at line 2, column 1", NULL);
	/* invalid UTF-8: libyaml reports a byte offset; we report where */
	refuse("outbox:\n  retention: \"\xff\"\n",
		   "YAML syntax error at line 2, column 15: invalid leading UTF-8 octet (0xFF)",
		   "must be UTF-8", NULL);
	refuse("# caf\xc3\xa9\nroutes: \"\xc3\"\n", "YAML syntax error at line 2, column 11: invalid trailing UTF-8 octet (0x22)", NULL);
	refuse("outbox: \"\xc0\xaf\"\n", "YAML syntax error at line 1, column 10", NULL);
	/* columns count characters, not bytes */
	refuse("outbox: { retention: \"caf\xc3\xa9\xff\" }\n",
		   "YAML syntax error at line 1, column 27: invalid leading UTF-8 octet (0xFF)", NULL);
	refuse("outbox: \"a\x01\"\n", "YAML syntax error at line 1, column 11: control characters are not allowed", NULL);
	/* a UTF-16 byte order mark: the document must be UTF-8 */
	refuse("\xff\xfeo\0u\0", "YAML syntax error at line 1, column 1", NULL);
	/* a UTF-8 BOM is fine */
	qb_config_free(accept("\xef\xbb\xbfoutbox: { batchSize: 3 }\n"));

	refuse("- a\n- b\n", "the document must be a mapping with the keys outbox, destinations, routes, sources, inbox, http, admin, database, daemon, egress and telemetry, got a sequence (line 1, column 1)", NULL);
	refuse("hello\n", "the document must be a mapping", "got a scalar", NULL);
	refuse("outbox: {}\n---\nroutes: []\n", "a second YAML document starts at line 2", NULL);

	/* aliases are refused where they are written */
	refuse("outbox: &o { batchSize: 1 }\ndestinations: *o\n",
		   "YAML alias \"*o\" at line 2, column 15: aliases are not supported", NULL);
	refuse("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n"
		   "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
		   "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
		   "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
		   "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
		   "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
		   "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
		   "outbox: *g\n",
		   "YAML alias \"*a\" at line 2, column 8", NULL);
	/* an anchor without an alias is harmless */
	qb_config_free(accept("outbox: &o { batchSize: 2 }\n"));

	/* nesting that no valid document has */
	{
		char		deep[400];
		int			i;

		for (i = 0; i < 150; i++)
			deep[i] = '[';
		for (; i < 300; i++)
			deep[i] = ']';
		deep[300] = '\0';
		refused_message(deep, err, sizeof(err));
		assert_non_null(strstr(err, "YAML nesting deeper than 64 levels"));
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_yaml_errors),
	};

	return cmocka_run_group_tests_name("qb_config_tree", tests, NULL, NULL);
}
