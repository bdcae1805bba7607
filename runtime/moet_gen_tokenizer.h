/*
 * moet_gen_tokenizer.h: the project's own small tokenizer for synthetic checkpoints (the
 * embedded demo of `serve`): a byte-level BPE in HF `tokenizers` format, with the special
 * tokens and chat format of DeepSeek-V3, sized to a model's vocab_size.
 *
 *   id 0  <｜begin▁of▁sentence｜>  (bos_token_id of the tiny preset)
 *   id 1  <｜end▁of▁sentence｜>    (eos_token_id)
 *   id 2  <｜User｜>               id 3  <｜Assistant｜>
 *   ids 4 .. 259                   the 256 byte tokens (GPT-2 byte-level characters)
 *   ids 260 .. 260+M-1             M merges learned by BPE from an embedded English text
 *   the rest up to vocab_size      <｜place▁holder▁no▁N｜> special tokens (never produced by
 *                                  encoding text; like DeepSeek-V3's reserved tokens)
 *
 * Untrained model, trained-looking tokenizer: text round-trips exactly and prompts encode to
 * a few tokens per word, which is all the demo needs. Deterministic: the same vocab_size
 * gives byte-identical files.
 */
#ifndef MOET_GEN_TOKENIZER_H
#define MOET_GEN_TOKENIZER_H

#include <stdint.h>

/* Smallest vocabulary the layout above fits (4 specials + 256 bytes). */
#define MOET_GEN_TOK_MIN_VOCAB 260

/*
 * The two files' texts for a vocabulary of vocab_size ids (>= MOET_GEN_TOK_MIN_VOCAB, at most
 * 1 << 20). Returns 0 with *out_tokenizer_json and *out_config_json (malloc'd, NUL-terminated,
 * the caller frees), or MOET_ERANGE / MOET_ENOMEM.
 */
int moet_gen_tokenizer_text(int64_t vocab_size, char **out_tokenizer_json,
			    char **out_config_json);

/*
 * Writes DIR/tokenizer.json and DIR/tokenizer_config.json (each through a temporary file and
 * rename, so a concurrent reader sees either no file or a whole one). Returns 0, or MOET_EIO
 * naming the file, or an error of moet_gen_tokenizer_text.
 */
int moet_gen_tokenizer_write(const char *dir, int64_t vocab_size);

#endif
