#!/usr/bin/env python3
"""N `lychee serve` replicas behind sglang-router (PyPI `sglang-router`, SGLang Model Gateway).

Starts the replicas (one per GPU with CUDA_VISIBLE_DEVICES, or CPU replicas with --device cpu), waits
until each answers GET /health with 200, starts the router in front of them (python -m
sglang_router.launch_router, policy chosen with --policy), waits until the router reports every
replica healthy, then prints one line on stdout:

    serve_replicas: http://127.0.0.1:8080 (policy cache_aware, 4 replicas)

and serves until SIGTERM or SIGINT, which it forwards to the router and to every replica: the router
stops taking requests, each replica drains (its /health turns 503, new requests get 503, accepted
ones finish within --drain-timeout) and exits 0; the script exits 0 when all did. A second SIGINT or
SIGTERM kills everything at once (exit 130).

With --restart, a replica that exits while the script runs (killed, crashed, drained alone with
SIGTERM) is started again on its port and GPU; the router's health checks see it come back and send
it traffic again. --state FILE keeps a JSON description of the deployment (router URL and pid, each
replica's URL, pid, GPU, restarts) current, for scripts and tests that act on one replica.

Options after `--` go to every `lychee serve` (model, policy, --max-running, ...).

  scripts/serve_replicas.py --replicas 4 --device cuda --policy cache_aware -- -m MODEL --max-running 64
  scripts/serve_replicas.py --replicas 2 --device cpu --port 8080 -- --threads 1 -c 2048
"""
import argparse
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPLICA_HOST = "127.0.0.1"  # replicas listen on loopback; only the router faces the network


def log(msg):
    print(f"serve_replicas: {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(f"error: {msg}")
    sys.exit(2)


def free_port(host="127.0.0.1"):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get(host, port, path, timeout=2.0, key=None):
    """(status, body text); OSError when nothing answers."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    except http.client.HTTPException as e:
        raise OSError(str(e)) from e
    finally:
        conn.close()


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


class Process:
    """A child in a process group of its own (the terminal's Ctrl-C reaches only this script)."""

    def __init__(self, name, cmd, env, log_path):
        self.name, self.cmd, self.env, self.log_path = name, cmd, env, log_path
        self.proc = None
        self.restarts = 0
        self.reported = False  # exited, logged, not restarted

    def start(self):
        self.reported = False
        self.started_at = time.monotonic()
        with open(self.log_path, "ab") as f:
            f.write(f"--- {time.strftime('%H:%M:%S')} {shlex.join(self.cmd)}\n".encode())
            f.flush()
            try:
                self.proc = subprocess.Popen(self.cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=f,
                                             stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as e:
                die(f"cannot start {self.name} ({shlex.join(self.cmd)}): {e}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:
                pass

    def tail(self, n=30):
        try:
            with open(self.log_path, "rb") as f:
                return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-n:])
        except OSError as e:
            return f"(no log: {e})"


class Replica(Process):
    def __init__(self, index, binary, device, gpu, port, drain_timeout, extra, log_dir):
        env = dict(os.environ)
        if device == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
        cmd = [binary, "serve", "--host", REPLICA_HOST, "--port", str(port), "--device", device,
               "--drain-seconds", str(drain_timeout), *extra]
        super().__init__(f"replica {index}", cmd, env, os.path.join(log_dir, f"replica_{index}.log"))
        self.index, self.gpu, self.port = index, gpu, port
        self.url = f"http://{REPLICA_HOST}:{port}"

    def wait_healthy(self, timeout, stopping):
        """Seconds until /health answered 200; raises RuntimeError saying why it did not."""
        t0 = time.monotonic()
        last = "no answer"
        while time.monotonic() - t0 < timeout and not stopping():
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with status {self.proc.returncode} before it served "
                                   f"(log {self.log_path}):\n{self.tail()}")
            try:
                status, body = get(REPLICA_HOST, self.port, "/health")
                if status == 200:
                    return time.monotonic() - t0
                last = f"HTTP {status} {body[:200]}"
            except OSError as e:
                last = str(e)
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not answer /health with 200 within {timeout:.0f} s (last: {last}; "
                           f"log {self.log_path}):\n{self.tail()}")


def api_key(extra):
    """The replicas' --api-key (or $LYCHEE_API_KEY, which they read too), for the router's own calls."""
    for i, arg in enumerate(extra):
        if arg == "--api-key" and i + 1 < len(extra):
            return extra[i + 1]
        if arg.startswith("--api-key="):
            return arg.split("=", 1)[1]
    return os.environ.get("LYCHEE_API_KEY") or None


def router_command(a, urls, prometheus_port, key=None):
    cmd = [a.router_python, "-m", "sglang_router.launch_router", "--worker-urls", *urls,
           "--host", a.host, "--port", str(a.port), "--policy", a.policy,
           # The router's own Prometheus exporter defaults to port 29000 on every host: a second
           # deployment on the machine would fail to start.
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prometheus_port),
           "--health-check-interval-secs", str(a.health_interval),
           "--health-failure-threshold", "2", "--health-success-threshold", "1",
           # A replica that refused connections (killed) opens its circuit; it is tried again after
           # this long (the router's default is 60 s, longer than a restart takes).
           "--cb-timeout-duration-secs", str(a.circuit_timeout),
           "--log-level", "warn"]
    if key:  # the router's calls to the replicas carry it, and the router asks it of its clients too
        cmd += ["--api-key", key]
    return cmd + shlex.split(a.router_args)


def router_healthy_workers(a, key):
    status, body = get("127.0.0.1" if a.host in ("0.0.0.0", "::") else a.host, a.port, "/workers", key=key)
    if status != 200:
        return None
    return {w["url"] for w in json.loads(body).get("workers", []) if w.get("is_healthy")}


class Deployment:
    def __init__(self, a, extra):
        self.a = a
        self.log_dir = a.log_dir or tempfile.mkdtemp(prefix="lychee_replicas_")
        os.makedirs(self.log_dir, exist_ok=True)
        gpus = [int(g) for g in a.gpus.split(",")] if a.gpus else list(range(a.replicas))
        if a.device == "cuda" and len(gpus) != a.replicas:
            die(f"--gpus names {len(gpus)} GPUs for {a.replicas} replicas")
        ports = ([a.replica_port + i for i in range(a.replicas)] if a.replica_port
                 else [free_port() for _ in range(a.replicas)])
        self.replicas = [Replica(i, a.binary, a.device, gpus[i] if a.device == "cuda" else None, ports[i],
                                 a.drain_timeout, extra, self.log_dir) for i in range(a.replicas)]
        self.extra = extra
        self.router = None
        self.stopping = False
        self.kill_now = False

    def write_state(self):
        if not self.a.state:
            return
        state = {"url": f"http://{self.a.host}:{self.a.port}", "policy": self.a.policy, "log_dir": self.log_dir,
                 "router_pid": self.router.proc.pid if self.router and self.router.proc else None,
                 "replicas": [{"index": r.index, "url": r.url, "pid": r.proc.pid if r.proc else None, "gpu": r.gpu,
                               "restarts": r.restarts, "alive": r.alive()} for r in self.replicas]}
        tmp = self.a.state + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1)
        os.replace(tmp, self.a.state)

    def start(self):
        for r in self.replicas:  # all load at once (one GPU each; on the CPU they share the cores)
            log(f"starting {r.name} on {r.url}{f' (GPU {r.gpu})' if r.gpu is not None else ''}: log {r.log_path}")
            r.start()
        for r in self.replicas:
            try:
                log(f"{r.name} serving after {r.wait_healthy(self.a.startup_timeout, lambda: self.stopping):.1f} s")
            except RuntimeError as e:
                self.fail(str(e))
        cmd = router_command(self.a, [r.url for r in self.replicas], free_port(), api_key(self.extra))
        self.router = Process("router", cmd, dict(os.environ), os.path.join(self.log_dir, "router.log"))
        shown = ["***" if i > 0 and cmd[i - 1] == "--api-key" else c for i, c in enumerate(cmd)]
        log(f"starting the router: {shlex.join(shown)} (log {self.router.log_path})")
        self.router.start()
        self.write_state()
        want = {r.url for r in self.replicas}
        t0 = time.monotonic()
        while not self.stopping:
            if not self.router.alive():
                self.fail(f"the router exited with status {self.router.proc.returncode}:\n{self.router.tail()}")
            try:
                healthy = router_healthy_workers(self.a, api_key(self.extra))
                if healthy is not None and want <= healthy:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() - t0 > self.a.startup_timeout:
                self.fail(f"the router did not report the {len(want)} replicas healthy within "
                          f"{self.a.startup_timeout:.0f} s:\n{self.router.tail()}")
            time.sleep(0.2)
        if self.stopping:
            sys.exit(self.wait_all())
        print(f"serve_replicas: http://{self.a.host}:{self.a.port} (policy {self.a.policy}, "
              f"{len(self.replicas)} replicas)", flush=True)

    def processes(self):
        return [p for p in [self.router, *self.replicas] if p is not None and p.proc is not None]

    def stop_all(self, sig):
        for p in self.processes():
            p.signal(sig)

    def fail(self, msg):
        self.stop_all(signal.SIGKILL)
        for p in self.processes():
            p.proc.wait()
        die(msg)

    def on_signal(self, sig, _frame):
        if self.stopping:
            self.kill_now = True
            self.stop_all(signal.SIGKILL)
            return
        self.stopping = True
        log(f"{signal.Signals(sig).name}: draining the router and {len(self.replicas)} replicas")
        self.stop_all(signal.SIGTERM)

    def supervise(self):
        """Until a signal: restarts replicas that exit (--restart); the router's exit is fatal."""
        while not self.stopping:
            if not self.router.alive():
                log(f"the router exited with status {self.router.proc.returncode}; stopping the replicas\n"
                    f"{self.router.tail()}")
                self.stopping = True
                self.stop_all(signal.SIGTERM)
                self.wait_all()
                return 1
            for r in self.replicas:
                if r.proc.poll() is None or r.reported or self.stopping:
                    continue
                code = r.proc.returncode
                if self.a.restart and time.monotonic() - r.started_at < 2:
                    continue  # one that fails at once (its port not yet free) is not restarted in a tight loop
                if self.a.restart:
                    r.restarts += 1
                    log(f"{r.name} exited with status {code}; restarting it (restart {r.restarts})")
                    r.start()
                else:
                    log(f"{r.name} exited with status {code}; the router routes around it")
                    r.reported = True
                self.write_state()
            time.sleep(0.2)
        return self.wait_all()

    def wait_all(self):
        deadline = time.monotonic() + self.a.drain_timeout + 30
        while time.monotonic() < deadline and not self.kill_now:
            if not any(p.alive() for p in self.processes()):
                break
            time.sleep(0.1)
        if self.kill_now or any(p.alive() for p in self.processes()):
            log("second signal: killed everything" if self.kill_now else "not stopped in time: killing what is left")
            self.stop_all(signal.SIGKILL)
            for p in self.processes():
                p.proc.wait()
            return 130
        bad = [f"{p.name} {p.proc.returncode}" for p in self.processes() if p.proc.returncode != 0 and not p.reported]
        self.write_state()
        if bad:
            log(f"exit statuses: {', '.join(bad)}")
            return 1
        log("stopped")
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--replicas", type=int, help="number of replicas (default: one per GPU, or 2 with --device cpu)")
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when nvidia-smi lists a GPU, else cpu")
    ap.add_argument("--gpus", help="comma-separated GPU ids, one per replica (default 0..N-1)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "lychee"))
    ap.add_argument("--host", default="127.0.0.1", help="the router's address (replicas listen on 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8080, help="the router's port")
    ap.add_argument("--replica-port", type=int, help="first replica port (then +1, +2, ...; default: free ports)")
    ap.add_argument("--policy", default="cache_aware",
                    choices=["cache_aware", "round_robin", "power_of_two", "random", "manual"],
                    help="the router's policy (manual: by the X-SMG-Routing-Key header)")
    ap.add_argument("--router-python", default=sys.executable, help="a Python with sglang-router installed")
    ap.add_argument("--router-args", default="", help="more sglang_router.launch_router options (one string)")
    ap.add_argument("--health-interval", type=int, default=2, help="seconds between the router's health checks")
    ap.add_argument("--circuit-timeout", type=int, default=5,
                    help="seconds before the router tries a replica whose circuit opened")
    ap.add_argument("--drain-timeout", type=float, default=30.0, help="each replica's --drain-timeout")
    ap.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for replicas and router to be ready")
    ap.add_argument("--restart", action="store_true", help="start a replica again when it exits")
    ap.add_argument("--state", help="keep a JSON description of the deployment here")
    ap.add_argument("--log-dir", help="replica_<i>.log and router.log (default: a new temporary directory)")
    ap.add_argument("serve_args", nargs=argparse.REMAINDER, help="-- then `lychee serve` options")
    a = ap.parse_args()
    extra = a.serve_args[1:] if a.serve_args[:1] == ["--"] else a.serve_args
    if a.device is None:
        a.device = "cuda" if gpu_count() > 0 else "cpu"
    if a.replicas is None:
        a.replicas = (len(a.gpus.split(",")) if a.gpus else gpu_count()) if a.device == "cuda" else 2
    if a.replicas < 1:
        die(f"--replicas must be at least 1 (got {a.replicas}{'; no GPU found' if a.device == 'cuda' else ''})")
    if not os.access(a.binary, os.X_OK):
        die(f"{a.binary} is not an executable (build it: scripts/build.sh)")
    check = subprocess.run([a.router_python, "-c", "import sglang_router, sys; print(sglang_router.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0:
        die(f"{a.router_python} cannot import sglang_router (pip install sglang-router): {check.stderr.strip()[-300:]}")
    log(f"sglang-router {check.stdout.strip()} ({a.router_python})")

    d = Deployment(a, extra)
    signal.signal(signal.SIGTERM, d.on_signal)
    signal.signal(signal.SIGINT, d.on_signal)
    d.start()
    d.write_state()
    sys.exit(d.supervise())


if __name__ == "__main__":
    main()
