"""`lychee serve` end to end: the official openai client and raw HTTP against the real binary."""
import concurrent.futures as cf
import http.client
import json
import random
import signal
import socket
import threading
import time

import pytest

from conftest import API_KEY, CONTEXT, DEVICE, LONG_TOKENS, Server

PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3, 4,", "def fibonacci(n):",
           "The best way to learn", "Water boils at", "My favourite colour is", "In the year 2000,"]


def chat(client, model, text, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": text}], **kw)


def complete(client, model, prompt, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 8)
    return client.completions.create(model=model, prompt=prompt, **kw)


def test_health_models_tokenize(server, client, model_id):
    assert server.request("GET", "/health", auth=False)[0] == 200
    models = client.models.list().data
    assert len(models) == 1 and models[0].owned_by == "lychee"
    status, _, body = server.request("GET", "/v1/models")
    assert status == 200 and body["data"][0]["context_length"] == CONTEXT
    meta = body["data"][0]["meta"]  # llama.cpp's fields: what token-id clients need
    assert meta["n_vocab"] == 49152 and meta["n_ctx"] == CONTEXT and meta["n_ctx_train"] == 8192 and meta["device"] == DEVICE
    assert meta["kv_cache_dtype"] == "bf16"
    status, _, body = server.request("POST", "/tokenize", {"content": "Hello world"})
    assert status == 200 and len(body["tokens"]) == 2
    status, _, back = server.request("POST", "/detokenize", {"tokens": body["tokens"]})
    assert status == 200 and back["content"] == "Hello world"


def test_chat(client, model_id):
    r = chat(client, model_id, "What is the capital of France?", max_tokens=20)
    assert r.object == "chat.completion" and r.model == model_id and r.id.startswith("chatcmpl-")
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_ignore_eos_runs_to_max_tokens(client, model_id):
    """vLLM's ignore_eos (benchmarks with a fixed output length): the model's end-of-turn token does
    not end the request; without it the same greedy answer stops there."""
    r = chat(client, model_id, "What is the capital of France?", max_tokens=60)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens < 60
    longer = chat(client, model_id, "What is the capital of France?", max_tokens=60, extra_body={"ignore_eos": True})
    assert longer.choices[0].finish_reason == "length" and longer.usage.completion_tokens == 60
    assert longer.choices[0].message.content.startswith(r.choices[0].message.content)


def test_completion_max_tokens(client, model_id):
    r = complete(client, model_id, "Once upon a time", max_tokens=5)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    assert r.choices[0].text
    ids = client.completions.create(model=model_id, prompt=[1, 2, 3], max_tokens=2, temperature=0)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 2


def test_streaming_equals_whole(client, model_id):
    for text in PROMPTS[:3]:
        whole = chat(client, model_id, text, max_tokens=12)
        chunks = list(chat(client, model_id, text, max_tokens=12, stream=True,
                           stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finals == [whole.choices[0].finish_reason]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
        whole_c = complete(client, model_id, text, max_tokens=12)
        streamed_c = "".join(c.choices[0].text for c in complete(client, model_id, text, max_tokens=12, stream=True))
        assert streamed_c == whole_c.choices[0].text


def test_raw_sse_format(server):
    req = {"prompt": "Hello", "max_tokens": 3, "temperature": 0, "stream": True}
    status, headers, text = server.request("POST", "/v1/completions", req)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = text.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for e in events[:-2]:
        assert e.startswith("data: ")
        json.loads(e[len("data: "):])


def test_stop_strings(client, model_id):
    whole = complete(client, model_id, "1, 2, 3, 4,", max_tokens=12).choices[0].text
    stop = whole[4:6]
    r = complete(client, model_id, "1, 2, 3, 4,", max_tokens=12, stop=["@@@", stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == whole[:whole.index(stop)]
    streamed = "".join(c.choices[0].text for c in complete(client, model_id, "1, 2, 3, 4,", max_tokens=12,
                                                           stop=stop, stream=True))
    assert streamed == r.choices[0].text


def test_seed_determinism(client, model_id):
    a = chat(client, model_id, "Tell me a story", temperature=1.0, seed=1234, max_tokens=10)
    b = chat(client, model_id, "Tell me a story", temperature=1.0, seed=1234, max_tokens=10)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_logprobs(client, model_id):
    r = chat(client, model_id, "Hi", max_tokens=4, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token


def test_lychee_policy_extension(server, client, model_id):
    """A request under LycheeDecode with a prompt past its budget (no forced sink or recent tokens)
    reads fewer KV bytes than full attention would: the server's KV-read metrics say so."""
    def reads():
        m = server.metrics()
        return (m.get('lychee_kv_read_bytes_total{policy="lychee"}', 0.0),
                m.get('lychee_kv_read_dense_bytes_total{policy="lychee"}', 0.0))
    before = reads()
    prompt = DOC + "\nQuestion: how many marbles does the red box hold?"
    n = len(server.request("POST", "/tokenize", {"content": prompt})[2]["tokens"])
    assert n > 4 * 32, n  # the prompt is several times the budget
    r = chat(client, model_id, prompt, max_tokens=8, extra_body={"lychee": {
        "policy": "lychee", "budget": 32, "block_size": 16, "sink": 0, "recent": 0}})
    assert r.usage.completion_tokens >= 1
    after = reads()
    read, dense = after[0] - before[0], after[1] - before[1]
    assert dense > 0 and 0 < read < 0.9 * dense, (read, dense)
    with pytest.raises(Exception) as e:
        chat(client, model_id, "Hi", extra_body={"lychee": {"policy": "lychee", "block_size": 0}})
    assert e.value.status_code == 400 and "lychee.block_size" in str(e.value)


def test_lychee_speculate_gives_fulls_text_and_reports_acceptance(server, client, model_id):
    """A speculating request (LycheeDecode drafting, Full verifying) answers Full's text, reports
    drafted/accepted in usage.speculation, and bad values or logprobs with it are 400s."""
    prompt = DOC + "\nQuestion: how many marbles does the red box hold?"
    full = chat(client, model_id, prompt, max_tokens=16, extra_body={"ignore_eos": True})
    spec = chat(client, model_id, prompt, max_tokens=16, extra_body={"ignore_eos": True, "lychee": {
        "policy": "lychee", "budget": 32, "block_size": 16, "sink": 16, "recent": 16, "speculate": 4}})
    assert spec.choices[0].message.content == full.choices[0].message.content
    s = spec.usage.model_extra["speculation"]
    assert s["drafted"] > 0 and 0 <= s["accepted"] <= s["drafted"]
    assert s["acceptance"] == pytest.approx(s["accepted"] / s["drafted"])
    assert "speculation" not in (full.usage.model_extra or {})
    for bad in ({"speculate": "often"}, {"speculate": 17}, {"speculate": [4]}):
        with pytest.raises(Exception) as e:
            chat(client, model_id, "Hi", extra_body={"lychee": bad})
        assert e.value.status_code == 400 and "lychee.speculate" in str(e.value), bad
    with pytest.raises(Exception) as e:
        chat(client, model_id, "Hi", logprobs=True, extra_body={"lychee": {"speculate": 2}})
    assert e.value.status_code == 400 and "logprobs" in str(e.value)


def error_of(server, method, path, body=None, **kw):
    status, _, b = server.request(method, path, body, **kw)
    assert set(b["error"]) >= {"message", "type", "param", "code"}, b
    return status, b["error"]


def test_errors(server):
    msgs = [{"role": "user", "content": "hi"}]
    status, e = error_of(server, "POST", "/v1/chat/completions", {"messages": msgs, "temperature": "hot"})
    assert status == 400 and e["param"] == "temperature" and "temperature" in e["message"]
    status, e = error_of(server, "POST", "/v1/chat/completions", {"messages": msgs, "n": 2})
    assert status == 400 and e["param"] == "n" and "only n = 1" in e["message"]
    status, e = error_of(server, "POST", "/v1/chat/completions", {"model": "gpt-4", "messages": msgs})
    assert status == 404 and e["code"] == "model_not_found"
    status, e = error_of(server, "POST", "/v1/chat/completions", {"messages": "hi"})
    assert status == 400 and e["param"] == "messages"
    status, _, b = server.request("POST", "/v1/chat/completions", raw=b"{not json")
    assert status == 400 and "not valid JSON" in b["error"]["message"]
    status, e = error_of(server, "GET", "/v1/nothing")
    assert status == 404
    status, e = error_of(server, "POST", "/v1/completions", raw=b'{"prompt": "' + b"a" * (9 << 20) + b'"}')
    assert status == 413
    status, e = error_of(server, "GET", "/v1/models", auth=False)
    assert status == 401
    status, e = error_of(server, "GET", "/metrics", headers={"Authorization": "Bearer wrong"})
    assert status == 401
    # A prompt over the context: 400 naming both numbers, before any work.
    words = "word " * (CONTEXT + 100)
    n = len(server.request("POST", "/tokenize", {"content": words})[2]["tokens"])
    status, e = error_of(server, "POST", "/v1/completions", {"prompt": words, "max_tokens": 4})
    assert status == 400 and f"{n} tokens" in e["message"] and str(CONTEXT) in e["message"], e


def test_openai_client_errors(client, model_id):
    import openai
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, model_id, "Hi", n=2)
    assert "n" == e.value.body["param"]
    with pytest.raises(openai.NotFoundError):
        chat(client, "no-such-model", "Hi")
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def open_stream(server, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200
    return conn, resp


def test_cancellation_mid_stream_frees_capacity(server, client, model_id):
    before = server.metrics()["lychee_requests_total{outcome=\"cancelled\"}"]
    conn, resp = open_stream(server, {"prompt": "Once upon a time", "max_tokens": LONG_TOKENS, "temperature": 0,
                                      "ignore_eos": True, "stream": True})
    first = resp.readline()
    assert first.startswith(b"data: ")
    assert server.metrics()["lychee_kv_tokens_used"] > 0
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    m = server.wait_pool_empty()
    assert m["lychee_requests_total{outcome=\"cancelled\"}"] == before + 1
    assert chat(client, model_id, "Hi", max_tokens=3).choices[0].message.content  # still serving


def test_a_vanished_non_streaming_client_cancels_its_request(server):
    """A client that sent a non-streaming request and went away (closed its socket) gets its
    request cancelled and its KV pages freed long before the 400 tokens would have finished."""
    before = server.metrics()["lychee_requests_total{outcome=\"cancelled\"}"]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/v1/completions",
                 json.dumps({"prompt": "Once upon a time", "max_tokens": LONG_TOKENS, "temperature": 0,
                             "ignore_eos": True}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
    deadline = time.time() + 30
    while server.metrics()["lychee_kv_tokens_used"] == 0 and time.time() < deadline:
        time.sleep(0.05)
    assert server.metrics()["lychee_kv_tokens_used"] > 0
    t0 = time.time()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    m = server.wait_pool_empty()
    assert m["lychee_requests_total{outcome=\"cancelled\"}"] == before + 1
    assert time.time() - t0 < 5  # LONG_TOKENS take longer than that


def test_concurrent_greedy_requests_are_isolated(server, client, model_id):
    alone = [complete(client, model_id, p, max_tokens=8).choices[0].text for p in PROMPTS]
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: complete(client, model_id, p, max_tokens=8).choices[0].text, PROMPTS))
    assert together == alone
    server.wait_pool_empty()


def test_soak(server, client, model_id):
    """100 requests, 8 at a time, every tenth cancelled mid-stream: no failure, no leaked capacity."""
    before = server.metrics()
    failures = []

    def one(i):
        try:
            prompt = PROMPTS[i % len(PROMPTS)]
            if i % 10 == 3:
                conn, resp = open_stream(server, {"prompt": prompt, "max_tokens": LONG_TOKENS, "stream": True,
                                                  "ignore_eos": True, "temperature": 0.8, "seed": i})
                resp.readline()
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
            elif i % 2:
                chunks = list(complete(client, model_id, prompt, max_tokens=6, stream=True, temperature=0.7, seed=i))
                assert chunks[-1].choices[0].finish_reason in ("stop", "length"), chunks[-1]
                assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
            else:
                r = chat(client, model_id, prompt, max_tokens=6, temperature=0.7, seed=i)
                assert r.choices[0].finish_reason in ("stop", "length")
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failures.append(f"request {i}: {e!r}")

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(100)))
    assert failures == []
    after = server.wait_pool_empty(timeout=30)
    ok = after['lychee_requests_total{outcome="ok"}'] - before['lychee_requests_total{outcome="ok"}']
    cancelled = (after['lychee_requests_total{outcome="cancelled"}']
                 - before['lychee_requests_total{outcome="cancelled"}'])
    assert ok == 90 and cancelled == 10
    assert after['lychee_requests_total{outcome="error"}'] == 0


def test_full_queue_is_503_and_sigterm_drains():
    s = Server("--max-running", "1", "--max-queue", "1", "-c", str(CONTEXT), api_key=None)
    try:
        conn, resp = open_stream(s, {"prompt": "Once upon a time", "max_tokens": 60 if DEVICE == "cpu" else 3000,
                                     "temperature": 0, "ignore_eos": True, "stream": True})
        resp.readline()  # running
        results = {}
        queued = threading.Thread(target=lambda: results.update(q=s.request(
            "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2, "temperature": 0})))
        queued.start()
        deadline = time.time() + 10
        while s.metrics()["lychee_waiting_requests"] < 1 and time.time() < deadline:
            time.sleep(0.02)
        status, headers, body = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 503 and headers.get("Retry-After") and "busy" in body["error"]["message"]
        # SIGTERM: no new requests, the running stream and the queued request finish, exit 0.
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        while "SIGTERM" not in s.output() and time.time() < deadline:
            time.sleep(0.02)
        status, _, body = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 503 and "shutting down" in body["error"]["message"]
        status, _, body = s.request("GET", "/health")  # a load balancer stops sending
        assert status == 503 and "shutting down" in body["error"]["message"]
        rest = resp.read().decode()
        assert rest.endswith("data: [DONE]\n\n") and '"finish_reason":"length"' in rest
        conn.close()
        queued.join(30)
        assert results["q"][0] == 200
        assert s.proc.wait(60) == 0, s.output()
    finally:
        s.stop()


COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white", "grey", "pink", "brown", "gold"]
DOC = "Inventory notes.\n" + "\n".join(f"The {c} box holds {i * 7 + 3} marbles and {i + 2} keys." for i, c in enumerate(COLOURS))


def ttft_and_text(server, prompt):
    """Time to the first streamed token, the whole text, and the usage (stream_options.include_usage)."""
    t0 = time.time()
    conn, resp = open_stream(server, {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True,
                                      "stream_options": {"include_usage": True}})
    first, text, usage = None, "", None
    for line in resp:
        if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            if c.get("text") and first is None:
                first = time.time() - t0
            text += c.get("text") or ""
    conn.close()
    return first, text, usage


def test_prefix_reuse(server, client, model_id):
    """A second question about the same document reuses the document's cached tokens: the usage
    says how many, /metrics counts the hit, and the answer equals a server without reuse. The
    time to first token is printed, not asserted (a 2-core machine shared with a build times
    noisily): cached_tokens is what proves the reuse."""
    q1 = DOC + "\nQuestion: how many marbles does the red box hold?\nAnswer:"
    q2 = DOC + "\nQuestion: how many keys does the gold box hold?\nAnswer:"
    hits = server.metrics()["lychee_prefix_cache_hits_total"]
    ttft1, _, u1 = ttft_and_text(server, q1)
    ttft2, text2, u2 = ttft_and_text(server, q2)
    shared = len(server.request("POST", "/tokenize", {"content": DOC + "\nQuestion: how many "})[2]["tokens"])
    assert u1["prompt_tokens_details"]["cached_tokens"] == 0
    assert shared - 2 <= u2["prompt_tokens_details"]["cached_tokens"] < u2["prompt_tokens"]
    assert server.metrics()["lychee_prefix_cache_hits_total"] == hits + 1
    # The same prompt again (the openai client's view): all but its last 8 tokens (always
    # prefilled) come from the cache.
    r = client.completions.create(model=model_id, prompt=q2, max_tokens=8, temperature=0)
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 8
    assert r.choices[0].text == text2
    ttft2_again, text2_again, _ = ttft_and_text(server, q2)
    assert text2_again == text2
    warm = min(ttft2, ttft2_again)
    plain = Server("-c", str(CONTEXT), "--prefix-cache", "0", api_key=None)
    try:
        ttft_and_text(plain, q1)  # warm-up: the first request of a fresh process
        cold, ref, ru = ttft_and_text(plain, q2)
        assert ru["prompt_tokens_details"]["cached_tokens"] == 0
        assert text2 == ref
        assert plain.metrics()["lychee_prefix_cache_entries"] == 0
    finally:
        assert plain.stop() == 0, plain.output()
    print(f"\n[prefix reuse] {u2['prompt_tokens']}-token prompt, {u2['prompt_tokens_details']['cached_tokens']} cached: "
          f"time to first token {cold * 1e3:.0f} ms without reuse -> {warm * 1e3:.0f} ms "
          f"(first question {ttft1 * 1e3:.0f} ms)")
    server.wait_pool_empty()


def test_seeded_requests_are_reproducible(server, client, model_id):
    """The same seeded request gives the same text again when its prompt is in the prefix cache,
    and alone or among 16 concurrent requests of other lengths (seeded requests are batch-invariant:
    docs/serving.md); another seed gives other text; responses carry a system_fingerprint."""
    question = DOC + "\nQuestion: which box holds the most keys? Answer:"
    ask = lambda seed: complete(client, model_id, question, max_tokens=24, temperature=0.9, seed=seed,
                                extra_body={"ignore_eos": True})
    first = ask(123)
    again = ask(123)
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # the second one came from the cache
    assert again.choices[0].text == first.choices[0].text
    fp = first.system_fingerprint
    assert fp and fp.startswith("fp_") and again.system_fingerprint == fp
    others = [(p * (1 + i % 4), 16 + i) for i, p in enumerate(PROMPTS * 2)]
    with cf.ThreadPoolExecutor(17) as pool:
        busy = [pool.submit(lambda a: complete(client, model_id, a[0], max_tokens=a[1], temperature=0.8,
                                               seed=None if a[1] % 2 else a[1]), a) for a in others]
        among = pool.submit(ask, 123)
        assert among.result().choices[0].text == first.choices[0].text
        assert all(f.result().choices[0].finish_reason in ("stop", "length") for f in busy)
    assert ask(124).choices[0].text != first.choices[0].text
    server.wait_pool_empty()


def test_cache_salt_isolates_the_prefix_cache(server):
    """cache_salt (vLLM's field): a tenant's prompt is never a prefix-cache hit for another salt,
    so cached_tokens cannot reveal it; the same salt hits."""
    prompt = "Salted notes. " + " ".join(f"Shelf {i} stores {i * 3} jars of {c} paint." for i, c in enumerate(COLOURS))
    def cached(salt):
        body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
        if salt:
            body["cache_salt"] = salt
        status, _, b = server.request("POST", "/v1/completions", body)
        assert status == 200, b
        return b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached("alpha") == 0
    assert cached("beta") == 0
    assert cached(None) == 0
    assert cached("alpha") > 0
    status, e = error_of(server, "POST", "/v1/completions", {"prompt": "hi", "cache_salt": 7})
    assert status == 400 and e["param"] == "cache_salt"


def test_engine_fault_fails_requests_and_health():
    """An exception escaping the engine loop (injected at a step by a test-only flag) ends the
    running request with a 500, turns /health to 503 and refuses new requests with 503, and the
    process keeps answering (no std::terminate); SIGTERM still exits 0."""
    s = Server("-c", str(CONTEXT), "--debug-fault-step", "5", api_key=None)
    try:
        status, _, b = s.request("POST", "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 50,
                                                             "temperature": 0, "ignore_eos": True})
        assert status == 500 and "injected fault" in b["error"]["message"], b
        status, _, b = s.request("GET", "/health")
        assert status == 503 and "engine failed" in b["error"]["message"], b
        status, _, b = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
        assert status == 503 and "engine failed" in b["error"]["message"], b
        assert s.metrics()["lychee_engine_healthy"] == 0
    finally:
        assert s.stop() == 0, s.output()


def test_full_kv_pool_under_load_queues_instead_of_failing():
    """A KV budget of a few requests' pages and many concurrent streams: requests wait for pages
    (admission counts pages; the budget is capped at the pool's) and every one completes, none
    with a 500; afterwards every page is back."""
    # About three requests' pages: f32 K/V on the CPU (46 KB a token), bf16 on the GPU (64-token pages).
    kv = "0.03" if DEVICE == "cpu" else "0.02"
    s = Server("-c", str(CONTEXT), "--max-running", "16", "--kv-memory", kv, api_key=None)
    try:
        m = s.metrics()
        assert m["lychee_kv_pages_total"] > 0
        failures = []

        def one(i):
            body = {"prompt": DOC + f"\nNote {i}:", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
            status, _, b = s.request("POST", "/v1/completions", body)
            if status != 200 or b["choices"][0]["finish_reason"] != "length":
                failures.append((i, status, b))

        with cf.ThreadPoolExecutor(12) as pool:
            list(pool.map(one, range(24)))
        assert failures == []
        after = s.wait_pool_empty(timeout=60)
        assert after['lychee_requests_total{outcome="ok"}'] == 24
        assert after.get('lychee_requests_total{outcome="error"}', 0) == 0
    finally:
        assert s.stop() == 0, s.output()


def test_fp8_kv_cache_is_shown_fingerprinted_and_counted():
    """--kv-cache-dtype fp8 (process-wide): /v1/models says so, the system_fingerprint differs
    from a bf16-KV server's, and the same --kv-memory admits ~2x the tokens where the backend's
    pool holds FP8 pages (the GPU: head_dim + 4 bytes per token and KV head against 2 x head_dim,
    1.88x at the default model's head_dim 64); the CPU's per-sequence f32 caches hold the same
    tokens either way."""
    def one(*args):
        s = Server("-c", str(CONTEXT), "--max-running", "4", "--kv-memory", "0.02", *args, api_key=None)
        try:
            _, _, models = s.request("GET", "/v1/models")
            _, _, b = s.request("POST", "/v1/completions", {"prompt": "The capital of France is", "max_tokens": 4,
                                                            "temperature": 0.5, "seed": 7})
            return models["data"][0]["meta"]["kv_cache_dtype"], b["system_fingerprint"], s.metrics()
        finally:
            assert s.stop() == 0, s.output()

    dtype_bf16, fp_bf16, m_bf16 = one()
    dtype_fp8, fp_fp8, m_fp8 = one("--kv-cache-dtype", "fp8")
    assert (dtype_bf16, dtype_fp8) == ("bf16", "fp8")
    assert fp_bf16.startswith("fp_") and fp_fp8.startswith("fp_") and fp_fp8 != fp_bf16
    tokens = lambda m: m["lychee_kv_pages_total"] * m["lychee_kv_page_tokens"]
    if DEVICE == "cpu":
        assert tokens(m_fp8) == tokens(m_bf16)
    else:
        assert tokens(m_fp8) >= 1.8 * tokens(m_bf16), (m_bf16, m_fp8)


def test_bad_kv_cache_dtype_names_the_option():
    s = Server("--kv-cache-dtype", "fp16", api_key=None, wait=False)
    assert s.proc.wait(timeout=60) != 0
    assert "--kv-cache-dtype" in s.output()


def test_signal_while_loading_or_draining_exits():
    """SIGTERM while the model loads exits at once (128 + 15), and a second SIGINT while draining
    does too, instead of waiting for the load or the drain."""
    s = Server("-c", str(CONTEXT), api_key=None, wait=False)
    try:
        deadline = time.time() + 30
        while time.time() < deadline:  # listening (503 while loading), the model not yet up
            try:
                if s.request("GET", "/health")[0] in (200, 503):
                    break
            except OSError:
                time.sleep(0.01)
        s.proc.send_signal(signal.SIGTERM)
        code = s.proc.wait(30)
        out = s.output()
        assert code == 143 and "while the model loads" in out or code == 0 and "SIGTERM: no new requests" in out, out
    finally:
        s.stop()
    s = Server("-c", str(CONTEXT), "--drain-seconds", "60", api_key=None)
    try:
        conn, resp = open_stream(s, {"prompt": "Once upon a time", "max_tokens": LONG_TOKENS, "temperature": 0,
                                     "ignore_eos": True, "stream": True})
        resp.readline()
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        while "SIGTERM" not in s.output() and time.time() < deadline:
            time.sleep(0.02)
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(10) == 128 + signal.SIGINT, s.output()
        assert "again while draining" in s.output()
        conn.close()
    finally:
        s.stop()


def test_a_load_failure_exits_with_the_error():
    """A model that cannot load ends `lychee serve` with the error and a non-zero status, promptly
    (the HTTP listener, started before the load so /health answers 503, is stopped and joined)."""
    s = Server("-m", "/nonexistent/model.gguf", api_key=None, wait=False)
    try:
        code = s.proc.wait(30)
        assert code != 0 and "nonexistent" in s.output(), s.output()
    finally:
        s.stop()
