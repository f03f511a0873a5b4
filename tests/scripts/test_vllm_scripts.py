"""vLLM as the peer (issue 37), what runs without a GPU or vLLM: scripts/bench/vllm_decode.py's
arguments, model folder (config.json of the named shape, a word-level tokenizer) and plan of
shapes; scripts/bench/vllm_compare.py's tables and targets on bench files with known answers;
scripts/gpu/fetch_vllm.py's resolver pieces (markers, backtracking, the ELF check) and
wheel_xz.py's --drop; serve_load.py's --server-cmd refusal without {port}."""
import importlib.util
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def module(rel):
    spec = importlib.util.spec_from_file_location(os.path.basename(rel)[:-3], os.path.join(ROOT, rel))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


vd = module("scripts/bench/vllm_decode.py")
vc = module("scripts/bench/vllm_compare.py")
fv = module("scripts/gpu/fetch_vllm.py")


def run(rel, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, rel), *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT)


# ------------------------------------------------------------------------------ vllm_decode.py


def test_config_has_the_shapes_of_lychees_table():
    c = vd.hf_config("llama3-8b")
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]) == (4096, 14336, 32)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]) == (32, 8, 128)
    assert c["vocab_size"] == 128256 and c["rope_theta"] == 500000.0 and c["rms_norm_eps"] == 1e-5
    assert c["architectures"] == ["LlamaForCausalLM"] and c["tie_word_embeddings"] is False
    assert c["max_position_embeddings"] == 131072 + 1024
    big = vd.hf_config("llama3-70b")
    assert (big["hidden_size"], big["intermediate_size"], big["num_hidden_layers"]) == (8192, 28672, 80)
    assert (big["num_attention_heads"], big["num_key_value_heads"]) == (64, 8)
    # the hidden size is heads x head_dim, as vLLM derives it
    for cfg in (c, big):
        assert cfg["hidden_size"] == cfg["num_attention_heads"] * cfg["head_dim"]
    with pytest.raises(ValueError, match="unknown shape 'llama3-405b'.*llama3-70b"):
        vd.hf_config("llama3-405b")


def test_model_dir_writes_config_and_a_tokenizer_of_the_vocabulary(tmp_path):
    r = run("scripts/bench/vllm_decode.py", "--write-model-dir", tmp_path / "m", "--shape", "llama3-70b")
    assert r.returncode == 0, r.stderr
    d = tmp_path / "m"
    assert sorted(os.listdir(d)) == ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"]
    cfg = json.loads((d / "config.json").read_text())
    assert cfg == vd.hf_config("llama3-70b")
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert tok["model"]["type"] == "WordLevel" and len(vocab) == 128256
    assert sorted(vocab.values()) == list(range(128256)) and vocab["t128255"] == 128255
    tc = json.loads((d / "tokenizer_config.json").read_text())
    assert vocab[tc["eos_token"]] == cfg["eos_token_id"] and vocab[tc["bos_token"]] == cfg["bos_token_id"]
    try:
        import tokenizers
    except ImportError:
        return
    t = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    assert t.encode("t5 t128000 t77").ids == [5, 128000, 77]
    assert t.decode([5, 77]) == "t5 t77"


def test_arguments_defaults_and_refusals(capsys):
    a = vd.parse_args([])
    assert a.contexts == [16384, 32768, 65536, 131072] and a.batches == [1, 4, 8]
    assert a.steps == 32 and a.shape == "llama3-8b" and not a.enforce_eager
    assert a.max_model_len == min(131072 + 1024, 131072 + 32 + 64)
    a = vd.parse_args(["--contexts", "1024", "--batches", "2", "--steps", "8"])
    assert a.max_model_len == 1024 + 8 + 64
    for bad, msg in [(["--contexts", "0"], "positive"), (["--batches", "x"], "integers"), (["--steps", "0"], ">= 1"),
                     (["--max-model-len", "1000", "--contexts", "1024"], "below the longest"),
                     (["--max-model-len", "200000"], "past the shape"), (["--gpu-memory-utilization", "1.5"], "0.98"),
                     (["--shape", "gpt2"], "invalid choice")]:
        with pytest.raises(SystemExit):
            vd.parse_args(bad)
        assert msg in capsys.readouterr().err, bad


def test_prompts_are_seeded_distinct_and_in_range():
    p = vd.prompt_ids(3, 500, 128256, 0)
    assert len(p) == 3 and all(len(x) == 500 for x in p)
    assert all(10 <= t < 128256 - 10 for x in p for t in x)
    assert p == vd.prompt_ids(3, 500, 128256, 0)
    assert len({tuple(x[:16]) for x in p}) == 3  # no shared prefix between rows
    assert vd.prompt_ids(3, 500, 128256, 1) != p and vd.prompt_ids(3, 600, 128256, 0)[0][:16] != p[0][:16]


def test_plan_skips_what_the_kv_cache_cannot_hold():
    rows = vd.plan([1, 8], [1000, 4000], 32, kv_tokens=10000)
    got = {(b, c): r for b, c, r in rows}
    assert got[(1, 1000)] is None and got[(1, 4000)] is None and got[(8, 1000)] is None  # 8 x 1033 = 8264
    assert "8 x 4033 = 32264 tokens" in got[(8, 4000)] and "10000" in got[(8, 4000)]
    assert all(r is None for _, _, r in vd.plan([8], [131072], 32, None))


# ------------------------------------------------------------------------------ vllm_compare.py


def test_compare_tables_and_targets(tmp_path):
    e2e = {"gpu": "H100", "commit": "abc", "rows": [
        {"batch": 1, "context": 131072, "policy": "full", "tpot_ms": 10.0, "bound_ms": 9.5, "weights": "bf16",
         "tensor_parallel": 1},
        {"batch": 1, "context": 131072, "policy": "lychee", "tpot_ms": 6.0, "bound_ms": 5.5, "weights": "bf16",
         "tensor_parallel": 1},
        {"batch": 4, "context": 16384, "policy": "full", "tpot_ms": 8.0, "bound_ms": 7.0, "weights": "bf16",
         "tensor_parallel": 1},
        {"batch": 4, "context": 16384, "policy": "full", "tpot_ms": 1.0, "weights": "fp8", "tensor_parallel": 1}]}
    vllm = {"gpu": "H100", "vllm": "0.26.0", "rows": [
        {"batch": 1, "context": 131072, "policy": "vllm", "tpot_ms": 11.0},
        {"batch": 4, "context": 16384, "policy": "vllm", "tpot_ms": 7.5},
        {"batch": 8, "context": 131072, "policy": "vllm", "skipped": "KV cache does not fit"}]}
    lines, targets = vc.decode_table(e2e, vllm)
    text = "\n".join(lines)
    assert "| 1 | 131072 | 10.000 | 6.000 | 11.000 | 9.500 | 86.4% | 1.10x | 1.83x |" in text
    assert "| 4 | 16384 | 8.000 | - | 7.500 | 7.000 | 93.3% | 0.94x | - |" in text  # fp8 row not taken
    assert "| 8 | 131072 | - | - | skipped |" in text
    assert targets["lychee Full TPOT <= vLLM's at every measured shape"] is False  # 8.0 > 7.5 at b4
    assert targets["LycheeDecode >= 1.6x faster than vLLM at batch 1, 128K"] is True
    lyc = [{"mode": "load", "policy": "full", "levels": [
        {"concurrency": 1, "output_tok_s": 90.0, "ttft_ms_p99": 900.0, "ttft_ms_p50": 800, "tpot_ms_p50": 10,
         "tpot_ms_p99": 11}]}]
    vll = [{"mode": "load", "policy": "vllm", "levels": [
        {"concurrency": 1, "output_tok_s": 80.0, "ttft_ms_p99": 1000.0, "ttft_ms_p50": 900, "tpot_ms_p50": 12,
         "tpot_ms_p99": 13}]}]
    s, t = vc.serve_table(lyc, vll)
    assert "| lychee | full | 1 | 90.0 | 800.0 | 900.0 | 10.00 | 11.00 |" in s
    assert list(t.values()) == [True]
    vll[0]["levels"][0]["ttft_ms_p99"] = 850.0
    assert list(vc.serve_table(lyc, vll)[1].values()) == [False]
    for name, obj in (("e.json", e2e), ("v.json", vllm)):
        (tmp_path / name).write_text(json.dumps(obj))
    r = run("scripts/bench/vllm_compare.py", "--e2e", tmp_path / "e.json", "--vllm", tmp_path / "v.json",
            "--markdown", tmp_path / "o.md")
    assert r.returncode == 0, r.stderr
    assert "NOT met" in (tmp_path / "o.md").read_text()
    assert run("scripts/bench/vllm_compare.py", "--e2e", tmp_path / "e.json").returncode == 2


# ------------------------------------------------------------------------------ fetch_vllm.py, wheel_xz.py


def test_markers_follow_python_312_on_x86_64_linux_and_extras():
    R = fv.Requirement
    assert fv.applies(R('six>=1.16.0; python_version > "3.11"'), set())
    assert not fv.applies(R('tomli; python_version < "3.11"'), set())
    assert fv.applies(R('llguidance; platform_machine == "x86_64"'), set())
    assert not fv.applies(R('pywin32; sys_platform == "win32"'), set())
    assert fv.applies(R('uvicorn; extra == "standard"'), {"standard"})
    assert not fv.applies(R('uvicorn; extra == "standard"'), set())


def test_backtracking_blames_the_unpinned_parent():
    S = fv.SpecifierSet
    contributions = [("vllm", "0.26.0", S("==0.1.10"), True), ("xgrammar", "0.2.8", S(">=0.1.11"), False),
                     ("quack-kernels", "0.6.5", S("<0.2,>=0.1.6"), False)]
    b = fv.find_culprits("apache-tvm-ffi", contributions, ["0.1.9", "0.1.10", "0.1.11"], {})
    assert b.culprits == [("xgrammar", "0.2.8")] and b.wanted == {"xgrammar": ">=0.1.11"}
    assert str(b.fixed) == "==0.1.10"
    with pytest.raises(SystemExit, match="fixed requirements alone conflict"):
        fv.find_culprits("x", [("a", "1", S("==1"), True), ("b", "1", S("==2"), True)], ["1", "2"], {})


def elf_with_needed(names):
    """A minimal 64-bit little-endian ELF: a .dynstr and a .dynamic with DT_NEEDED entries."""
    dynstr = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    offs, o = [], 1
    for n in names:
        offs.append(o)
        o += len(n) + 1
    dynamic = b"".join(struct.pack("<qQ", 1, x) for x in offs) + struct.pack("<qQ", 0, 0)
    body_off = 64
    dynstr_off, dynamic_off = body_off, body_off + len(dynstr)
    shoff = dynamic_off + len(dynamic)
    sh = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
          struct.pack("<IIQQQQIIQQ", 0, 3, 0, 0, dynstr_off, len(dynstr), 0, 0, 1, 0),
          struct.pack("<IIQQQQIIQQ", 0, 6, 0, 0, dynamic_off, len(dynamic), 1, 0, 8, 16)]
    hdr = bytearray(64)
    hdr[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<HH", hdr, 0x3A, 64, len(sh))
    return bytes(hdr) + dynstr + dynamic + b"".join(sh)


def test_elf_needed_reads_dt_needed():
    assert fv.elf_needed(elf_with_needed(["libtorch.so", "libcudart.so.13"])) == ["libtorch.so", "libcudart.so.13"]
    with pytest.raises(ValueError, match="not a 64-bit"):
        fv.elf_needed(b"MZ" + b"\0" * 100)


def test_wheel_xz_drop_leaves_the_member_and_its_record_line_out(tmp_path):
    whl = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("pkg/__init__.py", "x = 1\n")
        z.writestr("pkg/big.so", b"\0" * 1000)
        z.writestr("pkg-1.0.dist-info/RECORD", "pkg/__init__.py,sha256=a,6\npkg/big.so,sha256=b,1000\n"
                                               "pkg-1.0.dist-info/RECORD,,\n")
    out = tmp_path / "pkg-1.0-py3-none-any.whl.tar.xz"
    r = run("scripts/gpu/wheel_xz.py", "pack", whl, out, "--drop", "pkg/big.so")
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as t:
        assert sorted(t.getnames()) == ["pkg-1.0.dist-info/RECORD", "pkg/__init__.py"]
        assert b"big.so" not in t.extractfile("pkg-1.0.dist-info/RECORD").read()
    os.makedirs(tmp_path / "w")
    assert run("scripts/gpu/wheel_xz.py", "unpack", out, tmp_path / "w").returncode == 0
    with zipfile.ZipFile(tmp_path / "w" / whl.name) as z:
        assert z.read("pkg/__init__.py") == b"x = 1\n"
    r = run("scripts/gpu/wheel_xz.py", "pack", whl, out, "--drop", "pkg/none.so")
    assert r.returncode != 0 and "no member ['pkg/none.so']" in r.stderr


def test_the_committed_manifest_is_consistent():
    m = json.load(open(os.path.join(ROOT, "scripts/gpu/vllm_carry.json")))
    assert m["vllm"] == "0.26.0" and m["n_parts"] == len(m["parts"])
    assert sum(p["bytes"] for p in m["parts"].values()) == m["tar_bytes"]
    assert all(p["bytes"] <= m["part_mib"] * 2**20 for p in m["parts"].values())
    assert set(m["wheels"]) == {c["wheel"] for c in m["carried"].values()}
    assert not set(m["carried"]) & set(m["not_carried"])
    assert all(w["why"] for w in m["not_carried"].values())
    assert "vllm" in m["carried"] and "torch" in m["image"]
    assert not set(m["carried"]) & fv.IMAGE_SET  # nothing of the image is shadowed


def test_serve_load_needs_the_port_in_server_cmd():
    r = run("scripts/bench/serve_load.py", "--server-cmd", "vllm serve /m")
    assert r.returncode == 2 and "{port}" in r.stderr
