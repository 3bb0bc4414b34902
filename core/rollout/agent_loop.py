"""Multi-turn agent rollouts over any rollout engine: the model generates until it calls a tool or ends, the tools
run (in the sandbox, ``core.tools``), their outputs are appended as tokens, and generation resumes -- up to
``max_turns`` model turns and ``max_response_tokens`` tokens in all.

Token in, token out: each turn's prompt is the trajectory's ids so far (the prompt, the model's sampled tokens,
the tool-response tokens), never text re-tokenised -- re-tokenising can merge tokens across a boundary and the
trainer's log-probs would then be of other tokens than the ones sampled. The tool-response tokens come from the
model's chat template (``core.tools.chat``). In the returned Batch (``core.rollout.batch``) the response
is the whole stream: ``attention_mask`` 1 on all of it, ``response_mask`` 1 on the model's tokens only, and
``rollout_logprobs`` 0 on the tool tokens; per sample ``num_turns``, ``num_tool_calls``, ``num_tool_errors`` and
``truncated`` (its last turn did not end at EOS: cut by a length limit, or max_turns reached with a call pending).

Concurrency: with an engine that has a ``session`` (the embedded engine) the rollout is one continuous batch
across turns: a trajectory whose turn ended waits only for its own tools, then its next turn joins the running
batch. Otherwise (vLLM) each turn is one ``generate`` call over every live trajectory (the engine batches them
continuously) and the next turn starts when all have answered. The tool calls of all trajectories run
concurrently (``tool_workers`` sandbox processes).
A trajectory ends when a turn calls no tool (it answered, or hit the length limit), after ``max_turns`` turns,
or when the token budget leaves no room for the tools' answer and another turn.
"""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import torch

from core.config import AgentConfig, SamplingParams
from core.rollout.batch import assemble
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
                   cfg: AgentConfig, session: Callable | None = None) -> Batch:
    """``params.n`` agent trajectories per prompt. ``generate``: an engine's generate (prompt ids, params) ->
    Batch; ``params.max_new_tokens`` bounds each turn, ``cfg.max_response_tokens`` the whole response.
    ``session``: the engine's ``session`` where it has one (the embedded engine): turns run by continuous batching
    across turns, each trajectory's next turn admitted as soon as its tools have answered, every sequence drawing
    from its own seed. Without it (vLLM): turn-synchronous, one ``generate`` call per turn over every live
    trajectory."""
    n = params.n
    trajs = [_Trajectory(list(p)) for p in prompt_ids for _ in range(n)]
    turn = _Turns(tokenizer, eos_ids, TOOL_CALL_PARSERS[cfg.tool_parser], cfg)
    params = replace(params, n=1, stop=tuple(dict.fromkeys(tuple(params.stop) + tuple(cfg.stop))))
    with ThreadPoolExecutor(max(cfg.tool_workers, 1)) as pool:
        if session is not None:
            _continuous(session, trajs, params, cfg, turn, pool)
        else:
            _turn_synchronous(generate, trajs, params, cfg, turn, pool)
    batch = assemble(list(map(list, prompt_ids)), [t.tokens for t in trajs], [t.logps for t in trajs], n, pad_id,
                     sampled=[t.sampled for t in trajs])
    for key, values in (("num_turns", [t.turns for t in trajs]), ("num_tool_calls", [t.num_calls for t in trajs]),
                        ("num_tool_errors", [t.num_errors for t in trajs]),
                        ("truncated", [not t.at_eos for t in trajs])):
        batch[key] = torch.tensor(values, dtype=torch.float32)
    return batch


@dataclass(frozen=True)
class _Turns:
    """What happens at the end of a model turn and of a tool round, the same in both schedules."""
    tokenizer: object
    eos_ids: Sequence[int]
    parse: Callable
    cfg: AgentConfig

    def room(self, t: _Trajectory, params: SamplingParams) -> int:
        return min(params.max_new_tokens, self.cfg.max_response_tokens - len(t.tokens))

    def model_turn(self, t: _Trajectory, tokens: list[int], logps: list[float]) -> None:
        """Append a turn's sampled tokens (within the budget) and parse its tool calls; done when it made none, it
        was the last turn, or the budget is spent."""
        cfg, budget = self.cfg, self.cfg.max_response_tokens - len(t.tokens)
        t.add(tokens[:budget], logps[:budget], sampled=True)
        t.turns += 1
        t.at_eos = bool(tokens) and tokens[-1] in self.eos_ids and len(tokens) <= budget
        ended = not tokens or t.at_eos or len(tokens) > budget
        t.calls = [] if ended else self.parse(self.tokenizer.decode(tokens, skip_special_tokens=True))
        t.done = not t.calls or t.turns == cfg.max_turns or len(t.tokens) >= cfg.max_response_tokens

    def tool_round(self, t: _Trajectory, results: list[ToolResult]) -> None:
        """Append the tools' answers as template tokens, or end the trajectory when no turn would fit after them."""
        t.num_calls += len(results)
        t.num_errors += sum(not r.ok for r in results)
        ids = tool_response_ids(self.tokenizer, [r.text for r in results])
        if len(t.tokens) + len(ids) >= self.cfg.max_response_tokens:  # no room to answer after the tools
            t.done = True
            return
        t.add(ids, [], sampled=False)


def _turn_synchronous(generate, trajs: list[_Trajectory], params: SamplingParams, cfg: AgentConfig, turn: _Turns,
                      pool: ThreadPoolExecutor) -> None:
    for k in range(cfg.max_turns):
        live = [t for t in trajs if not t.done]
        if not live:
            break
        turn_params = replace(params, max_new_tokens=max(turn.room(t, params) for t in live),
                              seed=params.seed + 1_000_003 * k)
        # one engine call for every live trajectory: its ids so far are the prompt
        for t, tokens, logps in zip(live, *_turns(generate([t.prompt + t.tokens for t in live], turn_params))):
            turn.model_turn(t, tokens, logps)
        # every waiting trajectory's tool calls at once, then their answers as template tokens
        waiting = [t for t in live if not t.done]
        for t, results in zip(waiting, pool.map(lambda t: [run_tool(c, cfg) for c in t.calls], waiting)):
            turn.tool_round(t, results)


def _continuous(session, trajs: list[_Trajectory], params: SamplingParams, cfg: AgentConfig, turn: _Turns,
                pool: ThreadPoolExecutor) -> None:
    """One engine session for the whole rollout: a trajectory's turn is a sequence in it; when the turn ends its
    tool calls go to the pool, and when they have answered its next turn joins the running batch -- no
    trajectory waits for another's turn. Turn k of trajectory i samples from seed + 1,000,003 k + 7,919 i."""
    run = session([t.prompt for t in trajs], params, max(len(t.prompt) for t in trajs) + cfg.max_response_tokens)
    owner: dict[int, int] = {}                           # session sequence -> trajectory
    pending: dict[Future, int] = {}                      # tool round in the pool -> trajectory

    def start(i: int) -> None:
        t = trajs[i]
        seed = params.seed + 1_000_003 * t.turns + 7_919 * i
        owner[run.add(t.prompt + t.tokens, turn.room(t, params), seed)] = i

    for i in range(len(trajs)):
        start(i)
    while owner or pending:
        if owner:
            for seq in run.step():
                i = owner.pop(seq)
                turn.model_turn(trajs[i], run.tokens[seq], run.logps[seq])
                if not trajs[i].done:
                    pending[pool.submit(lambda t: [run_tool(c, cfg) for c in t.calls], trajs[i])] = i
        else:  # every live trajectory is waiting for its tools
            wait(list(pending), return_when=FIRST_COMPLETED)
        for future in [f for f in pending if f.done()]:
            i = pending.pop(future)
            turn.tool_round(trajs[i], future.result())
            if not trajs[i].done:
                start(i)
