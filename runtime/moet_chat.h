/*
 * moet_chat.h: DeepSeek-V3's chat format (the "chat_template" of its tokenizer_config.json),
 * rendered natively for the message shapes an OpenAI-compatible server needs. docs/tokenizer.md
 * ("Chat format") has the details.
 *
 *   BOS + system prompts (all of them, wherever they sit, joined by "\n\n")
 *       + for each user message:      <｜User｜> content
 *       + for each assistant message: <｜Assistant｜> content <｜end▁of▁sentence｜>
 *       + with add_generation_prompt: <｜Assistant｜>
 *
 * Supported roles: "system", "user", "assistant" (with content). Tool calls (an assistant
 * message without content) and "tool" messages are refused with MOET_EUNSUP; any other role
 * with MOET_EINVAL (the template would silently drop it; a server should say so instead).
 * Content is copied byte for byte, as the template does: text that spells a special token
 * (e.g. "<｜User｜>") inside a message becomes that token when encoded, as in transformers.
 *
 * Thread-safety: no state; every function may be called from any number of threads.
 */
#ifndef MOET_CHAT_H
#define MOET_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "moet_tokenizer.h"

/* NOTE: the strings of DeepSeek-V3's tokenizer_config.json ("bos_token", "eos_token" and the
 * literals of its "chat_template"); U+FF5C FULLWIDTH VERTICAL LINE and U+2581 LOWER ONE EIGHTH
 * BLOCK written as UTF-8 escapes. */
#define MOET_CHAT_BOS "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define MOET_CHAT_EOS "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"
#define MOET_CHAT_USER "<\xef\xbd\x9c" "User\xef\xbd\x9c>"
#define MOET_CHAT_ASSISTANT "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>"
#define MOET_CHAT_SYSTEM_SEP "\n\n"

/* One message. Both strings are borrowed and NUL-terminated (a server must refuse content
 * with an embedded NUL before it gets here). content NULL means "no content" (a tool-call
 * message in OpenAI's format). */
typedef struct moet_chat_msg {
	const char *role;    /* "system", "user" or "assistant" */
	const char *content; /* UTF-8 */
} moet_chat_msg;

/*
 * Renders msgs[0..n) as DeepSeek-V3's chat template does, the BOS included as text; with
 * add_generation_prompt (nonzero) it ends with "<｜Assistant｜>" for the model to continue.
 * n may be 0 (BOS, plus the generation prompt if asked).
 * Returns 0 with *out_text (malloc'd, NUL-terminated, the caller frees) and *out_n (bytes,
 * without the NUL), or MOET_EINVAL (NULL role, NULL content where the role needs it, unknown
 * role: the detail names the message index), MOET_EUNSUP (tool calls, tool messages),
 * MOET_ENOMEM.
 */
int moet_chat_render(const moet_chat_msg *msgs, size_t n, int add_generation_prompt,
		     char **out_text, size_t *out_n);

/*
 * Renders, then encodes the text with tok. The rendered text starts with the BOS token's text,
 * which the encoder turns into its id, so the ids start with exactly one BOS: the template
 * adds it, and no second one is prepended (transformers' apply_chat_template encodes with
 * add_special_tokens=False for the same reason, whatever add_bos_token says).
 * Returns 0 with *out_ids (malloc'd, the caller frees) and *out_n, or any error of
 * moet_chat_render or moet_tokenizer_encode (MOET_EINVAL for content that is not valid UTF-8),
 * or MOET_EFORMAT when tok has no BOS token or the text did not begin with it.
 */
int moet_chat_encode(const moet_tokenizer *tok, const moet_chat_msg *msgs, size_t n,
		     int add_generation_prompt, int32_t **out_ids, size_t *out_n);

#endif
