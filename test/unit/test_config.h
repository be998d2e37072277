/*-------------------------------------------------------------------------
 * test_config.h
 *	  What the configuration family's unit tests share (test_config.c and
 *	  test_config_<part>.c, one for each qb_config_<part>.c that has tests).
 *
 * Wording: "accept" parses a document and returns the config, failing the
 * test with the parser's message if it is refused; "refuse" parses a
 * document and checks that the message holds each expected substring.
 * Every test sets and unsets its own environment variables.
 *
 * Header-only (static inline functions): each unit test is one .c file
 * linked with the core library.
 *-------------------------------------------------------------------------
 */
#ifndef TEST_CONFIG_H
#define TEST_CONFIG_H

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "qb_config.h"

/* what the host allows every parse here (a test that changes it puts it back) */
static QbConfigEnv test_env;

/* the secret-file directories: NULL, any file (the daemon's) */
static inline void
test_set_file_dirs(const char *dirs, const char *setting)
{
	test_env.file_dirs = dirs;
	test_env.file_setting = setting;
	test_env.files_anywhere = dirs == NULL;
}

/* accept: parse text, fail the test with the message when it is refused. */
static inline QbConfig *
accept(const char *text)
{
	QbConfig   *cfg = (QbConfig *) 0x1;
	char		err[QB_ERRLEN] = "";

	if (qb_config_parse(text, strlen(text), &test_env, &cfg, err, sizeof(err)) != 0)
		fail_msg("refused: %s\n--- document:\n%s", err, text);
	assert_non_null(cfg);
	return cfg;
}

/*
 * refuse: parse text, expect a refusal whose message holds every string of
 * the NULL-terminated list.
 */
static inline void
refuse(const char *text,...)
{
	QbConfig   *cfg = (QbConfig *) 0x1;
	char		err[QB_ERRLEN] = "";
	const char *want;
	va_list		ap;

	if (qb_config_parse(text, strlen(text), &test_env, &cfg, err, sizeof(err)) == 0)
	{
		qb_config_free(cfg);
		fail_msg("accepted, expected a refusal:\n%s", text);
	}
	assert_null(cfg);
	va_start(ap, text);
	while ((want = va_arg(ap, const char *)) != NULL)
		if (strstr(err, want) == NULL)
			fail_msg("message \"%s\"\n lacks \"%s\"", err, want);
	va_end(ap);
}

/* refused_message: the message of a refusal, for checks of what it lacks. */
static inline void
refused_message(const char *text, char *err, size_t errlen)
{
	QbConfig   *cfg = NULL;

	assert_int_equal(qb_config_parse(text, strlen(text), &test_env, &cfg, err, errlen), -1);
	assert_null(cfg);
}

/* an http source's first lines, for the source tests of several files */
#define SRC "sources:\n  s:\n    type: http\n    path: /s\n"

/*
 * The daemon's keys (database:, daemon:): the extension accepts and ignores
 * them; the daemon (queuebox-mssqld) reads them.  A database url holds a
 * password, which no message repeats.
 */
#define PASSWORD "Pa55-w0rd-never-shown"

/* refuse_hiding: refuse, and the message must not hold PASSWORD */
static inline void
refuse_hiding(const char *text, const char *want)
{
	char		err[QB_ERRLEN] = "";

	refused_message(text, err, sizeof(err));
	if (strstr(err, PASSWORD) != NULL)
		fail_msg("the message repeats the password: %s", err);
	if (strstr(err, want) == NULL)
		fail_msg("message \"%s\"\n lacks \"%s\"", err, want);
}

#endif							/* TEST_CONFIG_H */
