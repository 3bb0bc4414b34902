"""Multi-turn agent rollouts over any rollout engine: the model generates until it calls a tool or ends, the tools
run (in the sandbox, ``core.tools``), their outputs are appended as tokens, and generation resumes -- up to
``max_turns`` model turns and ``max_response_tokens`` tokens in all.

Token in, token out: each turn's prompt is the trajectory's ids so far (the prompt, the model's sampled tokens,
the tool-response tokens), never text re-tokenised -- re-tokenising can merge tokens across a boundary and the
trainer's log-probs would then be of other tokens than the ones sampled. The tool-response tokens come from the
model's chat template (``core.tools.chat``). In the returned Batch (``core.engines.rollout_batch``) the response
is the whole stream: ``attention_mask`` 1 on all of it, ``response_mask`` 1 on the model's tokens only, and
``rollout_logprobs`` 0 on the tool tokens; per sample ``num_turns``, ``num_tool_calls``, ``num_tool_errors`` and
``truncated`` (its last turn did not end at EOS: cut by a length limit, or max_turns reached with a call pending).

Concurrency: each turn is one ``generate`` call over every live trajectory (the engine batches them
continuously), and the tool calls of all trajectories run concurrently (``tool_workers`` sandbox processes).
A trajectory ends when a turn calls no tool (it answered, or hit the length limit), after ``max_turns`` turns,
or when the token budget leaves no room for the tools' answer and another turn.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from core.config import AgentConfig, SamplingParams
from core.engines.rollout_batch import assemble
from core.protocol import Batch
from core.tools.builtin import TOOLS, refused
from core.tools.chat import tool_response_ids
from core.tools.parsers import TOOL_CALL_PARSERS, ToolCall
from core.tools.sandbox import SandboxLimits, ToolResult


@dataclass
class _Trajectory:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    sampled: list[float] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    turns: int = 0
    calls: list[ToolCall] = field(default_factory=list)
    num_calls: int = 0
    num_errors: int = 0
    at_eos: bool = False
    done: bool = False

    def add(self, tokens: list[int], logps: list[float], sampled: bool) -> None:
        self.tokens += tokens
        self.logps += logps if sampled else [0.0] * len(tokens)
        self.sampled += [1.0 if sampled else 0.0] * len(tokens)


def run_tool(call: ToolCall, cfg: AgentConfig) -> ToolResult:
    """One call's answer: the tool's result, or an error the model reads (unparsable call, unknown tool)."""
    if call.error:
        return refused(f"error: {call.error}")
    if call.name not in cfg.tools:
        return refused(f"error: unknown tool {call.name!r}; the tools are {list(cfg.tools)}")
    limits = SandboxLimits(timeout_s=cfg.tool_timeout_s, max_output_bytes=cfg.tool_max_output_bytes)
    return TOOLS[call.name](call.arguments, limits)


def _turns(out: Batch) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's sampled tokens and their log-probs from an engine's generate() Batch."""
    keep = out["response_mask"] > 0
    return ([r[k].tolist() for r, k in zip(out["responses"], keep)],
            [lp[k].tolist() for lp, k in zip(out["rollout_logprobs"], keep)])


def agent_generate(generate: Callable[[list[list[int]], SamplingParams], Batch], tokenizer, eos_ids: Sequence[int],
                   pad_id: int, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                   cfg: AgentConfig) -> Batch:
    """``params.n`` agent trajectories per prompt. ``generate``: an engine's generate (prompt ids, params) ->
    Batch; ``params.max_new_tokens`` bounds each turn, ``cfg.max_response_tokens`` the whole response."""
    trajs = [_Trajectory(list(p)) for p in prompt_ids for _ in range(params.n)]
    parse = TOOL_CALL_PARSERS[cfg.tool_parser]
    stop = tuple(dict.fromkeys(tuple(params.stop) + tuple(cfg.stop)))
    with ThreadPoolExecutor(max(cfg.tool_workers, 1)) as pool:
        for turn in range(cfg.max_turns):
            live = [t for t in trajs if not t.done]
            if not live:
                break
            room = max(cfg.max_response_tokens - len(t.tokens) for t in live)
            turn_params = replace(params, n=1, stop=stop, max_new_tokens=min(params.max_new_tokens, room),
                                  seed=params.seed + 1_000_003 * turn)
            # one engine call for every live trajectory: its ids so far are the prompt
            for t, tokens, logps in zip(live, *_turns(generate([t.prompt + t.tokens for t in live], turn_params))):
                budget = cfg.max_response_tokens - len(t.tokens)
                t.add(tokens[:budget], logps[:budget], sampled=True)
                t.turns += 1
                t.at_eos = bool(tokens) and tokens[-1] in eos_ids and len(tokens) <= budget
                ended = not tokens or t.at_eos or len(tokens) > budget
                t.calls = [] if ended else parse(tokenizer.decode(tokens, skip_special_tokens=True))
                t.done = not t.calls or turn == cfg.max_turns - 1 or len(t.tokens) >= cfg.max_response_tokens
            # every waiting trajectory's tool calls at once, then their answers as template tokens
            waiting = [t for t in live if not t.done]
            answers = pool.map(lambda t: [run_tool(c, cfg) for c in t.calls], waiting)
            for t, results in zip(waiting, answers):
                t.num_calls += len(results)
                t.num_errors += sum(not r.ok for r in results)
                ids = tool_response_ids(tokenizer, [r.text for r in results])
                if len(t.tokens) + len(ids) >= cfg.max_response_tokens:  # no room to answer after the tools
                    t.done = True
                    continue
                t.add(ids, [], sampled=False)
    batch = assemble(list(map(list, prompt_ids)), [t.tokens for t in trajs], [t.logps for t in trajs], params.n,
                     pad_id, sampled=[t.sampled for t in trajs])
    for key, values in (("num_turns", [t.turns for t in trajs]), ("num_tool_calls", [t.num_calls for t in trajs]),
                        ("num_tool_errors", [t.num_errors for t in trajs]),
                        ("truncated", [not t.at_eos for t in trajs])):
        batch[key] = torch.tensor(values, dtype=torch.float32)
    return batch
