/*
 * test_xtier_cli.c: --ram-budget-gb on verify, generate and logits. verify with 25% of the
 * CPU tier (no placement, and with a placement over a simulated device) reports bit-identical
 * logits and the tier's counters; generate gives the same ids with and without a budget;
 * logits writes the same bytes; bad values are one-line errors.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_test.h"

int main(void)
{
	char *dir = moet_test_mkdtemp("xtier-cli");
	char ck[512], a[600], b[600], pl[600];
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	char *out = NULL;
	int rc = moet_test_cli(&out, "gen-checkpoint --out %s --layers 4 --hot-count 8 "
			       "--hot-share 0.85 --shard-mb 1 --quiet", ck);
	CHECK(rc == 0, "gen: %s", out);
	free(out);
	moet_test_cli_expect("verify --help", 0, "--ram-budget-gb");
	char args[1200];
	snprintf(args, sizeof(args), "verify --model %s --ram-budget-gb 25%% --steps 3", ck);
	rc = moet_test_cli(&out, "%s", args);
	CHECK(rc == 0 && strstr(out, "batch 4: logits bit-identical") && strstr(out, "hit rate") &&
	      strstr(out, "recall"), "verify 25%%: rc %d: %s", rc, out);
	free(out);
	/* a placement: every even expert on a simulated device */
	snprintf(pl, sizeof(pl), "%s/p.yaml", dir);
	FILE *f = fopen(pl, "w");
	if (f) {
		fprintf(f, "gpus:\n  - {name: gpu0, budget: 1GiB}\ndefault:\n  gpu0: [");
		for (int e = 0; e < 32; e += 2)
			fprintf(f, "%s%d", e ? ", " : "", e);
		fprintf(f, "]\n");
		fclose(f);
	}
	rc = moet_test_cli(&out, "verify --model %s --placement %s --ram-budget-gb 50%% --steps 2",
			   ck, pl);
	CHECK(rc == 0 && strstr(out, "logits bit-identical") && strstr(out, "hit rate") &&
	      !strstr(out, "DIFFER"), "verify placement: rc %d: %s", rc, out);
	free(out);
	char *g1 = NULL, *g2 = NULL;
	CHECK(moet_test_cli(&g1, "generate --model %s --tokens 5,6,7 --max-new 6 2>/dev/null",
			    ck) == 0, "generate");
	CHECK(moet_test_cli(&g2, "generate --model %s --tokens 5,6,7 --max-new 6 "
			    "--ram-budget-gb 0.0005 2>/dev/null", ck) == 0, "generate budget");
	CHECK(g1 && g2 && !strcmp(g1, g2), "same ids: '%s' vs '%s'", g1, g2);
	free(g1);
	free(g2);
	snprintf(a, sizeof(a), "%s/a.npy", dir);
	snprintf(b, sizeof(b), "%s/b.npy", dir);
	CHECK(moet_test_cli(NULL, "logits --model %s --tokens 1,2,3,4 --out %s", ck, a) == 0 &&
	      moet_test_cli(NULL, "logits --model %s --tokens 1,2,3,4 --out %s --ram-budget-gb 10%%",
			    ck, b) == 0, "logits");
	size_t na = 0, nb = 0;
	char *da = moet_test_read_file(a, &na), *db = moet_test_read_file(b, &nb);
	CHECK(da && db && na == nb && na > 0 && !memcmp(da, db, na), "logits files equal");
	free(da);
	free(db);
	snprintf(args, sizeof(args), "verify --model %s --ram-budget-gb abc", ck);
	moet_test_cli_expect(args, 1, "--ram-budget-gb 'abc'");
	snprintf(args, sizeof(args), "verify --model %s --ram-budget-gb 101%%", ck);
	moet_test_cli_expect(args, 1, "share of the CPU tier");
	snprintf(args, sizeof(args), "generate --model %s --tokens 1 --ram-budget-gb 0.000001", ck);
	moet_test_cli_expect(args, 1, "below one expert slot");
	free(dir);
	return moet_test_done("test_xtier_cli");
}
