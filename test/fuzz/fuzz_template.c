/*-------------------------------------------------------------------------
 * fuzz_template.c
 *	  libFuzzer harness: templates of qb_extract.h (qb_template_check,
 *	  qb_template_render).
 *
 * Input: the first byte picks the names (bit 0: a source's {source,
 * eventType}, or a broker destination's {topic, key}) and which values are
 * NULL (bits 1 and 2); then a line with the template and one line per
 * value.  A template the check accepts is rendered; the result must be the
 * reference rendering: the text with each "{{ name }}" (blanks optional)
 * replaced by its value (blanks as isspace says).
 *-------------------------------------------------------------------------
 */
#include <ctype.h>

#include "fuzz_common.h"
#include "qb_extract.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* qbf_render: the reference rendering of a checked template; malloc'd. */
static char *
qbf_render(const char *t, const char *const *names, const char *const *values)
{
	size_t		cap = strlen(t) + 1;
	size_t		len = 0;
	char	   *out;

	for (int i = 0; names[i] != NULL; i++)
		cap += (values[i] ? strlen(values[i]) : 0) * (strlen(t) / 4 + 1);
	out = malloc(cap);
	if (out == NULL)
		abort();
	while (*t)
	{
		const char *close;
		const char *a;
		const char *b;
		int			k = -1;

		if (strncmp(t, "{{", 2) != 0 || (close = strstr(t + 2, "}}")) == NULL)
		{
			out[len++] = *t++;
			continue;
		}
		for (a = t + 2; a < close && isspace((unsigned char) *a); a++)
			;
		for (b = close; b > a && isspace((unsigned char) b[-1]); b--)
			;
		for (int i = 0; names[i] != NULL; i++)
			if ((size_t) (b - a) == strlen(names[i]) && strncmp(a, names[i], b - a) == 0)
				k = i;
		if (k < 0)
		{
			/* the check refused it: not a placeholder */
			out[len++] = *t++;
			continue;
		}
		if (values[k])
		{
			memcpy(out + len, values[k], strlen(values[k]));
			len += strlen(values[k]);
		}
		t = close + 2;
	}
	out[len] = '\0';
	return out;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const source_names[] = {"source", "eventType", NULL};
	static const char *const dest_names[] = {"topic", "key", NULL};
	const char *const *names;
	const char *values[2];
	char	   *tmpl;
	char	   *v[2];
	char		err[256];
	uint8_t		mode;

	if (size == 0)
		return 0;
	mode = data[0];
	data++;
	size--;
	names = (mode & 1) ? dest_names : source_names;
	tmpl = qbf_line(&data, &size);
	v[0] = qbf_line(&data, &size);
	v[1] = qbf_line(&data, &size);
	values[0] = (mode & 2) ? NULL : v[0];
	values[1] = (mode & 4) ? NULL : v[1];
	memset(err, 'x', sizeof(err));
	if (qb_template_check(tmpl, names, err, sizeof(err)))
	{
		char	   *got = qb_template_render(tmpl, names, values);
		char	   *want = qbf_render(tmpl, names, values);

		if (got == NULL)
			qbf_fail("qb_template_render(\"%s\") returned NULL", tmpl);
		if (strcmp(got, want) != 0)
			qbf_fail("qb_template_render(\"%s\") = \"%s\", the reference says \"%s\"",
					 tmpl, got, want);
		free(got);
		free(want);
	}
	else
	{
		qbf_err_ok(err, sizeof(err), "qb_template_check");
		if (err[0] == '\0')
			qbf_fail("qb_template_check refused \"%s\" with an empty message", tmpl);
	}
	free(tmpl);
	free(v[0]);
	free(v[1]);
	return 0;
}
