"""Calling a service: ``map_using_service_async`` against a service of 20 ms latency.

Run ``python -m bench service`` (or ``python -m bench.bench_service [items]``). The service is
an aiohttp server in a process of its own that answers ``GET /?x=N`` with ``N * 2`` after 20 ms
(``asyncio.sleep``, so it answers any number of calls at once). Measured in the same run, on
one processor (``set_local_parallelism(1)``), items from ``Sources.items``:

- ``map_using_service_async`` at ``max_concurrent=64`` through an aiohttp session, beside the
  ideal 64 calls per 20 ms (3,200 calls/s) and beside an asyncio loop written by hand (a
  semaphore of 64 and ``gather`` over the same session and items);
- ``map_using_service`` (a blocking ``http.client`` connection, kept alive) and a plain loop of
  the same blocking calls, one call at a time: about 50 calls/s at best.

The rates of the pipelines include the job's start and end (the items are many enough for
these to be a small part).
"""

from __future__ import annotations

import asyncio
import http.client
import os
import subprocess
import sys
import time

from jetwake import Member, Pipeline, ServiceFactory, Sinks, Sources

from .report import line, timer

LATENCY_S = 0.020
CONCURRENCY = 64
ITEMS = 9_600          # 3 s at the ideal rate
SYNC_ITEMS = 100       # 2 s at 50 calls/s
IDEAL = CONCURRENCY / LATENCY_S


# --- the service (its own process) ------------------------------------------------------------

def serve(port: int) -> None:
    from aiohttp import web

    async def answer(request: web.Request) -> web.Response:
        await asyncio.sleep(LATENCY_S)
        return web.Response(text=str(int(request.query["x"]) * 2))
    app = web.Application()
    app.router.add_get("/", answer)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, backlog=1024)


def _start_service() -> tuple[subprocess.Popen, int]:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "bench.bench_service", "--serve", str(port)],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    deadline = time.monotonic() + 30
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/?x=1")
            assert conn.getresponse().read() == b"2"
            conn.close()
            return proc, port
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("the benchmark's service did not start") from None
            time.sleep(0.1)


# --- the clients --------------------------------------------------------------------------------

async def _session():
    import aiohttp
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


def _close(session):
    return session.close()


def _async_call(url: str):
    async def call(session, x: int) -> int:
        async with session.get(url, params={"x": str(x)}) as r:
            return int(await r.text())
    return call


class _Blocking:
    """One kept-alive connection, one blocking call at a time."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, x: int) -> int:
        self.conn.request("GET", f"/?x={x}")
        return int(self.conn.getresponse().read())

    def close(self) -> None:
        self.conn.close()


# --- the measurements ---------------------------------------------------------------------------

def _pipeline_rate(member: Member, items: int, build) -> float:
    p = Pipeline()
    stage = build(p.read_from(Sources.items(range(items))))
    stage.set_local_parallelism(1).write_to(Sinks.list("results"))
    member.get_list("results").clear()
    with timer() as t:
        member.new_job(p).join()
    got = sorted(member.get_list("results"))
    assert got == [x * 2 for x in range(items)], f"{len(got)} results for {items} items"
    return items / t[0]


def _hand_written_rate(url: str, items: int) -> float:
    async def run() -> float:
        session = await _session()
        call = _async_call(url)
        sem = asyncio.Semaphore(CONCURRENCY)

        async def one(x: int) -> int:
            async with sem:
                return await call(session, x)
        try:
            start = time.perf_counter()
            results = await asyncio.gather(*(one(x) for x in range(items)))
            elapsed = time.perf_counter() - start
        finally:
            await session.close()
        assert results == [x * 2 for x in range(items)]
        return items / elapsed
    return asyncio.run(run())


def _blocking_loop_rate(port: int, items: int) -> float:
    client = _Blocking(port)
    try:
        with timer() as t:
            results = [client.call(x) for x in range(items)]
    finally:
        client.close()
    assert results == [x * 2 for x in range(items)]
    return items / t[0]


def main(items: int = ITEMS) -> None:
    proc, port = _start_service()
    url = f"http://127.0.0.1:{port}/"
    try:
        with Member(cooperative_threads=2) as member:
            # a first small job: imports and the service's first connections are not measured
            _pipeline_rate(member, 200, lambda s: s.map_using_service_async(
                ServiceFactory(_session, _close), _async_call(url), max_concurrent=CONCURRENCY))
            engine = _pipeline_rate(member, items, lambda s: s.map_using_service_async(
                ServiceFactory(_session, _close), _async_call(url), max_concurrent=CONCURRENCY))
            sync = _pipeline_rate(member, SYNC_ITEMS, lambda s: s.map_using_service(
                ServiceFactory(lambda: _Blocking(port), _Blocking.close),
                lambda client, x: client.call(x)))
        hand = _hand_written_rate(url, items)
        loop = _blocking_loop_rate(port, SYNC_ITEMS)
    finally:
        proc.terminate()
        proc.wait(10)
    print(f"service latency {LATENCY_S * 1000:.0f} ms, max_concurrent={CONCURRENCY}, one "
          f"processor, {items:,} items (sync: {SYNC_ITEMS})", flush=True)
    line("map_using_service_async (64 in flight)", engine, IDEAL, "calls", "ideal 64 / 20 ms")
    line("map_using_service_async (64 in flight)", engine, hand, "calls",
         "asyncio by hand (64)")
    line("map_using_service_async (64 in flight)", engine, sync, "calls",
         "map_using_service")
    line("map_using_service (blocking calls)", sync, loop, "calls", "plain blocking loop")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else ITEMS)
