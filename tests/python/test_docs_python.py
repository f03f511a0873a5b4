"""docs/python.md's Python blocks run as written, each in a fresh interpreter from the repository
root (the default model; on the CPU unless a GPU is present)."""
import re
import subprocess
import sys

import pytest

from lychee_test_paths import ROOT

DOC = ROOT / "docs" / "python.md"


def python_blocks():
    text = DOC.read_text()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)
    return blocks


def test_the_page_has_examples():
    assert len(python_blocks()) >= 10


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_block_runs(index):
    code = python_blocks()[index]
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"docs/python.md block {index}:\n{code}\n--- stderr:\n{r.stderr[-3000:]}"
    assert r.stdout.strip(), f"docs/python.md block {index} printed nothing"
