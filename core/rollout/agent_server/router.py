"""One base URL in front of a run's rollout servers (one per replica), for agents that run outside the replicas.

Sticky: every request of a trajectory goes to the replica that opened it -- the one holding its record (its
conversation, which a later turn extends) and the KV prefix cache its earlier turns left there. Least-loaded: a new
trajectory opens on the replica with the fewest requests in flight, then the fewest open trajectories, then the
lowest index. The router has its own token (``Authorization: Bearer``; 401 without it) and holds each replica's;
a request naming no trajectory, or one the router did not open, gets a 400 naming ``trajectory_id`` and reaches no
replica. Replies (streamed ones too) pass through unchanged, so a replica's 4xx/503 is the agent's.

A replica is anything with ``url``, ``token``, ``start_trajectory(key, seed)`` and ``finish(tid)``: an
``AgentServer`` in this process, or a handle that calls a remote replica's.
"""

import json
import secrets
import threading
from typing import Protocol

from core.rollout.agent_server.server import BadRequest, require_bearer


class Replica(Protocol):
    url: str
    token: str

    def start_trajectory(self, key: str, seed: int | None = None) -> str: ...

    def finish(self, tid: str) -> list: ...


class Router:
    def __init__(self, replicas: list[Replica], token: str | None = None):
        if not replicas:
            raise ValueError("a router needs at least one replica")
        self.replicas = list(replicas)
        self.token = token or secrets.token_urlsafe(24)
        self.home: dict[str, int] = {}                 # open trajectory id -> its replica
        self.in_flight = [0] * len(self.replicas)      # requests sent and not yet answered, per replica
        self.opened = [0] * len(self.replicas)         # open trajectories, per replica
        self.lock = threading.Lock()
        self.url = ""

    def start_trajectory(self, key: str, seed: int | None = None) -> str:
        """Open a trajectory on the least-loaded replica; its id, which the router sends to that replica only."""
        with self.lock:
            k = min(range(len(self.replicas)), key=lambda r: (self.in_flight[r], self.opened[r], r))
            self.opened[k] += 1
        tid = self.replicas[k].start_trajectory(key, seed)
        with self.lock:
            self.home[tid] = k
        return tid

    def finish(self, tid: str) -> list:
        """The trajectory's record, from its replica."""
        with self.lock:
            k = self.home.pop(tid)
            self.opened[k] -= 1
        return self.replicas[k].finish(tid)

    def replica_of(self, tid: str) -> int:
        with self.lock:
            if tid not in self.home:
                raise BadRequest("trajectory_id", f"trajectory_id {str(tid)[:80]!r}: not opened by this router "
                                                  "(another run's, finished, or never started)")
            return self.home[tid]

    def app(self):
        return create_router_app(self)


def create_router_app(router: Router):
    # (no `from __future__ import annotations` in this module: FastAPI reads the routes' annotations as objects)
    import httpx2
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.background import BackgroundTask

    app = FastAPI(title="hybridrl rollout router", docs_url=None, redoc_url=None, openapi_url=None)
    clients: dict[str, httpx2.AsyncClient] = {}  # one connection pool, made in the serving event loop

    def client() -> httpx2.AsyncClient:
        if "c" not in clients:
            clients["c"] = httpx2.AsyncClient(timeout=None, limits=httpx2.Limits(max_connections=None))
        return clients["c"]

    @app.exception_handler(BadRequest)
    async def bad_request(_request, e: BadRequest):
        return JSONResponse(e.body(), e.status)

    @app.api_route("/v1/{path:path}", methods=["GET", "POST"])
    async def forward(path: str, request: Request):
        require_bearer(request.headers, router.token, "the run's router token")
        body = await request.body()
        if request.method == "GET":  # /v1/models: every replica serves the same policy
            k, tid = 0, None
        else:
            tid = request.headers.get("x-trajectory-id")
            if not tid:
                try:
                    parsed = json.loads(body or b"{}")
                except ValueError:
                    raise BadRequest("body", "the request body is not JSON") from None
                tid = parsed.get("trajectory_id") if isinstance(parsed, dict) else None
            if not tid:
                raise BadRequest("trajectory_id", "trajectory_id: required (header X-Trajectory-Id, or extra_body="
                                                  "{\"trajectory_id\": ...})")
            k = router.replica_of(tid)
        replica = router.replicas[k]
        headers = {"authorization": f"Bearer {replica.token}", "content-type": "application/json"}
        if tid:
            headers["x-trajectory-id"] = tid
        with router.lock:
            router.in_flight[k] += 1
        try:
            sent = client().build_request(request.method, f"{replica.url}/{path}", content=body, headers=headers)
            reply = await client().send(sent, stream=True)
        except Exception:
            with router.lock:
                router.in_flight[k] -= 1
            raise

        async def done():
            await reply.aclose()
            with router.lock:
                router.in_flight[k] -= 1

        kind = reply.headers.get("content-type", "application/json")
        if kind.startswith("text/event-stream"):
            return StreamingResponse(reply.aiter_raw(), reply.status_code, media_type=kind,
                                     background=BackgroundTask(done))
        content = await reply.aread()
        await done()
        return Response(content, reply.status_code, media_type=kind)

    return app
