"""Hugging Face cache ids (-m org/name[:quant]) through the Python package.

The cache is laid out from local files the way huggingface_hub lays it out (blobs/<sha256>,
snapshots/<commit>/<file> as relative links, refs/main), and huggingface_hub itself must read it
back (scan_cache_dir, try_to_load_from_cache) before lychee is asked to: lychee then resolves
the same file and chats through it exactly as through the file's own path.
"""
import hashlib
import os
from pathlib import Path

import huggingface_hub
import pytest

import lychee

from lychee_test_paths import default_model

REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def add_file(cache: Path, repo: str, commit: str, name: str, source: Path):
    """One file of a repository, as hf_hub_download leaves it (the blob links to `source`)."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    # A blob is named by the file's etag (its sha256 for LFS files); huggingface_hub does not re-hash
    # it, so any unique hex name serves.
    digest = hashlib.sha256(f"{repo}/{name}".encode()).hexdigest()
    blob = repo_dir / "blobs" / digest
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not blob.exists():
        blob.symlink_to(source.resolve())
    link = repo_dir / "snapshots" / commit / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    model = default_model()
    if not model.exists():
        pytest.fail(f"default model not fetched at {model}: run scripts/fetch_assets.sh")
    root = tmp_path_factory.mktemp("hub")
    other = root.parent / "other_quant.gguf"
    other.write_bytes(b"GGUF not a model: never opened")
    add_file(root, REPO, COMMIT, GGUF, model)
    add_file(root, REPO, COMMIT, "SmolLM2-135M-Instruct.Q8_0.gguf", other)
    return root


@pytest.fixture
def hub_cache_env(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def test_huggingface_hub_reads_the_layout(cache):
    info = huggingface_hub.scan_cache_dir(cache)
    assert not info.warnings
    (repo,) = info.repos
    assert repo.repo_id == REPO
    (rev,) = repo.revisions
    assert rev.commit_hash == COMMIT and "main" in rev.refs
    assert sorted(f.file_name for f in rev.files) == ["SmolLM2-135M-Instruct.Q4_1.gguf",
                                                      "SmolLM2-135M-Instruct.Q8_0.gguf"]


def test_engine_resolves_and_chats(hub_cache_env):
    expected = huggingface_hub.try_to_load_from_cache(REPO, GGUF, cache_dir=hub_cache_env)
    assert isinstance(expected, str)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    via_cache = lychee.Engine(REPO + ":q4_1", device="cpu")
    assert Path(via_cache.model_path) == Path(expected)
    direct = lychee.Engine(default_model(), device="cpu")
    assert via_cache.chat_tokens(messages) == direct.chat_tokens(messages)
    assert via_cache.chat(messages, max_tokens=6).text == direct.chat(messages, max_tokens=6).text


def test_missing_model_says_where_and_how(hub_cache_env):
    with pytest.raises(Exception) as e:
        lychee.Engine("HuggingFaceTB/not-cached", device="cpu")
    message = str(e.value)
    assert str(hub_cache_env / "models--HuggingFaceTB--not-cached") in message
    assert "huggingface-cli download HuggingFaceTB/not-cached" in message
    with pytest.raises(Exception, match="Q5_K_M"):
        lychee.Engine(REPO + ":Q5_K_M", device="cpu")
