"""A rollout rank's side of streaming generation (``trainer.async.mode: streaming``; the driver's side:
``core.streaming``): one engine run that lives across steps and weight updates. The driver adds prompt groups
(each with a key), advances it a few decode steps at a time and takes the groups that finished; a weight sync
between two calls raises ``version`` and recomputes the in-flight sequences' KV with the new weights
(``Run.reprefill``), so their next tokens come from the new policy alone -- a partial rollout. Every token records
the version that drew it (``rollout_versions``), and draws the uniform of its own (seed, index)
(``core.rollout.sampling.token_uniforms``): a sample is the same whichever calls, batches or updates it ran through.

With an agent (``rollout.agent``) a group is n trajectories: each turn is a sequence of the run, the tools answer in
a thread pool between turns (``core.rollout.agent_loop.ContinuousAgents``), and the group is handed out when all n
have ended.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Sequence

import torch

from core.config import AgentConfig, SamplingParams
from core.protocol import Batch
from core.rollout.agent_loop import ContinuousAgents, Trajectory, TurnRules, trajectories_batch, turn_params
from core.rollout.batch import assemble, merge_padded
from core.rollout.run import STOP_WINDOW, Run, ends_in_stop
from core.rollout.sampling import sequence_seeds
from core.tools.parsers import TOOL_CALL_PARSERS


class StreamState:
    """The embedded engine's run across calls, and which group (the driver's key) each of its prompts belongs to."""

    def __init__(self, engine, params: SamplingParams, max_prompt_length: int, agent: AgentConfig | None = None,
                 eos_ids: Sequence[int] = (), recompute_kv: bool = True):
        self.engine, self.params, self.agent, self.recompute_kv = engine, params, agent, recompute_kv
        width = agent.max_response_tokens if agent is not None else params.max_new_tokens
        self.max_len, self.widths = max_prompt_length + width, (max_prompt_length, width)
        if hasattr(engine, "stream"):
            self.run: Run | ChunkedRun = engine.stream(turn_params(params, agent) if agent is not None else params,
                                                       self.max_len)
        elif agent is None:
            self.run = ChunkedRun(engine, params)
        else:
            raise ValueError("an agent's rollout streams on the embedded engine only (its turns are sequences of "
                             "one engine run); use trainer.async.mode=one_step_off with this backend")
        self.group: dict[int, Any] = {}          # run prompt index (an agent's turn) -> group key
        self.members: dict[Any, list[int]] = {}  # group key -> its run prompts (agent: its trajectories)
        self.left: dict[Any, int] = {}           # group key -> its samples not yet finished
        self.started: set = set()                # groups whose first token has been drawn
        self.ready: list = []                    # groups that ended outside a step (a checkpoint's tool answers)
        self.stale_kv = False                    # the KV cache was freed or used by another call since the last step
        self.agents: ContinuousAgents | None = None
        if agent is not None:
            rules = TurnRules(engine.tokenizer, list(eos_ids), TOOL_CALL_PARSERS[agent.tool_parser], agent)
            self.pool = ThreadPoolExecutor(max(agent.tool_workers, 1))
            self.agents = ContinuousAgents(self._queue_turn, self.run, rules, self.run.p, self.pool)
            self.traj_group: dict[int, Any] = {}     # trajectory -> its group's key
            self.traj_cohort: dict[int, int] = {}    # trajectory -> the run's cohort its turns extend

    @property
    def version(self) -> int:
        return self.run.version

    def add(self, ids: list[list[int]], seeds: list[int], keys: list) -> None:
        """Queue prompt groups (one cohort: their shared prefix is prefilled once; an agent's turns: one each)."""
        n = self.params.n
        for key in keys:
            self.left[key], self.members[key] = n, []
        if self.agents is not None:  # every turn extends its prompt: the call's shared prefix is prefilled once
            cohort = self.run.add_cohort([list(p) for p in ids])
            for k, (prompt, key) in enumerate(zip(ids, keys)):
                for seed in seeds[k * n:(k + 1) * n]:
                    i = len(self.agents.trajs)
                    self.traj_group[i], self.traj_cohort[i] = key, cohort
                    self.members[key].append(i)
                    self.agents.add(Trajectory(list(prompt)), seed)
            return
        for i, key in zip(self.run.add_prompts(ids, seeds, self.params.max_new_tokens), keys):
            self.group[i] = key
            self.members[key].append(i)

    def _queue_turn(self, traj: int, ids: list[int], max_new_tokens: int, seed: int) -> int:
        i = self.run.add(ids, max_new_tokens, seed, self.traj_cohort[traj])
        self.group[i] = self.traj_group[traj]
        return i

    def advance(self, steps: int) -> tuple[Batch | None, dict]:
        """Up to ``steps`` decode steps (fewer when nothing is queued or in flight). Returns the groups that
        finished, as one padded batch with a ``stream_key`` column and ``rollout_versions`` (B, Tr) -- or None --
        and the first version of each group that started in these steps (the driver's staleness bound)."""
        run = self.run
        started, done, self.ready = {}, self.ready, []
        if isinstance(run, ChunkedRun):  # one engine call of ``steps`` tokens for every sequence in flight
            self._admitted([self.group[i] for i in run.queue], started)
            self._ended([self.group[seq // self.params.n] for seq in run.step(steps)], done)
            return self._finished(done), started
        if self.engine.cache is None or self.engine.cache.max_len < self.max_len:
            self.engine.wake(self.max_len)
            self.stale_kv = True
        if self.stale_kv:
            run.reprefill()
            self.stale_kv = False
        for _ in range(steps):
            if not (run.queue or run.live or (self.agents is not None and self.agents.busy())):
                break
            queued = set(run.queue)
            if self.agents is not None:
                self._ended([self.traj_group[i] for i in self.agents.step()], done)
            else:
                self._ended([self.group[seq // self.params.n] for seq in run.step()], done)
            # admitted in this step: its first token is this version's (an agent's turn is forgotten once admitted)
            admitted = queued - set(run.queue)
            self._admitted([self.group.pop(i) if self.agents is not None else self.group[i] for i in admitted],
                           started)
        return self._finished(done), started

    def _ended(self, keys: list, done: list) -> None:
        """One sample of each of these groups finished; a group whose samples all have goes into ``done``."""
        for key in keys:
            self.left[key] -= 1
            if self.left[key] == 0:
                done.append(key)

    def _admitted(self, keys: list, started: dict) -> None:
        """These groups drew tokens now: the first time a group does, its version goes into ``started``."""
        for key in keys:
            if key not in self.started:
                self.started.add(key)
                started[key] = self.run.version

    def _finished(self, done: list) -> Batch | None:
        if not done:
            return None
        n = self.params.n
        if self.agents is not None:
            parts = []
            for key in done:
                trajs = [self.agents.trajs[i] for i in self.members[key]]
                part = trajectories_batch([trajs[0].prompt], trajs, n, self.engine.pad_id, versions=True)
                part["rollout_seeds"] = torch.tensor([self.agents.seeds[i] for i in self.members[key]])
                parts.append(part)
            out = merge_padded(parts, self.engine.pad_id, *self.widths)
        else:
            prompts, tokens, logps, versions, seeds = zip(*(self.run.pop(self.members[key][0]) for key in done))
            tokens, logps, versions = (sum(x, []) for x in (tokens, logps, versions))
            out = assemble(list(prompts), tokens, logps, n, self.engine.pad_id)
            out["rollout_versions"] = assemble(list(prompts), tokens, [list(map(float, v)) for v in versions],
                                               n, self.engine.pad_id)["rollout_logprobs"]
            out["rollout_seeds"] = torch.tensor(sum(seeds, []), dtype=torch.long)
            out = merge_padded([out], self.engine.pad_id, *self.widths)
        out["stream_key"] = [key for key in done for _ in range(n)]
        for key in done:
            self._forget(key)
        return out

    def _forget(self, key) -> None:
        members = self.members.pop(key)
        del self.left[key]
        self.started.discard(key)
        for i in members:
            if self.agents is not None:
                self.agents.trajs[i] = None  # its tokens were handed out
            else:
                self.group.pop(i, None)

    def reweighted(self) -> None:
        """After a weight sync: the next tokens are the next version's; the in-flight sequences' KV is recomputed
        with the new weights before the next step (unless ``recompute_kv`` is off: the old KV stays)."""
        self.run.version += 1
        self.stale_kv = self.stale_kv or self.recompute_kv

    def abort(self, keys: set) -> None:
        """Drop these groups, queued or in flight (over the staleness bound: they would never be trained on)."""
        for key in keys & set(self.members):
            if self.agents is not None:
                self.agents.abort(set(self.members[key]))
            else:
                self.run.abort(set(self.members[key]))
                self.run.pop(self.members[key][0])
            self._forget(key)

    # ------------------------------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """For a checkpoint: the sampling, the run's sequences (``Run.state_dict``), the groups -- and an agent's
        trajectories, once every tool round in flight has answered (its answer is applied now, as it would be at
        the next step)."""
        if self.agents is not None:
            self._ended([self.traj_group[i] for i in self.agents.drain()], self.ready)  # ended on its tools' answer
        state = {"params": self.params, "widths": self.widths, "agent": self.agent, "recompute_kv": self.recompute_kv,
                 "group": self.group,
                 "members": self.members, "left": self.left, "started": self.started, "ready": self.ready}
        if self.agents is not None:
            a = self.agents
            state["agents"] = {"trajs": a.trajs, "seeds": a.seeds, "owner": a.owner, "traj_group": self.traj_group,
                               "traj_cohort": self.traj_cohort}
        state["run"] = self.run.state_dict()
        return state

    @staticmethod
    def from_state(engine, state: dict, eos_ids: Sequence[int] = ()) -> "StreamState":
        """The stream ``state_dict`` saved, on ``engine`` with the weights it holds now: the in-flight sequences'
        KV is recomputed from their tokens before the next step, as after a weight sync."""
        out = StreamState(engine, state["params"], state["widths"][0], state["agent"], eos_ids, state["recompute_kv"])
        out.run.load_state_dict(state["run"])
        for key in ("group", "members", "left", "started", "ready"):
            setattr(out, key, state[key])
        if "agents" in state:
            a = state["agents"]
            out.agents.trajs, out.agents.seeds, out.agents.owner = a["trajs"], a["seeds"], a["owner"]
            out.traj_group, out.traj_cohort = a["traj_group"], a["traj_cohort"]
        out.stale_kv = True
        return out


class ChunkedRun:
    """A stream's run on an engine that takes weights only between ``generate`` calls (vLLM's offline engine):
    every call generates up to k more tokens of every sequence in flight, its prompt being the sequence so far
    (abort and re-queue at chunk boundaries). A weight update lands between two calls; the next chunk's prefill is
    computed with the new weights (vLLM resets its prefix cache on every update, so within a version the re-queued
    prefix is a cache hit, not a recompute). Chunk c of a sequence samples with its own seed, (seed, c) hashed: a
    sequence draws the same tokens whichever others share its calls. The same attributes as ``Run`` where a
    stream reads them."""

    def __init__(self, engine, params: SamplingParams):
        self.e, self.p = engine, params
        self.prompts: list[list[int]] = []
        self.seeds: list[int] = []
        self.tokens: list[list[int]] = []
        self.logps: list[list[float]] = []
        self.versions: list[list[int]] = []
        self.max_new: list[int] = []
        self.chunks: list[int] = []
        self.queue: list[int] = []           # prompts not yet started
        self.live_seqs: list[int] = []       # sequences in flight
        self.version = 0
        self.stops: dict[int, tuple[str, ...]] = {}  # sequence -> its own stop strings (a server's, ``add``)
        self.eos = set() if params.ignore_eos else set(getattr(engine, "eos_ids", None)
                                                       or [engine.tokenizer.eos_token_id])

    @property
    def live(self) -> int:
        return len(self.live_seqs)

    def add_prompts(self, prompts: list[list[int]], seeds: list[int], max_new_tokens: int) -> list[int]:
        first = len(self.prompts)
        for k, ids in enumerate(prompts):
            self.prompts.append(list(ids))
            self.queue.append(first + k)
            for seed in seeds[k * self.p.n:(k + 1) * self.p.n]:
                for column, value in ((self.seeds, seed), (self.tokens, []), (self.logps, []), (self.versions, []),
                                      (self.max_new, max_new_tokens), (self.chunks, 0)):
                    column.append(value)
        return list(range(first, len(self.prompts)))

    def add(self, ids: list[int], max_new_tokens: int, seed: int, cohort: int = 0,
            stop: Sequence[str] | None = None) -> int:
        """``Run.add`` here (a rollout server's request): one sequence (n = 1) with its own seed and, given, its own
        stop strings instead of the run's; its index. ``cohort`` is not used: vLLM caches shared prefixes itself."""
        if self.p.n != 1:
            raise ValueError(f"a session samples each added prompt once (n = 1), got n = {self.p.n}")
        (i,) = self.add_prompts([ids], [seed], max_new_tokens)
        if stop is not None:
            self.stops[i] = tuple(stop)
        return i

    def step(self, k: int) -> list[int]:
        """Up to ``k`` tokens of every queued and live sequence, one engine call per set of stop strings; the
        sequences that finished."""
        n = self.p.n
        self.live_seqs += [i * n + j for i in self.queue for j in range(n)]
        self.queue = []
        by_stop: dict[tuple[str, ...], list[int]] = {}
        for s in self.live_seqs:
            by_stop.setdefault(tuple(self.stops.get(s, self.p.stop)), []).append(s)
        finished = [s for stop, seqs in by_stop.items() for s in self._chunk(seqs, k, stop)]
        done = set(finished)
        self.live_seqs = [s for s in self.live_seqs if s not in done]
        return finished

    def _chunk(self, seqs: list[int], k: int, stop: tuple[str, ...]) -> list[int]:
        n = self.p.n
        ids = [self.prompts[s // n] + self.tokens[s] for s in seqs]
        seeds = [sequence_seeds(self.seeds[s], 1, self.chunks[s])[0] for s in seqs]
        out = self.e.generate(ids, replace(self.p, n=1, max_new_tokens=k, stop=stop), seeds=seeds)
        keep = out["response_mask"] > 0
        finished = []
        for s, row, lp, m in zip(seqs, out["responses"], out["rollout_logprobs"], keep):
            before = len(self.tokens[s])
            got = row[m].tolist()[:self.max_new[s] - before]
            cut = self._stop_across(self.tokens[s] + got, before, stop) if stop and before else None
            got = got[:None if cut is None else cut - before]
            self.tokens[s] += got
            self.logps[s] += lp[m].tolist()[:len(got)]
            self.versions[s] += [self.version] * len(got)
            self.chunks[s] += 1
            # fewer than k: the engine stopped it (EOS, a stop string inside the chunk), or one across two chunks
            ended = cut is not None or len(got) < k or got[-1] in self.eos or len(self.tokens[s]) >= self.max_new[s]
            if ended:
                finished.append(s)
        return finished

    def _stop_across(self, tokens: list[int], start: int, stop: tuple[str, ...]) -> int | None:
        """The length at which a stop string begun in an earlier chunk ends within this one (the engine saw only the
        chunk), or None: the embedded engine's rule (``ends_in_stop``) tried at each of this chunk's first tokens."""
        for j in range(start + 1, min(len(tokens), start + STOP_WINDOW) + 1):
            if ends_in_stop(self.e.tokenizer, tokens[:j], stop):
                return j
        return None

    def reprefill(self) -> None:
        """Nothing to recompute: every chunk prefills its sequences again."""

    def abort(self, prompts: set[int]) -> None:
        self.queue = [i for i in self.queue if i not in prompts]
        self.live_seqs = [s for s in self.live_seqs if s // self.p.n not in prompts]

    pop = Run.pop  # the same columns as a Run's: a finished group's prompt, tokens, log-probs, versions, seeds

    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("prompts", "seeds", "tokens", "logps", "versions", "max_new", "chunks",
                                              "queue", "live_seqs", "version")}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def versions_tensor(batch: Batch) -> torch.Tensor:
    """Each sample's first (oldest) token version (B,); its response mask picks the model's tokens."""
    v = batch["rollout_versions"].masked_fill(batch["response_mask"] == 0, float("inf"))
    return v.amin(-1)
