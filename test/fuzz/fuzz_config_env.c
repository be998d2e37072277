/*-------------------------------------------------------------------------
 * fuzz_config_env.c
 *	  libFuzzer harness: QUEUEBOX_* overrides over a YAML document.
 *
 * Input: the first byte's low two bits say how many override lines follow
 * (0..3), each "NAME=value"; the variable set is QUEUEBOX_NAME (a NAME
 * byte other than a letter, digit or '_' becomes '_').  The rest is the
 * document.  The variables are set before qb_config_parse and unset after,
 * so no input leaks into the next.
 *-------------------------------------------------------------------------
 */
#include "fuzz_config_one.h"

int			LLVMFuzzerInitialize(int *argc, char ***argv);
int			LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	qbf_config_env_init();
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char		names[3][80];
	int			nvars = 0;
	int			want;
	char	   *text;

	if (size == 0)
		return 0;
	qbf_raw = (const char *) data;
	qbf_raw_len = size;
	want = data[0] & 3;
	data++;
	size--;
	for (int i = 0; i < want && size > 0; i++)
	{
		char	   *line = qbf_line(&data, &size);
		char	   *eq = strchr(line, '=');
		size_t		n;

		if (eq == NULL || eq == line)
		{
			free(line);
			continue;
		}
		*eq = '\0';
		n = strlen(line) > 60 ? 60 : strlen(line);
		memcpy(names[nvars], "QUEUEBOX_", 9);
		for (size_t k = 0; k < n; k++)
		{
			unsigned char c = (unsigned char) line[k];

			names[nvars][9 + k] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
				(c >= '0' && c <= '9') ? (char) c : '_';
		}
		names[nvars][9 + n] = '\0';
		if (setenv(names[nvars], eq + 1, 1) == 0)
			nvars++;
		free(line);
	}
	text = qbf_strndup(data, size);
	qbf_config_one(text, size);
	free(text);
	for (int i = 0; i < nvars; i++)
		unsetenv(names[i]);
	return 0;
}
