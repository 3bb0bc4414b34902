"""``trainer.deterministic``: a run that repeats bit for bit on the same machine kind, and the weights' digest
that proves it.

What already repeats under the same seeds, whatever this flag: the prompt order (``trainer.seed``), each step's
sampling (``algo.sampling.seed`` + step, every row seeded by its index in the batch, so the samples do not depend on
which replica draws them), the reward pool (each sample scored alone), FSDP's gloo/NCCL reductions on a fixed
world (fixed ring order), a resumed run (the RNG of every rank in the checkpoint). What the flag adds:

- every worker runs ``torch.use_deterministic_algorithms(True)`` (an op with no deterministic implementation
  raises instead of varying) with the libraries' own switches set before they load: cuBLAS's fixed workspace
  (``CUBLAS_WORKSPACE_CONFIG``), MKL's conditional numerical reproducibility (``MKL_CBWR``: the same code path
  whatever the data's alignment) and no dynamic thread counts (``OMP_DYNAMIC`` / ``MKL_DYNAMIC``: a matmul split
  over as many threads every time);
- the configurations whose numbers depend on timing are refused before Ray (``problems``): streaming with
  ``trainer.async.overlap_steps=0`` (a phase's length decides how many tokens each weight version draws), an
  agent runner (agents' requests reach the engine in the order they arrive), vLLM and SGLang (their schedulers
  batch what arrives; not shown to repeat);
- after every step the actor's full weights are hashed (``weights_sha256``: sha256 over HF names, dtypes, shapes
  and bytes) and logged as ``actor/weights_sha256``: two runs are compared step by step, and the first step whose
  digest differs is where a regression starts. It costs one gather of the full weights per step (a weight sync's
  traffic), which is why it is not on by default.
"""

from __future__ import annotations

import hashlib
import os
from typing import Iterable

import torch

ENV = "HYBRIDRL_DETERMINISTIC"
# set in every worker's environment before torch (and with it MKL, OpenMP, cuBLAS) loads
LIBRARY_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "MKL_CBWR": "AUTO", "OMP_DYNAMIC": "FALSE",
               "MKL_DYNAMIC": "FALSE"}
DIGEST_KEY = "actor/weights_sha256"


def worker_env(deterministic: bool) -> dict[str, str]:
    """The environment variables a run's workers start with (none unless ``deterministic``)."""
    return {ENV: "1", **LIBRARY_ENV} if deterministic else {}


def enable_if_asked() -> bool:
    """In a worker (or the driver with trainer.backend=local): deterministic algorithms when the run asked for them
    (``ENV``). Uninitialised memory is not filled (torch's default under the switch, a write of every new tensor):
    a kernel that reads memory it did not write fails the repeat test instead."""
    if os.environ.get(ENV) != "1":
        return False
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    return True


def problems(cfg) -> list[str]:
    """What ``trainer.deterministic: true`` cannot make repeat, each naming its key and the fix."""
    if not cfg.trainer.deterministic:
        return []
    out, why = [], "trainer.deterministic=true: "
    if cfg.trainer.async_.mode == "streaming" and cfg.trainer.async_.overlap_steps == 0:
        out.append(why + "trainer.async.overlap_steps=0 lets each trainer phase's length decide how many decode steps "
                   "run beside it (so which weight version draws which token); set a fixed number, e.g. "
                   "trainer.async.overlap_steps=8")
    if cfg.rollout.agent.enable and cfg.rollout.agent.runner:
        out.append(why + "rollout.agent.runner's agents reach the engine in the order their requests arrive, which "
                   "timing decides; drop the runner for the built-in agent loop")
    if cfg.rollout.backend != "embedded":
        out.append(why + f"rollout.backend={cfg.rollout.backend} batches requests as its scheduler receives them and "
                   "is not shown to repeat bit for bit; use rollout.backend=embedded")
    return out


def weights_sha256(buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> str:
    """sha256 over every (name, dtype, shape, bytes) of the full weights, in the order the buckets give them (the
    same on every rank and run: ``PolicyWorker.bucket_plan``)."""
    h = hashlib.sha256()
    for bucket in buckets:
        for name, t in bucket:
            t = t.detach().cpu().contiguous()
            h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()
