"""Every ```sh, ```python and ```console block of README.md and docs/*.md runs as written, from the
repository root, against the built binary and the default model; and every relative Markdown link
of those pages points at a file that exists.

An HTML comment on the line right before a block changes how it runs (docs/README.md, "Writing
examples in these pages"):
  <!-- example: gpu -->            needs a GPU: runs only with LYCHEE_DOCS_GPU=1 (the GPU machine)
  <!-- example: server -->         runs while `lychee serve --port 8080`, started here, is ready
  <!-- example: skip (reason) -->  not run (long jobs, installs); the reason is required
  <!-- example: output -->         shown output, not run

A block runs under `bash -euo pipefail` (sh) or this interpreter (python, which must have the
lychee package and openai installed, as scripts/test.sh's environment has); processes it leaves
behind (a server started with `&`) are killed with its process group. Where user and network
namespaces are available (`unshare --net --map-root-user`) each block gets its own loopback, so a
port such as 8080 cannot collide with anything else on the machine.

    LYCHEE_BUILD_DIR=build python3 -m pytest -q tests/docs
    LYCHEE_DOCS_GPU=1 LYCHEE_BUILD_DIR=build-gpu python3 -m pytest -q tests/docs -k gpu
"""
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("LYCHEE_BUILD_DIR", os.path.join(ROOT, "build")))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "python": "python", "console": "console"}
MARKER = re.compile(r"^\s*<!--\s*example:\s*(\S+)(.*?)-->\s*$")
KINDS = {"gpu", "server", "skip", "output"}
PORT = 8080          # the port the server examples are written with
TIMEOUT_S = 600      # one block; the slowest CPU block (the Python policies example) takes well under this


@dataclass
class Block:
    page: str
    line: int        # 1-based line of the opening fence
    lang: str        # sh, python or console
    kind: str        # run, gpu, server, skip or output
    note: str
    code: str

    @property
    def id(self):
        return f"{self.page}:{self.line}:{self.lang}:{self.kind}"


def parse(page):
    """The fenced blocks of one page with their markers; a marker nobody knows, a skip without a
    reason or an unclosed fence is an error naming the page and line."""
    lines = open(os.path.join(ROOT, page), encoding="utf-8").read().split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{page}:{start + 1}: the code block opened here is never closed")
        i += 1
        kind, note = "run", ""
        mk = MARKER.match(lines[start - 1]) if start > 0 else None
        if mk:
            kind, note = mk.group(1), mk.group(2).strip()
            if kind not in KINDS:
                raise ValueError(f"{page}:{start}: unknown example marker '{kind}' (known: {', '.join(sorted(KINDS))})")
            if kind == "skip" and not note:
                raise ValueError(f"{page}:{start}: '<!-- example: skip -->' needs a reason, e.g. 'skip (trains for hours)'")
        if lang in LANGS:
            blocks.append(Block(page, start + 1, LANGS[lang], kind, note, "\n".join(body) + "\n"))
    return blocks


def all_blocks():
    return [b for page in PAGES for b in parse(page)]


def console_commands(code):
    """The `$ ` lines of a console block (with their `\\` continuation lines), as a script."""
    out, cont = [], False
    for line in code.split("\n"):
        if line.startswith("$ ") or cont:
            text = line[2:] if line.startswith("$ ") and not cont else line
            out.append(text)
            cont = text.rstrip().endswith("\\")
    return "\n".join(out) + "\n"


def uses_build_dir(code):
    """Commands are written with build/bin/...; another build tree (the GPU machine's build-gpu)
    stands in for it."""
    if os.path.realpath(BUILD) == os.path.realpath(os.path.join(ROOT, "build")):
        return code
    return re.sub(r"(?<![\w/.-])build/bin/", BUILD + "/bin/", code)


def isolation():
    """The command prefix that gives a block its own network namespace, or [] where the kernel or
    the tools do not allow it (then the block shares the machine's ports)."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        return []
    probe = subprocess.run([unshare, "--net", "--map-root-user", ip, "link", "set", "lo", "up"],
                           capture_output=True, timeout=30)
    return [unshare, "--net", "--map-root-user"] if probe.returncode == 0 else []


ISOLATION = None


def wrapper(block, script):
    """A bash script that (in the namespace) brings up the loopback, starts the server for server
    blocks, and runs the block."""
    lychee = os.path.join(BUILD, "bin", "lychee")
    run = (f'"{sys.executable}" "{script}"' if block.lang == "python" else f'bash -euo pipefail "{script}"')
    lines = ["set -euo pipefail", "if command -v ip >/dev/null; then ip link set lo up 2>/dev/null || true; fi"]
    if block.kind == "server":
        lines += [f'"{lychee}" serve --port {PORT} > "{script}.serve.log" 2>&1 &',
                  "for i in $(seq 1 240); do",
                  f'  if "{sys.executable}" -c "import urllib.request as u; u.urlopen(\'http://127.0.0.1:{PORT}/health\', timeout=2)" 2>/dev/null; then break; fi',
                  f'  if ! kill -0 $! 2>/dev/null; then echo "lychee serve exited:"; cat "{script}.serve.log"; exit 1; fi',
                  "  sleep 0.5", "done"]
    lines.append(run)
    return "\n".join(lines) + "\n"


def run_block(block, tmp_path):
    global ISOLATION
    if ISOLATION is None:
        ISOLATION = isolation()
    code = console_commands(block.code) if block.lang == "console" else block.code
    code = uses_build_dir(code)
    script = tmp_path / ("block.py" if block.lang == "python" else "block.sh")
    script.write_text(code)
    outer = tmp_path / "run.sh"
    outer.write_text(wrapper(block, script))
    env = dict(os.environ, LYCHEE_BUILD_DIR=BUILD)
    log = tmp_path / "output.log"
    # Output to a file, not a pipe: a server the block left running in the background keeps a pipe
    # open, and the block is over when its shell exits.
    with open(log, "w") as f:
        p = subprocess.Popen([*ISOLATION, "bash", str(outer)], cwd=ROOT, env=env, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
        try:
            p.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            pytest.fail(f"{block.id}: still running after {TIMEOUT_S} s; output so far:\n{log.read_text()[-4000:]}")
        finally:
            try:  # what the block left running (a server started with &): same process group
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = log.read_text()
    return p.returncode, out


BLOCKS = all_blocks()


def test_pages_have_runnable_examples():
    """The parse found the examples: the README's CLI, server and Python ones at least."""
    readme = [b for b in BLOCKS if b.page == "README.md" and b.kind == "run"]
    assert {b.lang for b in readme} >= {"sh", "python"}, [b.id for b in readme]
    assert sum(b.kind == "run" for b in BLOCKS) >= 8, [b.id for b in BLOCKS]


def test_parse_rules(tmp_path, monkeypatch):
    """Markers bind to the block right after them; a bad marker is an error naming page and line."""
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- example: gpu -->\n```sh\nnvidia-smi\n```\n\n```python\nprint(1)\n```\n"
                    "<!-- example: output -->\n```console\n$ echo a \\\n  b\na b\n```\n```json\n{}\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    blocks = parse("p.md")
    assert [(b.line, b.lang, b.kind) for b in blocks] == [(3, "sh", "gpu"), (7, "python", "run"), (11, "console", "output")]
    assert console_commands(blocks[2].code) == "echo a \\\n  b\n"
    page.write_text("<!-- example: gpus -->\n```sh\nls\n```\n")
    with pytest.raises(ValueError, match=r"p.md:1: unknown example marker 'gpus'"):
        parse("p.md")
    page.write_text("<!-- example: skip -->\n```sh\nls\n```\n")
    with pytest.raises(ValueError, match="needs a reason"):
        parse("p.md")
    page.write_text("```sh\nls\n")
    with pytest.raises(ValueError, match="p.md:1: the code block opened here is never closed"):
        parse("p.md")


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


@pytest.mark.parametrize("page", PAGES)
def test_relative_links_resolve(page):
    """Every relative link and image of a page points at a file or folder that exists."""
    text = open(os.path.join(ROOT, page), encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # links inside code blocks are code
    text = re.sub(r"`[^`\n]*`", "", text)
    missing = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = target.split("#")[0]
        if not os.path.exists(os.path.join(ROOT, os.path.dirname(page), path)):
            missing.append(target)
    assert not missing, f"{page}: links to missing files: {missing}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind in ("run", "server", "gpu")], ids=lambda b: b.id)
def test_example_runs(block, tmp_path):
    if block.kind == "gpu" and os.environ.get("LYCHEE_DOCS_GPU") != "1":
        pytest.skip("a GPU example: runs with LYCHEE_DOCS_GPU=1 on the GPU machine")
    if not os.access(os.path.join(BUILD, "bin", "lychee"), os.X_OK):
        pytest.fail(f"no {BUILD}/bin/lychee: build first (scripts/build.sh)")
    rc, out = run_block(block, tmp_path)
    assert rc == 0, f"{block.id} ({block.lang}) exited {rc}:\n{block.code}\n--- output ---\n{out[-6000:]}"
    # An OpenAI-style error body or a Python traceback printed by a command that still exited 0.
    assert '"error":' not in out and "Traceback (most recent call last)" not in out, f"{block.id}:\n{out[-6000:]}"


if __name__ == "__main__":  # list the blocks: python3 tests/docs/test_docs_examples.py
    for b in BLOCKS:
        print(f"{b.id:40s} {b.lang:8s} {b.note}")
