"""The Python engine API on the CUDA backend (the GPU machine: scripts/gpu/run_all.sh python).

Skips, saying why, where no usable CUDA device is; with LYCHEE_REQUIRE_GPU=1 (the GPU script) it
fails instead, so a broken driver cannot make the run green.
"""
import _thread
import os
import subprocess
import threading
import time

import pytest

import lychee
from lychee.policy import Full, Lychee, Quest

from lychee_test_paths import cli_binary

PROMPT = "The Roman Empire was"
WHY = lychee.cuda_device_status()
if os.environ.get("LYCHEE_REQUIRE_GPU") != "1":
    pytestmark = pytest.mark.skipif(WHY != "", reason=f"no usable CUDA device: {WHY}")


@pytest.fixture(scope="module")
def gpu():
    return lychee.Engine(device="cuda", max_context=4096)


def long_prompt(engine, n_tokens):
    text = ""
    while len(engine.tokenize(text)) < n_tokens:
        text += "The quick brown fox jumps over the lazy dog near the river bank. "
    return text


def test_gpu_generate_equals_the_cli(gpu):
    assert gpu.device == "cuda"
    out = subprocess.run([str(cli_binary()), "generate", "--device", "cuda", "--max-context", "4096", "-p", PROMPT,
                          "-n", "24"], capture_output=True, text=True, timeout=300, check=True).stdout
    assert out == gpu.generate(PROMPT, max_tokens=24).text + "\n"


def test_gpu_fp8_weights_with_policies_at_load_equal_the_cli():
    e = lychee.Engine(device="cuda", max_context=4096, weights="fp8", policies=[Lychee(budget=64)])
    assert e.weights == "fp8"
    assert e.fp8_kept_layers == [0, 1, 2, 12]  # the stand-in roles' retrieval layers stay bf16
    got = e.generate(PROMPT, max_tokens=16, policy=Lychee(budget=64)).text
    out = subprocess.run([str(cli_binary()), "generate", "--device", "cuda", "--max-context", "4096", "--weights", "fp8",
                          "--policy", "lychee", "--budget", "64", "-p", PROMPT, "-n", "16"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert out == got + "\n"


def test_gpu_fp8_kv_cache_doubles_the_tokens_and_equals_the_cli():
    # kv_cache_dtype="fp8": the GPU's pages hold e4m3 codes and a scale per token and KV head, so the
    # same kv_memory holds 2 x 64 / (64 + 4) = 1.88x the default model's tokens; the text is the CLI's.
    bf16 = lychee.Engine(device="cuda", max_context=4096, kv_memory=0.05)
    fp8 = lychee.Engine(device="cuda", max_context=4096, kv_memory=0.05, kv_cache_dtype="fp8")
    assert (bf16.kv_cache_dtype, fp8.kv_cache_dtype) == ("bf16", "fp8")
    assert fp8.kv_tokens / bf16.kv_tokens == pytest.approx(2 * 64 / 68, rel=1e-3)
    got = fp8.generate(PROMPT, max_tokens=16).text
    out = subprocess.run([str(cli_binary()), "generate", "--device", "cuda", "--max-context", "4096", "--kv-memory", "0.05",
                          "--kv-cache-dtype", "fp8", "-p", PROMPT, "-n", "16"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert out == got + "\n"


def test_gpu_stream_equals_generate(gpu):
    whole = gpu.generate(PROMPT, max_tokens=32, temperature=0.8, seed=3)
    s = gpu.stream(PROMPT, max_tokens=32, temperature=0.8, seed=3)
    assert "".join(s) == whole.text
    assert s.completion.tokens == whole.tokens


def test_gpu_budgets_covering_the_sequence_equal_full(gpu):
    prompt = long_prompt(gpu, 600)
    full = gpu.generate(prompt, max_tokens=8, ignore_eos=True, policy=Full())
    for policy in [Lychee(budget=4096, block_size=16), Quest(budget=4096)]:
        assert gpu.generate(prompt, max_tokens=8, ignore_eos=True, policy=policy).tokens == full.tokens, policy
    plain = Lychee(budget=128, block_size=16, sink=0, recent=0)  # no forced tokens: the budget alone
    sparse = gpu.generate(prompt, max_tokens=8, ignore_eos=True, policy=plain)
    assert 0 < sparse.kv_bytes_read < 0.8 * sparse.kv_bytes_dense


def test_gpu_unsupported_policy_is_a_clear_error(gpu):
    with pytest.raises(lychee.UnsupportedError, match="block"):
        gpu.generate(PROMPT, max_tokens=4, policy=Lychee(budget=256, block_size=24))


def test_gpu_keyboard_interrupt(gpu):
    want = gpu.generate(PROMPT, max_tokens=8).tokens
    timer = threading.Timer(0.3, _thread.interrupt_main)
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        gpu.generate(PROMPT, max_tokens=4000, ignore_eos=True)
    timer.join()
    assert time.monotonic() - t0 < 5.0
    assert gpu.generate(PROMPT, max_tokens=8).tokens == want
