/*
 * chat.c: DeepSeek-V3's chat template rendered in C (moet_chat.h).
 *
 * NOTE: the source is the "chat_template" Jinja text of DeepSeek-V3's tokenizer_config.json
 * (../shared/data/tokenizers/deepseek-v3/). Read as a program, for the roles supported here:
 *
 *   system_prompt = the contents of every system message, in order, joined by "\n\n"
 *                   (first pass over all messages, so a system message late in the list still
 *                   lands at the front)
 *   emit bos_token, system_prompt
 *   for each message (second pass):
 *     user:                      emit "<｜User｜>" + content
 *     assistant, content != none: emit "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>"
 *     assistant, content == none: tool calls               -> refused here (MOET_EUNSUP)
 *     tool:                      tool outputs               -> refused here (MOET_EUNSUP)
 *   if add_generation_prompt (and no tool output is open): emit "<｜Assistant｜>"
 *
 * The template's tags all use "{%-" or sit between tags, and its string literals hold the only
 * newlines, so trim_blocks/lstrip_blocks change nothing: the output is exactly the pieces
 * above. tests/runtime/test_chat.c checks that byte for byte against jinja2 renders.
 *
 * Two passes: the first checks every message and sums the length, the second writes into one
 * exact-size buffer, so a refusal never leaves a half-built string behind.
 */
#include "moet_chat.h"

#include <stdlib.h>
#include <string.h>

#include "moet_err.h"

enum chat_role { ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT };

/* Classifies message i; 0 with *out_role, or the error the header promises. */
static int check_msg(const moet_chat_msg *m, size_t i, enum chat_role *out_role)
{
	if (!m->role)
		return moet_err(MOET_EINVAL, "chat: messages[%zu].role: missing", i);
	if (!strcmp(m->role, "tool"))
		return moet_err(MOET_EUNSUP,
				"chat: messages[%zu]: role 'tool' (tool outputs) is not supported",
				i);
	if (!strcmp(m->role, "system"))
		*out_role = ROLE_SYSTEM;
	else if (!strcmp(m->role, "user"))
		*out_role = ROLE_USER;
	else if (!strcmp(m->role, "assistant"))
		*out_role = ROLE_ASSISTANT;
	else
		return moet_err(MOET_EINVAL,
				"chat: messages[%zu].role: '%.40s' is not system, user or "
				"assistant", i, m->role);
	if (!m->content) {
		if (*out_role == ROLE_ASSISTANT)
			return moet_err(MOET_EUNSUP,
					"chat: messages[%zu]: an assistant message without content "
					"(tool calls) is not supported", i);
		return moet_err(MOET_EINVAL, "chat: messages[%zu].content: missing", i);
	}
	return 0;
}

static char *put(char *p, const char *s, size_t n)
{
	memcpy(p, s, n);
	return p + n;
}

#define PUT_LIT(p, lit) put((p), (lit), sizeof(lit) - 1)

int moet_chat_render(const moet_chat_msg *msgs, size_t n, int add_generation_prompt,
		     char **out_text, size_t *out_n)
{
	if (!out_text || !out_n || (n && !msgs))
		return moet_err(MOET_EINVAL, "chat: render: NULL argument");
	*out_text = NULL;
	*out_n = 0;

	/* pass 1: check and measure */
	size_t len = sizeof(MOET_CHAT_BOS) - 1, n_sys = 0;
	for (size_t i = 0; i < n; i++) {
		enum chat_role r = ROLE_USER;
		int rc = check_msg(&msgs[i], i, &r);
		if (rc)
			return rc;
		size_t c = strlen(msgs[i].content);
		if (r == ROLE_SYSTEM)
			len += c + (n_sys++ ? sizeof(MOET_CHAT_SYSTEM_SEP) - 1 : 0);
		else if (r == ROLE_USER)
			len += sizeof(MOET_CHAT_USER) - 1 + c;
		else
			len += sizeof(MOET_CHAT_ASSISTANT) - 1 + c + sizeof(MOET_CHAT_EOS) - 1;
	}
	if (add_generation_prompt)
		len += sizeof(MOET_CHAT_ASSISTANT) - 1;

	char *text = malloc(len + 1);
	if (!text)
		return moet_err(MOET_ENOMEM, "chat: render: %zu bytes", len + 1);

	/* pass 2: BOS, the system prompt, then the conversation */
	char *p = PUT_LIT(text, MOET_CHAT_BOS);
	n_sys = 0;
	for (size_t i = 0; i < n; i++) {
		if (strcmp(msgs[i].role, "system"))
			continue;
		if (n_sys++)
			p = PUT_LIT(p, MOET_CHAT_SYSTEM_SEP);
		p = put(p, msgs[i].content, strlen(msgs[i].content));
	}
	for (size_t i = 0; i < n; i++) {
		const char *c = msgs[i].content;
		if (!strcmp(msgs[i].role, "user")) {
			p = PUT_LIT(p, MOET_CHAT_USER);
			p = put(p, c, strlen(c));
		} else if (!strcmp(msgs[i].role, "assistant")) {
			p = PUT_LIT(p, MOET_CHAT_ASSISTANT);
			p = put(p, c, strlen(c));
			p = PUT_LIT(p, MOET_CHAT_EOS);
		}
	}
	if (add_generation_prompt)
		p = PUT_LIT(p, MOET_CHAT_ASSISTANT);
	*p = 0;
	*out_text = text;
	*out_n = (size_t)(p - text);
	return 0;
}

int moet_chat_encode(const moet_tokenizer *tok, const moet_chat_msg *msgs, size_t n,
		     int add_generation_prompt, int32_t **out_ids, size_t *out_n)
{
	char *text = NULL;
	size_t n_text = 0, n_ids = 0;
	int32_t *ids = NULL, bos;
	int rc;

	if (!tok || !out_ids || !out_n)
		return moet_err(MOET_EINVAL, "chat: encode: NULL argument");
	*out_ids = NULL;
	*out_n = 0;
	if (moet_tokenizer_find(tok, MOET_CHAT_BOS, &bos))
		return moet_err(MOET_EFORMAT, "chat: the tokenizer has no BOS token '%s'",
				MOET_CHAT_BOS);
	rc = moet_chat_render(msgs, n, add_generation_prompt, &text, &n_text);
	if (rc)
		goto fail;
	/* NOTE: no BOS is prepended: the rendered text begins with it (the template's
	 * {{bos_token}}) and the encoder turns that text into the one BOS id. */
	rc = moet_tokenizer_encode(tok, text, n_text, &ids, &n_ids);
	if (rc)
		goto fail;
	if (n_ids == 0 || ids[0] != bos) {
		rc = moet_err(MOET_EFORMAT, "chat: the rendered text did not encode to a leading "
				"BOS (id %d)", (int)bos);
		goto fail;
	}
	free(text);
	*out_ids = ids;
	*out_n = n_ids;
	return 0;
fail:
	free(ids);
	free(text);
	return rc;
}
