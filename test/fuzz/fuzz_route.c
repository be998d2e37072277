/*-------------------------------------------------------------------------
 * fuzz_route.c
 *	  libFuzzer harness: topic patterns (qb_pattern_check) and matching
 *	  (qb_topic_match) of qb_route.h.
 *
 * Input: the first line is a pattern, the second a topic.  Both functions
 * run on both strings (a topic is a pattern too), and qb_topic_match is
 * compared with a reference matcher: dynamic programming over the
 * segments, "*" one segment, "**" any number, anything else itself, an
 * empty string having no segment (the definition in qb_route.h).
 *-------------------------------------------------------------------------
 */
#include "fuzz_common.h"
#include "qb_route.h"

int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define QBF_MAX_SEGS 512

/* qbf_split: the segments of s (start and length); -1 when too many. */
static int
qbf_split(const char *s, const char **seg, size_t *len)
{
	int			n = 0;

	if (*s == '\0')
		return 0;
	for (;;)
	{
		size_t		l = strcspn(s, ".");

		if (n == QBF_MAX_SEGS)
			return -1;
		seg[n] = s;
		len[n++] = l;
		if (s[l] == '\0')
			return n;
		s += l + 1;
	}
}

static bool
qbf_seg_is(const char *s, size_t len, const char *what)
{
	return len == strlen(what) && strncmp(s, what, len) == 0;
}

/* qbf_ref_match: the reference; -1 when a string has too many segments. */
static int
qbf_ref_match(const char *pattern, const char *topic)
{
	static const char *ps[QBF_MAX_SEGS],
			   *ts[QBF_MAX_SEGS];
	static size_t pl[QBF_MAX_SEGS],
				tl[QBF_MAX_SEGS];
	/* m[i][j]: the pattern's segments from i match the topic's from j */
	static bool m[QBF_MAX_SEGS + 1][QBF_MAX_SEGS + 1];
	int			np = qbf_split(pattern, ps, pl);
	int			nt = qbf_split(topic, ts, tl);

	if (np < 0 || nt < 0)
		return -1;
	for (int i = np; i >= 0; i--)
		for (int j = nt; j >= 0; j--)
		{
			if (i == np)
				m[i][j] = j == nt;
			else if (qbf_seg_is(ps[i], pl[i], "**"))
				m[i][j] = m[i + 1][j] || (j < nt && m[i][j + 1]);
			else
				m[i][j] = j < nt && m[i + 1][j + 1] &&
					(qbf_seg_is(ps[i], pl[i], "*") ||
					 (pl[i] == tl[j] && strncmp(ps[i], ts[j], pl[i]) == 0));
		}
	return m[0][0];
}

static void
qbf_pair(const char *pattern, const char *topic)
{
	bool		got = qb_topic_match(pattern, topic);
	int			want = qbf_ref_match(pattern, topic);

	if (want >= 0 && got != (bool) want)
		qbf_fail("qb_topic_match(\"%s\", \"%s\") = %d, the reference says %d",
				 pattern, topic, got, want);
}

static void
qbf_check(const char *pattern)
{
	char		err[256];

	memset(err, 'x', sizeof(err));
	if (!qb_pattern_check(pattern, err, sizeof(err)))
	{
		qbf_err_ok(err, sizeof(err), "qb_pattern_check");
		if (err[0] == '\0')
			qbf_fail("qb_pattern_check refused \"%s\" with an empty message", pattern);
	}
	else if (!qb_topic_match(pattern, pattern) && strstr(pattern, "*") == NULL)
		qbf_fail("the valid literal pattern \"%s\" does not match itself", pattern);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char	   *pattern = qbf_line(&data, &size);
	char	   *topic = qbf_line(&data, &size);

	qbf_check(pattern);
	qbf_check(topic);
	qbf_pair(pattern, topic);
	qbf_pair(topic, pattern);
	free(pattern);
	free(topic);
	return 0;
}
