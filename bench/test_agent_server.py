"""The rollout server (core.rollout.agent_server) against the built-in agent loop, on the same engine, prompts and
tools in the same run: model tokens per second of the agent recipe's CPU workload written as an OpenAI-client agent
(recipes/agent/openai_agent.py, through HTTP and the ``openai`` client) vs the built-in continuous loop
(core.rollout.agent_loop), and a request's latency (p50 / p99, client side) with 1, 8 and 32 agents at once.

Workload: SmolLM2-135M-Instruct, the one-shot calculator prompt, 2-3 digit multiplications, up to 3 turns of 48
tokens, the calculator in the sandbox; the two draw different samples (their turn rules agree, their seeds do not),
so the figure is model tokens per second over several seeds, the two alternating, after one untimed round of each.
Not tracked yet: no baseline.
"""

import asyncio
import time
from pathlib import Path

import numpy as np
import torch

from core.cli import recipe_module
from core.config import AgentConfig, SamplingParams
from core.models import load_causal_lm, load_tokenizer, resolve_dtype
from core.rollout.agent_loop import agent_generate
from core.rollout.agent_server import AgentServer, Serving
from core.rollout.agent_server.runner import drive_agents, load_runner
from core.rollout.engine import RolloutEngine
from core.rollout.sampling import sequence_seeds

ROOT = Path(__file__).resolve().parents[1]


async def _latencies(server: AgentServer, prompt: list[dict], agents: int, requests: int) -> list[float]:
    """``requests`` one-turn requests of 32 tokens from ``agents`` clients at once: each one's seconds."""
    import openai

    out, gate = [], asyncio.Semaphore(agents)

    async def one(k: int) -> None:
        tid = server.start_trajectory(f"latency/{agents}/{k}")
        client = openai.AsyncOpenAI(base_url=server.url, api_key=server.token, max_retries=0,
                                    default_headers={"X-Trajectory-Id": tid})
        async with gate:
            start = time.perf_counter()
            await client.chat.completions.create(model="policy", messages=prompt, max_tokens=32)
            out.append(time.perf_counter() - start)
        await client.close()
        server.finish(tid)

    await asyncio.gather(*(one(k) for k in range(requests)))
    return out


def test_agent_server_vs_the_built_in_loop(full_size, report):
    data = recipe_module(ROOT / "recipes" / "agent", "data")
    runner = load_runner(f"{ROOT / 'recipes/agent/openai_agent.py'}:run")
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    dtype = resolve_dtype("auto", torch.device("cpu"))
    engine = RolloutEngine(load_causal_lm("SmolLM2-135M-Instruct", dtype), tok)
    rows = [data.row(a, b, "train", i) for i, (a, b) in enumerate(data.pairs("train", 16 if full_size else 2))]
    rows = [r | {"ground_truth": r["reward_model"]["ground_truth"]} for r in rows]
    prompts = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
               for r in rows]
    cfg = AgentConfig(max_turns=3, max_response_tokens=160, tools=("calculator",), tool_max_output_bytes=256)
    n = 4 if full_size else 2
    server = AgentServer(engine, tok, max_response_tokens=cfg.max_response_tokens, describe_tools=False)
    serving = Serving(server)
    totals = {"builtin": [0, 0.0], "server": [0, 0.0]}
    # one untimed round of each side first: the server's first requests build the openai client's, FastAPI's and
    # the chat template's objects (~0.5 s the engine waits), which a training run pays once, at its first step
    warm = SamplingParams(n=n, temperature=0.7, max_new_tokens=48, seed=99)
    with server.sampling(warm, 160 + cfg.max_response_tokens, own_thread=False):
        drive_agents(runner, server, rows[:4], n, 64, sequence_seeds(99, 4 * n), 99)
    agent_generate(engine.generate, tok, engine.eos_ids, engine.pad_id, prompts[:4], warm, cfg, session=engine.session)
    for seed in range(3 if full_size else 1):
        params = SamplingParams(n=n, temperature=0.7, max_new_tokens=48, seed=seed)
        start = time.perf_counter()
        batch = agent_generate(engine.generate, tok, engine.eos_ids, engine.pad_id, prompts, params, cfg,
                               session=engine.session)
        totals["builtin"][1] += time.perf_counter() - start
        totals["builtin"][0] += int(batch["response_mask"].sum())
        start = time.perf_counter()
        with server.sampling(params, 160 + cfg.max_response_tokens, own_thread=False):  # as a rollout worker runs it
            runs = drive_agents(runner, server, rows, n, 64, sequence_seeds(seed, len(rows) * n), seed)
        totals["server"][1] += time.perf_counter() - start
        totals["server"][0] += sum(int(sum(r.segments[-1].traj.sampled)) for r in runs if r.segments)
    latency = {}
    with server.sampling(SamplingParams(temperature=0.7, max_new_tokens=32), 512):
        for agents in (1, 8, 32):
            seconds = asyncio.run(_latencies(server, rows[0]["prompt"], agents, agents * (4 if full_size else 1)))
            latency |= {f"latency_p50_s_{agents}": float(np.percentile(seconds, 50)),
                        f"latency_p99_s_{agents}": float(np.percentile(seconds, 99))}
    serving.close()
    speed = {k: tokens / seconds for k, (tokens, seconds) in totals.items()}
    report("agent_server", trajectories=len(rows) * n, dtype=str(dtype).removeprefix("torch."),
           builtin_tokens_per_s=speed["builtin"], server_tokens_per_s=speed["server"],
           ratio=speed["server"] / speed["builtin"], **latency)
