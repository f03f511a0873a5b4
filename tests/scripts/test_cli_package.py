"""The wheel ships the CLI: `pip install .` puts a `lychee` command into the environment's scripts
folder (bin/, on PATH) and the asset fetcher `lychee fetch-default` runs into its share/lychee
(pyproject.toml, apps/CMakeLists.txt). scripts/test.sh installs the package into the virtual
environment this suite runs in; where the package is not installed, the tests skip."""
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "golden" / "models" / "llama_tied_f32"


def installed_cli():
    try:
        dist = importlib.metadata.distribution("lychee")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the lychee package is not installed in this environment (scripts/test.sh installs it)")
    exes = [f for f in dist.files or [] if f.name == "lychee" and f.parent.name in ("bin", "scripts", "Scripts")]
    assert exes, "the installed lychee wheel has no bin/lychee: " + ", ".join(sorted(str(f) for f in dist.files or []))
    return Path(exes[0].locate()).resolve()


def test_the_wheel_puts_lychee_on_path(tmp_path):
    exe = installed_cli()
    # The environment's bin/ is what activating it puts on PATH: `lychee` is found there by name.
    env = dict(os.environ, PATH=str(exe.parent) + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run(["lychee", "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("lychee 0."), out.stdout
    # Run from an unrelated folder: nothing comes from the source tree.
    # Bytes: the tiny random model's tokens need not decode as UTF-8.
    out = subprocess.run(["lychee", "generate", "-m", str(TINY), "-p", "The quick", "-n", "3"], capture_output=True,
                         env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.strip(), "no text generated"


def test_the_wheel_ships_the_asset_fetcher():
    exe = installed_cli()
    script = exe.parent.parent / "share" / "lychee" / "fetch_assets.sh"
    assert script.is_file(), f"{script} is missing: `lychee fetch-default` would fail"
    assert os.access(script, os.X_OK)
