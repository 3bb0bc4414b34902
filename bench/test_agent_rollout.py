"""Agent rollouts: continuous batching across turns (the embedded engine's session) vs turn-synchronous batching
(one generate call per turn, the next turn after every trajectory's tools answered), on the same engine, prompts
and tools in the same run.

Workload: recipes/agent's CPU task (SmolLM2-135M-Instruct, the one-shot calculator prompt, 2-3 digit
multiplications), up to 3 turns of 48 tokens, the calculator in the sandbox. The two schedules draw different
samples (per-trajectory seeds vs one generator per turn), so the figure is model tokens per second, over several
seeds each. Not tracked yet: it has no baseline.
"""

import time
from pathlib import Path

import torch

from core.rollout.agent_loop import agent_generate
from core.cli import recipe_module
from core.config import AgentConfig, SamplingParams
from core.rollout.engine import RolloutEngine
from core.models import load_causal_lm, load_tokenizer, resolve_dtype


def test_continuous_vs_turn_synchronous_agent_rollouts(full_size, report):
    data = recipe_module(Path(__file__).parents[1] / "recipes" / "agent", "data")
    tok = load_tokenizer("SmolLM2-135M-Instruct")
    dtype = resolve_dtype("auto", torch.device("cpu"))
    engine = RolloutEngine(load_causal_lm("SmolLM2-135M-Instruct", dtype), tok)
    pairs = data.pairs("train", 16 if full_size else 2)
    prompts = [tok.apply_chat_template(data.row(a, b, "train", 0)["prompt"], add_generation_prompt=True,
                                       tokenize=True, return_dict=False) for a, b in pairs]
    cfg = AgentConfig(max_turns=3, max_response_tokens=160, tools=("calculator",))
    seeds = range(3 if full_size else 1)
    figures = {}
    for name, session in (("continuous", engine.session), ("turn_synchronous", None)):
        tokens, seconds, turns = 0, 0.0, 0.0
        for seed in seeds:
            params = SamplingParams(n=4 if full_size else 2, temperature=0.7, max_new_tokens=48, seed=seed)
            start = time.perf_counter()
            batch = agent_generate(engine.generate, tok, engine.eos_ids, engine.pad_id, prompts, params, cfg,
                                   session=session)
            seconds += time.perf_counter() - start
            tokens += int(batch["response_mask"].sum())
            turns += float(batch["num_turns"].mean()) / len(seeds)
        figures |= {f"{name}_tokens_per_s": tokens / seconds, f"{name}_turns_mean": turns}
    report("agent_rollout", trajectories=len(prompts) * (4 if full_size else 2),
           dtype=str(dtype).removeprefix("torch."), **figures,
           ratio=figures["continuous_tokens_per_s"] / figures["turn_synchronous_tokens_per_s"])
