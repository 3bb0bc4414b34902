"""An OpenAI-compatible HTTP server in front of a rollout engine, recording every trajectory token in, token out.

Routes (FastAPI on uvicorn): ``POST /v1/chat/completions`` (messages, tools in OpenAI's schema and the replies'
``tool_calls``, ``n``, ``max_tokens``, ``stop``, ``seed``, ``logprobs``, ``stream``), ``POST /v1/completions``
(a text or token-id prompt), ``GET /v1/models``. Every request carries the run's token (``Authorization: Bearer``;
401 without it) and a trajectory id the run opened (header ``X-Trajectory-Id`` or ``extra_body={"trajectory_id":
...}``); a request that breaks the schema gets a 400 naming the field, and nothing is recorded. Sampling is the
run's: ``temperature`` and ``top_p`` other than the run's are refused (the trainer's log-probs assume them).

What is recorded is ``core.rollout.agent_server.conversation``'s: per trajectory, the ids each turn was prompted
with and the tokens sampled, their log-probs and weight versions. ``finish(trajectory)`` hands them out as the agent
loop's ``Trajectory`` records. A request's stop strings end its sequence in the engine (``Run.add``). A streamed
reply is sent as chunks once its sequence has finished (the engine decodes it among the other requests; the chunks
are OpenAI's format).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass

from core.rollout.agent_server.conversation import Conversations, Prompt, Segment
from core.rollout.agent_server.engine_loop import Completion, EngineLoop
from core.config.algo import SamplingParams
from core.rollout.sampling import sequence_seeds
from core.tools.parsers import TOOL_CALL_PARSERS


class BadRequest(Exception):
    def __init__(self, param: str, message: str, status: int = 400):
        super().__init__(message)
        self.param, self.message, self.status = param, message, status

    def body(self) -> dict:
        """OpenAI's error format: the message, its type, the field it names."""
        kind = "authentication_error" if self.status == 401 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": None}}


def require_bearer(headers, token: str, whose: str) -> None:
    """BadRequest 401 unless ``headers`` carry ``Authorization: Bearer <token>`` (compared in constant time)."""
    given = headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise BadRequest("authorization", f"a valid bearer token is required ({whose})", 401)


@dataclass(frozen=True)
class ChatRequest:
    messages: list
    tools: list | None
    tool_choice: str
    n: int
    max_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    logprobs: bool
    stream: bool


def _number(body: dict, key: str, kind, low, high):
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(key, f"{key}: {value!r} is not a {kind.__name__ if isinstance(kind, type) else 'number'} "
                              f"in [{low}, {high}]")
    return value


def parse_chat(body: dict, params: SamplingParams, max_n: int, max_tokens: int) -> ChatRequest:
    """A chat request's fields, checked; BadRequest names the first field that is wrong."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages", "messages: a non-empty list of {role, content} is required")
    return ChatRequest(messages, *_tools(body), *_sampling(body, params, max_n, max_tokens))


def _tools(body: dict) -> tuple[list | None, str]:
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("tools", "tools: a list of {\"type\": \"function\", \"function\": {...}}")
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type") != "function":
                raise BadRequest(f"tools[{i}].type", f"tools[{i}].type: {t.get('type') if isinstance(t, dict) else t!r}"
                                                     " is not supported (only \"function\")")
            if not isinstance(t.get("function"), dict) or not isinstance(t["function"].get("name"), str):
                raise BadRequest(f"tools[{i}].function.name", f"tools[{i}].function.name: a string is required")
    choice = body.get("tool_choice", "auto")
    if choice not in ("auto", "none"):
        raise BadRequest("tool_choice", f"tool_choice: {choice!r} is not supported (\"auto\" or \"none\")")
    return tools, choice


def _sampling(body: dict, params: SamplingParams, max_n: int, max_tokens: int) -> tuple:
    """n, max_tokens, stop, seed, logprobs, stream of a request, checked against the run's sampling."""
    for key, run_value in (("temperature", params.temperature), ("top_p", params.top_p)):
        value = _number(body, key, (int, float), 0, 2)
        if value is not None and abs(value - run_value) > 1e-9:
            raise BadRequest(key, f"{key}: {value} differs from the run's {run_value} (algo.sampling.{key}: the "
                                  "trainer's log-probs assume it); leave it out or send the run's")
    n = _number(body, "n", int, 1, max_n)
    top = body.get("top_logprobs")
    if top:
        raise BadRequest("top_logprobs", "top_logprobs: not supported (the sampled tokens' log-probs only)")
    limit = _number(body, "max_completion_tokens", int, 1, max_tokens) or _number(body, "max_tokens", int, 1,
                                                                                  max_tokens)
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else stop
    if not isinstance(stop, (list, tuple)) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop", "stop: a string or a list of up to 4 non-empty strings")
    return (n or 1, limit or max_tokens, tuple(stop), _number(body, "seed", int, 0, 2**63), bool(body.get("logprobs")),
            bool(body.get("stream")))


class AgentServer:
    """The routes' state: the engine and its loop while a rollout samples (``sampling``), the conversations, the
    run's token and trajectory ids. ``max_response_tokens``: a trajectory's budget of tokens after its first prompt
    (its turns and the template's between them); a request is given what is left of it at most."""

    def __init__(self, engine, tokenizer, run_id: str | None = None, token: str | None = None,
                 tool_parser: str = "hermes", tool_stop: tuple[str, ...] = ("</tool_call>",), max_n: int = 16,
                 max_response_tokens: int = 1 << 30, describe_tools: bool = True, model_name: str = "policy"):
        self.engine, self.tok, self.model_name = engine, tokenizer, model_name
        self.run_id = run_id or secrets.token_hex(4)
        self.token = token or secrets.token_urlsafe(24)
        self.parse_calls, self.tool_stop, self.max_n = TOOL_CALL_PARSERS[tool_parser], tool_stop, max_n
        self.budget = max_response_tokens
        self.loop: EngineLoop | None = None
        self.params, self.max_tokens = SamplingParams(), 0
        self.conversations = Conversations(tokenizer, engine.eos_ids, describe_tools)
        self.open: dict[str, int | None] = {}          # trajectory id -> its sampling seed (None: from its id)
        self.lock = threading.Lock()
        self.url = ""

    @contextmanager
    def sampling(self, params: SamplingParams, max_len: int, own_thread: bool = True):
        """Serve requests inside the block: an engine loop sampling with ``params`` (its temperature and top_p the
        only ones accepted; ``max_new_tokens`` a request's limit), sequences of up to ``max_len`` tokens, decoding
        in a thread of its own or (``own_thread`` false) where the caller ``loop.drive``s it. Outside, requests get
        a 503."""
        self.params, self.max_tokens = params, params.max_new_tokens
        self.loop = EngineLoop(self.engine, params, max_len, own_thread)
        try:
            yield self
        finally:
            loop, self.loop = self.loop, None
            loop.close()

    def ready(self) -> None:
        if self.loop is None:
            raise BadRequest("", "the rollout is not sampling now (between two of its calls)", 503)

    # ------------------------------------------------------------------------------------------ trajectories
    def start_trajectory(self, key: str, seed: int | None = None) -> str:
        """A new trajectory id of this run (``<run_id>/<key>``) that requests may name; ``seed``: its samples'
        (each turn's drawn from it), else one derived from the id."""
        tid = f"{self.run_id}/{key}"
        with self.lock:
            self.open[tid] = seed
        return tid

    def finish(self, tid: str) -> list[Segment]:
        """The trajectory's recorded segments (its requests are refused from now on)."""
        with self.lock:
            self.open.pop(tid, None)
        return self.conversations.finished(tid)

    def trajectory_of(self, headers, body: dict) -> str:
        tid = headers.get("x-trajectory-id") or body.get("trajectory_id")
        if not tid:
            raise BadRequest("trajectory_id", "trajectory_id: required (header X-Trajectory-Id, or extra_body="
                                              "{\"trajectory_id\": ...})")
        with self.lock:
            if tid not in self.open:
                whose = "not of this run" if not str(tid).startswith(self.run_id + "/") else "not open (finished or never started)"
                raise BadRequest("trajectory_id", f"trajectory_id {str(tid)[:80]!r}: {whose}")
        return tid

    # ------------------------------------------------------------------------------------------ completions
    def seeds(self, p: Prompt, seed: int | None, n: int) -> list[int]:
        """Each of ``n`` choices' sampling seed: the request's ``seed``, else the trajectory's (given or from its id)
        mixed with the request's place in it (its turn and prompt length), so a rerun of the same agents draws the
        same tokens."""
        if seed is not None:
            return sequence_seeds(seed, n)
        base = self.open.get(p.trajectory)
        base = self.params.seed ^ zlib.crc32(p.trajectory.encode()) if base is None else base
        turn = p.at[1] if p.parent is not None else 0
        return sequence_seeds(base ^ zlib.crc32(f"{turn}#{len(p.ids)}".encode()), n)

    def room(self, p: Prompt, limit: int) -> int:
        """A request's token limit within its trajectory's budget; BadRequest when none is left."""
        used = len(p.parent.traj.tokens) + len(p.added) if p.parent is not None else 0
        if used >= self.budget:
            raise BadRequest("max_tokens", f"the trajectory's {self.budget} response tokens are spent "
                                           "(rollout.agent.max_response_tokens)")
        return min(limit, self.budget - used)

    async def chat(self, tid: str, req: ChatRequest) -> dict:
        tools = req.tools if req.tool_choice != "none" else None
        try:
            p = self.conversations.prompt(tid, req.messages, [t["function"] for t in tools] if tools else None)
        except ValueError as e:
            raise BadRequest("messages", str(e)) from None
        stop = req.stop + (self.tool_stop if tools else ())
        limit = self.room(p, req.max_tokens)
        try:
            futures = [self.loop.submit(p.ids, limit, seed, stop) for seed in self.seeds(p, req.seed, req.n)]
        except ValueError as e:
            raise BadRequest("max_tokens", str(e)) from None
        done: list[Completion] = [await asyncio.wrap_future(f) for f in futures]
        choices = []
        for k, c in enumerate(done):
            message, finish = self.reply(c.tokens, bool(tools), limit)
            self.conversations.reply(p, c.tokens, c.logps, c.versions, message)
            choice = {"index": k, "message": message, "finish_reason": finish, "token_ids": c.tokens,
                      "logprobs": {"content": self._logprobs(c.tokens, c.logps)} if req.logprobs else None}
            choices.append(choice)
        completion_tokens = sum(len(ch["token_ids"]) for ch in choices)
        return {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "prompt_token_ids": p.ids,
                "usage": {"prompt_tokens": len(p.ids), "completion_tokens": completion_tokens,
                          "total_tokens": len(p.ids) + completion_tokens}}

    async def complete(self, tid: str, body: dict) -> dict:
        """``/v1/completions``: a text prompt (tokenised as is) or token ids; a prompt that extends one of the
        trajectory's records continues it (the ids between masked out of the loss)."""
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            ids = self.tok(prompt, add_special_tokens=False)["input_ids"]
        elif (isinstance(prompt, list) and prompt and all(isinstance(x, int) and not isinstance(x, bool)
                                                          and 0 <= x < len(self.tok) for x in prompt)):
            ids = prompt
        else:
            raise BadRequest("prompt", "prompt: a non-empty string or list of token ids of the model's vocabulary")
        n, max_tokens, stop, seed, logprobs, _ = _sampling(body, self.params, self.max_n, self.max_tokens)
        p = self.conversations.prompt_ids(tid, ids)
        max_tokens = self.room(p, max_tokens)
        try:
            futures = [self.loop.submit(p.ids, max_tokens, s, stop) for s in self.seeds(p, seed, n)]
        except ValueError as e:
            raise BadRequest("max_tokens", str(e)) from None
        choices = []
        for k, f in enumerate(futures):
            c = await asyncio.wrap_future(f)
            text = self.tok.decode(c.tokens, skip_special_tokens=True)
            self.conversations.reply(p, c.tokens, c.logps, c.versions, {"role": "assistant", "content": text})
            choices.append({"index": k, "text": text, "token_ids": c.tokens,
                            "finish_reason": self._finish(c.tokens, max_tokens),
                            "logprobs": {"tokens": [self.tok.decode([t]) for t in c.tokens],
                                         "token_logprobs": c.logps} if logprobs else None})
        used = sum(len(c["token_ids"]) for c in choices)
        return {"id": f"cmpl-{secrets.token_hex(12)}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices, "prompt_token_ids": p.ids,
                "usage": {"prompt_tokens": len(p.ids), "completion_tokens": used, "total_tokens": len(p.ids) + used}}

    def _finish(self, tokens: list[int], limit: int) -> str:
        """``length`` when the sequence ran to ``limit`` without ending at EOS, else ``stop``."""
        ended = bool(tokens) and tokens[-1] in self.conversations.eos
        return "length" if len(tokens) >= limit and not ended else "stop"

    def reply(self, tokens: list[int], tools: bool, max_tokens: int) -> tuple[dict, str]:
        """The assistant message of sampled ``tokens``: its text, and with tools the calls it makes in OpenAI's
        ``tool_calls`` (the text before the first call its content); the finish reason."""
        text = self.tok.decode(tokens, skip_special_tokens=True)
        calls = [c for c in self.parse_calls(text) if not c.error] if tools else []
        if calls:
            content = text[:text.find("<tool_call>")].strip() if "<tool_call>" in text else ""
            return {"role": "assistant", "content": content or None,
                    "tool_calls": [{"id": f"call_{secrets.token_hex(6)}", "type": "function",
                                    "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                   for c in calls]}, "tool_calls"
        return {"role": "assistant", "content": text}, self._finish(tokens, max_tokens)

    def _logprobs(self, tokens: list[int], logps: list[float]) -> list[dict]:
        out = []
        for t, lp in zip(tokens, logps):
            piece = self.tok.decode([t])
            out.append({"token": piece, "logprob": lp, "bytes": list(piece.encode()), "top_logprobs": []})
        return out
