"""vLLM as the rollout engine (``rollout.backend=vllm``; ``pip install -e '.[vllm]'``, CUDA).

One vLLM engine per rank, in the rank's own process beside the actor (colocated): vLLM's ``external_launcher``
executor joins the torch.distributed world the worker group already started, and every ``tensor_parallel_size``
consecutive ranks form one replica (vLLM builds its TP groups from consecutive ranks; the worker group gives the
rollout role ``mp_size = tensor_parallel_size``, so the ranks of a replica get the same prompts and the controller
keeps the output of the first). The ranks of a replica must sample alike: their engines share a seed
(``replica_seed``), one per replica, so replicas draw different samples.

The engine's memory follows the colocated phases: ``sleep()`` after a rollout offloads its weights to host memory
and frees its KV cache (vLLM sleep level 1: the next generate may come without a weight sync in between, e.g.
validation, so the weights must survive); a weight sync wakes the weights alone and loads the actor's full
tensors bucket by bucket through the model's own ``load_weights`` (which fuses q/k/v and gate/up and cuts each TP
rank's slice); ``generate`` wakes the KV cache.

Log-probs: vLLM returns the sampled tokens' log-probs (``logprobs=0``); where the engine has ``logprobs_mode`` it
is asked for ``processed_logprobs`` (after temperature, as ours are; top-k / top-p filtering would renormalise
them, which training runs leave off). The trainer recomputes ``old_logprobs`` either way; these feed only the
rollout/trainer mismatch metric and truncated importance sampling.

API used (vLLM's documented offline API): ``LLM(...)``, ``LLM.generate`` on ``{"prompt_token_ids": ...}`` prompts,
``LLM.sleep`` / ``LLM.wake_up(tags=...)``, and the model object at
``llm.llm_engine.model_executor.driver_worker.worker.model_runner.model`` (the access path vLLM's torchrun example
documents) for ``load_weights``. Not run in this repository's CI or on its lent GPU, which have no vLLM: the
argument and output translation below is what the tests check.
"""

from __future__ import annotations

import inspect
import os
from typing import Iterable, Sequence

import torch

from core.config import SamplingParams
from core.engines.rollout import replica_seed
from core.engines.rollout_batch import assemble, chat_prompt_ids, decode_responses
from core.protocol import Batch


def engine_kwargs(model_path: str, cfg, max_model_len: int | None, seed: int, supported: set[str] | None = None) -> dict:
    """``vllm.LLM`` arguments for a rollout config (``core.roles.RolloutConfig``); ``supported``: the names this
    vLLM's ``LLM``/``EngineArgs`` accept (None = all), so a version without ``logprobs_mode`` simply goes without."""
    kw = {"model": model_path, "tokenizer": model_path, "dtype": "bfloat16" if cfg.dtype == "auto" else cfg.dtype,
          "tensor_parallel_size": cfg.tensor_parallel_size, "distributed_executor_backend": "external_launcher",
          "gpu_memory_utilization": cfg.gpu_memory_utilization, "enable_sleep_mode": True,
          "max_num_seqs": cfg.max_batch_size, "seed": seed, "enable_prefix_caching": True,
          # the actor's process owns the NCCL communicators; vLLM's custom all-reduce would allocate IPC buffers
          # that do not survive sleep
          "disable_custom_all_reduce": True, "logprobs_mode": "processed_logprobs"}
    if max_model_len:
        kw["max_model_len"] = max_model_len
    if supported is not None:
        kw = {k: v for k, v in kw.items() if k in supported or k == "model"}
    return kw


def sampling_kwargs(params: SamplingParams) -> dict:
    """``vllm.SamplingParams`` arguments for ours: the same n, temperature (0 = greedy), top-p, top-k (-1 = off),
    length limit, stop strings and ignore_eos; one log-prob per token (the sampled one's); token ids, and text
    only where stop strings need it (responses are decoded by our tokenizer, as the embedded engine's are)."""
    return {"n": params.n, "temperature": max(params.temperature, 0.0), "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "max_tokens": params.max_new_tokens,
            "stop": list(params.stop) or None, "ignore_eos": params.ignore_eos, "logprobs": 0,
            "detokenize": bool(params.stop)}


def completion_rows(outputs) -> tuple[list[list[int]], list[list[float]]]:
    """Each completion's token ids and its tokens' log-probs, prompt by prompt and sample by sample (vLLM keeps a
    prompt's n completions together, as ``assemble`` expects). A completion's ``logprobs`` is a list with one
    {token id: Logprob} mapping per position."""
    tokens, logps = [], []
    for i, request in enumerate(outputs):
        for j, seq in enumerate(request.outputs):
            ids = list(seq.token_ids)
            if seq.logprobs is None or len(seq.logprobs) != len(ids):
                raise ValueError(f"vLLM output {i} sample {j}: {len(ids)} tokens but "
                                 f"{'no' if seq.logprobs is None else len(seq.logprobs)} log-prob entries")
            tokens.append(ids)
            logps.append([float(pos[t].logprob) for pos, t in zip(seq.logprobs, ids)])
    return tokens, logps


class VLLMEngine:
    """The rollout engine interface (``generate``, ``update_weights``, ``sleep``, ``decode``, ...) over vLLM."""

    def __init__(self, cfg, rank: int, device: torch.device, tokenizer, max_model_len: int | None):
        from vllm import LLM

        from core.models import resolve_model

        # external_launcher runs the engine in this process (vLLM's V1 engine would otherwise start its own)
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        accepted = set(inspect.signature(LLM.__init__).parameters)
        try:
            from vllm.engine.arg_utils import EngineArgs

            accepted |= set(inspect.signature(EngineArgs).parameters)
        except ImportError:
            pass
        path = resolve_model(cfg.model)
        self.cfg, self.device, self.tokenizer = cfg, device, tokenizer
        kwargs = engine_kwargs(path, cfg, max_model_len, replica_seed(rank, cfg.tensor_parallel_size), accepted)
        self.llm = LLM(**kwargs)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.dtype = getattr(torch, kwargs["dtype"])
        self._asleep: set[str] = set()

    # ------------------------------------------------------------------------------------- memory
    def sleep(self) -> int:
        """Weights to host memory, KV cache freed (vLLM sleep level 1); returns 0 (vLLM does not report bytes)."""
        if not self._asleep:
            self.llm.sleep(level=1)
            self._asleep = {"weights", "kv_cache"}
        return 0

    def _wake(self, tag: str) -> None:
        if tag in self._asleep:
            self.llm.wake_up(tags=[tag])
            self._asleep.discard(tag)

    # ------------------------------------------------------------------------------------- weights
    def weight_names(self) -> None:
        """None: vLLM's ``load_weights`` maps the actor's names to its own (fused) parameters and rejects others."""
        return None

    @torch.no_grad()
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Full tensors by the actor's (HF) names, cast to the engine's dtype; every TP rank takes its slice."""
        self._wake("weights")
        bucket = [(name, t.to(self.device, self.dtype)) for name, t in named_tensors]
        self._model().load_weights(weights=bucket)
        return sum(t.numel() * t.element_size() for _, t in bucket)

    def verify_weights(self, named_tensors) -> None:
        raise ValueError("rollout.debug_sync compares tensors by name, which vLLM's fused, TP-sliced parameters do "
                         "not have: run it with rollout.backend=embedded")

    def _model(self):
        worker = self.llm.llm_engine.model_executor.driver_worker
        return getattr(worker, "worker", worker).model_runner.model

    # ------------------------------------------------------------------------------------- generation
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams) -> Batch:
        """n samples of every prompt, in the embedded engine's Batch layout (``core.engines.rollout.assemble``).
        ``params.seed`` is not used: the replica's engine seed drives sampling (see the module docstring)."""
        from vllm import SamplingParams as VLLMSamplingParams

        self._wake("weights")
        self._wake("kv_cache")
        prompts = [list(p) for p in prompt_ids]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts],
                                    VLLMSamplingParams(**sampling_kwargs(params)), use_tqdm=False)
        tokens, logps = completion_rows(outputs)
        return assemble(prompts, tokens, logps, params.n, self.pad_id)

    def decode(self, batch: Batch) -> list[str]:
        return decode_responses(self.tokenizer, batch)

    def chat_prompt_ids(self, prompts: Sequence[list[dict]]) -> list[list[int]]:
        return chat_prompt_ids(self.tokenizer, prompts)
