/*-------------------------------------------------------------------------
 * qb_utf8.c
 *	  The UTF-8 check of what QueueBox receives (webhook headers and bodies,
 *	  broker messages) before it reaches a text column.
 *-------------------------------------------------------------------------
 */
#include "qb_utf8.h"

/*
 * qb_utf8_invalid_at: RFC 3629 UTF-8, no overlongs, no surrogates, nothing
 * above U+10FFFF; also refuses NUL, which text columns cannot hold.
 */
long
qb_utf8_invalid_at(const char *str, size_t len)
{
	const unsigned char *s = (const unsigned char *) str;
	size_t		i = 0;

	while (i < len)
	{
		unsigned char c = s[i];
		size_t		n;
		unsigned	cp;

		if (c == 0)
			return (long) i;
		if (c < 0x80)
		{
			i++;
			continue;
		}
		if (c >= 0xC2 && c <= 0xDF)
			n = 1, cp = c & 0x1F;
		else if (c >= 0xE0 && c <= 0xEF)
			n = 2, cp = c & 0x0F;
		else if (c >= 0xF0 && c <= 0xF4)
			n = 3, cp = c & 0x07;
		else
			return (long) i;
		for (size_t k = 1; k <= n; k++)
		{
			if (i + k >= len || (s[i + k] & 0xC0) != 0x80)
				return (long) i;
			cp = (cp << 6) | (s[i + k] & 0x3F);
		}
		if ((n == 2 && cp < 0x800) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)) ||
			(cp >= 0xD800 && cp <= 0xDFFF))
			return (long) i;
		i += n + 1;
	}
	return -1;
}
