/*
 * gen_tokenizer.c: the demo tokenizer (moet_gen_tokenizer.h): byte-level BPE learned here
 * from a short embedded text, written as HF `tokenizers` JSON plus a tokenizer_config.json
 * whose chat template renders DeepSeek-V3's format (runtime/moet_chat.h).
 *
 * Training, the textbook way: the text is split into words as GPT-2's pre-tokenizer does for
 * ASCII (an optional leading space, then a run of letters, of digits, or of other symbols;
 * whitespace runs alone); each distinct word is a list of byte tokens with its count; then,
 * repeatedly, the most frequent adjacent pair (ties: the smaller left id, then right id) is
 * merged into a new token, until the vocabulary is full or no pair is left. The merges are
 * valid for any input: the runtime pre-tokenizer (ByteLevel with GPT-2's regex) need not
 * split exactly as the trainer did, it only changes which merges apply.
 *
 * NOTE: O(merges x corpus): a few KB of text and ~1,000 merges take milliseconds.
 */
#include "moet_gen_tokenizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moet_chat.h"
#include "moet_err.h"

#define N_SPECIAL 4
#define FIRST_MERGE (N_SPECIAL + 256)

/* Our own words: the corpus of the merges. Plain ASCII prose, some code and numbers. */
static const char corpus[] =
	"This is the demo model of moet-hybrid, a runtime for mixture of experts models. "
	"The model is synthetic and untrained: its weights are random numbers, so what it "
	"writes is not meant to make sense. The tokenizer, on the other hand, is a real "
	"byte-level BPE: any text can be written with it, and reading the tokens back gives "
	"the same text, byte for byte. Hello! How are you today? I am fine, thank you. "
	"What is the weather like where you are? It is sunny and warm, with a light wind "
	"from the west. Tell me a story about a small robot who wanted to learn to paint. "
	"Once upon a time there was a little machine that lived in a quiet workshop. Every "
	"morning it watched the light come through the window and wished it could keep the "
	"colors. One day the old painter who owned the shop left a brush on the table, and "
	"the robot picked it up. The first lines were crooked, the second were better, and "
	"by the end of the week the walls were covered with birds, rivers and mountains. "
	"Questions and answers: what is the capital of France? Paris. How many days are "
	"there in a year? There are 365 days, or 366 in a leap year. What is 12 times 12? "
	"It is 144. Count with me: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 1000, 2024, 3.14. "
	"The server answers requests from many users at the same time: it puts the tokens "
	"of every running sequence into one batch, so that the experts are read once per "
	"step for all of them. Experts that are used often live on the graphics cards; "
	"the others are computed by the processor, straight from the checkpoint's bytes. "
	"int main(void) { printf(\"hello, world\\n\"); return 0; } "
	"def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n"
	"SELECT name, count(*) FROM users WHERE age > 30 GROUP BY name; "
	"The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor "
	"jugs. We should read the documentation before we change the configuration, and "
	"we should write tests that check the results against an independent reference. "
	"Please summarize the following text in one sentence. Translate this into French. "
	"Write a short poem about the sea, the sky and the stars at night. Thank you very "
	"much for your help; have a good day, and see you tomorrow.\n";

/* GPT-2's byte -> printable code point map. */
static unsigned byte_cp(int b)
{
	if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
		return (unsigned)b;
	int n = 0;
	for (int x = 0; x < b; x++)
		n += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
	return 256u + (unsigned)n;
}

static size_t put_utf8(char *o, unsigned cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	o[0] = (char)(0xC0 | (cp >> 6));
	o[1] = (char)(0x80 | (cp & 0x3F));
	return 2; /* every code point of the map is < 0x800 */
}

/* The corpus split into words (GPT-2's classes for ASCII): [start, len) pairs. */
static int is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static int is_digit(int c) { return c >= '0' && c <= '9'; }
static int is_space(int c) { return c == ' ' || c == '\n' || c == '\t'; }
static int cls(int c) { return is_alpha(c) ? 1 : is_digit(c) ? 2 : is_space(c) ? 3 : 4; }

typedef struct word {
	int32_t *sym; /* token ids */
	int n;
	int count;
} word;

typedef struct trainer {
	word *w;
	int n_w;
	char **text;  /* [vocab] byte-level strings of the tokens (NULL for specials) */
	int32_t (*merge)[2];
	int n_merge;
} trainer;

static int add_word(trainer *t, const char *s, int len)
{
	for (int i = 0; i < t->n_w; i++) {
		word *w = &t->w[i];
		if (w->n != len)
			continue;
		int same = 1;
		for (int k = 0; k < len && same; k++)
			same = w->sym[k] == N_SPECIAL + (unsigned char)s[k];
		if (same) {
			w->count++;
			return 0;
		}
	}
	word *w = &t->w[t->n_w];
	if (!(w->sym = malloc((size_t)len * sizeof(int32_t))))
		return moet_err(MOET_ENOMEM, "demo tokenizer: words");
	for (int k = 0; k < len; k++)
		w->sym[k] = N_SPECIAL + (unsigned char)s[k];
	w->n = len;
	w->count = 1;
	t->n_w++;
	return 0;
}

static int split_corpus(trainer *t)
{
	size_t n = sizeof(corpus) - 1;
	if (!(t->w = calloc(n, sizeof(*t->w))))
		return moet_err(MOET_ENOMEM, "demo tokenizer: words");
	size_t i = 0;
	while (i < n) {
		size_t j = i;
		int c = (unsigned char)corpus[i];
		if (c == ' ' && i + 1 < n && cls((unsigned char)corpus[i + 1]) != 3)
			j++; /* a single leading space joins the next word */
		int k = cls((unsigned char)corpus[j]);
		while (j < n && cls((unsigned char)corpus[j]) == k)
			j++;
		int rc = add_word(t, corpus + i, (int)(j - i));
		if (rc)
			return rc;
		i = j;
	}
	return 0;
}

/* The best pair: highest count over all words, ties to the smaller (left, right). Counts go
 * into an open-addressed table of PAIR_SLOTS (more than the corpus has positions). */
#define PAIR_SLOTS 16384
typedef struct pair_slot {
	int64_t key; /* a * 2^21 + b + 1; 0: empty */
	int count;
} pair_slot;

static int best_pair(const trainer *t, pair_slot *tab, int32_t *out_a, int32_t *out_b)
{
	memset(tab, 0, PAIR_SLOTS * sizeof(*tab));
	for (int i = 0; i < t->n_w; i++) {
		const word *w = &t->w[i];
		int32_t pa = -1, pb = -1;
		for (int k = 0; k + 1 < w->n; k++) {
			int32_t a = w->sym[k], b = w->sym[k + 1];
			if (a == pa && b == pb && a == b) {
				pa = -1; /* "aaa": non-overlapping, as the merge applies */
				continue;
			}
			pa = a;
			pb = b;
			int64_t key = ((int64_t)a << 21) + b + 1;
			uint64_t h = ((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 50;
			while (tab[h].key && tab[h].key != key)
				h = (h + 1) & (PAIR_SLOTS - 1);
			tab[h].key = key;
			tab[h].count += w->count;
		}
	}
	int best = 0;
	int64_t best_key = 0;
	for (int h = 0; h < PAIR_SLOTS; h++)
		if (tab[h].key && (tab[h].count > best ||
				   (tab[h].count == best && tab[h].key < best_key))) {
			best = tab[h].count;
			best_key = tab[h].key;
		}
	if (!best_key) { /* no pair left */
		*out_a = *out_b = 0;
		return 0;
	}
	*out_a = (int32_t)((best_key - 1) >> 21);
	*out_b = (int32_t)((best_key - 1) & ((1 << 21) - 1));
	return best;
}

static void apply_merge(trainer *t, int32_t a, int32_t b, int32_t id)
{
	for (int i = 0; i < t->n_w; i++) {
		word *w = &t->w[i];
		int o = 0;
		for (int k = 0; k < w->n; k++) {
			if (k + 1 < w->n && w->sym[k] == a && w->sym[k + 1] == b) {
				w->sym[o++] = id;
				k++;
			} else {
				w->sym[o++] = w->sym[k];
			}
		}
		w->n = o;
	}
}

static int train(trainer *t, int64_t vocab)
{
	int rc = split_corpus(t);
	if (rc)
		return rc;
	int64_t max_merge = vocab - FIRST_MERGE;
	if (!(t->merge = malloc((size_t)(max_merge + 1) * sizeof(*t->merge))))
		return moet_err(MOET_ENOMEM, "demo tokenizer: merges");
	for (int b = 0; b < 256; b++) {
		char buf[4];
		size_t n = put_utf8(buf, byte_cp(b));
		if (!(t->text[N_SPECIAL + b] = strndup(buf, n)))
			return moet_err(MOET_ENOMEM, "demo tokenizer: tokens");
	}
	pair_slot *tab = malloc(PAIR_SLOTS * sizeof(*tab));
	if (!tab)
		return moet_err(MOET_ENOMEM, "demo tokenizer: pair counts");
	while (t->n_merge < max_merge) {
		int32_t a = 0, b = 0;
		if (!best_pair(t, tab, &a, &b))
			break;
		int32_t id = FIRST_MERGE + t->n_merge;
		size_t la = strlen(t->text[a]), lb = strlen(t->text[b]);
		char *s = malloc(la + lb + 1);
		if (!s) {
			free(tab);
			return moet_err(MOET_ENOMEM, "demo tokenizer: tokens");
		}
		memcpy(s, t->text[a], la);
		memcpy(s + la, t->text[b], lb + 1);
		t->text[id] = s;
		t->merge[t->n_merge][0] = a;
		t->merge[t->n_merge][1] = b;
		t->n_merge++;
		apply_merge(t, a, b, id);
	}
	free(tab);
	return 0;
}

/* NOTE: written for this project: the same output as moet_chat_render (systems hoisted and
 * joined by a blank line, then the turns), in Jinja for tools that read tokenizer_config.json. */
static const char chat_template[] =
	"{{ bos_token }}{%- set ns = namespace(sys='', any=false) -%}"
	"{%- for m in messages -%}{%- if m['role'] == 'system' -%}"
	"{%- if ns.any -%}{%- set ns.sys = ns.sys + '\\n\\n' -%}{%- endif -%}"
	"{%- set ns.sys = ns.sys + m['content'] -%}{%- set ns.any = true -%}"
	"{%- endif -%}{%- endfor -%}{{ ns.sys }}"
	"{%- for m in messages -%}"
	"{%- if m['role'] == 'user' -%}{{ '" MOET_CHAT_USER "' + m['content'] }}"
	"{%- elif m['role'] == 'assistant' -%}"
	"{{ '" MOET_CHAT_ASSISTANT "' + m['content'] + eos_token }}"
	"{%- endif -%}{%- endfor -%}"
	"{%- if add_generation_prompt -%}{{ '" MOET_CHAT_ASSISTANT "' }}{%- endif -%}";

static json_t *added_token(int64_t id, const char *content)
{
	return json_pack("{s:I, s:s, s:b, s:b, s:b, s:b, s:b}", "id", (json_int_t)id,
			 "content", content, "single_word", 0, "lstrip", 0, "rstrip", 0,
			 "normalized", 0, "special", 1);
}

static int build_json(const trainer *t, int64_t vocab, json_t **out_tok, json_t **out_cfg)
{
	static const char *const specials[N_SPECIAL] = { MOET_CHAT_BOS, MOET_CHAT_EOS,
							  MOET_CHAT_USER, MOET_CHAT_ASSISTANT };
	json_t *added = json_array(), *v = json_object(), *merges = json_array();
	json_t *tok = NULL, *cfg = NULL;
	int ok = added && v && merges;
	for (int i = 0; ok && i < N_SPECIAL; i++)
		ok = !json_array_append_new(added, added_token(i, specials[i]));
	for (int64_t id = FIRST_MERGE + t->n_merge; ok && id < vocab; id++) {
		char name[64];
		snprintf(name, sizeof(name), "<\xef\xbd\x9cplace\xe2\x96\x81holder\xe2\x96\x81no"
			 "\xe2\x96\x81%lld\xef\xbd\x9c>", (long long)(id - FIRST_MERGE - t->n_merge));
		ok = !json_array_append_new(added, added_token(id, name));
	}
	for (int64_t id = N_SPECIAL; ok && id < FIRST_MERGE + t->n_merge; id++)
		ok = !json_object_set_new(v, t->text[id], json_integer((json_int_t)id));
	for (int i = 0; ok && i < t->n_merge; i++)
		ok = !json_array_append_new(merges, json_pack("[s, s]", t->text[t->merge[i][0]],
							       t->text[t->merge[i][1]]));
	if (ok)
		tok = json_pack("{s:s, s:n, s:n, s:o, s:n, s:{s:s, s:b, s:b, s:b}, "
				"s:{s:s, s:b, s:b, s:b}, s:{s:s, s:b, s:b, s:b}, "
				"s:{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}}",
				"version", "1.0", "truncation", "padding", "added_tokens", added,
				"normalizer",
				"pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
				"trim_offsets", 1, "use_regex", 1,
				"post_processor", "type", "ByteLevel", "add_prefix_space", 0,
				"trim_offsets", 1, "use_regex", 1,
				"decoder", "type", "ByteLevel", "add_prefix_space", 0,
				"trim_offsets", 1, "use_regex", 1,
				"model", "type", "BPE", "dropout", "unk_token",
				"continuing_subword_prefix", "end_of_word_suffix",
				"fuse_unk", 0, "byte_fallback", 0, "ignore_merges", 0,
				"vocab", v, "merges", merges);
	else {
		json_decref(added);
		json_decref(v);
		json_decref(merges);
	}
	if (tok)
		cfg = json_pack("{s:b, s:b, s:s, s:s, s:s, s:b, s:I, s:n, s:s, s:s}",
				"add_bos_token", 1, "add_eos_token", 0,
				"bos_token", MOET_CHAT_BOS, "eos_token", MOET_CHAT_EOS,
				"chat_template", chat_template, "clean_up_tokenization_spaces", 0,
				"model_max_length", (json_int_t)4096, "pad_token",
				"tokenizer_class", "PreTrainedTokenizerFast",
				"moet_note", "synthetic demo tokenizer made by moet-hybrid "
				"(runtime/gen_tokenizer.c), for an untrained demo model");
	if (!tok || !cfg) {
		json_decref(tok);
		return moet_err(MOET_ENOMEM, "demo tokenizer: JSON");
	}
	*out_tok = tok;
	*out_cfg = cfg;
	return 0;
}

int moet_gen_tokenizer_text(int64_t vocab_size, char **out_tokenizer_json,
			    char **out_config_json)
{
	if (vocab_size < MOET_GEN_TOK_MIN_VOCAB || vocab_size > (1 << 20))
		return moet_err(MOET_ERANGE, "demo tokenizer: vocab_size %lld outside [%d, %d]",
				(long long)vocab_size, MOET_GEN_TOK_MIN_VOCAB, 1 << 20);
	trainer t = { 0 };
	json_t *tok = NULL, *cfg = NULL;
	char *a = NULL, *b = NULL;
	int rc = 0;
	if (!(t.text = calloc((size_t)vocab_size, sizeof(char *)))) {
		rc = moet_err(MOET_ENOMEM, "demo tokenizer: tokens");
		goto fail;
	}
	if ((rc = train(&t, vocab_size)) || (rc = build_json(&t, vocab_size, &tok, &cfg)))
		goto fail;
	a = json_dumps(tok, JSON_INDENT(1) | JSON_ENSURE_ASCII);
	b = json_dumps(cfg, JSON_INDENT(2));
	if (!a || !b) {
		rc = moet_err(MOET_ENOMEM, "demo tokenizer: JSON text");
		goto fail;
	}
	*out_tokenizer_json = a;
	*out_config_json = b;
	a = b = NULL;
fail:
	free(a);
	free(b);
	json_decref(tok);
	json_decref(cfg);
	for (int i = 0; t.w && i < t.n_w; i++)
		free(t.w[i].sym);
	free(t.w);
	for (int64_t i = 0; t.text && i < vocab_size; i++)
		free(t.text[i]);
	free(t.text);
	free(t.merge);
	return rc;
}

static int write_atomic(const char *dir, const char *name, const char *text)
{
	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	FILE *f = fopen(tmp, "wb");
	if (!f)
		return moet_err(MOET_EIO, "%s: cannot create", tmp);
	size_t n = strlen(text);
	int bad = fwrite(text, 1, n, f) != n;
	bad |= fputc('\n', f) == EOF;
	bad |= fclose(f) != 0;
	if (bad || rename(tmp, path)) {
		unlink(tmp);
		return moet_err(MOET_EIO, "%s: cannot write", path);
	}
	return 0;
}

int moet_gen_tokenizer_write(const char *dir, int64_t vocab_size)
{
	char *tj = NULL, *cj = NULL;
	int rc = moet_gen_tokenizer_text(vocab_size, &tj, &cj);
	if (!rc)
		rc = write_atomic(dir, "tokenizer_config.json", cj);
	if (!rc)
		rc = write_atomic(dir, "tokenizer.json", tj);
	free(tj);
	free(cj);
	return rc;
}
