/*-------------------------------------------------------------------------
 * qb_route.c
 *	  Topic patterns and routing.
 *
 * Wording:
 *	- segment: the text between two dots of a topic or a pattern.
 *	- wildcard: a pattern segment that is exactly "*" (one segment) or "**"
 *	  (any number of segments, zero included).  Any other pattern segment is
 *	  a literal and matches the same text, case included.
 *
 * Matching walks segments in place, with no allocation, using the classic
 * two-pointer glob algorithm: "*" behaves like '?' and "**" like '*' of a
 * file glob.  Only the most recent "**" needs remembering, because a later
 * "**" can absorb whatever an earlier one would have, so the walk is
 * O(pattern segments x topic segments) even for "**.a.**.a.**.b".
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <string.h>

#include "qb_route.h"

/* seg_len: length of the segment starting at s. */
static size_t
seg_len(const char *s)
{
	return strcspn(s, ".");
}

/* seg_next: start of the segment after s, or NULL after the last one. */
static const char *
seg_next(const char *s)
{
	s += seg_len(s);
	return *s == '.' ? s + 1 : NULL;
}

/* seg_is: is the segment at s exactly what? */
static bool
seg_is(const char *s, const char *what)
{
	size_t		len = strlen(what);

	return seg_len(s) == len && strncmp(s, what, len) == 0;
}

/* seg_equal: are the segments at a and b the same text? */
static bool
seg_equal(const char *a, const char *b)
{
	size_t		len = seg_len(a);

	return seg_len(b) == len && strncmp(a, b, len) == 0;
}

/*
 * qb_topic_match: see qb_route.h.  An empty topic has no segment, so only
 * a pattern made of "**" matches it.
 */
bool
qb_topic_match(const char *pattern, const char *topic)
{
	const char *p = *pattern ? pattern : NULL;
	const char *t = *topic ? topic : NULL;
	const char *star_p = NULL;	/* pattern after the last "**" seen */
	const char *star_t = NULL;	/* topic where that "**" started taking */
	bool		have_star = false;

	while (t != NULL)
	{
		if (p != NULL && seg_is(p, "**"))
		{
			/* let it take nothing first; take more on a later mismatch */
			have_star = true;
			star_p = seg_next(p);
			star_t = t;
			p = star_p;
		}
		else if (p != NULL && (seg_is(p, "*") || seg_equal(p, t)))
		{
			p = seg_next(p);
			t = seg_next(t);
		}
		else if (have_star)
		{
			star_t = seg_next(star_t);
			t = star_t;
			p = star_p;
		}
		else
			return false;
	}
	while (p != NULL && seg_is(p, "**"))
		p = seg_next(p);
	return p == NULL;
}

/* qb_pattern_check: see qb_route.h. */
bool
qb_pattern_check(const char *pattern, char *err, size_t errlen)
{
	const char *s = pattern;
	int			n = 1;

	if (*pattern == '\0')
	{
		snprintf(err, errlen, "the pattern is empty; use \"**\" to match every topic");
		return false;
	}
	for (s = pattern; s != NULL; s = seg_next(s), n++)
	{
		size_t		len = seg_len(s);
		size_t		i;

		if (len == 0)
		{
			snprintf(err, errlen,
					 "segment %d is empty (a leading, trailing or doubled dot); segments are separated by single dots, e.g. \"orders.*.created\"",
					 n);
			return false;
		}
		for (i = 0; i < len; i++)
		{
			unsigned char c = (unsigned char) s[i];

			if (c <= ' ' || c == 0x7f)
			{
				snprintf(err, errlen, "segment %d contains a space or a control character", n);
				return false;
			}
		}
		if (memchr(s, '*', len) != NULL && !seg_is(s, "*") && !seg_is(s, "**"))
		{
			snprintf(err, errlen,
					 "segment %d \"%.*s\" mixes '*' with other text: a wildcard is a whole segment, \"*\" for one segment or \"**\" for any number",
					 n, len > 40 ? 40 : (int) len, s);
			return false;
		}
	}
	return true;
}
