"""SGLang as the rollout engine (``rollout.backend=sglang``): ``pip install -e '.[sglang]'`` on CUDA machines.

NOT RUN BY US. sglang 0.5.x needs torch 2.14 and its CUDA kernels; this project's environment pins torch 2.13
(constraints.txt, CPU). Every call below was checked against the ``sglang.Engine`` source
of 0.5.23 (the newest release, python/sglang/srt/entrypoints/engine.py) and 0.5.6 (verl's pin); the tests
(tests/rollout/test_sglang_rollout.py) drive this adapter against a stand-in whose methods carry those signatures
verbatim: they prove the translation, the bucketing and the call sequence, not SGLang itself.

Layout: one Engine per rollout replica, started by the replica's first rank (``rank % tensor_parallel_size == 0``)
on GPUs ``local_rank .. local_rank + tp - 1`` (``base_gpu_id``); SGLang runs its TP workers in processes of its
own. The other ranks of the replica hold no engine: they receive the first rank's outputs (a broadcast over the
replica's group), so every rank returns the same Batch, as with vLLM's ``external_launcher``.

The RL hooks, in verl's order (verl/workers/rollout/sglang_rollout) plus 0.5.21's weight-update session:
- after a rollout, ``sleep``: ``release_memory_occupation(tags=["kv_cache", "weights"])`` (needs
  ``enable_memory_saver=True``, set here);
- a weight sync: ``resume_memory_occupation(tags=["weights"])``, ``begin_weight_update()`` (0.5.21+: updates
  outside a session fail), one ``update_weights_from_tensor(bucket, flush_cache=False)`` per bucket (full tensors
  in HF names; SGLang serialises them for each of its TP ranks, which cut their own slices), then
  ``end_weight_update()`` and ``flush_cache()`` (the radix cache holds the old weights' keys/values);
- ``generate`` resumes the KV cache first.
Every call's ``(success, message)`` is checked; a failure raises naming the call and SGLang's message.

Generation from token ids, one request per sample (``n`` = 1 each: SGLang's order of n > 1 outputs is not
documented), sample j of prompt i seeded ``request_seeds(seed, prompts, n)[i] + j`` through ``sampling_seed``,
which SGLang honours only with ``enable_deterministic_inference`` (set here; it costs some throughput). The
returned log-probs are those of the distribution sampled from (after temperature: SGLang's default, unless the
environment sets ``SGLANG_RETURN_ORIGINAL_LOGPROB``, which the adapter refuses).
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch

from core.config import SamplingParams
from core.rollout.engine import replica_seed
from core.rollout.batch import assemble, decode_responses
from core.rollout.vllm_engine import request_seeds
from core.models import chat_prompt_ids, resolve_dtype, resolve_model
from core.protocol import Batch

# SGLang's memory tags (python/sglang/srt/constants.py: GPU_MEMORY_TYPE_KV_CACHE, GPU_MEMORY_TYPE_WEIGHTS)
KV_CACHE, WEIGHTS = "kv_cache", "weights"


class SGLangError(RuntimeError):
    pass


def engine_kwargs(model_path: str, cfg, max_model_len: int | None, seed: int, local_rank: int) -> dict:
    """``sglang.Engine(**kwargs)`` (its ``ServerArgs`` fields) for a rollout config (``core.config.RolloutConfig``)."""
    kw = {"model_path": model_path, "dtype": str(resolve_dtype(cfg.dtype, "cuda")).removeprefix("torch."),
          "tp_size": cfg.tensor_parallel_size, "base_gpu_id": local_rank,
          "mem_fraction_static": cfg.gpu_memory_utilization, "random_seed": seed,
          "enable_memory_saver": True,              # release / resume_memory_occupation do nothing without it
          "enable_weights_cpu_backup": True,        # released weights come back with their values (a generate
                                                    # may follow a sleep without a sync: validation)
          "enable_deterministic_inference": True,   # per-request sampling_seed is ignored without it
          "max_running_requests": cfg.max_batch_size}
    if max_model_len:
        kw["context_length"] = max_model_len
    return kw


def sampling_params(params: SamplingParams, seed: int) -> dict:
    """One sample's SGLang sampling parameters (``SamplingParams`` fields): n 1, temperature (0 = greedy), top-p,
    top-k (-1 = off), the length limit, stop strings kept in the output (``no_stop_trim``, as the embedded engine
    keeps them), ignore_eos, and its seed."""
    return {"n": 1, "temperature": max(params.temperature, 0.0), "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "max_new_tokens": params.max_new_tokens,
            "stop": list(params.stop) or None, "no_stop_trim": bool(params.stop), "ignore_eos": params.ignore_eos,
            "sampling_seed": seed}


def requests(prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> tuple[list[list[int]], list[dict]]:
    """The generate call's ``input_ids`` and ``sampling_params``: each prompt n times in a row, one seed each."""
    ids, sp = [], []
    for prompt, seed in zip(prompt_ids, request_seeds(params.seed, len(prompt_ids), params.n)):
        for j in range(params.n):
            ids.append(list(prompt))
            sp.append(sampling_params(params, seed + j))
    return ids, sp


def completion_rows(outputs: list[dict]) -> tuple[list[list[int]], list[list[float]]]:
    """Each output's token ids and their log-probs. An output is ``{"output_ids": [...], "meta_info": {
    "output_token_logprobs": [(logprob, token_id, text_or_None), ...], "finish_reason": {...}, ...}}``."""
    tokens, logps = [], []
    for i, out in enumerate(outputs):
        ids, meta = list(out["output_ids"]), out["meta_info"]
        reason = meta.get("finish_reason") or {}
        if reason.get("type") == "abort":
            raise SGLangError(f"SGLang aborted request {i}: {reason.get('message', reason)}")
        entries = meta.get("output_token_logprobs")
        if entries is None or len(entries) != len(ids):
            raise SGLangError(f"SGLang output {i}: {len(ids)} tokens but "
                              f"{'no' if entries is None else len(entries)} log-prob entries")
        if [int(e[1]) for e in entries] != ids:
            raise SGLangError(f"SGLang output {i}: log-prob entries name other tokens than output_ids")
        tokens.append(ids)
        logps.append([float(e[0]) for e in entries])
    return tokens, logps


def checked(call: str, result) -> None:
    """SGLang reports failures as values: ``(success, message[, ...])`` or an object with ``.success``."""
    if result is None:
        return
    ok, message = (result[0], result[1]) if isinstance(result, tuple) else (getattr(result, "success", True),
                                                                             getattr(result, "message", ""))
    if not ok:
        raise SGLangError(f"sglang Engine.{call} failed: {message}")


class SGLangEngine:
    """The rollout engine interface (``generate``, ``update_weights``, ``finish_update``, ``sleep``, ``decode``,
    ...) over ``sglang.Engine``. ``engine_cls``: the Engine class (tests pass a stand-in with its signatures)."""

    def __init__(self, cfg, rank: int, device: torch.device, tokenizer, max_model_len: int | None,
                 local_rank: int = 0, engine_cls=None):
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB"):
            raise ValueError("SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would return log-probs before "
                             "temperature, not those of the distribution it samples from; unset it")
        if engine_cls is None:
            if device.type != "cuda":
                raise ValueError("rollout.backend=sglang needs CUDA GPUs (SGLang has no CPU path); use embedded or "
                                 "vllm on a CPU pool")
            try:
                from sglang import Engine as engine_cls
            except ImportError as e:
                raise ImportError("rollout.backend=sglang needs SGLang: pip install -e '.[sglang]'") from e
        tp = cfg.tensor_parallel_size
        self.cfg, self.device, self.tokenizer, self.tp = cfg, device, tokenizer, tp
        self.leader = rank % tp == 0
        # the replica's ranks, for the leader's outputs (created on every rank: new_group is collective)
        self.group = self._replica_group(rank, tp) if tp > 1 else None
        self.llm = engine_cls(**engine_kwargs(resolve_model(cfg.model), cfg, max_model_len,
                                              replica_seed(rank, tp), local_rank)) if self.leader else None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.dtype = getattr(torch, str(resolve_dtype(cfg.dtype, "cuda")).removeprefix("torch."))
        self._asleep: set[str] = set()
        self._updating = False

    @staticmethod
    def _replica_group(rank: int, tp: int):
        import torch.distributed as dist

        mine = None
        for first in range(0, dist.get_world_size(), tp):
            group = dist.new_group(list(range(first, first + tp)))
            if first <= rank < first + tp:
                mine = group
        return mine

    def shutdown(self) -> None:
        """End the engine. SGLang's ``shutdown`` kills every child process of the caller (its own and any other)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown()

    # ------------------------------------------------------------------------------------- memory
    def sleep(self) -> int:
        """Weights and KV cache released (SGLang's memory saver); returns 0 (SGLang does not report bytes)."""
        if self.leader and not self._asleep:
            self.llm.release_memory_occupation(tags=[KV_CACHE, WEIGHTS])
            self._asleep = {KV_CACHE, WEIGHTS}
        return 0

    def _wake(self, tag: str) -> None:
        if tag in self._asleep:
            self.llm.resume_memory_occupation(tags=[tag])
            self._asleep.discard(tag)

    # ------------------------------------------------------------------------------------- weights
    def weight_names(self) -> None:
        """None: SGLang's model ``load_weights`` maps the actor's HF names (fusing q/k/v and gate/up)."""
        return None

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """One bucket of full tensors in HF names, cast to the engine's dtype on this rank's GPU (SGLang hands them
        to its TP workers by CUDA IPC); the first bucket of a sync resumes the weights and opens the session.
        Returns the bytes received."""
        device = self.device if self.device.type == "cuda" else "cpu"
        bucket = [(n, t.detach().to(device, self.dtype).contiguous()) for n, t in named_tensors]
        if self.leader and bucket:
            if not self._updating:
                self._wake(WEIGHTS)
                if hasattr(self.llm, "begin_weight_update"):   # 0.5.21+: updates outside a session fail
                    checked("begin_weight_update", self.llm.begin_weight_update())
                self._updating = True
            checked("update_weights_from_tensor",
                    self.llm.update_weights_from_tensor(bucket, load_format=None, flush_cache=False))
        return sum(t.numel() * t.element_size() for _, t in bucket)

    def finish_update(self) -> None:
        """The end of a sync: close the session and flush the radix cache (its entries hold the old weights')."""
        if self.leader and self._updating:
            if hasattr(self.llm, "end_weight_update"):
                checked("end_weight_update", self.llm.end_weight_update())
            checked("flush_cache", self.llm.flush_cache())
            self._updating = False

    def verify_weights(self, named_tensors) -> None:
        raise ValueError("rollout.debug_sync compares tensors by name, which SGLang's fused, TP-sliced parameters "
                         "do not have: run it with rollout.backend=embedded")

    # ------------------------------------------------------------------------------------- generation
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Batch:
        """n samples of every prompt, in the embedded engine's Batch layout (``rollout_batch.assemble``)."""
        prompts = [list(p) for p in prompt_ids]
        rows = None
        if self.leader:
            self.finish_update()
            self._wake(WEIGHTS)
            self._wake(KV_CACHE)
            ids, sp = requests(prompts, params)
            outputs = self.llm.generate(input_ids=ids, sampling_params=sp, return_logprob=True)
            rows = completion_rows(outputs if isinstance(outputs, list) else [outputs])
        if self.group is not None:
            import torch.distributed as dist

            box = [rows]
            dist.broadcast_object_list(box, src=dist.get_process_group_ranks(self.group)[0], group=self.group)
            rows = box[0]
        return assemble(prompts, rows[0], rows[1], params.n, self.pad_id)

    def decode(self, batch: Batch) -> list[str]:
        return decode_responses(self.tokenizer, batch)

    def chat_prompt_ids(self, prompts: Sequence[list[dict]]) -> list[list[int]]:
        return chat_prompt_ids(self.tokenizer, prompts)
