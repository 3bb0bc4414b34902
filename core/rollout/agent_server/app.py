"""The HTTP routes of ``AgentServer`` (FastAPI) and serving them on uvicorn in a thread of the rollout's process, on
the address the config names only."""

import json
import threading
import time

from core.rollout.agent_server.server import AgentServer, BadRequest, parse_chat, require_bearer


def create_app(server: AgentServer):
    # (no `from __future__ import annotations` in this module: FastAPI reads the routes' annotations as objects)
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="hybridrl rollout server", docs_url=None, redoc_url=None, openapi_url=None)

    def authorize(request: Request) -> None:
        require_bearer(request.headers, server.token, "the run's agent server token")

    async def checked(request: Request) -> dict:
        authorize(request)
        try:
            body = await request.json()
        except ValueError:
            raise BadRequest("body", "the request body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("body", "the request body must be a JSON object")
        return body

    @app.exception_handler(BadRequest)
    async def bad_request(_request, e: BadRequest):
        return JSONResponse(e.body(), e.status)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await checked(request)
        server.ready()
        req = parse_chat(body, server.params, server.max_n, server.max_tokens)
        out = await server.chat(server.trajectory_of(request.headers, body), req)
        if not req.stream:
            return out
        return StreamingResponse(_chunks(out), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await checked(request)
        server.ready()
        return await server.complete(server.trajectory_of(request.headers, body), body)

    @app.get("/v1/models")
    async def models(request: Request):
        authorize(request)
        return {"object": "list", "data": [{"id": server.model_name, "object": "model", "created": 0,
                                            "owned_by": "hybridrl"}]}

    return app


def _chunks(out: dict):
    """A finished chat completion as OpenAI's server-sent chunks: per choice its role, content (with its
    log-probs), tool calls and finish reason; then [DONE]."""
    head = {"id": out["id"], "object": "chat.completion.chunk", "created": out["created"], "model": out["model"]}

    def event(choice: dict) -> str:
        return f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"

    for ch in out["choices"]:
        k, msg = ch["index"], ch["message"]
        yield event({"index": k, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        if msg.get("content"):
            yield event({"index": k, "delta": {"content": msg["content"]}, "finish_reason": None,
                         "logprobs": ch["logprobs"]})
        for i, call in enumerate(msg.get("tool_calls") or []):
            yield event({"index": k, "delta": {"tool_calls": [{"index": i, **call}]}, "finish_reason": None})
        yield event({"index": k, "delta": {}, "finish_reason": ch["finish_reason"]})
    yield "data: [DONE]\n\n"


class Serving:
    """An ``AgentServer``'s routes (``create_app``), or a ``Router``'s (``server.app()``), on uvicorn in a daemon
    thread, listening on ``host`` only (``port`` 0: a free one); ``url`` (also set on ``server``) is its OpenAI base
    URL."""

    def __init__(self, server, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 30.0):
        import uvicorn

        app = create_app(server) if isinstance(server, AgentServer) else server.app()
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                access_log=False)
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, name="agent-server", daemon=True)
        self.thread.start()
        deadline = time.time() + timeout_s
        while not self.uvicorn.started:
            if not self.thread.is_alive() or time.time() > deadline:
                raise RuntimeError(f"the agent server did not start on {host}:{port}")
            time.sleep(0.01)
        bound = self.uvicorn.servers[0].sockets[0].getsockname()
        self.host, self.port = bound[0], bound[1]
        self.url = f"http://{host}:{self.port}/v1"
        server.url = self.url

    def close(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(timeout=10)
