/*
 * test_bench_load.c: `moet-hybrid bench load` on a generated checkpoint: the table names the
 * sequential read, the load of the whole tier and the h2d part; the JSON record has the disk
 * ceiling, the two rows with their bytes (the load's = the experts' checkpoint bytes, counted
 * here independently from the checkpoint), and the load object; buffered and unregistered
 * variants run; bad options are one line. The start (--device cpu: simulated devices) with a
 * placement of experts 0-3 of every layer on device 0 and the uring upload: its row's bytes
 * are the dense part + the hot experts + the CPU tier (counted here from the checkpoint by
 * tensor name), the start object's parts add up, the bound is the disk's. The slots' NUMA
 * report: one slot per expert of the checkpoint, each found on a node, every page queried;
 * on a one-node machine all on node 0 with no policy. The fill rows (fill-map-fresh,
 * fill-map-warm, fill-pread: the staged upload's fill without a GPU) cover every routed
 * expert's bytes without a placement and the hot experts' with one (counted here), with
 * positive times; the start records MOET_UPLOAD_READ (start.read) and a bad value of it or
 * of MOET_UPLOAD is refused by name; a bad --fill-gb is one line. --cold reports the page
 * cache's share of the shards before and after its drop (on ext4, xfs, btrfs: most before,
 * almost none after) and the fill rows the staging the environment sets.
 */
#include <jansson.h>
#include <linux/magic.h>
#include <numa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "moet_ckpt.h"
#include "moet_err.h"
#include "moet_test.h"

int main(void)
{
	char *dir = moet_test_mkdtemp("bench-load");
	char ck[512], js[600], args[1400];
	snprintf(ck, sizeof(ck), "%s/ck", dir);
	snprintf(js, sizeof(js), "%s/load.json", dir);
	char *out = NULL;
	int rc = moet_test_cli(&out, "gen-checkpoint --out %s --layers 3 --quiet", ck);
	CHECK(rc == 0, "gen: %s", out);
	free(out);
	rc = moet_test_cli(&out, "bench load --model %s --no-gpu --json %s", ck, js);
	CHECK(rc == 0 && strstr(out, "disk-seq-read") && strstr(out, "load-tier") &&
	      strstr(out, "slots per node") &&
	      strstr(out, "h2d: not measured") && strstr(out, "ETA"), "bench load: %s", out);
	free(out);
	/* expert bytes counted from the checkpoint */
	moet_ckpt *c = NULL;
	double want = 0;
	static unsigned char seen[3][1024];
	long long n_experts = 0;
	CHECK(moet_ckpt_open(ck, &c) == 0, "open: %s", moet_errmsg());
	for (size_t i = 0; c && i < moet_ckpt_count(c); i++) {
		const moet_tensor *t = moet_ckpt_at(c, i);
		int64_t tl, te;
		if (moet_tensor_part(t->name, 3, &tl, &te) == MOET_PART_EXPERT) {
			want += (double)t->n_bytes;
			if (tl >= 0 && tl < 3 && te >= 0 && te < 1024 && !seen[tl][te]++)
				n_experts++;
		}
	}
	moet_ckpt_close(c);
	json_error_t je;
	json_t *rec = json_load_file(js, 0, &je);
	CHECK(rec != NULL, "record: %s", je.text);
	json_t *ceil = json_object_get(json_object_get(rec, "ceilings"), "disk_read_GBps");
	CHECK(ceil && json_real_value(json_object_get(ceil, "value")) > 0, "disk ceiling");
	json_t *rows = json_object_get(rec, "results");
	CHECK(json_array_size(rows) == 5, "five rows");
	json_t *r2 = json_array_get(rows, 1);
	CHECK(r2 && !strcmp(json_string_value(json_object_get(r2, "name")), "load-tier") &&
	      json_number_value(json_object_get(r2, "bytes")) == want,
	      "load row bytes %.0f, checkpoint experts %.0f",
	      json_number_value(json_object_get(r2, "bytes")), want);
	json_t *ld = json_object_get(rec, "load");
	CHECK(ld && json_integer_value(json_object_get(ld, "experts")) ==
			    json_integer_value(json_object_get(ld, "tier_experts")) &&
	      json_number_value(json_object_get(ld, "time_to_ready_s")) > 0, "load object");
	CHECK(!strcmp(json_string_value(json_object_get(rec, "bench")), "load"), "bench name");
	const char *fills[3] = { "fill-map-fresh", "fill-map-warm", "fill-pread" };
	for (int k = 0; k < 3; k++) {
		json_t *rf = json_array_get(rows, 2 + (size_t)k);
		const char *nm = json_string_value(json_object_get(rf, "name"));
		CHECK(nm && !strcmp(nm, fills[k]) &&
		      json_number_value(json_object_get(rf, "bytes")) == want &&
		      json_number_value(json_object_get(rf, "median_s")) > 0 &&
		      json_number_value(json_object_get(rf, "ratio")) > 0,
		      "row %s: %s, bytes %.0f (experts %.0f)", fills[k], nm ? nm : "-",
		      json_number_value(json_object_get(rf, "bytes")), want);
	}
	json_t *fo = json_object_get(rec, "fill");
	CHECK(fo && json_number_value(json_object_get(fo, "bytes")) == want &&
	      json_number_value(json_object_get(fo, "pread_GBps")) > 0 &&
	      json_number_value(json_object_get(fo, "map_fresh_GBps")) > 0 &&
	      !strcmp(json_string_value(json_object_get(fo, "experts")), "all"), "fill object");
	/* the slots' NUMA report: every slot (one per expert, counted from the checkpoint) is
	 * found on a node; on a one-node machine all of them on node 0, no policy */
	json_t *nm = json_object_get(ld, "numa");
	json_t *spn = json_object_get(nm, "slots_per_node");
	long long on_nodes = 0, pages_found = 0;
	const char *key;
	json_t *val;
	json_object_foreach(spn, key, val)
		on_nodes += json_integer_value(val);
	json_object_foreach(json_object_get(nm, "pages_per_node"), key, val)
		pages_found += json_integer_value(val);
	const long long slot_b = json_integer_value(json_object_get(ld, "slot_bytes"));
	const long long pages = slot_b * n_experts / sysconf(_SC_PAGESIZE);
	const long long spread = json_integer_value(json_object_get(nm, "slots_spread"));
	CHECK(nm && on_nodes + spread == n_experts &&
	      json_integer_value(json_object_get(nm, "slots_empty")) == 0,
	      "numa: %lld slots on one node + %lld spread, %lld experts", on_nodes, spread,
	      n_experts);
	CHECK(json_integer_value(json_object_get(nm, "pages")) == pages &&
	      pages_found + json_integer_value(json_object_get(nm, "pages_absent")) == pages,
	      "numa pages: %lld found of %lld", pages_found, pages);
	if (numa_available() < 0 || numa_max_node() < 1)
		CHECK(json_integer_value(json_object_get(spn, "0")) == n_experts &&
		      !strcmp(json_string_value(json_object_get(nm, "mode")), "off") &&
		      json_array_size(json_object_get(nm, "nodes")) == 0,
		      "one node: every slot on node 0, no policy");
	json_decref(rec);
	rc = moet_test_cli(&out, "bench load --model %s --no-gpu --buffered --no-register --quiet "
			   "--qd 4", ck);
	CHECK(rc == 0 && strstr(out, "buffered (page cache)") && strstr(out, "unregistered") &&
	      !strstr(out, "ETA"), "buffered: %s", out);
	free(out);
	/* the start, on simulated devices */
	char place[512];
	snprintf(place, sizeof(place), "%s/place.yaml", dir);
	const char *yaml = "version: 1\ngpus:\n  - {name: gpu0, budget: 1GiB, reserve: 0GiB}\n"
			   "default: {gpu0: \"0-3\"}\n";
	CHECK(moet_test_write_file(place, yaml, strlen(yaml)) == 0, "placement file");
	setenv("MOET_UPLOAD_READ", "pread", 1);
	rc = moet_test_cli(&out, "bench load --model %s --no-gpu --quiet --device cpu --placement "
			   "%s --upload uring --json %s", ck, place, js);
	CHECK(rc == 0 && strstr(out, "start") && strstr(out, "ready/bound") &&
	      strstr(out, "start-numa") &&
	      strstr(out, "MOET_UPLOAD=uring"), "start: %s", out);
	free(out);
	double dense = 0, hot = 0, tier = 0;
	CHECK(moet_ckpt_open(ck, &c) == 0, "open: %s", moet_errmsg());
	for (size_t i = 0; c && i < moet_ckpt_count(c); i++) {
		const moet_tensor *t = moet_ckpt_at(c, i);
		int64_t tl, te;
		moet_part p = moet_tensor_part(t->name, 3, &tl, &te);
		if (p == MOET_PART_EXPERT)
			*(te < 4 ? &hot : &tier) += (double)t->n_bytes;
		else if (p != MOET_PART_MTP)
			dense += (double)t->n_bytes;
	}
	moet_ckpt_close(c);
	rec = json_load_file(js, 0, &je);
	CHECK(rec != NULL, "record: %s", je.text);
	rows = json_object_get(rec, "results");
	json_t *r3 = json_array_get(rows, 5), *st = json_object_get(rec, "start");
	json_t *rfp = json_array_get(rows, 4);
	CHECK(rfp && json_number_value(json_object_get(rfp, "bytes")) == hot &&
	      !strcmp(json_string_value(json_object_get(json_object_get(rec, "fill"), "experts")),
		      "placement"), "fill with the placement: the hot experts' %.0f bytes (%.0f)",
	      hot, json_number_value(json_object_get(rfp, "bytes")));
	const char *rdv = json_string_value(json_object_get(st, "read"));
	CHECK(rdv && !strcmp(rdv, "pread"), "start.read: %s", rdv ? rdv : "-");
	CHECK(r3 && !strcmp(json_string_value(json_object_get(r3, "name")), "start") &&
	      json_number_value(json_object_get(r3, "bytes")) == dense + hot + tier,
	      "start row bytes %.0f, checkpoint %.0f + %.0f + %.0f",
	      json_number_value(json_object_get(r3, "bytes")), dense, hot, tier);
	double parts = json_number_value(json_object_get(st, "open_s")) +
		       json_number_value(json_object_get(st, "upload_s")) +
		       json_number_value(json_object_get(st, "tier_s"));
	double ready = json_number_value(json_object_get(st, "time_to_ready_s"));
	CHECK(st && ready > 0 && parts > 0.999 * ready && parts < 1.001 * ready &&
	      json_number_value(json_object_get(st, "hot_bytes")) == hot &&
	      json_number_value(json_object_get(st, "tier_bytes")) == tier &&
	      json_number_value(json_object_get(st, "h2d_bytes")) == 0 &&
	      json_number_value(json_object_get(st, "ready_over_bound")) > 0 &&
	      !strcmp(json_string_value(json_object_get(st, "upload")), "uring"), "start object");
	CHECK(json_integer_value(json_object_get(json_object_get(st, "numa"), "pages")) > 0,
	      "start: the CPU tier's slots verified");
	json_decref(rec);
	/* --cold: the shards' pages dropped before the start; the staging the fill rows report is
	 * the environment's */
	setenv("MOET_UPLOAD_CHUNK_MB", "2", 1);
	setenv("MOET_UPLOAD_STORE", "nt", 1);
	rc = moet_test_cli(&out, "bench load --model %s --no-gpu --quiet --device cpu --placement "
			   "%s --upload uring --cold --json %s", ck, place, js);
	unsetenv("MOET_UPLOAD_CHUNK_MB");
	unsetenv("MOET_UPLOAD_STORE");
	CHECK(rc == 0 && strstr(out, "start-cold") && strstr(out, "4 x 2 MiB"), "--cold: %s", out);
	free(out);
	rec = json_load_file(js, 0, &je);
	json_t *cold = json_object_get(json_object_get(rec, "start"), "cold"),
	       *fill = json_object_get(rec, "fill");
	double before = json_number_value(json_object_get(cold, "cache_before")),
	       after = json_number_value(json_object_get(cold, "cache_after"));
	CHECK(cold && before >= 0 && before <= 1 && after >= 0 && after <= 1, "start.cold");
	CHECK(json_integer_value(json_object_get(fill, "buffer_mb")) == 2 &&
	      !strcmp(json_string_value(json_object_get(fill, "store")), "nt"), "fill staging");
	/* on a disk filesystem the drop takes (tmpfs keeps its pages: nothing to assert) */
	struct statfs sf;
	if (statfs(ck, &sf) == 0 && (sf.f_type == EXT4_SUPER_MAGIC || sf.f_type == XFS_SUPER_MAGIC ||
				     sf.f_type == BTRFS_SUPER_MAGIC))
		CHECK(before > 0.5 && after < 0.1, "--cold on a disk: %.3f before, %.3f after",
		      before, after);
	else
		printf("--cold: not a disk filesystem (%.3f before, %.3f after)\n", before, after);
	json_decref(rec);
	snprintf(args, sizeof(args), "bench load --model %s --no-gpu --cold", ck);
	moet_test_cli_expect(args, 1, "--cold is for the start");
	snprintf(args, sizeof(args), "bench load --model %s --placement %s", ck, place);
	moet_test_cli_expect(args, 1, "give --device");
	setenv("MOET_UPLOAD_READ", "mmap", 1);
	snprintf(args, sizeof(args), "bench load --model %s --no-gpu --quiet --device cpu", ck);
	moet_test_cli_expect(args, 1, "MOET_UPLOAD_READ='mmap'");
	unsetenv("MOET_UPLOAD_READ");
	setenv("MOET_UPLOAD", "fast", 1);
	moet_test_cli_expect(args, 1, "MOET_UPLOAD='fast'");
	unsetenv("MOET_UPLOAD");
	snprintf(args, sizeof(args), "bench load --model %s --fill-gb -1", ck);
	moet_test_cli_expect(args, 1, "--fill-gb '-1'");
	snprintf(args, sizeof(args), "bench load --model %s --device tpu", ck);
	moet_test_cli_expect(args, 1, "--device 'tpu'");
	snprintf(args, sizeof(args), "bench load --model %s --qd 0", ck);
	moet_test_cli_expect(args, 1, "--qd '0'");
	snprintf(args, sizeof(args), "bench load --model %s/nothing --no-gpu", dir);
	moet_test_cli_expect(args, 1, "nothing");
	free(dir);
	return moet_test_done("test_bench_load");
}
