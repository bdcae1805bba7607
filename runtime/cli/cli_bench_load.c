/*
 * cli_bench_load.c: `moet-hybrid bench load`: options and the record (runtime/bench_load.c
 * does the work).
 */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "moet_bench_load.h"
#include "moet_err.h"
#include "moet_model.h"
#include "moet_placement.h"
#include "moet_uring.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: moet-hybrid bench load --model DIR [--ram-budget-gb G] [--qd N]\n"
		   "                              [--buffered] [--disk-gb G] [--no-gpu] [--no-register]\n"
		   "                              [--device cuda|cpu [--placement FILE]\n"
		   "                              [--upload uring|staged|plain] [--cold]]\n"
		   "                              [--fill-gb G]\n"
		   "                              [--quiet] [--json FILE]\n\n"
		   "Time to make the CPU tier (every routed expert) resident in RAM slots by\n"
		   "io_uring reads, against the disk's sequential read bandwidth (O_DIRECT) and,\n"
		   "with a GPU, the host-to-device bandwidth, measured in the same run. Progress\n"
		   "(bytes, rate, ETA) on stderr, the table on stdout.\n\n"
		   "  --ram-budget-gb G  slots to fill in GiB (default: the whole tier, at most 80%%\n"
		   "                     of MemAvailable)\n"
		   "  --qd N             io_uring requests in flight (default 64)\n"
		   "  --buffered         read through the page cache (default: O_DIRECT where the\n"
		   "                     filesystem takes it)\n"
		   "  --disk-gb G        sequential read of at most G GiB (default 8)\n"
		   "  --no-gpu           skip the host-to-device measurement\n"
		   "  --no-register      do not register the slots with io_uring (no up-front pin)\n"
		   "  --device D         also the start on D (cuda; cpu: simulated devices): a\n"
		   "                     fresh open, the hot experts' upload, the CPU tier's fill;\n"
		   "                     time to ready against max(read / disk, upload / h2d)\n"
		   "  --placement FILE   the start's placement (default: every expert on GPU 0)\n"
		   "  --upload S         the hot experts' source (MOET_UPLOAD; default: the\n"
		   "                     environment's, else staged)\n"
		   "  --cold             before the start, the shards' pages dropped from the page\n"
		   "                     cache (fdatasync, posix_fadvise DONTNEED; no root), so\n"
		   "                     that it reads the disk; the share before and after is\n"
		   "                     reported (row start-cold)\n"
		   "  --fill-gb G        the fill rows (the staged upload's fill of its staging\n"
		   "                     without the transfer: fresh mapping, mapping again,\n"
		   "                     pread): at most G GiB of the hot experts (default 8)\n"
		   "  --quiet            no progress bar\n"
		   "  --json FILE        write the JSON record (docs/benchmarks.md)\n");
}

int moet_cli_bench_load(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "model", required_argument, NULL, 'm' },
		{ "ram-budget-gb", required_argument, NULL, 'B' },
		{ "qd", required_argument, NULL, 'q' },
		{ "buffered", no_argument, NULL, 'b' },
		{ "disk-gb", required_argument, NULL, 'D' },
		{ "no-gpu", no_argument, NULL, 'G' },
		{ "no-register", no_argument, NULL, 'R' },
		{ "quiet", no_argument, NULL, 'Q' },
		{ "device", required_argument, NULL, 'd' },
		{ "placement", required_argument, NULL, 'p' },
		{ "upload", required_argument, NULL, 'u' },
		{ "fill-gb", required_argument, NULL, 'F' },
		{ "cold", no_argument, NULL, 'C' },
		{ "json", required_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	moet_bench_load_opts o = { .progress = 1 };
	const char *json_path = NULL, *place = NULL;
	int16_t *owner = NULL;
	double v;
	char *end;
	int c, rc = 0;
	optind = 1;
	while (!rc && (c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'm': o.model_dir = optarg; break;
		case 'B':
		case 'D':
		case 'F':
			v = strtod(optarg, &end);
			if (end == optarg || *end || !(v > 0) || v > 1e6)
				rc = moet_err(MOET_EINVAL, "--%s '%s': a size in GiB above 0",
					      c == 'B' ? "ram-budget-gb" : c == 'D' ? "disk-gb" :
					      "fill-gb", optarg);
			else if (c == 'B')
				o.ram_budget_bytes = (size_t)(v * (double)(1ull << 30));
			else if (c == 'D')
				o.disk_bytes = (size_t)(v * (double)(1ull << 30));
			else
				o.fill_bytes = (size_t)(v * (double)(1ull << 30));
			break;
		case 'q':
			o.queue_depth = (unsigned)strtoul(optarg, &end, 10);
			if (*end || o.queue_depth < 1 || o.queue_depth > 4096)
				rc = moet_err(MOET_EINVAL, "--qd '%s': an integer in [1, 4096]", optarg);
			break;
		case 'b': o.direct = MOET_URING_DIRECT_OFF; break;
		case 'G': o.no_gpu = 1; break;
		case 'C': o.cold = 1; break;
		case 'R': o.no_register = 1; break;
		case 'Q': o.progress = 0; break;
		case 'd':
			if (strcmp(optarg, "cuda") && strcmp(optarg, "cpu"))
				rc = moet_err(MOET_EINVAL, "--device '%s': cuda or cpu", optarg);
			o.device = optarg;
			break;
		case 'p': place = optarg; break;
		case 'u':
			if (strcmp(optarg, "uring") && strcmp(optarg, "staged") &&
			    strcmp(optarg, "plain"))
				rc = moet_err(MOET_EINVAL, "--upload '%s': uring, staged or plain",
					      optarg);
			o.upload = optarg;
			break;
		case 'j': json_path = optarg; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (!rc && optind < argc)
		rc = moet_err(MOET_EINVAL, "unexpected argument '%s'", argv[optind]);
	if (!rc && !o.model_dir) {
		usage(stderr);
		return 2;
	}
	if (!rc && place && !o.device)
		rc = moet_err(MOET_EINVAL, "--placement is for the start: give --device too");
	if (!rc && o.cold && !o.device)
		rc = moet_err(MOET_EINVAL, "--cold is for the start: give --device too");
	if (!rc && place)
		rc = moet_cli_load_owner(o.model_dir, place, &owner, &o.n_devices);
	o.owner = owner;
	json_t *rec = NULL;
	if (!rc)
		rc = moet_bench_record_new("load", &rec);
	if (!rc)
		rc = moet_bench_load(&o, rec, stderr, stdout);
	if (!rc && json_path)
		rc = moet_bench_write(rec, json_path);
	json_decref(rec);
	free(owner);
	return rc ? moet_cli_fail("bench load", rc) : 0;
}
