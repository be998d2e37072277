/*-------------------------------------------------------------------------
 * fuzz_config.c
 *	  libFuzzer harness: the whole input is a YAML document for
 *	  qb_config_parse (the loader, ${NAME} expansion, the validator of
 *	  every section and type, jq compiles of transform: keys).
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
	/* the parser takes a length; the copy has a NUL past it, as a caller's */
	char	   *text = qbf_strndup(data, size);

	qbf_config_one(text, size);
	free(text);
	return 0;
}
