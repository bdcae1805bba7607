/* cli_inspect.c: placeholder until the subcommand lands (fails with EUNSUP). */
#include <stdint.h>
#include <stdio.h>

#include "cli.h"
#include "moet_err.h"

int moet_cli_inspect(int argc, char **argv)
{
	(void)argc;
	return moet_cli_fail(argv[0], moet_err(MOET_EUNSUP, "not implemented yet"));
}
