/*
 * test_upload_reg.c: the register upload's plan (runtime/upload_reg.c) and its switches,
 * without a GPU.
 *   - random items (unaligned, adjacent, overlapping, empty, spanning many chunks, in random
 *     order) over page sizes 4 KiB and 64 KiB and chunk sizes from one page to larger than
 *     everything: copying the plan's pieces gives the bytes that copying the items gives;
 *     the pieces' bytes add up to the items'; chunks are whole pages, sorted, disjoint, at
 *     most the chunk size; every locked page holds an item's byte and every such page is
 *     locked (nothing outside the items' pages, so nothing outside the mapping); touching
 *     chunks are split only when full; each piece lies in its chunk;
 *   - bad items and sizes: one-line messages naming the item and the problem;
 *   - MOET_UPLOAD=register parsed, unknown values refused; bad MOET_UPLOAD_REG_* values
 *     refused by name before any CUDA call, through moet_upload_many too; the same for the
 *     staged source's MOET_UPLOAD_CHUNK_MB and MOET_UPLOAD_STORE (upload.c).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moet_err.h"
#include "moet_gpu.h"
#include "moet_test.h"
#include "moet_upload.h"

#define SRC_BYTES ((size_t)3 << 20)
#define MAX_ITEMS 160

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void)
{
	return moet_test_xorshift64(&rng);
}

/* The plan's structure against the items (an independent page map). */
static void check_plan(const char *tag, const moet_upload_plan *p, const moet_upload_item *it,
		       int n, const char *src, size_t page, size_t C)
{
	const size_t n_pages = SRC_BYTES / page + 2;
	unsigned char *covered = calloc(n_pages, 1);
	const uintptr_t base = (uintptr_t)src & ~(uintptr_t)(page - 1);
	size_t bytes = 0, n_cov = 0, piece_bytes = 0;
	for (int i = 0; i < n; i++) {
		bytes += it[i].bytes;
		for (size_t b = 0; b < it[i].bytes; b += page / 2)
			covered[((uintptr_t)it[i].src + b - base) / page] = 1;
		if (it[i].bytes)
			covered[((uintptr_t)it[i].src + it[i].bytes - 1 - base) / page] = 1;
	}
	for (size_t q = 0; q < n_pages; q++)
		n_cov += covered[q];
	CHECK(p->bytes == bytes, "%s: plan bytes %zu, items %zu", tag, p->bytes, bytes);
	CHECK(p->locked_bytes == n_cov * page, "%s: locked %zu bytes, %zu pages hold items", tag,
	      p->locked_bytes, n_cov);
	int64_t want_piece0 = 0;
	for (int64_t k = 0; k < p->n_chunks; k++) {
		const moet_upload_chunk *c = &p->chunks[k];
		const uintptr_t a = (uintptr_t)c->base, e = a + c->bytes;
		CHECK(a % page == 0 && c->bytes % page == 0 && c->bytes > 0 && c->bytes <= C,
		      "%s: chunk %lld at %#lx, %zu bytes (page %zu, chunk %zu)", tag, (long long)k,
		      (unsigned long)a, c->bytes, page, C);
		for (uintptr_t q = a; q < e; q += page)
			CHECK(covered[(q - base) / page], "%s: chunk %lld locks page %#lx of no item",
			      tag, (long long)k, (unsigned long)q);
		if (k + 1 < p->n_chunks) {
			const uintptr_t nb = (uintptr_t)p->chunks[k + 1].base;
			CHECK(e <= nb, "%s: chunks %lld and %lld overlap or are unsorted", tag,
			      (long long)k, (long long)k + 1);
			CHECK(e < nb ? !covered[(e - base) / page] : c->bytes == C,
			      "%s: chunk %lld ends at %#lx: %s", tag, (long long)k,
			      (unsigned long)e, e < nb ? "a page of an item is left out"
						       : "split before it was full");
		}
		CHECK(c->piece0 == want_piece0 && c->n_pieces > 0, "%s: chunk %lld pieces %lld+%lld",
		      tag, (long long)k, (long long)c->piece0, (long long)c->n_pieces);
		want_piece0 += c->n_pieces;
		for (int64_t q = c->piece0; q < c->piece0 + c->n_pieces && q < p->n_pieces; q++) {
			const moet_upload_item *pc = &p->pieces[q];
			const uintptr_t s = (uintptr_t)pc->src;
			piece_bytes += pc->bytes;
			CHECK(pc->bytes > 0 && s >= a && s + pc->bytes <= e,
			      "%s: piece %lld (%zu bytes at %#lx) outside chunk %lld", tag,
			      (long long)q, pc->bytes, (unsigned long)s, (long long)k);
		}
	}
	CHECK(want_piece0 == p->n_pieces, "%s: %lld pieces, chunks name %lld", tag,
	      (long long)p->n_pieces, (long long)want_piece0);
	CHECK(piece_bytes == bytes, "%s: pieces %zu bytes, items %zu", tag, piece_bytes, bytes);
	free(covered);
}

/* Random items over src; dst regions disjoint in an arena. */
static int make_items(moet_upload_item *it, const char *src, char *dst, size_t dst_cap,
		      size_t page)
{
	int n = 1 + (int)(next() % MAX_ITEMS);
	size_t at_dst = 0, at_src = next() % 5000;
	for (int i = 0; i < n; i++) {
		const unsigned kind = (unsigned)(next() % 8);
		size_t len = kind == 0   ? 0
			     : kind == 1 ? 1 + next() % 16
			     : kind == 2 ? page * (1 + next() % 9) + next() % 3
					 : 1 + next() % (3 * page);
		size_t off = kind == 3	 ? at_src			  /* adjacent to the last */
			     : kind == 4 ? (at_src > 700 ? at_src - 700 : 0) /* overlapping */
			     : kind == 5 ? (at_src + page - 1) / page * page /* the next page */
					 : next() % SRC_BYTES;
		if (off + len > SRC_BYTES)
			off = SRC_BYTES - len;
		if (at_dst + len > dst_cap)
			len = 0;
		it[i] = (moet_upload_item){ src + off, dst + at_dst, len };
		at_dst += len;
		at_src = off + len;
	}
	for (int i = n - 1; i > 0; i--) { /* random order */
		int j = (int)(next() % (uint64_t)(i + 1));
		moet_upload_item t = it[i];
		it[i] = it[j];
		it[j] = t;
	}
	return n;
}

static void plan_cases(void)
{
	const size_t pages[2] = { 4096, 65536 };
	char *src = aligned_alloc(65536, SRC_BYTES), *ref = malloc(SRC_BYTES * 4);
	char *got = malloc(SRC_BYTES * 4);
	moet_upload_item *it = malloc(MAX_ITEMS * sizeof(*it));
	for (size_t i = 0; i < SRC_BYTES; i++)
		src[i] = (char)(next() >> 24);
	int cases = 0;
	for (int pg = 0; pg < 2; pg++) {
		const size_t page = pages[pg];
		const size_t chunks[5] = { page, 3 * page - 1000, 64 << 10, 1 << 20, SRC_BYTES * 2 };
		for (int ci = 0; ci < 5; ci++) {
			const size_t C = (chunks[ci] + page - 1) / page * page;
			for (int rep = 0; rep < 12; rep++, cases++) {
				char tag[64];
				snprintf(tag, sizeof(tag), "page %zu chunk %zu case %d", page,
					 chunks[ci], rep);
				int n = make_items(it, src, got, SRC_BYTES * 4, page);
				memset(ref, 0xA5, SRC_BYTES * 4);
				memset(got, 0xA5, SRC_BYTES * 4);
				for (int i = 0; i < n; i++) /* the reference: item by item */
					memcpy(ref + ((char *)it[i].dst - got), it[i].src,
					       it[i].bytes);
				moet_upload_plan p;
				int rc = moet_upload_plan_make(it, n, page, chunks[ci], &p);
				CHECK(rc == 0, "%s: %s", tag, moet_errmsg());
				if (rc)
					continue;
				for (int64_t q = 0; q < p.n_pieces; q++)
					memcpy(p.pieces[q].dst, p.pieces[q].src, p.pieces[q].bytes);
				CHECK(memcmp(ref, got, SRC_BYTES * 4) == 0,
				      "%s: the pieces' copy differs from the items'", tag);
				check_plan(tag, &p, it, n, src, page, C);
				moet_upload_plan_free(&p);
			}
		}
	}
	printf("plan: %d random cases: pieces copy the items' bytes, chunks lock only their "
	       "pages\n", cases);
	/* one item over many chunks, exactly aligned: chunks full, one piece each */
	moet_upload_item one = { src, got, 10 * 4096 };
	moet_upload_plan p;
	CHECK(moet_upload_plan_make(&one, 1, 4096, 4 * 4096, &p) == 0 && p.n_chunks == 3 &&
	      p.n_pieces == 3 && p.chunks[2].bytes == 2 * 4096 &&
	      p.pieces[1].dst == got + 4 * 4096, "10 pages in chunks of 4: %lld chunks",
	      (long long)p.n_chunks);
	moet_upload_plan_free(&p);
	/* one byte past a chunk's end: a second piece of one byte */
	one = (moet_upload_item){ src + 100, got, 4 * 4096 - 100 + 1 };
	CHECK(moet_upload_plan_make(&one, 1, 4096, 4 * 4096, &p) == 0 && p.n_chunks == 2 &&
	      p.n_pieces == 2 && p.pieces[1].bytes == 1 && p.pieces[1].src == src + 4 * 4096 &&
	      p.pieces[1].dst == got + 4 * 4096 - 100 && p.chunks[1].bytes == 4096,
	      "one byte past a chunk: %lld chunks, %lld pieces", (long long)p.n_chunks,
	      (long long)p.n_pieces);
	moet_upload_plan_free(&p);
	moet_upload_plan_free(&p); /* twice: zeroed */
	moet_upload_plan_free(NULL);
	free(src);
	free(ref);
	free(got);
	free(it);
}

static void expect(int rc, int want, const char *needle, const char *what)
{
	CHECK(rc == want && strstr(moet_errmsg(), needle) && !strchr(moet_errmsg(), '\n'),
	      "%s: rc %d (want %d), '%s' (want '%s')", what, rc, want, moet_errmsg(), needle);
}

static void bad_cases(void)
{
	char buf[64], dst[64];
	moet_upload_item it[3] = { { buf, dst, 8 }, { NULL, NULL, 0 }, { NULL, dst, 4 } };
	moet_upload_plan p;
	expect(moet_upload_plan_make(it, 3, 4096, 1 << 20, &p), MOET_EINVAL,
	       "upload item 2: NULL source", "NULL source");
	CHECK(!p.chunks && !p.pieces && p.n_chunks == 0, "plan zeroed after a failure");
	it[2] = (moet_upload_item){ buf, NULL, 4 };
	expect(moet_upload_plan_make(it, 3, 4096, 1 << 20, &p), MOET_EINVAL,
	       "upload item 2: NULL destination", "NULL destination");
	it[2] = (moet_upload_item){ (const void *)(UINTPTR_MAX - 100), dst, 200 };
	expect(moet_upload_plan_make(it, 3, 4096, 1 << 20, &p), MOET_ERANGE,
	       "upload item 2: 200 bytes", "source wraps");
	it[2] = (moet_upload_item){ (const void *)(UINTPTR_MAX - 4000), dst, 100 };
	expect(moet_upload_plan_make(it, 3, 4096, 1 << 20, &p), MOET_ERANGE, "wrap",
	       "last page rounds past the end");
	it[2] = (moet_upload_item){ buf, (void *)(UINTPTR_MAX - 10), 64 };
	expect(moet_upload_plan_make(it, 3, 4096, 1 << 20, &p), MOET_ERANGE, "wrap",
	       "destination wraps");
	expect(moet_upload_plan_make(it, 1, 3000, 1 << 20, &p), MOET_EINVAL, "power of two",
	       "page 3000");
	expect(moet_upload_plan_make(it, 1, 0, 1 << 20, &p), MOET_EINVAL, "power of two",
	       "page 0");
	expect(moet_upload_plan_make(it, 1, 4096, 0, &p), MOET_EINVAL, "chunk of 0 bytes",
	       "chunk 0");
	expect(moet_upload_plan_make(it, -1, 4096, 1 << 20, &p), MOET_EINVAL, "-1 items",
	       "negative count");
	expect(moet_upload_plan_make(NULL, 2, 4096, 1 << 20, &p), MOET_EINVAL, "2 items",
	       "NULL items");
	CHECK(moet_upload_plan_make(it + 1, 1, 4096, 1 << 20, &p) == 0 && p.n_chunks == 0 &&
	      p.n_pieces == 0 && p.bytes == 0, "only empty items: an empty plan");
	moet_upload_plan_free(&p);
	CHECK(moet_upload_plan_make(NULL, 0, 4096, 1 << 20, &p) == 0 && p.n_chunks == 0,
	      "no items: an empty plan");
	moet_upload_plan_free(&p);
}

static void switch_cases(void)
{
	char buf[64], dst[64];
	moet_upload_item it = { buf, dst, sizeof(buf) };
	int src = -1;
	setenv("MOET_UPLOAD", "register", 1);
	CHECK(moet_upload_source(&src) == 0 && src == MOET_UPLOAD_REGISTER,
	      "MOET_UPLOAD=register: %d %s", src, moet_errmsg());
	setenv("MOET_UPLOAD", "registered", 1);
	expect(moet_upload_source(&src), MOET_EINVAL, "MOET_UPLOAD='registered'",
	       "unknown MOET_UPLOAD");
	CHECK(strstr(moet_errmsg(), "register"), "the message lists register");
	expect(moet_upload_many(&it, 1, 1, NULL), MOET_EINVAL, "MOET_UPLOAD='registered'",
	       "moet_upload_many refuses an unknown MOET_UPLOAD");
	setenv("MOET_UPLOAD", "register", 1);
	const char *bad[][3] = { { "MOET_UPLOAD_REG_KB", "abc", "MOET_UPLOAD_REG_KB='abc'" },
				 { "MOET_UPLOAD_REG_KB", "-5", "MOET_UPLOAD_REG_KB='-5'" },
				 { "MOET_UPLOAD_REG_KB", "64k", "MOET_UPLOAD_REG_KB='64k'" },
				 { "MOET_UPLOAD_REG_CHUNKS", "1", "1 chunks locked at once" },
				 { "MOET_UPLOAD_REG_CHUNKS", "65", "MOET_UPLOAD_REG_CHUNKS='65'" },
				 { "MOET_UPLOAD_REG_THREADS", "0", "MOET_UPLOAD_REG_THREADS='0'" },
				 { "MOET_UPLOAD_REG_FAULT", "x", "MOET_UPLOAD_REG_FAULT='x'" } };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv(bad[i][0], bad[i][1], 1);
		expect(moet_upload_many(&it, 1, 1, NULL), MOET_EINVAL, bad[i][2], bad[i][2]);
		unsetenv(bad[i][0]);
	}
	/* the staged source's knobs, refused before anything is allocated */
	setenv("MOET_UPLOAD", "staged", 1);
	const char *bads[][3] = { { "MOET_UPLOAD_CHUNK_MB", "0", "MOET_UPLOAD_CHUNK_MB='0'" },
				  { "MOET_UPLOAD_CHUNK_MB", "2048", "MOET_UPLOAD_CHUNK_MB='2048'" },
				  { "MOET_UPLOAD_CHUNK_MB", "8M", "MOET_UPLOAD_CHUNK_MB='8M'" },
				  { "MOET_UPLOAD_STORE", "stream", "MOET_UPLOAD_STORE='stream'" } };
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		setenv(bads[i][0], bads[i][1], 1);
		expect(moet_upload_many(&it, 1, 1, NULL), MOET_EINVAL, bads[i][2], bads[i][2]);
		expect(moet_upload_many_staged(&it, 1, 1, NULL), MOET_EINVAL, bads[i][2],
		       bads[i][2]);
		unsetenv(bads[i][0]);
	}
	setenv("MOET_UPLOAD", "register", 1);
	moet_upload_reg_opts o = { .max_chunks = 70 };
	expect(moet_upload_many_register(&it, 1, &o, NULL), MOET_EINVAL, "70 chunks",
	       "70 chunks by option");
	o = (moet_upload_reg_opts){ .n_threads = -2 };
	expect(moet_upload_many_register(&it, 1, &o, NULL), MOET_EINVAL, "-2 registering",
	       "negative threads by option");
	/* nothing to copy: no CUDA call, no error */
	moet_upload_stats st;
	it.bytes = 0;
	CHECK(moet_upload_many_register(&it, 1, NULL, &st) == 0 && st.bytes == 0 &&
	      st.reg_chunks == 0, "empty upload: %s", moet_errmsg());
	if (moet_gpu_count(NULL) == 0) {
		/* no device: the first CUDA call fails cleanly, named */
		it.bytes = sizeof(buf);
		int rc = moet_upload_many_register(&it, 1, NULL, &st);
		CHECK((rc == MOET_EDEVICE || rc == MOET_EUNSUP) && moet_errmsg()[0] &&
		      st.bytes == sizeof(buf) && st.reg_chunks == 0,
		      "no GPU: rc %d '%s'", rc, moet_errmsg());
	}
	unsetenv("MOET_UPLOAD");
}

int main(void)
{
	plan_cases();
	bad_cases();
	switch_cases();
	return moet_test_done("test_upload_reg");
}
