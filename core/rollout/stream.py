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
from typing import Any, Sequence

import torch

from core.config import AgentConfig, SamplingParams
from core.protocol import Batch
from core.rollout.agent_loop import ContinuousAgents, Trajectory, TurnRules, trajectories_batch, turn_params
from core.rollout.batch import assemble, merge_padded
from core.rollout.run import Run
from core.tools.parsers import TOOL_CALL_PARSERS


class StreamState:
    """The embedded engine's run across calls, and which group (the driver's key) each of its prompts belongs to."""

    def __init__(self, engine, params: SamplingParams, max_prompt_length: int, agent: AgentConfig | None = None,
                 eos_ids: Sequence[int] = ()):
        self.engine, self.params, self.agent = engine, params, agent
        width = agent.max_response_tokens if agent is not None else params.max_new_tokens
        self.max_len, self.widths = max_prompt_length + width, (max_prompt_length, width)
        self.run: Run = engine.stream(turn_params(params, agent) if agent is not None else params, self.max_len)
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
            self.traj_group: dict[int, Any] = {}

    @property
    def version(self) -> int:
        return self.run.version

    def add(self, ids: list[list[int]], seeds: list[int], keys: list) -> None:
        """Queue prompt groups (one cohort: their shared prefix is prefilled once; an agent's turns: one each)."""
        n = self.params.n
        for key in keys:
            self.left[key], self.members[key] = n, []
        if self.agents is not None:
            for k, (prompt, key) in enumerate(zip(ids, keys)):
                for seed in seeds[k * n:(k + 1) * n]:
                    i = len(self.agents.trajs)
                    self.traj_group[i] = key
                    self.members[key].append(i)
                    self.agents.add(Trajectory(list(prompt)), seed)
            return
        for i, key in zip(self.run.add_prompts(ids, seeds, self.params.max_new_tokens), keys):
            self.group[i] = key
            self.members[key].append(i)

    def _queue_turn(self, traj: int, ids: list[int], max_new_tokens: int, seed: int) -> int:
        i = self.run.add_prompts([ids], [seed], max_new_tokens)[0]
        self.group[i] = self.traj_group[traj]
        return i

    def advance(self, steps: int) -> tuple[Batch | None, dict]:
        """Up to ``steps`` decode steps (fewer when nothing is queued or in flight). Returns the groups that
        finished, as one padded batch with a ``stream_key`` column and ``rollout_versions`` (B, Tr) -- or None --
        and the first version of each group that started in these steps (the driver's staleness bound)."""
        run = self.run
        if self.engine.cache is None or self.engine.cache.max_len < self.max_len:
            self.engine.wake(self.max_len)
            self.stale_kv = True
        if self.stale_kv:
            run.reprefill()
            self.stale_kv = False
        started, done, self.ready = {}, self.ready, []
        for _ in range(steps):
            if not (run.queue or run.live or (self.agents is not None and self.agents.busy())):
                break
            queued = set(run.queue)
            if self.agents is not None:
                ended = [self.traj_group[i] for i in self.agents.step()]
            else:
                ended = [self.group[seq // self.params.n] for seq in run.step()]
            for key in ended:
                self.left[key] -= 1
                if self.left[key] == 0:
                    done.append(key)
            for i in queued - set(run.queue):  # admitted in this step: its first token is this version's
                key = self.group.pop(i) if self.agents is not None else self.group[i]
                if key not in self.started:
                    self.started.add(key)
                    started[key] = run.version
        return self._finished(done), started

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
        with the new weights before the next step."""
        self.run.version += 1
        self.stale_kv = True

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
            for i in self.agents.drain():  # a trajectory that ended on its tools' answer
                key = self.traj_group[i]
                self.left[key] -= 1
                if self.left[key] == 0:
                    self.ready.append(key)
        state = {"params": self.params, "widths": self.widths, "agent": self.agent, "group": self.group,
                 "members": self.members, "left": self.left, "started": self.started, "ready": self.ready}
        if self.agents is not None:
            a = self.agents
            state["agents"] = {"trajs": a.trajs, "seeds": a.seeds, "owner": a.owner, "traj_group": self.traj_group}
        state["run"] = self.run.state_dict()
        return state

    @staticmethod
    def from_state(engine, state: dict, eos_ids: Sequence[int] = ()) -> "StreamState":
        """The stream ``state_dict`` saved, on ``engine`` with the weights it holds now: the in-flight sequences'
        KV is recomputed from their tokens before the next step, as after a weight sync."""
        out = StreamState(engine, state["params"], state["widths"][0], state["agent"], eos_ids)
        out.run.load_state_dict(state["run"])
        for key in ("group", "members", "left", "started", "ready"):
            setattr(out, key, state[key])
        if "agents" in state:
            a = state["agents"]
            out.agents.trajs, out.agents.seeds, out.agents.owner, out.traj_group = (a["trajs"], a["seeds"], a["owner"],
                                                                                    a["traj_group"])
        out.stale_kv = True
        return out


def versions_tensor(batch: Batch) -> torch.Tensor:
    """Each sample's first (oldest) token version (B,); its response mask picks the model's tokens."""
    v = batch["rollout_versions"].masked_fill(batch["response_mask"] == 0, float("inf"))
    return v.amin(-1)
