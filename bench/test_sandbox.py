"""The tool sandbox's cost: a trivial call (``print(1)``) with ``tools.isolation: process`` (rlimits + seccomp) and
``namespaces`` (bubblewrap, uid nobody, cgroups; the default) in the same run -- calls/s, p50 and p99 latency, and
namespaces' p50 over process's (target <= 2) -- and recipes/agent's CPU rollout (the calculator in the sandbox)
under each, as model tokens per second (target: within 5%).

Full size (``--benchmark``): 200 trivial calls per mode, the agent rollout of 8 prompts x 4 samples over 2 seeds per
mode (process twice: the noise of two equal runs); smoke: 10 calls, 2 prompts x 2 samples, 1 seed.
"""

import statistics
import time
from pathlib import Path

import pytest
import torch

from core.tools import isolation
from core.tools.sandbox import run_python


def _latencies(mode: str, n: int) -> list[float]:
    run_python("print(1)", isolation=mode)  # warm: the probe, the page cache
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = run_python("print(1)", isolation=mode)
        out.append(time.perf_counter() - t)
        assert r.text == "1\n", r.text
    return out


def test_trivial_call_latency_process_vs_namespaces(full_size, report):
    if isolation.probe():
        pytest.skip(f"no namespaces here: {isolation.probe()}")
    n = 200 if full_size else 10
    figures = {}
    for mode in ("process", "namespaces"):
        lat = sorted(_latencies(mode, n))
        figures |= {f"{mode}_calls_per_s": n / sum(lat), f"{mode}_p50_ms": 1e3 * statistics.median(lat),
                    f"{mode}_p99_ms": 1e3 * lat[min(n - 1, int(0.99 * n))]}
    report("sandbox_trivial_call", tracked={"namespaces_over_process_p50": "lower"}, calls=n, **figures,
           namespaces_over_process_p50=figures["namespaces_p50_ms"] / figures["process_p50_ms"])


@pytest.mark.timeout(1800)
def test_agent_rollout_process_vs_namespaces(full_size, report, monkeypatch):
    if isolation.probe():
        pytest.skip(f"no namespaces here: {isolation.probe()}")
    from core.rollout.agent_loop import agent_generate
    from core.cli import recipe_module
    from core.config import AgentConfig, SamplingParams
    from core.rollout.engine import RolloutEngine
    from core.models import load_causal_lm, load_tokenizer, resolve_dtype

    data = recipe_module(Path(__file__).parents[1] / "recipes" / "agent", "data")
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    engine = RolloutEngine(load_causal_lm("SmolLM2-135M-Instruct", resolve_dtype("auto", torch.device("cpu"))), tok)
    prompts = [tok.apply_chat_template(data.row(a, b, "train", 0)["prompt"], add_generation_prompt=True,
                                       tokenize=True, return_dict=False)
               for a, b in data.pairs("train", 8 if full_size else 2)]
    cfg = AgentConfig(max_turns=3, max_response_tokens=160, tools=("calculator",))
    figures = {}
    for mode in ("process", "namespaces", "process_again"):  # process twice: the noise between two equal runs
        monkeypatch.setenv(isolation.ENV, mode.removesuffix("_again"))
        tokens, seconds, calls = 0, 0.0, 0
        for seed in range(2 if full_size else 1):
            params = SamplingParams(n=4 if full_size else 2, temperature=0.7, max_new_tokens=48, seed=seed)
            start = time.perf_counter()
            batch = agent_generate(engine.generate, tok, engine.eos_ids, engine.pad_id, prompts, params, cfg,
                                   session=engine.session)
            seconds += time.perf_counter() - start
            tokens += int(batch["response_mask"].sum())
            calls += int(batch["num_tool_calls"].sum())
        figures |= {f"{mode}_tokens_per_s": tokens / seconds, f"{mode}_tool_calls": calls}
    report("sandbox_agent_rollout", tracked={"namespaces_over_process": "higher"}, **figures,
           namespaces_over_process=figures["namespaces_tokens_per_s"] / figures["process_tokens_per_s"],
           process_again_over_process=figures["process_again_tokens_per_s"] / figures["process_tokens_per_s"])
