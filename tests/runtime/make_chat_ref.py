#!/usr/bin/env python3
"""make_chat_ref.py: the reference renders for tests/runtime/test_chat.c.

Renders N varied conversations (fixed seed: 0-3 system messages placed anywhere, 1-5
user/assistant turns, unicode, empty strings, whitespace and newline runs, text that looks
like the template's own markers, with and without add_generation_prompt) with jinja2 from the
"chat_template" of DeepSeek-V3's tokenizer_config.json, the way transformers'
apply_chat_template does, and writes JSON lines:

  line 1: {"chat_template": ..., "bos_token": ..., "eos_token": ...}   (what was rendered from)
  then:   {"messages": [{"role": ..., "content": ...}, ...], "add_generation_prompt": bool,
           "text": rendered, "ids": [...]}

gzip-compressed. "ids" are HF `tokenizers`' encoding of the rendered text with
add_special_tokens=False, which is what apply_chat_template(tokenize=True) does (the BOS comes
from the template's {{bos_token}}, not from add_bos_token).

  pip install jinja2 tokenizers
  python3 tests/runtime/make_chat_ref.py \
      --config ../shared/data/tokenizers/deepseek-v3/tokenizer_config.json \
      --tokenizer ../shared/data/tokenizers/deepseek-v3/tokenizer.json \
      --out tests/runtime/chat_ref/deepseek-v3.jsonl.gz

NOTE: the Jinja environment is the one transformers builds in its chat-template utilities
(ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, the loopcontrols
extension, a raise_exception global and a tojson filter), and the render call passes
messages, tools=None, documents=None, add_generation_prompt and the special-token strings
(bos_token, eos_token, pad_token, unk_token) as transformers does. This template uses none of
the extras beyond bos_token. Written from that description, not copied from transformers.
"""
import argparse
import gzip
import io
import json
import random
import unicodedata

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers

WORDS = ("hello world the a of to is what why how please explain write code in C Python "
         "résumé naïve Zürich 你好 世界 こんにちは 안녕하세요 Привет мир مرحبا שלום "
         "🙂 👍🏽 👨‍👩‍👧 🇯🇵 e\u0301 1234 3.14159 {json} [x] <tag> \\n \\t").split()
TRICKY = ["", " ", "  ", "\n", "\n\n", "\t", " \n \t ", "\r\n", "\u3000", "\u00a0",
          "<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "{{ x }}", "{% if %}",
          "'quoted' \"double\"", "trailing space ", " leading", "line1\nline2\n",
          "```python\nprint('hi')\n```", "a\u200db", "\\u0000 is not NUL"]


def rand_text(rng):
    k = rng.random()
    if k < 0.25:
        return rng.choice(TRICKY)
    n = rng.randint(1, 12)
    parts = []
    for _ in range(n):
        parts.append(rng.choice(WORDS))
        parts.append(rng.choice([" ", " ", " ", "\n", "  ", "", "\n\n", "\t"]))
    if rng.random() < 0.2:
        parts.append(rng.choice(TRICKY))
    if rng.random() < 0.1:  # random code points, no surrogates, no NUL
        for _ in range(rng.randint(1, 10)):
            cp = rng.randint(1, 0x2FFFF)
            # NOTE: only code points assigned in Unicode 14 (PCRE2 10.42's tables, and this
            # Python's unicodedata when it is 3.11): a code point assigned later (e.g.
            # U+141B0, Unicode 16) is \p{L} to HF's Oniguruma but not to PCRE2 10.42, a
            # known gap of the tokenizer (docs/tokenizer.md), not of the chat format.
            if 0xD800 <= cp <= 0xDFFF or unicodedata.category(chr(cp)) == "Cn":
                cp = 0xFFFD
            parts.append(chr(cp))
    return "".join(parts)


def conversation(rng, i):
    turns = []
    n_turns = rng.randint(1, 5)
    for t in range(n_turns):
        turns.append({"role": "user", "content": rand_text(rng)})
        # the last turn often ends on the user (a request), sometimes on the assistant
        if t < n_turns - 1 or rng.random() < 0.3:
            turns.append({"role": "assistant", "content": rand_text(rng)})
    if rng.random() < 0.05:  # assistant first, or two users in a row: the template allows it
        turns.insert(0, {"role": rng.choice(["assistant", "user"]), "content": rand_text(rng)})
    n_sys = rng.choice([0, 0, 1, 1, 1, 2, 3])
    for _ in range(n_sys):
        pos = 0 if rng.random() < 0.6 else rng.randint(0, len(turns))
        turns.insert(pos, {"role": "system", "content": rand_text(rng)})
    if i % 50 == 7:  # system messages only
        turns = [m for m in turns if m["role"] == "system"] or [
            {"role": "system", "content": rand_text(rng)}]
    if i == 13:
        turns = []
    return turns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20250807)
    a = ap.parse_args()

    if unicodedata.unidata_version != "14.0.0":
        raise SystemExit("needs Python 3.11 (unicodedata 14.0.0) for the code-point filter")
    cfg = json.load(open(a.config, encoding="utf-8"))

    def tok_str(v):
        return v["content"] if isinstance(v, dict) else v

    special = {k: tok_str(cfg.get(k)) for k in ("bos_token", "eos_token", "pad_token",
                                                "unk_token")}

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    env.globals["raise_exception"] = raise_exception
    tmpl = env.from_string(cfg["chat_template"])

    hf = tokenizers.Tokenizer.from_file(a.tokenizer)
    rng = random.Random(a.seed)
    with open(a.out, "wb") as raw, \
            gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz, \
            io.TextIOWrapper(gz, encoding="utf-8") as f:
        f.write(json.dumps({"chat_template": cfg["chat_template"],
                            "bos_token": special["bos_token"],
                            "eos_token": special["eos_token"]}, ensure_ascii=False) + "\n")
        for i in range(a.n):
            msgs = conversation(rng, i)
            gen = (i % 3) != 2
            text = tmpl.render(messages=msgs, tools=None, documents=None,
                               add_generation_prompt=gen, **special)
            ids = hf.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"messages": msgs, "add_generation_prompt": gen, "text": text,
                                "ids": ids}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
