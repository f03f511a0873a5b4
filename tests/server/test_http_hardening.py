"""The server's HTTP face against hostile or careless clients (docs/serving-security.md): slow and
oversized requests, chunked bodies, refused requests on keep-alive connections, log injection,
Host/Origin checks and prompts too long for the context. Raw sockets where a library would tidy
the request up."""
import json
import socket
import time

from conftest import API_KEY, CONTEXT


def connect(server, timeout=5):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    s.settimeout(timeout)
    return s


def read_response(sock):
    """(status, headers with lower-case names, body) of one response with a Content-Length body;
    None when the server closed the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, headers, rest[:length].decode("utf-8", "replace")


def request_bytes(method, path, body=b"", key=API_KEY, extra=""):
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + extra + "\r\n").encode() + body


def health_time(server):
    start = time.monotonic()
    with connect(server, timeout=5) as s:
        s.sendall(request_bytes("GET", "/health"))
        r = read_response(s)
    assert r is not None and r[0] == 200, r
    return time.monotonic() - start


def test_slow_clients_do_not_hold_the_workers(server):
    """More clients than HTTP workers (here 8 running + 64 queued + 16 = 88), each trickling a
    request head a byte at a time: before the reception each one held a worker until its head was
    complete, and /health waited behind them."""
    slow = []
    try:
        for _ in range(150):
            s = connect(server)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            slow.append(s)
        for _ in range(3):
            time.sleep(0.3)
            for s in slow:
                s.sendall(b"a")
            assert health_time(server) < 1.0
    finally:
        for s in slow:
            s.close()


def test_a_chunked_body_over_the_cap_is_refused(server):
    """Bodies must carry a Content-Length (the reception frames requests by it); cpp-httplib 0.11
    read a chunked body without any limit."""
    with connect(server) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  + f"Authorization: Bearer {API_KEY}\r\n".encode()
                  + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"x" * (1 << 20)
        try:
            for _ in range(9):  # 9 MiB, over the 8 MiB cap
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            s.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # refused and closed early
        r = read_response(s)
    assert r is not None, "closed without an answer"
    status, headers, body = r
    assert status in (411, 413), (status, body)
    assert "Content-Length" in json.loads(body)["error"]["message"]
    assert health_time(server) < 1.0


def test_a_refused_request_leaves_nothing_on_a_keep_alive_connection(server):
    """A 401 answered before the body was read: the body must not be parsed as the next request."""
    body = json.dumps({"prompt": "hello", "max_tokens": 1}).encode()
    with connect(server) as s:
        s.sendall(request_bytes("POST", "/v1/completions", body, key="wrong-key"))
        first = read_response(s)
        assert first is not None and first[0] == 401, first
        if first[1].get("connection", "").lower() == "close":
            return  # closing the connection is the other correct answer
        s.sendall(request_bytes("GET", "/v1/models"))
        second = read_response(s)
    assert second is not None, "closed without an answer"
    status, _, text = second
    assert status == 200, (status, text)
    assert json.loads(text)["data"][0]["object"] == "model"


def test_paths_are_escaped_in_the_log(server):
    """A percent-encoded CR LF and a terminal escape in the path cannot start a log line of their own."""
    marker = "INJECTED-%d" % time.monotonic_ns()
    with connect(server) as s:
        s.sendall(request_bytes("GET", f"/v1/nothing%0d%0a{marker}%20200%20fake%1b[31m"))
        r = read_response(s)
    assert r is not None and r[0] == 404, r
    time.sleep(0.2)  # the log line is written after the answer
    log = server.output()
    lines = [line for line in log.splitlines() if marker in line]
    assert lines, log[-2000:]
    for line in lines:
        assert not line.startswith(marker), line
        assert "\x1b" not in line and "\\x0d\\x0a" + marker in line, repr(line)


def test_the_api_key_is_checked_whole(server):
    for key in ["", API_KEY[:-1], API_KEY + "x", "x" * len(API_KEY), API_KEY.upper()]:
        with connect(server) as s:
            s.sendall(request_bytes("GET", "/v1/models", key=key))
            r = read_response(s)
        assert r is not None and r[0] == 401, (key, r)


def test_foreign_host_and_origin_are_refused_on_loopback(server):
    """DNS rebinding (a page's name pointed at 127.0.0.1) and cross-site requests from web pages."""
    cases = [("Host: evil.example\r\n", 403), (f"Host: evil.example:{server.port}\r\n", 403),
             ("Origin: http://evil.example\r\n", 403), ("Origin: null\r\n", 403),
             (f"Host: localhost:{server.port}\r\n", 200), (f"Origin: http://localhost:{server.port}\r\n", 200),
             ("Origin: http://127.0.0.1:3000\r\n", 200), ("Host: [::1]\r\n", 200)]
    for extra, expected in cases:
        head = f"GET /v1/models HTTP/1.1\r\nAuthorization: Bearer {API_KEY}\r\n"
        if not extra.startswith("Host"):
            head += "Host: 127.0.0.1\r\n"
        with connect(server) as s:
            s.sendall((head + extra + "\r\n").encode())
            r = read_response(s)
        assert r is not None and r[0] == expected, (extra, r)


def test_a_100_mb_prompt_is_refused_at_once(server):
    """Content-Length over the body cap: refused from the head, the body never read."""
    start = time.monotonic()
    with connect(server) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  + f"Authorization: Bearer {API_KEY}\r\n".encode()
                  + b"Content-Type: application/json\r\nContent-Length: 100000000\r\n\r\n"
                  + b'{"prompt": "' + b"a" * 65536)
        r = read_response(s)
    assert r is not None, "closed without an answer"
    status, _, body = r
    assert status == 413, (status, body)
    assert "8388608 bytes" in json.loads(body)["error"]["message"]
    assert time.monotonic() - start < 1.0


def test_prompts_far_longer_than_the_context_are_refused_without_tokenizing(server, model_id):
    """Under the body cap but more bytes than the context can hold: refused from the byte count,
    not after tokenizing megabytes (seconds of a worker's and the CPU's time)."""
    text = "lorem ipsum dolor sit amet " * (20 * CONTEXT)  # 540 bytes a context token: under 8 MiB at 8192
    cases = [("/v1/completions", {"model": model_id, "prompt": text, "max_tokens": 1}, "prompt"),
             ("/v1/chat/completions", {"model": model_id, "messages": [{"role": "user", "content": text}],
                                       "max_tokens": 1}, "messages"),
             ("/tokenize", {"content": text}, "content")]
    for path, payload, field in cases:
        body = json.dumps(payload).encode()
        start = time.monotonic()
        with connect(server, timeout=30) as s:
            s.sendall(request_bytes("POST", path, body))
            r = read_response(s)
        elapsed = time.monotonic() - start
        assert r is not None, path
        status, _, text_body = r
        assert status == 400, (path, status, text_body[:300])
        error = json.loads(text_body)["error"]
        # Refused by its byte count (tokenizing would have counted tokens), and soon.
        assert error["param"] == field and f"the text is {len(text)} bytes" in error["message"], error
        assert f"context of {CONTEXT} tokens" in error["message"], error
        assert elapsed < 3.0, (path, elapsed)
    # A prompt that fits is still served.
    status, _, out = server.request("POST", "/tokenize", {"content": "lorem ipsum " * 100})
    assert status == 200 and len(out["tokens"]) > 100
