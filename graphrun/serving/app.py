"""The HTTP endpoint: the Open Inference Protocol's routes on Starlette (served by uvicorn).

* ``GET /v2/health/live`` — the process answers (never needs the token);
* ``GET /v2/health/ready`` — ``{"ready": bool}``, HTTP 200 or 503: the store answered one
  of the last :data:`PROBE_FAILURES` probes (an authenticated ``stats`` to every
  partition's server, every ``probe_s`` seconds,
  :func:`graphrun.machine.readiness.store_is_ready`; a kubelet's ``failureThreshold``:
  one slow answer on a busy machine is no store gone) and the engine is joined; a
  request that finds the store gone turns it false at once; a store that went away and
  came back is joined again by the probe;
* ``GET /v2/models/<name>``, ``/v2/models/<name>/ready`` — metadata, readiness;
* ``POST /v2/models/<name>/infer`` — :mod:`graphrun.serving.protocol`;
* ``GET /metrics`` — Prometheus text (its own registry: latency histogram by route,
  requests by route and code, errors by type, micro-batch sizes, store seconds).

Micro-batching: checked requests wait in a bounded queue; one task takes what queued
while the last forward ran, or else what arrives within ``window_s`` of the first (up
to ``max_batch_ids`` ids), and runs it as one forward in the engine's one worker
thread, then answers each. A full queue is HTTP 503, a bad request
400 ``{"error": ...}``; an unexpected failure is 500 with one line, and the server goes on.

With a token every route but ``/v2/health/live`` and ``/v2/health/ready`` (:data:`OPEN`:
a kubelet's probes send no secret) wants ``Authorization: Bearer <token>`` (compared in
constant time, :func:`hmac.compare_digest`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from graphrun.errors import BadRequest, ServerBusy, StoreUnavailable
from graphrun.serving.engine import Engine, Stats
from graphrun.serving.protocol import Bounds, Mode, Query, answer, parse

log = logging.getLogger("graphrun.serving")
T = TypeVar("T")
Handler = Callable[[Request], Awaitable[Response]]
Item = tuple[Query, "asyncio.Future[dict[str, Any]]"]  # a request waiting for its answer

#: routes that need no token: liveness, and readiness for a kubelet's probe (one bit, from
#: the last store probe: no request reaches the store or the model)
OPEN = frozenset({"/v2/health/live", "/v2/health/ready"})
LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
#: failed store probes in a row after which the endpoint is not ready (and joins again)
PROBE_FAILURES = 3


@dataclass(frozen=True)
class Settings:
    name: str  # the model's name in the routes
    bounds: Bounds = field(default_factory=Bounds)
    window_s: float = 0.002  # how long a micro-batch gathers requests after its first
    probe_s: float = 1.0  # store probe period
    token: str | None = None
    mode: Mode = "sampled"
    seed: int = 0


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "graphrun_serving_"
        self.latency = Histogram(p + "request_seconds", "request latency", ["route"],
                                 buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.requests = Counter(p + "requests", "requests answered", ["route", "code"], registry=r)
        self.errors = Counter(p + "errors", "requests refused or failed", ["type"], registry=r)
        self.batch = Histogram(p + "batch_ids", "ids in one forward", buckets=BATCH_BUCKETS,
                               registry=r)  # fmt: skip
        self.store = Histogram(p + "store_seconds", "seconds a micro-batch spent on the store",
                               ["stage"], buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self.forward = Histogram(p + "forward_seconds", "seconds of one forward",
                                 buckets=LATENCY_BUCKETS, registry=r)  # fmt: skip
        self._counted: dict[tuple[str, int], tuple[Counter, Histogram]] = {}

    def answered(self, route: str, code: int, seconds: float) -> None:
        """An answer of ``route`` counted and timed (each route's and code's series looked
        up once: prometheus_client's ``labels`` costs microseconds a call)."""
        key = (route, code)
        got = self._counted.get(key)
        if got is None:  # a few routes, a few codes: bounded
            got = self._counted[key] = (self.requests.labels(route, str(code)),
                                        self.latency.labels(route))  # fmt: skip
        got[0].inc()
        got[1].observe(seconds)


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class Encoded(Response):
    """A JSON answer encoded by msgspec (a third of the stdlib's time for the long lists
    of floats an answer is)."""

    media_type = "application/json"

    def render(self, content: object) -> bytes:
        return msgspec.json.encode(content)


class Server:
    """The engine, its worker thread, the micro-batch queue and the readiness state."""

    def __init__(self, engine: Engine, settings: Settings, probe: Callable[[], bool]) -> None:
        self.engine, self.settings, self.probe = engine, settings, probe
        self.metrics = Metrics()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="graphrun-serving")
        self.queue: asyncio.Queue[Item] | None = None
        self.ready = engine.connected
        self.failed_probes = 0  # in a row
        self.pending = 0

    async def run_in_worker(self, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    # ---- micro-batching ----------------------------------------------------------------

    async def submit(self, query: Query) -> dict[str, Any]:
        assert self.queue is not None
        if self.pending >= self.settings.bounds.max_queue:
            raise ServerBusy(
                f"{self.pending} requests in flight, at most {self.settings.bounds.max_queue}"
            )
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending += 1
        try:
            self.queue.put_nowait((query, fut))
            return await fut
        finally:
            self.pending -= 1

    async def batches(self) -> None:
        """Forever: a micro-batch of the requests queued while the last one ran (under
        load: no wait), or else of what arrives within the window after the first; at
        most ``max_batch_ids`` ids (a request that would pass it starts the next one)."""
        assert self.queue is not None
        limit, window = self.settings.bounds.max_batch_ids, self.settings.window_s
        carry: Item | None = None
        while True:
            first = carry if carry is not None else await self.queue.get()
            carry = None
            batch, ids = [first], first[0].size
            if window > 0 and self.queue.empty():
                await asyncio.sleep(window)  # then whatever arrived: no task per request
            while ids < limit and not self.queue.empty():
                item = self.queue.get_nowait()
                if ids + item[0].size > limit:
                    carry = item
                    break
                batch.append(item)
                ids += item[0].size
            await self.run_batch(batch)

    async def run_batch(self, batch: list[Item]) -> None:
        try:
            stats: Stats = await self.run_in_worker(self.engine.answer, [q for q, _ in batch])
        except BaseException as exc:
            if isinstance(exc, StoreUnavailable):
                self.ready = False
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        m = self.metrics
        m.batch.observe(stats.ids)
        m.store.labels("sample").observe(stats.sample_s)
        m.store.labels("fetch").observe(stats.fetch_s)
        m.forward.observe(stats.forward_s)
        for (_, fut), rows in zip(batch, stats.rows, strict=True):
            if fut.done():
                continue
            if isinstance(rows, BadRequest):
                fut.set_exception(rows)
            else:
                fut.set_result(rows)

    # ---- readiness ---------------------------------------------------------------------

    async def probing(self) -> None:
        while True:
            await self.check_ready()
            await asyncio.sleep(self.settings.probe_s)

    async def check_ready(self) -> bool:
        answered = await asyncio.get_running_loop().run_in_executor(None, self.probe)
        self.failed_probes = 0 if answered else self.failed_probes + 1
        ok = self.failed_probes < PROBE_FAILURES and (answered or self.ready)
        if not ok and self.engine.connected:  # its sessions end with the servers: join again
            await self.run_in_worker(self.engine.close)
        if ok and not self.engine.connected:
            try:
                await self.run_in_worker(self.engine.connect)
            except Exception as exc:
                log.warning("graphrun serving: joining the store again failed: %s", exc)
        self.ready = ok and self.engine.connected
        return self.ready


def build_app(server: Server) -> Starlette:
    s = server.settings
    m = server.metrics
    base = f"/v2/models/{s.name}"

    async def live(_: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(_: Request) -> Response:
        return JSONResponse({"ready": server.ready}, status_code=200 if server.ready else 503)

    async def metadata(_: Request) -> Response:
        g = server.engine.graph
        return JSONResponse({
            "name": s.name, "versions": ["1"], "platform": "graphrun",
            "inputs": [
                {"name": "node_ids", "datatype": "INT64", "shape": [-1]},
                {"name": "features", "datatype": "FP32", "shape": [1, g.in_dim]},
                {"name": "neighbors", "datatype": "INT64", "shape": [-1]},
            ],
            "outputs": [
                {"name": "logits", "datatype": "FP32", "shape": [-1, -1]},
                {"name": "predictions", "datatype": "INT64", "shape": [-1]},
                {"name": "embeddings", "datatype": "FP32", "shape": [-1, -1]},
            ],
        })  # fmt: skip

    async def infer(request: Request) -> Response:
        body = await _read_body(request, s.bounds.max_body_bytes)
        try:
            decoded = _decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise BadRequest(f"request: not JSON ({type(exc).__name__})") from None
        query = parse(decoded, server.engine.graph, s.bounds, s.mode, s.seed)
        if not server.ready:
            raise StoreUnavailable("the store is not reachable (/v2/health/ready is false)")
        rows = await server.submit(query)
        rid = decoded.get("id") if isinstance(decoded, dict) else None
        return Encoded(answer(s.name, query, rows, rid))

    async def metrics(_: Request) -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        server.queue = asyncio.Queue()
        tasks = [asyncio.create_task(server.batches()), asyncio.create_task(server.probing())]
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            server.pool.shutdown(wait=True)
            server.engine.close()

    token = s.token.encode() if s.token is not None else None

    def guarded(route: str, handler: Handler) -> Handler:
        """``handler`` behind the token, its errors as protocol answers, counted and timed
        (a wrapper per route, not a middleware: Starlette's runs each request in a task
        of its own)."""

        async def guard(request: Request) -> Response:
            return await _guard(route, request, handler)

        return guard

    async def _guard(route: str, request: Request, handler: Handler) -> Response:
        t0 = time.perf_counter()
        if token is not None and route not in OPEN:
            got = request.headers.get("authorization", "")
            if not hmac.compare_digest(got.encode(), b"Bearer " + token):
                m.errors.labels("unauthorized").inc()
                m.requests.labels(route, "401").inc()
                return error("unauthorized: send Authorization: Bearer <token>", 401)
        try:
            response: Response = await handler(request)
        except BadRequest as exc:
            m.errors.labels("bad_request").inc()
            response = error(str(exc))
        except ServerBusy as exc:
            m.errors.labels("busy").inc()
            response = error(f"busy: {exc}", 503)
        except StoreUnavailable as exc:
            m.errors.labels("store_unavailable").inc()
            response = error(str(exc), 503)
        except Exception as exc:
            log.exception("graphrun serving: request failed")
            m.errors.labels("internal").inc()
            response = error(f"internal error: {type(exc).__name__}", 500)
        m.answered(route, response.status_code, time.perf_counter() - t0)
        return response

    routes = [
        Route(path, guarded(path, fn), methods=[method])
        for path, fn, method in (
            ("/v2/health/live", live, "GET"), ("/v2/health/ready", ready, "GET"),
            (base, metadata, "GET"), (f"{base}/ready", ready, "GET"),
            (f"{base}/infer", infer, "POST"), ("/metrics", metrics, "GET"),
        )
    ]  # fmt: skip
    return Starlette(routes=routes, lifespan=lifespan)


_decode = msgspec.json.Decoder().decode  # any JSON value: protocol.parse checks its shape


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused past ``limit`` bytes (read no further than that)."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise BadRequest(f"request: body of {declared} bytes, at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"request: body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
