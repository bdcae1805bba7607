#!/usr/bin/env python3
"""make_tokenizer_ref.py: the reference ids for tests/runtime/test_tokenizer.c.

Encodes N varied strings (ASCII prose, code, numbers, whitespace runs, CJK, kana, Hangul,
other scripts, emoji with ZWJ and modifiers, combining marks, random code points, special and
added tokens in running text, concatenations of random vocabulary pieces) with HF `tokenizers`
(PyPI) on DeepSeek-V3's tokenizer.json and writes one JSON object per line, {"s": text,
"ids": [...]}, gzip-compressed. The strings come from a fixed seed, so a rerun with the same
`tokenizers` version gives the same file.

  pip install tokenizers
  python3 tests/runtime/make_tokenizer_ref.py \
      --tokenizer ../shared/data/tokenizers/deepseek-v3/tokenizer.json \
      --out tests/runtime/tokenizer_ref/deepseek-v3.jsonl.gz

NOTE: encode(..., add_special_tokens=True) as `tokenizers` does by default; this file's
post-processor (ByteLevel) adds no ids, so that is the same as the raw pipeline.
"""
import argparse
import gzip
import json
import random

import tokenizers

ASCII_WORDS = ("the of and to in is that it was for on are with as his they be at one have "
               "this from or had by hot word but what some we can out other were all there "
               "when up use your how said an each she which do their time if will way about "
               "Hello World HTTP JSON DeepSeek don't I'm we'll it's they've U.S.A. e.g. "
               "naïve café résumé Zürich straße façade").split()
CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}\n",
    "if x != None and y >= 3:\n        print(f\"{x=}\")",
    "#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); }",
    "const x = () => { return [1, 2, 3].map(v => v ** 2); };",
    "SELECT id, name FROM users WHERE age > 30 ORDER BY name;",
    "<div class=\"a\">&nbsp;</div>\r\n<br/>",
    "fn main() -> Result<(), Box<dyn Error>> { Ok(()) }",
    "    \n\n\t\t  x=1;;  //comment\r\n",
    "$ ls -la | grep '^d' && echo ok || exit 1",
    "{\"key\": [true, false, null, 1.5e-3], \"k2\": {}}",
    "a_b_c __init__ self.__dict__ @decorator #hashtag ~/.bashrc",
]
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可自会那后能对着事其里所去行过家十用发天如然作方成者多日都三小军二无同么经法当起与好看学进种将还分此心前面又定见只主没公从"
KANA = "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんアイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンー゛゜"
HANGUL = "한국어안녕하세요감사합니다대한민국서울"
OTHER = ["Привет мир", "Γειά σου Κόσμε", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया",
         "สวัสดีชาวโลก", "Xin chào thế giới", "გამარჯობა", "Բարեւ", "ሰላም ልዑል", "ᚠᚢᚦᚨᚱᚲ",
         "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "Ⅻ ⅻ ½ ¾ ² ³ ① ② ٣ ४ ๕", "e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "🇺🇳", "❤️", "🏳️‍🌈", "🤖", "✨", "🧑🏿‍💻", "©", "™",
         "🫠", "🥲", "1️⃣", "#️⃣"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2009", "\u200b",
          "\u2028", "\x0b", "\x0c", "\x85", " \n ", "\t\n\t"]
PUNCT = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["…", "—", "–", "“", "”", "‘", "’", "«",
                                                    "»", "。", "、", "！", "？", "・", "€", "£",
                                                    "¥", "°", "±", "×", "÷", "→", "∑", "≤"]


def number(rng):
    k = rng.randrange(6)
    if k == 0:
        return str(rng.randrange(10 ** rng.randrange(1, 12)))
    if k == 1:
        return f"{rng.uniform(-1e4, 1e4):.{rng.randrange(0, 6)}f}"
    if k == 2:
        return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
    if k == 3:
        return f"{rng.random():e}"
    if k == 4:
        return "0x" + "".join(rng.choice("0123456789abcdefABCDEF") for _ in range(rng.randrange(1, 9)))
    return "".join(rng.choice("0123456789,._ ") for _ in range(rng.randrange(1, 20)))


def random_cp(rng):
    while True:
        r = rng.random()
        if r < 0.5:
            cp = rng.randrange(0x20, 0x3000)
        elif r < 0.8:
            cp = rng.randrange(0x3000, 0x10000)
        else:
            cp = rng.randrange(0x10000, 0x30000)
        if not 0xD800 <= cp <= 0xDFFF:
            return chr(cp)


def piece(rng, specials, vocab_pieces):
    k = rng.randrange(14)
    if k == 0:
        return " ".join(rng.choice(ASCII_WORDS) for _ in range(rng.randrange(1, 12)))
    if k == 1:
        return rng.choice(CODE)
    if k == 2:
        return number(rng)
    if k == 3:
        return "".join(rng.choice(SPACES) for _ in range(rng.randrange(1, 6)))
    if k == 4:
        return "".join(rng.choice(CJK) for _ in range(rng.randrange(1, 16)))
    if k == 5:
        return "".join(rng.choice(KANA + CJK) for _ in range(rng.randrange(1, 12)))
    if k == 6:
        return "".join(rng.choice(HANGUL) for _ in range(rng.randrange(1, 8)))
    if k == 7:
        return rng.choice(OTHER)
    if k == 8:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randrange(1, 5)))
    if k == 9:
        return "".join(rng.choice(PUNCT) for _ in range(rng.randrange(1, 6)))
    if k == 10:
        return "".join(random_cp(rng) for _ in range(rng.randrange(1, 8)))
    if k == 11:
        return rng.choice(specials)
    if k == 12:
        return "".join(rng.choice(vocab_pieces) for _ in range(rng.randrange(1, 6)))
    # mixed-case identifiers and words glued to punctuation
    w = rng.choice(ASCII_WORDS)
    return rng.choice(["", "(", "'", "\"", "_", "-", "."]) + w.upper() + rng.choice(PUNCT) + w


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=20240607)
    a = ap.parse_args()
    tok = tokenizers.Tokenizer.from_file(a.tokenizer)
    cfg = json.load(open(a.tokenizer, encoding="utf-8"))
    specials = [t["content"] for t in cfg["added_tokens"]]
    rng = random.Random(a.seed)
    # Pieces of the vocabulary as text: decoded single tokens that are whole UTF-8.
    vocab_pieces = []
    for i in rng.sample(range(128000), 3000):
        s = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" not in s:
            vocab_pieces.append(s)
    fixed = ["", " ", "a", "\n", "  \n\n  ", "<｜begin▁of▁sentence｜>Hello",
             "<｜User｜>hi<｜Assistant｜>", "<｜begin▁of▁sentence｜><｜begin▁of▁sentence｜>",
             "<｜begin▁of▁sentence", "<think>\n</think>", "1234567", "x" * 300, " " * 100,
             "\t" * 20 + "x", "Ｈｅｌｌｏ　ｗｏｒｌｄ",
             # long runs: one huge word or whitespace run (BPE and regex backtracking at size)
             " " * 20000, "a" * 20000, "1" * 20001, "\n" * 5000 + "x", "é" * 10000,
             "😀" * 5000, "ab " * 7000, "中" * 10000, "\t \n" * 3000, "x" * 5000 + " " * 5000]
    with gzip.GzipFile(a.out, "wb", mtime=0) as f:
        for i in range(a.n):
            if i < len(fixed):
                s = fixed[i]
            else:
                s = "".join(piece(rng, specials, vocab_pieces)
                            for _ in range(rng.randrange(1, 7)))
            ids = tok.encode(s).ids
            line = json.dumps({"s": s, "ids": ids}, ensure_ascii=False, separators=(",", ":"))
            f.write(line.encode("utf-8") + b"\n")
    print(f"wrote {a.n} strings to {a.out} (tokenizers {tokenizers.__version__})")


if __name__ == "__main__":
    main()
