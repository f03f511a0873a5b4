"""The Python API's shape on the default model, on the CPU: batches (a list of prompts or of
conversations as one continuously batched call), SamplingParams in place of keyword arguments,
the OpenAI response form, a stream holding the engine (EngineBusyError, never a silent cancel),
seeds, log-probabilities, docstrings for every public name, and the type stubs (checked by mypy).
"""
import inspect
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import lychee
from lychee import SamplingParams
from lychee.policy import Lychee

PROMPTS = ["The Roman Empire was", "Once upon a time", "The capital of France is", "def fibonacci(n):",
           "Water boils at", "My favourite colour is"]


@pytest.fixture(scope="module")
def engine():
    # max_batch 4 < len(PROMPTS): the batch also exercises admission as places free up.
    return lychee.Engine(device="cpu", max_batch=4)


# --- batches ------------------------------------------------------------------------------------

def test_batch_equals_one_by_one_under_greedy(engine):
    # Different max_tokens make sequences finish at different steps, so later prompts join a
    # batch in progress; ignore_eos keeps the lengths exact.
    params = [SamplingParams(max_tokens=3 + 2 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    one_by_one = [engine.generate(p, s) for p, s in zip(PROMPTS, params)]
    batch = engine.generate(PROMPTS, params)
    assert isinstance(batch, list) and len(batch) == len(PROMPTS)
    for single, got in zip(one_by_one, batch):
        assert got.tokens == single.tokens
        assert got.text == single.text
        assert got.finish_reason == single.finish_reason == "length"
        assert got.prompt_tokens == single.prompt_tokens
        assert got.kv_bytes_read == single.kv_bytes_read and got.decode_steps == single.decode_steps
    assert [len(c.tokens) for c in batch] == [3 + 2 * i for i in range(len(PROMPTS))]


def test_batch_stops_like_single_calls(engine):
    # Stop tokens (no ignore_eos) and stop strings end each sequence where a call of its own ends.
    full = engine.generate(PROMPTS[0], max_tokens=24, ignore_eos=True)
    stop = full.text[8:12]
    params = SamplingParams(max_tokens=24, stop=[stop])
    prompts = [PROMPTS[0], "What is 2 + 2? Answer:", PROMPTS[2]]
    one_by_one = [engine.generate(p, params) for p in prompts]
    batch = engine.generate(prompts, params)
    assert [c.tokens for c in batch] == [c.tokens for c in one_by_one]
    assert [c.text for c in batch] == [c.text for c in one_by_one]
    assert [c.finish_reason for c in batch] == [c.finish_reason for c in one_by_one]
    assert batch[0].finish_reason == "stop" and stop not in batch[0].text


def test_token_id_prompts_and_a_single_string(engine):
    ids = [engine.tokenize(p) for p in PROMPTS[:2]]
    by_ids = engine.generate(ids, max_tokens=4)
    by_text = engine.generate(PROMPTS[:2], max_tokens=4)
    assert [c.tokens for c in by_ids] == [c.tokens for c in by_text]
    single = engine.generate(PROMPTS[0], max_tokens=4)
    assert isinstance(single, lychee.Completion)
    assert single.tokens == by_text[0].tokens
    assert engine.generate(ids[0], max_tokens=4).tokens == single.tokens  # token ids: one prompt
    assert engine.generate(iter(PROMPTS[:2]), max_tokens=4)[1].tokens == by_text[1].tokens


def test_chat_batch_equals_one_by_one(engine):
    conversations = [[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
                     [("system", "Be brief."), ("user", "Name a colour.")]]
    one_by_one = [engine.chat(c, max_tokens=12) for c in conversations]
    batch = engine.chat(conversations, max_tokens=12)
    assert isinstance(batch, list) and len(batch) == 2
    assert [c.tokens for c in batch] == [c.tokens for c in one_by_one]
    assert "Paris" in batch[0].text


def test_batch_sampling_per_prompt_and_errors(engine):
    params = [SamplingParams(max_tokens=2, ignore_eos=True), SamplingParams(max_tokens=5, ignore_eos=True)]
    assert [len(c.tokens) for c in engine.generate(PROMPTS[:2], params)] == [2, 5]
    # A keyword argument replaces the field in every prompt's SamplingParams.
    assert [len(c.tokens) for c in engine.generate(PROMPTS[:2], params, max_tokens=3)] == [3, 3]
    assert [c.tokens for c in engine.generate(PROMPTS[:2], max_tokens=0)] == [[], []]
    with pytest.raises(ValueError, match="2 SamplingParams for 3 prompts"):
        engine.generate(PROMPTS[:3], params)
    with pytest.raises(TypeError, match="on_text"):
        engine.generate(PROMPTS[:2], max_tokens=2, on_text=print)
    with pytest.raises(TypeError, match="stream\\(\\) takes one prompt"):
        engine.stream(PROMPTS[:2])
    with pytest.raises(lychee.InvalidArgumentError, match=r"prompts\[1\]: .*outside the vocabulary"):
        engine.generate([[1, 2], [3, 10**7]], max_tokens=2)
    with pytest.raises(lychee.InvalidArgumentError, match=r"prompts\[0\]: .*tidal"):
        engine.generate(PROMPTS[:2], max_tokens=2, policy=lychee.policy.Tidal(budget=64, layers=[999]))


# --- SamplingParams -----------------------------------------------------------------------------

def test_sampling_params_equal_keyword_arguments(engine):
    kwargs = dict(max_tokens=12, temperature=0.8, top_p=0.9, top_k=40, seed=11, stop=["\n\n"], ignore_eos=True)
    params = SamplingParams(**kwargs)
    by_kwargs = engine.generate(PROMPTS[1], **kwargs)
    for got in (engine.generate(PROMPTS[1], params), engine.generate(PROMPTS[1], sampling=params)):
        assert got.tokens == by_kwargs.tokens and got.text == by_kwargs.text and got.seed == 11
    assert "".join(engine.stream(PROMPTS[1], params)) == by_kwargs.text
    policy = Lychee(budget=32, block_size=16, sink=4, recent=4)
    a = engine.generate(PROMPTS[0], SamplingParams(max_tokens=6, ignore_eos=True, policy=policy))
    b = engine.generate(PROMPTS[0], max_tokens=6, ignore_eos=True, policy=policy)
    assert a.tokens == b.tokens and a.policy == b.policy and a.policy.startswith("lychee")
    # Keywords replace the object's fields.
    assert len(engine.generate(PROMPTS[0], params, max_tokens=3).tokens) == 3
    chat = [{"role": "user", "content": "Hi"}]
    assert engine.chat(chat, params).tokens == engine.chat(chat, **kwargs).tokens


def test_sampling_params_checks_and_replace():
    p = SamplingParams(max_tokens=5)
    assert p.replace(temperature=0.5) == SamplingParams(max_tokens=5, temperature=0.5)
    assert p.max_tokens == 5 and p.temperature == 0.0 and p.seed is None
    with pytest.raises(TypeError, match="SamplingParams.max_tokens must be an int"):
        SamplingParams(max_tokens="5")
    with pytest.raises(ValueError, match="SamplingParams.top_k must be >= 0"):
        SamplingParams(top_k=-1)
    with pytest.raises(TypeError, match=r"SamplingParams.stop\[1\] must be a str"):
        SamplingParams(stop=["a", 1])
    with pytest.raises(TypeError, match="SamplingParams.policy must be a lychee.policy object"):
        SamplingParams(policy="lychee")
    with pytest.raises(ValueError, match="SamplingParams.seed must be <="):
        SamplingParams(seed=2**64)
    with pytest.raises(ValueError, match="SamplingParams.logprobs must be >= 0"):
        SamplingParams(logprobs=-1)
    with pytest.raises(Exception):  # frozen
        p.max_tokens = 3


def test_sampling_object_in_the_wrong_place(engine):
    with pytest.raises(TypeError, match="sampling must be a lychee.SamplingParams.*keyword arguments"):
        engine.generate(PROMPTS[0], 16)


# --- seeds --------------------------------------------------------------------------------------

def test_seeded_sampling_is_reproducible(engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=7, ignore_eos=True)
    a, b = engine.generate(PROMPTS[0], params), engine.generate(PROMPTS[0], params)
    assert a.tokens == b.tokens and a.seed == 7
    assert engine.generate(PROMPTS[0], params.replace(seed=8)).tokens != a.tokens
    # A seeded batch gives every prompt what a call of its own gives.
    batch = engine.generate([PROMPTS[0], PROMPTS[1], PROMPTS[0]], params)
    assert batch[0].tokens == a.tokens and batch[2].tokens == a.tokens
    assert batch[1].tokens == engine.generate(PROMPTS[1], params).tokens


def test_unseeded_sampling_draws_a_seed_and_reports_it(engine):
    params = SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)
    runs = [engine.generate(PROMPTS[0], params) for _ in range(3)]
    assert len({r.seed for r in runs}) == 3
    assert len({tuple(r.tokens) for r in runs}) > 1
    again = engine.generate(PROMPTS[0], params.replace(seed=runs[0].seed))
    assert again.tokens == runs[0].tokens


# --- OpenAI form --------------------------------------------------------------------------------

def test_chat_openai_format(engine):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    d = engine.chat(messages, max_tokens=12, format="openai")
    assert isinstance(d, dict)
    assert d["object"] == "chat.completion" and d["id"].startswith("chatcmpl-")
    assert isinstance(d["created"], int) and abs(d["created"] - time.time()) < 600
    assert d["model"] == engine.model_name == "SmolLM2-135M-Instruct.Q4_1"
    (choice,) = d["choices"]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    plain = engine.chat(messages, max_tokens=12)
    assert choice["message"]["content"] == plain.text and choice["finish_reason"] == plain.finish_reason
    u = d["usage"]
    assert u["prompt_tokens"] == plain.prompt_tokens and u["completion_tokens"] == len(plain.tokens)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert plain.to_openai()["choices"][0]["message"] == choice["message"]
    json.dumps(d)  # plain JSON types
    # The openai client's own model of the response accepts it.
    openai_types = pytest.importorskip("openai.types.chat")
    parsed = openai_types.ChatCompletion.model_validate(d)
    assert parsed.choices[0].message.content == plain.text
    batch = engine.chat([messages, messages], max_tokens=12, format="openai")
    assert [b["choices"][0]["message"]["content"] for b in batch] == [plain.text, plain.text]


def test_generate_openai_format(engine):
    d = engine.generate(PROMPTS[0], max_tokens=6, format="openai")
    assert d["object"] == "text_completion" and d["id"].startswith("cmpl-")
    assert d["choices"][0]["text"] == engine.generate(PROMPTS[0], max_tokens=6).text
    openai_types = pytest.importorskip("openai.types")
    openai_types.Completion.model_validate(d)
    with pytest.raises(ValueError, match='format must be None or "openai"'):
        engine.generate(PROMPTS[0], max_tokens=2, format="json")


def test_logprobs(engine):
    got = engine.generate(PROMPTS[0], max_tokens=6, logprobs=3, ignore_eos=True)
    plain = engine.generate(PROMPTS[0], max_tokens=6, ignore_eos=True)
    assert got.tokens == plain.tokens and plain.logprobs is None
    assert len(got.logprobs) == 6
    for t in got.logprobs:
        assert t["logprob"] <= 0.0 and len(t["top_logprobs"]) == 3
        # Greedy: the chosen token is the likeliest.
        assert math.isclose(t["logprob"], t["top_logprobs"][0]["logprob"], rel_tol=1e-6)
        assert t["top_logprobs"][0]["logprob"] >= t["top_logprobs"][1]["logprob"] >= t["top_logprobs"][2]["logprob"]
    d = engine.chat([("user", "Hi")], max_tokens=4, logprobs=2, format="openai")
    content = d["choices"][0]["logprobs"]["content"]
    assert len(content) == d["usage"]["completion_tokens"] and len(content[0]["top_logprobs"]) == 2
    batch = engine.generate(PROMPTS[:2], max_tokens=6, logprobs=3, ignore_eos=True)
    assert batch[0].logprobs == got.logprobs


# --- a stream holds the engine --------------------------------------------------------------------

def test_a_request_while_a_stream_runs_is_an_error_not_a_cancel(engine):
    stream = engine.stream(PROMPTS[0], max_tokens=400, ignore_eos=True)
    first = next(stream)
    assert first and stream.running
    for call in (lambda: engine.generate(PROMPTS[1], max_tokens=2),
                 lambda: engine.generate(PROMPTS[:2], max_tokens=2),
                 lambda: engine.chat([("user", "Hi")], max_tokens=2),
                 lambda: engine.stream(PROMPTS[1], max_tokens=2)):
        with pytest.raises(lychee.EngineBusyError, match="a stream is still generating|another stream"):
            call()
    assert issubclass(lychee.EngineBusyError, RuntimeError) and issubclass(lychee.EngineBusyError, lychee.Error)
    assert repr(lychee.EngineBusyError) == "<class 'lychee.EngineBusyError'>"
    # The stream was not touched: it runs to its end and gives the whole text.
    rest = "".join(stream)
    assert stream.completion.finish_reason == "length" and len(stream.completion.tokens) == 400
    assert first + rest == stream.completion.text
    assert not stream.running
    # Once it has ended the engine is free.
    assert engine.generate(PROMPTS[1], max_tokens=2).tokens


def test_a_closed_stream_frees_the_engine(engine):
    with engine.stream(PROMPTS[0], max_tokens=4000, ignore_eos=True) as s:
        next(s)
    assert not s.running and s.completion.finish_reason == "cancelled"
    assert engine.generate(PROMPTS[1], max_tokens=2).tokens
    s2 = engine.stream(PROMPTS[0], max_tokens=4000, ignore_eos=True)
    next(s2)
    del s2  # dropping the last reference closes it
    assert engine.generate(PROMPTS[1], max_tokens=2).tokens


# --- documentation and types --------------------------------------------------------------------

def public_members(cls):
    """The methods and properties a user reaches (not dunders, not data fields, which the class's
    docstring describes)."""
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if isinstance(member, property) or inspect.isroutine(member) or hasattr(member, "fget"):
            yield name, member


def test_every_public_name_has_a_docstring():
    import lychee.policy
    import lychee.sampling

    missing = []
    for module in (lychee, lychee.policy, lychee.sampling):
        assert (module.__doc__ or "").strip(), module.__name__
        for name in module.__all__:
            obj = getattr(module, name)
            if not (getattr(obj, "__doc__", None) or "").strip():
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for member_name, member in public_members(obj):
                    if not (inspect.getdoc(member) or "").strip():
                        missing.append(f"{module.__name__}.{name}.{member_name}")
    assert not missing, f"no docstring: {missing}"


def test_help_of_engine_is_useful():
    text = inspect.getdoc(lychee.Engine)
    for word in ("generate", "stream", "chat", "SamplingParams", "format=\"openai\"", "max_batch", "EngineBusyError"):
        assert word in text, word
    for method in ("generate", "stream", "chat"):
        doc = inspect.getdoc(getattr(lychee.Engine, method))
        assert "SamplingParams" in doc or "as for generate" in doc or "As generate" in doc, method
    import pydoc
    rendered = pydoc.render_doc(lychee.Engine, renderer=pydoc.plaintext)
    assert "def generate" in rendered or "generate(self" in rendered


def test_type_stubs_are_installed():
    package = Path(lychee.__file__).parent
    assert (package / "py.typed").exists()
    stub = (package / "_lychee.pyi").read_text()
    for name in ("class Engine", "def generate_batch", "class Completion", "def to_openai", "class Stream",
                 "class Request", "EngineBusyError"):
        assert name in stub, name


USAGE = '''
from typing import Dict, List, Any
import lychee
from lychee import SamplingParams
from lychee.policy import Lychee

engine = lychee.Engine(device="cpu")
params = SamplingParams(max_tokens=4, temperature=0.7, seed=1, policy=Lychee(budget=64))
one: lychee.Completion = engine.generate("Hi", params)
many: List[lychee.Completion] = engine.generate(["Hi", "Yo"], params)
text: str = one.text
ids: List[int] = one.tokens
as_dict: Dict[str, Any] = engine.generate("Hi", max_tokens=4, format="openai")
stream: lychee.Stream = engine.stream("Hi", params)
reply: lychee.Completion = engine.chat([{"role": "user", "content": "Hi"}], params)
replies: List[lychee.Completion] = engine.chat([[{"role": "user", "content": "Hi"}]], max_tokens=2)
response: Dict[str, Any] = engine.chat([{"role": "user", "content": "Hi"}], format="openai")
chunks: lychee.Stream = engine.chat([{"role": "user", "content": "Hi"}], stream=True)
try:
    engine.generate("Hi", top_p=2.0)
except lychee.InvalidArgumentError as e:
    message: str = str(e)
'''

BAD_USAGE = '''
import lychee
engine = lychee.Engine(device="cpu")
n: int = engine.generate("Hi").text
'''


@pytest.mark.parametrize("source,ok", [(USAGE, True), (BAD_USAGE, False)])
def test_mypy_checks_usage_against_the_stubs(tmp_path, source, ok):
    pytest.importorskip("mypy")
    f = tmp_path / "usage.py"
    f.write_text(textwrap.dedent(source))
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                        "--strict-optional", str(f)], capture_output=True, text=True, timeout=600)
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    else:
        # The mistake is found: the stubs carry real types, not Any.
        assert r.returncode == 1 and 'Incompatible types in assignment (expression has type "str"' in r.stdout, r.stdout
