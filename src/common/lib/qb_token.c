/*-------------------------------------------------------------------------
 * qb_token.c
 *	  HTTP field syntax: header names are tokens, header values hold no
 *	  control character but tab.  One copy for the three places that care:
 *	  the ingress (what it stores), the HTTP publisher (what it sends) and
 *	  the configuration (the header names it names).
 *-------------------------------------------------------------------------
 */
#include <stdio.h>
#include <string.h>

#include "qb_token.h"

static bool
qb_tchar(unsigned char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

long
qb_token_invalid_at(const char *name)
{
	if (*name == '\0')
		return 0;
	for (const char *p = name; *p; p++)
		if (!qb_tchar((unsigned char) *p))
			return p - name;
	return -1;
}

long
qb_field_value_invalid_at(const char *value)
{
	for (const char *p = value; *p; p++)
	{
		unsigned char c = (unsigned char) *p;

		if ((c < 0x20 && c != '\t') || c == 0x7f)
			return p - value;
	}
	return -1;
}

bool
qb_header_valid(const char *name, const char *value)
{
	return qb_token_invalid_at(name) < 0 && qb_field_value_invalid_at(value) < 0;
}

void
qb_token_printable(char *buf, size_t len, const char *name, size_t max)
{
	size_t		o = 0;

	if (len == 0)
		return;
	for (size_t i = 0; name[i] != '\0' && i < max && o + 5 < len; i++)
	{
		unsigned char c = (unsigned char) name[i];

		if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"')
			buf[o++] = (char) c;
		else
			o += (size_t) snprintf(buf + o, len - o, "\\x%02x", c);
	}
	buf[o] = '\0';
}
