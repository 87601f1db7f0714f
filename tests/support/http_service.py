"""A real HTTP service for the tests of ``map_using_service`` (the standard library's
ThreadingHTTPServer on a free loopback port), with a chosen latency and chosen failures, that
counts what it sees: requests, calls in flight at once (the most of them), each key's
requests in arrival order and whether two of one key ever overlapped.

``GET /?x=<int>&key=<str>`` answers ``x * 10`` as text after ``latency_ms`` (plus
``slow[x]`` ms for the items listed there); it answers 500 for the items in ``fail`` and for
the first ``fail_first`` requests of every item.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

__all__ = ["HttpService", "aiohttp_factory", "fetch"]


class HttpService:
    def __init__(self, latency_ms: float = 0, *, fail: set[int] | frozenset = frozenset(),
                 fail_first: int = 0, slow: dict[int, float] | None = None) -> None:
        self.latency_ms = latency_ms
        self.fail = set(fail)
        self.fail_first = fail_first
        self.slow = dict(slow or {})
        self.lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.attempts: dict[int, int] = defaultdict(int)
        self.by_key: dict[str, list[int]] = defaultdict(list)
        self.key_busy: set[str] = set()
        self.key_overlaps = 0
        self.callers: set[str] = set()  # the X-Caller headers seen (a member's process id)
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                q = parse_qs(urlparse(self.path).query)
                x = int(q["x"][0])
                key = q.get("key", [""])[0]
                with service.lock:
                    service.requests += 1
                    service.callers.add(self.headers.get("X-Caller", ""))
                    service.in_flight += 1
                    service.max_in_flight = max(service.max_in_flight, service.in_flight)
                    service.attempts[x] += 1
                    attempt = service.attempts[x]
                    if key:
                        service.by_key[key].append(x)
                        if key in service.key_busy:
                            service.key_overlaps += 1
                        service.key_busy.add(key)
                try:
                    time.sleep((service.latency_ms + service.slow.get(x, 0)) / 1000)
                    failing = x in service.fail or attempt <= service.fail_first
                    body = b"failing" if failing else str(x * 10).encode()
                    self.send_response(500 if failing else 200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                finally:
                    with service.lock:
                        service.in_flight -= 1
                        service.key_busy.discard(key)

            def log_message(self, fmt: str, *args: object) -> None:  # quiet
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # many calls connect at once
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # a client that gave up (a timeout, a killed member) closed its socket

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "HttpService":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


async def fetch(session, url: str, x: int, key: str = "") -> int:
    """One call to the service: ``x * 10``, or an error for an answer other than 200."""
    params = {"x": str(x)}
    if key:
        params["key"] = key
    async with session.get(url, params=params) as r:
        text = await r.text()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {text}")
        return int(text)


async def _new_session():
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


def _close_session(session):
    return session.close()


def aiohttp_factory(shared_per: str = "processor"):
    """A ServiceFactory of an aiohttp session, made and closed on the stage's event loop."""
    from jetwake import ServiceFactory
    return ServiceFactory(_new_session, _close_session, shared_per=shared_per)
