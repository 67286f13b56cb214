#!/usr/bin/env python3
"""Loopback HTTP server for the benchmarks tests: the Hugging Face hub's file
layout and the dataset viewer's rows API, plus misbehaving routes.

usage: http_server.py FIXTURE_DIR
Prints the port it listens on (127.0.0.1, ephemeral), then serves until its
stdin closes (so it dies with the test runner).

Routes
  /datasets/REPO/resolve/REV/FILE   REPO in HUB_FILES: that fixture; REPO "t/ok": FIXTURE_DIR/FILE
  /datasets/t/BEHAVIOUR/resolve/REV/FILE   see behave() and stream()
  /cdn/FILE                          FIXTURE_DIR/FILE (redirect target)
  /rows?dataset=..&config=..&split=..&offset=..&length=..   rows API over a fixture JSONL
  /hits?path=P                       how many requests P (path + query) has had
"""
import gzip
import json
import os
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIXTURES = sys.argv[1]
HITS = {}
LOCK = threading.Lock()

# Registry entries served from fixtures with the same layout.
HUB_FILES = {
    "HuggingFaceH4/MATH-500": "math500_test.jsonl",
    "math-ai/aime25": "aime25_evalchemy.json",
    # every release file of it is served by the one real release_v1 copy
    "livecodebench/code_generation_lite": "livecodebench_release_v1_nopriv_mavencoder.jsonl",
}
ROWS = {
    "openai/gsm8k": "gsm8k_test.jsonl",
    "HuggingFaceH4/aime_2024": "aime24_qwen25math.jsonl",
    "math-ai/amc23": "amc23_qwen25math.jsonl",
    "Hothan/OlympiadBench": "olympiadbench_qwen25math.jsonl",
    "MathArena/hmmt_feb_2025": "hmmt_feb_2025.jsonl",
    "t/rows-flaky": "aime24_qwen25math.jsonl",
    "t/rows-truncated": "aime24_qwen25math.jsonl",
    "t/rows-shrink": "gsm8k_test.jsonl",
    "t/rows-bad": None,
    "t/rows-evil": None,
    "t/rows-empty": None,
    "t/rows-huge": "aime24_qwen25math.jsonl",
}

# The hub's columns where the fixture copy names them differently: MathArena's
# dataset card lists problem_idx (int), problem, answer, problem_type.
HUB_COLUMNS = {
    "MathArena/hmmt_feb_2025": lambda i, r: {"problem_idx": i + 1, "problem": r["question"],
                                             "answer": r["answer"], "problem_type": r["problem_type"]},
}

LFS_POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
               b"oid sha256:35dc41080a3680858b27fa7e0533d2d547825316fc5dafe5d316f4ccc5a06132\n"
               b"size 446564\n")
HTML = b"<!DOCTYPE html>\n<html><head><title>500</title></head><body>Internal Error</body></html>\n"


def hit(key):
    with LOCK:
        HITS[key] = HITS.get(key, 0) + 1
        return HITS[key]


def fixture(name):
    path = os.path.join(FIXTURES, os.path.basename(name))
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return f.read()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def send(self, code, body, ctype="application/octet-stream", headers=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def cut(self, body, keep):
        """Promises all of body, sends keep bytes, drops the connection."""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body[:keep])
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True

    def do_GET(self):
        url = urllib.parse.urlsplit(self.path)
        n = hit(self.path)
        parts = url.path.split("/")
        if url.path == "/hits":
            key = urllib.parse.parse_qs(url.query)["path"][0]
            return self.send(200, str(HITS.get(key, 0)).encode(), "text/plain")
        if url.path == "/rows":
            return self.rows(urllib.parse.parse_qs(url.query), n)
        if parts[1] == "cdn":
            body = fixture(parts[-1])
            return self.send(200, body) if body is not None else self.not_found()
        if parts[1] == "datasets" and "resolve" in parts:
            r = parts.index("resolve")
            repo, name = "/".join(parts[2:r]), "/".join(parts[r + 2:])
            if repo in HUB_FILES:
                return self.send(200, fixture(HUB_FILES[repo]))
            if repo.startswith("t/"):
                return self.behave(repo[2:], name, n)
        return self.not_found()

    def not_found(self):
        self.send(404, b"Entry not found", "text/plain", [("X-Error-Message", "Entry not found")])

    def behave(self, how, name, n):
        body = fixture(name)
        if body is None:
            return self.not_found()
        if how == "ok":
            return self.send(200, body)
        if how == "redirect":  # the hub answers resolve/ with a redirect to its CDN
            return self.send(302, b"", headers=[("Location", "/cdn/" + name)])
        if how == "flaky500":
            return self.send(500, b"Internal Error", "text/plain") if n == 1 else self.send(200, body)
        if how == "flaky429":
            if n == 1:
                return self.send(429, b"slow down", "text/plain", [("Retry-After", "1")])
            return self.send(200, body)
        if how == "always503":
            return self.send(503, b"unavailable", "text/plain")
        if how == "cutonce":
            return self.cut(body, len(body) // 2) if n == 1 else self.send(200, body)
        if how == "cut":
            return self.cut(body, len(body) // 2)
        if how == "slow":
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:10])
            self.wfile.flush()
            time.sleep(8)
            self.close_connection = True
            return None
        if how in ("rangecut", "norange"):
            return self.ranged(how, body, n)
        if how in ("endless", "drip"):
            return self.stream(how)
        if how == "gzipbomb":  # 64 MiB of 'A' in a ~64 KB gzip reply
            z = gzip.compress(b"A" * (64 << 20), compresslevel=9)
            return self.send(200, z, "text/plain", [("Content-Encoding", "gzip")])
        if how == "empty":
            return self.send(200, b"", "application/json")
        if how == "garbage":
            return self.send(200, b"\x00\x01\x02 not json at all {", "application/json")
        if how == "evilmsg":  # terminal escapes in the hub's error header
            return self.send(403, b"denied", "text/plain",
                             [("X-Error-Message", "\x1b[2J\x1b]0;pwned\x07\x1b[31mgated\x9b1m")])
        if how == "corrupt":  # one byte changed, same length
            return self.send(200, body[:100] + bytes([body[100] ^ 1]) + body[101:])
        if how == "lfs":
            return self.send(200, LFS_POINTER, "text/plain")
        if how == "html":
            return self.send(200, HTML, "text/html")
        return self.not_found()

    def ranged(self, how, body, n):
        """rangecut: a request without Range is cut at half, one with
        "Range: bytes=N-" gets 206 and the rest; norange: Range ignored, the
        first request cut at half, the others whole (200)."""
        rng = self.headers.get("Range")
        if rng:
            hit("range " + self.path)
        if how == "rangecut" and rng and rng.startswith("bytes=") and rng.endswith("-"):
            start = int(rng[6:-1])
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(body) - 1, len(body)))
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            self.wfile.write(body[start:])
            return None
        if how == "rangecut" or n == 1:
            return self.cut(body, len(body) // 2)
        return self.send(200, body)

    def stream(self, how):
        """endless: chunked 64 KB chunks forever; drip: 2 bytes every 0.5 s of a
        promised megabyte. Both stop when the client hangs up."""
        self.send_response(200)
        if how == "endless":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(1 << 20))
        self.end_headers()
        self.close_connection = True
        chunk = b"x" * 65536
        try:
            while True:
                if how == "endless":
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                else:
                    self.wfile.write(b"xx")
                    self.wfile.flush()
                    time.sleep(0.5)
        except OSError:
            pass

    def rows(self, q, n):
        ds = q.get("dataset", [""])[0]
        offset, length = int(q.get("offset", ["0"])[0]), int(q.get("length", ["100"])[0])
        if ds not in ROWS or length > 100:
            return self.send(404 if ds not in ROWS else 422,
                             json.dumps({"error": "bad request"}).encode(), "application/json")
        if ds == "t/rows-bad":
            return self.send(200, b'{"rows": "nope"}', "application/json")
        if ds == "t/rows-evil":
            return self.send(400, json.dumps({"error": "\x1b[2Jbad\x07 request"}).encode(), "application/json")
        if ds == "t/rows-empty":
            return self.send(200, b'{"rows": [], "num_rows_total": 0}', "application/json")
        if ds == "t/rows-flaky" and offset == 0 and n == 1:
            return self.send(503, json.dumps({"error": "try later"}).encode(), "application/json")
        with open(os.path.join(FIXTURES, ROWS[ds]), encoding="utf-8") as f:
            data = [json.loads(l) for l in f if l.strip()]
        if ds in HUB_COLUMNS:
            data = [HUB_COLUMNS[ds](i, r) for i, r in enumerate(data)]
        total = len(data)
        if ds == "t/rows-shrink" and offset > 0:
            total -= 1
        page = data[offset:offset + length]
        if ds == "t/rows-huge":  # claims 10^12 rows and serves full pages of copies
            total = 10**12
            page = [data[(offset + i) % len(data)] for i in range(length)]
        rows = [{"row_idx": offset + i, "row": r,
                 "truncated_cells": ["problem"] if ds == "t/rows-truncated" and offset + i == 7 else []}
                for i, r in enumerate(page)]
        reply = {"features": [], "rows": rows, "num_rows_total": total,
                 "num_rows_per_page": 100, "partial": False}
        self.send(200, json.dumps(reply).encode(), "application/json")


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        """A client hanging up on a streamed reply is expected, not news."""
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


def main():
    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # returns when the test runner closes our stdin or exits
    os._exit(0)


if __name__ == "__main__":
    main()
