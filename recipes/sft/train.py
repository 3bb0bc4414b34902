"""Supervised fine-tuning (SFT): the cold start every reasoning and agent recipe assumes, on the same actor (FSDP2,
LoRA, offload), config tree, checkpoints and resume, trackers and export as RL.

    hybridrl train sft [--config-name config] [--dry-run] [hydra overrides]
    python recipes/sft/train.py [...]                                      (the same, without the CLI)

Each step takes the next ``data.prompts_per_step`` rows; each row's ``messages`` (the whole conversation, OpenAI's
format: system, user, assistant with its tool calls, tool answers) become ids with the loss on the assistant's
tokens only (``core.sft``: tool answers and the template's headers are context, as the agent loop masks them in
RL), packed into rows of at most ``sft.max_tokens`` tokens without cross-contamination. One optimizer step of the
mean negative log-likelihood of every trained token over all DP ranks (``PolicyWorker.sft_update``), then the new
weights go to the rollout engine, which the held-out validation samples from: the same ``val/*`` metrics as an RL
run of the task (accuracy by the reward, tool use), so an SFT run and the RL run after it read on one scale.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.config import AlgoConfig
from core.loop import Roles, Timer, reduce_over_ranks, sync_rollout
from core.plan_report import dp_size
from core.protocol import Batch
from core.sft import collate, conversation_sample, pack
from core.train.policy import PolicyWorker

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class SFTConfig:
    # tokens of a packed row: samples are packed up to it, never across it (a longer sample is an error)
    max_tokens: int = 1024


SECTIONS = {"sft": SFTConfig}


def make_step(cfg, sections: dict) -> Callable:
    """``core.trainer.fit``'s step_fn (called before Ray starts: a config it cannot train stops here)."""
    from core.config import ConfigError
    from core.models import load_tokenizer

    if cfg.actor.strategy != "fsdp" or cfg.actor.ulysses_sp != 1:
        raise ConfigError(f"recipes/sft trains on the FSDP2 actor without sequence parallelism; got actor.strategy="
                          f"{cfg.actor.strategy}, actor.ulysses_sp={cfg.actor.ulysses_sp}: set actor.strategy=fsdp and "
                          "actor.ulysses_sp=1", "actor.strategy")
    tokenizer, max_tokens, dp = load_tokenizer(cfg.actor.model), sections["sft"].max_tokens, dp_size(cfg)

    def step(roles: Roles, draw: Callable[[], Batch], algo: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
             kl_ctrl=None) -> tuple[None, dict[str, float]]:
        """One SFT step on the next rows (``draw()``); returns no RL batch and the step's metrics."""
        timer = Timer()
        with timer("step"):
            # 1. each row's conversation as ids, the loss on the assistant's tokens
            rows = draw()
            rows.require("messages")
            samples = [conversation_sample(tokenizer, list(m), where=w)
                       for m, w in zip(rows["messages"], rows["where"])]
            # 2. packed into rows of at most sft.max_tokens tokens, as many as the DP ranks split evenly
            packed = collate(samples, pack(samples, max_tokens, multiple=dp))
            batch = Batch({"input_ids": packed.input_ids, "position_ids": packed.position_ids,
                           "segment": packed.segment, "loss_mask": packed.loss_mask})
            # 3. one optimizer step of the mean NLL of every trained token, over all DP ranks
            with timer("update_actor"):
                metrics = reduce_over_ranks(roles.actor.dp_split(PolicyWorker.sft_update, batch))
            # 4. the new weights into the rollout engine, which the held-out validation samples from
            with timer("sync_weights"):
                metrics |= sync_rollout(roles, algo.sync_timeout_s)
        return None, metrics | {"sft/samples": len(samples), "sft/packed_rows": len(packed.input_ids),
                                **{f"timing_s/{k}": v for k, v in timer.seconds.items()}}

    return step


def sizes(cfg, sections: dict, dp: int) -> str:
    """The step's batch sizes in words (printed at start and by --dry-run, in place of the RL step's)."""
    return "\n".join([
        f"  conversations per step     {cfg.data.prompts_per_step}  (data.prompts_per_step)",
        f"  packed rows                <= {sections['sft'].max_tokens} tokens each (sft.max_tokens), a multiple of "
        f"{dp} per step",
        f"  data-parallel ranks        {dp}  (each takes an equal share of the packed rows)",
        f"  micro-batch per rank       {cfg.actor.micro_batch_size} packed rows",
        "  optimizer updates per step 1  (the mean NLL of every trained token of the step)"])


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, sections=SECTIONS, make_step=make_step, sizes=sizes)


if __name__ == "__main__":
    sys.exit(main())
