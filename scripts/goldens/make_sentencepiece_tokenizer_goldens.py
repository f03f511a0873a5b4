#!/usr/bin/env python3
"""Golden files for lychee's SentencePiece-style tokenizers (BPE with byte fallback, Unigram, GGUF).

Trains two tiny SentencePiece BPE models and one Unigram model on a few KB of text (the training
text of make_tokenizer_goldens.py), writes them in the shapes the published models use, and records
what the reference gives on fixed texts:

  tests/golden/tokenizers/llama2/    tokenizer.json as Llama-2, TinyLlama, CodeLlama and Mistral v0.1
                                     ship it: normalizer Sequence[Prepend("▁"), Replace(" ", "▁")],
                                     no pre-tokenizer, BPE with byte_fallback and fuse_unk, decoder
                                     Sequence[Replace, ByteFallback, Fuse, Strip], post-processor
                                     TemplateProcessing("<s> $A")
  tests/golden/tokenizers/mistral/   Mistral v0.3's shape: no normalizer, Metaspace(prepend_scheme
                                     "first", split false); control tokens [INST], [/INST],
                                     [TOOL_CALLS] inside the SentencePiece vocabulary
  tests/golden/tokenizers/unigram/   a Unigram model (byte_fallback), normalizer Replace(" {2,}", " "),
                                     Metaspace(prepend_scheme "always", split true) and its decoder
  tests/golden/tokenizers/spm_gguf/  tokenizer.gguf: the Mistral-style SentencePiece model as a GGUF
                                     (tokenizer.ggml.model = llama: tokens, scores, token types), and
                                     cases.json from transformers' GGUF loader

Each folder's cases.json holds, per text, the ids with and without the special tokens the
tokenizer adds, the ids when special tokens in the text are not parsed, and the decode with and
without skip_special_tokens. The tokenizer.json goldens come from `tokenizers` (what
transformers' PreTrainedTokenizerFast runs on a tokenizer.json); the script checks that
transformers gives the same ids and decodes. The GGUF goldens come from
transformers' GGUF tokenizer builder (what AutoTokenizer.from_pretrained(gguf_file=...) runs).

Usage (needs sentencepiece, tokenizers, transformers, gguf, protobuf; no torch):
  python3 scripts/goldens/make_sentencepiece_tokenizer_goldens.py --out tests/golden

The output is deterministic (SentencePiece trains single-threaded here; sorted keys).
"""

import argparse
import io
import json
import os
import sys
import tempfile

import sentencepiece as spm
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_goldens import TRAINING_TEXT  # noqa: E402

# Texts every SentencePiece tokenizer is checked on: leading, trailing and repeated spaces,
# newlines and tabs, digits, accents (composed and decomposed), CJK, emoji, characters absent
# from the training text (byte fallback), and special tokens in the text.
CASE_TEXTS = [
    "Hello world",
    " Hello world",
    "  Hello  world  ",
    "Hello\nworld\n\nThe quick brown fox.\n",
    "\n\nleading newlines",
    "\tdef tokenize(text):\n    return len(text)  # two  spaces\n",
    "In 2024 the team trained 3 models on 1,000,000 tokens; 97.5% at step 12345.",
    "Café naïve résumé Ångström façade déjà vu",
    "Cafe\u0301 A\u030angstro\u0308m (decomposed)",
    "日本語の文章です。我们今天学习中文。한국어 문장입니다.",
    "Emoji time 😀 😂 👍 🚀 ❤️ and new ones 🦜🧪 👩🏽‍💻",
    "Byte fallback: Ωμέγα ∮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ሰላም ᚠᛇᚻ \x01\x7f",
    "▁ already ▁▁ escaped ▁",
    "<s>Hello</s> <s> x</s>",
    "[INST] What is 2+2? [/INST] Four.</s>[INST]Next[/INST]",
    "<unk> and <0x41> as text",
    "",
    " ",
    "   ",
    "\n",
    "a",
    "x\u00a0y\u3000z\u200bw",
]

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
MISTRAL_CONTROL = ["[INST]", "[/INST]", "[TOOL_CALLS]"]


def train_spm(model_type, vocab_size, control_symbols=()):
    """A SentencePiece model with Llama's settings: byte fallback, digits split, no normalisation,
    a dummy prefix, whitespace kept as it is; ids 0, 1, 2 = <unk>, <s>, </s>."""
    out = io.BytesIO()
    lines = [line for line in TRAINING_TEXT.split("\n") if line] * 3
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, model_type=model_type,
        vocab_size=vocab_size, byte_fallback=True, split_digits=True,
        character_coverage=1.0, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_by_unicode_script=True, max_sentencepiece_length=16, num_threads=1,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, control_symbols=list(control_symbols),
        minloglevel=2)
    return out.getvalue()


def spm_pieces(model_bytes):
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    m.ParseFromString(model_bytes)
    return [(p.piece, p.score, p.type) for p in m.pieces]


def bpe_from_spm(pieces):
    """vocab and merges the way transformers converts a SentencePiece BPE model (and its GGUF
    loader rebuilds them): generate_merges over the vocabulary, ranked by the pieces' scores."""
    from transformers.tokenization_utils_base import generate_merges
    vocab = {p: i for i, (p, _, _) in enumerate(pieces)}
    merges = generate_merges(vocab, {p: s for p, s, _ in pieces})
    return vocab, merges


def special_added_tokens(pieces):
    return [AddedToken(p, special=True, normalized=False) for p, _, t in pieces if t in (2, 3)]


def with_spm_bpe_decoding(tok, vocab, pieces):
    """The decoder, special tokens and BOS post-processor both SentencePiece-BPE shapes share."""
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1)])
    tok.add_special_tokens(special_added_tokens(pieces))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, vocab[BOS])])
    return tok


def llama2_tokenizer(pieces):
    vocab, merges = bpe_from_spm(pieces)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK, fuse_unk=True,
                               byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    return with_spm_bpe_decoding(tok, vocab, pieces)


def mistral_tokenizer(pieces):
    vocab, merges = bpe_from_spm(pieces)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=UNK, fuse_unk=True,
                               byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                 split=False)
    return with_spm_bpe_decoding(tok, vocab, pieces)


def unigram_tokenizer(pieces):
    tok = Tokenizer(models.Unigram([(p, s) for p, s, _ in pieces], unk_id=0, byte_fallback=True))
    tok.normalizer = normalizers.Replace(Regex(" {2,}"), " ")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always",
                                                 split=True)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    tok.add_special_tokens(special_added_tokens(pieces))
    return tok


def config_for(style):
    c = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "add_bos_token": style != "unigram",
         "add_eos_token": False, "clean_up_tokenization_spaces": False,
         "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096}
    if style == "unigram":
        c["bos_token"] = None
    return c


def encode_case(encode, decode, text):
    """encode(text, add_special, parse_special) -> ids; decode(ids, skip_special) -> str."""
    ids_special = encode(text, True, True)
    return {
        "text": text,
        "ids_add_special": ids_special,
        "ids": encode(text, False, True),
        "ids_no_parse_special": encode(text, False, False),
        "decode": decode(ids_special, False),
        "decode_skip_special": decode(ids_special, True),
    }


def tokenizers_codec(tok):
    def encode(text, add_special, parse_special):
        tok.encode_special_tokens = not parse_special
        ids = tok.encode(text, add_special_tokens=add_special).ids
        tok.encode_special_tokens = False
        return ids

    def decode(ids, skip):
        return tok.decode(ids, skip_special_tokens=skip)
    return encode, decode


def transformers_codec(hf):
    def encode(text, add_special, parse_special):
        return hf(text, add_special_tokens=add_special,
                  split_special_tokens=not parse_special)["input_ids"]

    def decode(ids, skip):
        return hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
    return encode, decode


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1, sort_keys=True)
        f.write("\n")


def summary(vocab_size, bos, eos, unk, add_bos):
    return {"vocab_size": vocab_size, "bos_id": bos, "eos_id": eos, "unk_id": unk,
            "add_bos": add_bos}


def write_hf(out_dir, style, tok, pieces):
    from transformers import PreTrainedTokenizerFast
    d = os.path.join(out_dir, "tokenizers", style)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"), pretty=False)
    config = config_for(style)
    write_json(os.path.join(d, "tokenizer_config.json"), config)
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    cases = [encode_case(*tokenizers_codec(tok), t) for t in CASE_TEXTS]
    # transformers on the same files must agree, or the goldens would not be transformers'.
    hf = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"),
                                 **{k: v for k, v in config.items()
                                    if k in ("bos_token", "eos_token", "unk_token")})
    for c, t in zip(cases, CASE_TEXTS):
        h = encode_case(*transformers_codec(hf), t)
        assert h == c, f"{style}: transformers and tokenizers differ on {t!r}:\n{h}\n{c}"
    vocab = tok.get_vocab(with_added_tokens=True)
    obj = {"reference": (f"tokenizers {sys.modules['tokenizers'].__version__} (transformers "
                         f"{sys.modules['transformers'].__version__} agrees)"),
           **summary(tok.get_vocab_size(with_added_tokens=True), vocab.get(config["bos_token"], -1),
                     vocab[EOS], vocab[UNK], config["add_bos_token"]),
           "sentencepiece_ids": spm_ids_note(style),
           "cases": cases}
    write_json(os.path.join(d, "cases.json"), obj)
    print(f"{style}: vocab {obj['vocab_size']}, tokenizer.json "
          f"{os.path.getsize(os.path.join(d, 'tokenizer.json'))} bytes", file=sys.stderr)


SPM_AGREEMENT = {}


def spm_ids_note(style):
    return SPM_AGREEMENT.get(style, "")


def check_against_sentencepiece(style, model_bytes, tok):
    """How often the converted tokenizer agrees with SentencePiece itself (informational)."""
    sp = spm.SentencePieceProcessor(model_proto=model_bytes)
    same = sum(sp.encode(t) == tok.encode(t, add_special_tokens=False).ids for t in CASE_TEXTS)
    SPM_AGREEMENT[style] = (f"sentencepiece {spm.__version__} gives the same ids on {same} of "
                            f"{len(CASE_TEXTS)} texts")


def gguf_transformers_tokenizer(path):
    """The tokenizer transformers' from_pretrained(gguf_file=...) builds (TokenizersBackend's GGUF
    branch: get_gguf_tokenizer, convert_gguf_tokenizer, the file's tokenizer_config as kwargs).

    transformers' GGUF reader imports torch for tensor types and dequantisation only; without torch
    installed, a stand-in module whose every attribute is a placeholder class lets the metadata
    reader load (no tensor is read here).
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        import types

        class TorchStandIn(types.ModuleType):
            def __getattr__(self, name):
                return type(name, (), {})
        sys.modules["torch"] = TorchStandIn("torch")
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (convert_gguf_tokenizer,
                                                                        get_gguf_tokenizer)
    architecture, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(path)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **tokenizer_config, **extra)


def write_gguf(out_dir, pieces):
    import gguf
    d = os.path.join(out_dir, "tokenizers", "spm_gguf")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_tokenizer_model("llama")
    w.add_token_list([p for p, _, _ in pieces])
    w.add_token_scores([s for _, s, _ in pieces])
    w.add_token_types([t for _, _, t in pieces])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    hf = gguf_transformers_tokenizer(path)
    cases = [encode_case(*transformers_codec(hf), t) for t in CASE_TEXTS]
    obj = {"reference": (f"transformers {sys.modules['transformers'].__version__} "
                         "GGUF loader (get_gguf_tokenizer + convert_gguf_tokenizer)"),
           **summary(len(hf), hf.bos_token_id, hf.eos_token_id, hf.unk_token_id,
                     bool(hf.add_bos_token)),
           "cases": cases}
    write_json(os.path.join(d, "cases.json"), obj)
    print(f"spm_gguf: vocab {len(hf)}, tokenizer.gguf {os.path.getsize(path)} bytes",
          file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/golden", help="output folder")
    args = ap.parse_args()
    llama_model = train_spm("bpe", 900)
    mistral_model = train_spm("bpe", 900, MISTRAL_CONTROL)
    unigram_model = train_spm("unigram", 520)
    for style, model, build in (("llama2", llama_model, llama2_tokenizer),
                                ("mistral", mistral_model, mistral_tokenizer),
                                ("unigram", unigram_model, unigram_tokenizer)):
        pieces = spm_pieces(model)
        tok = build(pieces)
        check_against_sentencepiece(style, model, tok)
        write_hf(args.out, style, tok, pieces)
    write_gguf(args.out, spm_pieces(mistral_model))


if __name__ == "__main__":
    main()
