/*
 * serve_demo.c: the embedded demo of `serve` (moet_serve.h): with no --model, the server runs
 * the tiny synthetic checkpoint (untrained: random weights) with the project's own tokenizer,
 * made on first use in the user's cache directory.
 *
 * NOTE: the checkpoint is the one `./quickstart.sh demo` makes (preset tiny, seed 1), in the
 * same folder, so both share it; a folder made by quickstart.sh before the server existed
 * gets the tokenizer files added. A new folder is written under a temporary name and renamed
 * into place, so two servers (or tests) starting at once never see half a checkpoint.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "moet_err.h"
#include "moet_gen.h"
#include "moet_gen_tokenizer.h"
#include "moet_serve.h"

int moet_serve_demo_dir(char *buf, size_t n)
{
	const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
	int k;
	if (x && x[0])
		k = snprintf(buf, n, "%s/moet-hybrid/demo-tiny", x);
	else
		k = snprintf(buf, n, "%s/.cache/moet-hybrid/demo-tiny", h && h[0] ? h : "/tmp");
	return k < 0 || (size_t)k >= n ? moet_err(MOET_ERANGE, "demo folder path too long") : 0;
}

static int exists(const char *dir, const char *name)
{
	char p[4200];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return stat(p, &st) == 0;
}

/* mkdir -p of dir's parent. */
static int make_parents(const char *dir)
{
	char p[4096];
	snprintf(p, sizeof(p), "%s", dir);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0755) && errno != EEXIST)
			return moet_err(MOET_EIO, "%s: cannot create (%s)", p, strerror(errno));
		*s = '/';
	}
	return 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

static int gen_into(const char *tmp, int64_t *out_vocab)
{
	moet_gen_params gp;
	moet_gen_params_init(&gp);
	gp.seed = 1;
	moet_config cfg;
	int rc = moet_gen_config(&gp, &cfg);
	if (!rc)
		rc = moet_gen_checkpoint(tmp, &gp);
	if (!rc)
		rc = moet_gen_tokenizer_write(tmp, cfg.vocab_size);
	*out_vocab = cfg.vocab_size;
	return rc;
}

int moet_serve_demo_ensure(const char *dir)
{
	int64_t vocab = 0;
	int rc = 0;
	if (exists(dir, "config.json") && exists(dir, "tokenizer.json"))
		return 0;
	if (strlen(dir) > 4000)
		return moet_err(MOET_ERANGE, "demo folder path too long");
	if (exists(dir, "config.json")) { /* made by quickstart.sh demo: add the tokenizer */
		moet_gen_params gp;
		moet_gen_params_init(&gp);
		moet_config cfg;
		rc = moet_gen_config(&gp, &cfg);
		return rc ? rc : moet_gen_tokenizer_write(dir, cfg.vocab_size);
	}
	if ((rc = make_parents(dir)))
		return rc;
	char tmp[4200];
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", dir, (long)getpid());
	nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS); /* a leftover of a crashed run */
	rc = gen_into(tmp, &vocab);
	if (!rc && rename(tmp, dir) != 0) {
		if (errno == EEXIST || errno == ENOTEMPTY)
			rc = exists(dir, "tokenizer.json") ? 0
							   : moet_gen_tokenizer_write(dir, vocab);
		else
			rc = moet_err(MOET_EIO, "%s: cannot rename to %s (%s)", tmp, dir,
				      strerror(errno));
	}
	nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return rc;
}
