"""Agents as users write them, trained unchanged: ``rollout.agent.runner`` names an async function

    async def run(client: openai.AsyncOpenAI, row: dict) -> str | dict

written with the ordinary ``openai`` client (its ``base_url`` is this replica's rollout server; every request it
sends is recorded under the trajectory the client was made for). ``row`` is the data row: ``prompt`` (the chat
messages), ``data_source``, ``ground_truth``, ``extra_info``. It returns the final answer, which the recipe's reward
scores, or a dict: ``answer``; ``tool_errors`` (how many of its tool calls failed: ``agent/tool_error_rate``); any
other keys reach the reward as ``extra_info["agent"]`` (a verifier's verdict, a cost the reward charges). Many run
at once (``rollout.agent.max_concurrent``), ``n`` per row; an agent that raises scores its answer as empty and the
run goes on (the error is printed once per step).

Each trajectory trains as its last segment (``core.rollout.agent_server.conversation``): the prompt the server rendered
for its first request, then every sampled token (loss mask 1) and template token (0) after it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.rollout.agent_server.conversation import Segment
from core.rollout.agent_server.server import AgentServer
from core.protocol import Batch
from core.rollout.agent_loop import Trajectory, trajectories_batch


def load_runner(spec: str) -> Callable:
    """``path/to/file.py:function`` or ``package.module:function``; ValueError naming what is missing."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"rollout.agent.runner {spec!r}: write FILE.py:FUNCTION or MODULE:FUNCTION")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise ValueError(f"rollout.agent.runner: {path} not found")
        module_spec = importlib.util.spec_from_file_location(f"agent_runner_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not asyncio.iscoroutinefunction(fn):
        raise ValueError(f"rollout.agent.runner: {name!r} in {where} is not an async function (async def {name}"
                         "(client, row))")
    return fn


@dataclass
class AgentRun:
    segments: list[Segment]
    answer: str
    error: str = ""
    extras: dict | None = None    # the runner's other keys, for the reward (extra_info["agent"])


def _returned(out) -> tuple[str, int, dict | None]:
    """A runner's return value: its answer, tool errors, extras."""
    if not isinstance(out, dict):
        return str(out or ""), 0, None
    extras = {k: v for k, v in out.items() if k not in ("answer", "tool_errors")}
    errors = out.get("tool_errors", 0)
    if not isinstance(errors, int) or isinstance(errors, bool) or errors < 0:
        raise TypeError(f"the runner returned tool_errors={errors!r}: a count (int >= 0) is expected")
    return str(out.get("answer") or ""), errors, extras or None


async def run_agents(runner: Callable, server: AgentServer, rows: list[dict], n: int, concurrency: int,
                     seeds: list[int], call: int) -> list[AgentRun]:
    """``n`` agents per row (sample j of row i: ``seeds[i * n + j]``), at most ``concurrency`` at once; in row
    order."""
    import openai

    gate = asyncio.Semaphore(concurrency)
    # one connection pool for every agent's client: a client with a pool of its own takes ~28 ms to make (its TLS
    # context), 64 of them ~2 s during which the engine has no request to decode
    pool = openai.DefaultAsyncHttpxClient()

    async def one(i: int, j: int) -> AgentRun:
        tid = server.start_trajectory(f"{call}/{i}/{j}", seed=seeds[i * n + j])
        client = openai.AsyncOpenAI(base_url=server.url, api_key=server.token, max_retries=0, timeout=3600.0,
                                    default_headers={"X-Trajectory-Id": tid}, http_client=pool)
        answer, errors, extras, error = "", 0, None, ""
        async with gate:
            try:
                answer, errors, extras = _returned(await runner(client, dict(rows[i])))
            except Exception as e:  # noqa: BLE001 -- an agent's failure is its sample's, not the run's
                error = "".join(traceback.format_exception_only(e)).strip()
        segments = server.finish(tid)
        if segments:
            segments[-1].traj.num_errors = errors
        return AgentRun(segments, answer, error, extras)

    try:
        return list(await asyncio.gather(*(one(i, j) for i in range(len(rows)) for j in range(n))))
    finally:
        await pool.aclose()


def drive_agents(runner: Callable, server: AgentServer, rows: list[dict], n: int, concurrency: int,
                 seeds: list[int], call: int) -> list[AgentRun]:
    """``run_agents`` on a thread of their own while this thread decodes their requests (inside
    ``server.sampling(..., own_thread=False)``)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1, thread_name_prefix="agents") as pool:
        done = pool.submit(asyncio.run, run_agents(runner, server, rows, n, concurrency, seeds, call))
        server.loop.drive(done)
        return done.result()


def agents_batch(runs: list[AgentRun], prompt_ids: list[list[int]], n: int, pad_id: int) -> Batch:
    """The generate() Batch of the agents' trajectories (each its last segment; an agent that never asked the model:
    its row's prompt and no response), n per row, with the agent loop's per-sample keys."""
    trajs = [r.segments[-1].traj if r.segments else Trajectory(list(prompt_ids[k // n])) for k, r in enumerate(runs)]
    return trajectories_batch([t.prompt for t in trajs], trajs, 1, pad_id)
