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
class Trajectory:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    sampled: list[float] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    versions: list[float] = field(default_factory=list)  # the weight version of each token (a stream's)
    turns: int = 0
    calls: list[ToolCall] = field(default_factory=list)
    num_calls: int = 0
    num_errors: int = 0
    at_eos: bool = False
    done: bool = False

    def add(self, tokens: list[int], logps: list[float], sampled: bool, versions: Sequence[int] = ()) -> None:
        self.tokens += tokens
        self.logps += logps if sampled else [0.0] * len(tokens)
        self.sampled += [1.0 if sampled else 0.0] * len(tokens)
        last = self.versions[-1] if self.versions else 0.0  # tool tokens: the version of the turn before them
        self.versions += list(map(float, versions)) if versions else [last] * len(tokens)


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
    trajs = [Trajectory(list(p)) for p in prompt_ids for _ in range(n)]
    turn = TurnRules(tokenizer, eos_ids, TOOL_CALL_PARSERS[cfg.tool_parser], cfg)
    params = turn_params(params, cfg)
    with ThreadPoolExecutor(max(cfg.tool_workers, 1)) as pool:
        if session is not None:
            _continuous(session, trajs, params, cfg, turn, pool)
        else:
            _turn_synchronous(generate, trajs, params, cfg, turn, pool)
    return trajectories_batch(list(map(list, prompt_ids)), trajs, n, pad_id)


def turn_params(params: SamplingParams, cfg: AgentConfig) -> SamplingParams:
    """The sampling of one turn: one sequence, stopping at the run's and the agent's stop strings."""
    return replace(params, n=1, stop=tuple(dict.fromkeys(tuple(params.stop) + tuple(cfg.stop))))


def trajectories_batch(prompts: list[list[int]], trajs: list[Trajectory], n: int, pad_id: int,
                       versions: bool = False) -> Batch:
    """The generate() Batch of finished trajectories (n per prompt) with ``num_turns``, ``num_tool_calls``,
    ``num_tool_errors``, ``truncated``; ``versions``: and each token's ``rollout_versions``."""
    batch = assemble(prompts, [t.tokens for t in trajs], [t.logps for t in trajs], n, pad_id,
                     sampled=[t.sampled for t in trajs])
    for key, values in (("num_turns", [t.turns for t in trajs]), ("num_tool_calls", [t.num_calls for t in trajs]),
                        ("num_tool_errors", [t.num_errors for t in trajs]),
                        ("truncated", [not t.at_eos for t in trajs])):
        batch[key] = torch.tensor(values, dtype=torch.float32)
    if versions:
        batch["rollout_versions"] = assemble(prompts, [t.tokens for t in trajs], [t.versions for t in trajs], n,
                                             pad_id)["rollout_logprobs"]
    return batch


@dataclass(frozen=True)
class TurnRules:
    """What happens at the end of a model turn and of a tool round, the same in both schedules."""
    tokenizer: object
    eos_ids: Sequence[int]
    parse: Callable
    cfg: AgentConfig

    def room(self, t: Trajectory, params: SamplingParams) -> int:
        return min(params.max_new_tokens, self.cfg.max_response_tokens - len(t.tokens))

    def model_turn(self, t: Trajectory, tokens: list[int], logps: list[float], versions: Sequence[int] = ()) -> None:
        """Append a turn's sampled tokens (within the budget) and parse its tool calls; done when it made none, it
        was the last turn, or the budget is spent."""
        cfg, budget = self.cfg, self.cfg.max_response_tokens - len(t.tokens)
        t.add(tokens[:budget], logps[:budget], sampled=True, versions=versions[:budget])
        t.turns += 1
        t.at_eos = bool(tokens) and tokens[-1] in self.eos_ids and len(tokens) <= budget
        ended = not tokens or t.at_eos or len(tokens) > budget
        t.calls = [] if ended else self.parse(self.tokenizer.decode(tokens, skip_special_tokens=True))
        t.done = not t.calls or t.turns == cfg.max_turns or len(t.tokens) >= cfg.max_response_tokens

    def tool_round(self, t: Trajectory, results: list[ToolResult]) -> None:
        """Append the tools' answers as template tokens, or end the trajectory when no turn would fit after them."""
        t.num_calls += len(results)
        t.num_errors += sum(not r.ok for r in results)
        ids = tool_response_ids(self.tokenizer, [r.text for r in results])
        if len(t.tokens) + len(ids) >= self.cfg.max_response_tokens:  # no room to answer after the tools
            t.done = True
            return
        t.add(ids, [], sampled=False)


def _turn_synchronous(generate, trajs: list[Trajectory], params: SamplingParams, cfg: AgentConfig, turn: TurnRules,
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


def _continuous(session, trajs: list[Trajectory], params: SamplingParams, cfg: AgentConfig, turn: TurnRules,
                pool: ThreadPoolExecutor) -> None:
    """One engine session for the whole rollout (``ContinuousAgents``). Turn k of trajectory i samples from seed
    + 1,000,003 k + 7,919 i."""
    run = session([t.prompt for t in trajs], params, max(len(t.prompt) for t in trajs) + cfg.max_response_tokens)
    agents = ContinuousAgents(lambda i, ids, max_new, seed: run.add(ids, max_new, seed), run, turn, params, pool)
    for i, t in enumerate(trajs):
        agents.add(t, params.seed + 7_919 * i)
    while agents.busy():
        agents.step()


class ContinuousAgents:
    """Trajectories whose turns are sequences of one engine run (a session, or a rollout stream across steps): when
    a turn ends its tool calls go to the pool, and when they have answered its next turn joins the running batch
    -- no trajectory waits for another's turn. ``queue(trajectory, ids, max_new_tokens, seed) -> sequence`` adds a
    trajectory's turn to the run; turn k of a trajectory with seed s samples from s + 1,000,003 k."""

    def __init__(self, queue: Callable[[int, list[int], int, int], int], run, turn: TurnRules, params: SamplingParams,
                 pool: ThreadPoolExecutor):
        self.queue, self.run, self.turn, self.params, self.pool = queue, run, turn, params, pool
        self.trajs: list[Trajectory] = []
        self.seeds: list[int] = []
        self.owner: dict[int, int] = {}               # run sequence -> trajectory
        self.pending: dict[Future, int] = {}          # tool round in the pool -> trajectory

    def add(self, t: Trajectory, seed: int) -> int:
        """A trajectory, its first turn queued; returns its index."""
        self.trajs.append(t)
        self.seeds.append(seed)
        self._start(len(self.trajs) - 1)
        return len(self.trajs) - 1

    def _start(self, i: int) -> None:
        t = self.trajs[i]
        seed = (self.seeds[i] + 1_000_003 * t.turns) % 2**63
        self.owner[self.queue(i, t.prompt + t.tokens, self.turn.room(t, self.params), seed)] = i

    def busy(self) -> bool:
        return bool(self.owner or self.pending)

    def step(self) -> list[int]:
        """One decode step of the run (or, when every live trajectory waits for its tools, a wait for the first to
        answer); the trajectories that ended."""
        ended = []
        if self.owner:
            for seq in self.run.step():
                i = self.owner.pop(seq)
                _, (tokens,), (logps,), (versions,), _ = self.run.pop(seq)  # n = 1: the sequence is its prompt's
                self.turn.model_turn(self.trajs[i], tokens, logps, versions)
                if self.trajs[i].done:
                    ended.append(i)
                else:
                    self.pending[self.pool.submit(self._tools, self.trajs[i])] = i
        else:
            wait(list(self.pending), return_when=FIRST_COMPLETED)
        for future in [f for f in self.pending if f.done()]:
            ended += self._answered(future)
        return ended

    def drain(self) -> list[int]:
        """Wait for every tool round in the pool and apply it (a checkpoint holds no running calls); the
        trajectories that ended."""
        ended = []
        for future in list(self.pending):
            future.result()
            ended += self._answered(future)
        return ended

    def abort(self, trajs: set[int]) -> None:
        """Drop these trajectories: their turn in the run, or their tool round's answer when it comes."""
        seqs = {seq for seq, i in self.owner.items() if i in trajs}
        self.run.abort(seqs)
        for seq in seqs:
            del self.owner[seq]
        self.pending = {f: i for f, i in self.pending.items() if i not in trajs}

    def _tools(self, t: Trajectory) -> list[ToolResult]:
        return [run_tool(c, self.turn.cfg) for c in t.calls]

    def _answered(self, future: Future) -> list[int]:
        i = self.pending.pop(future)
        self.turn.tool_round(self.trajs[i], future.result())
        if self.trajs[i].done:
            return [i]
        self._start(i)
        return []
