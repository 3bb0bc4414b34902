"""Multi-turn tool-calling RL (GRPO advantages over agent rollouts): the RL step of this recipe, built from core's
phases.

    hybridrl train agent [--config-name config|retool_qwen32b] [--dry-run] [hydra overrides]
    python recipes/agent/train.py [...]                                      (the same, without the CLI)

The step is GRPO's: what makes it an agent run is ``rollout.agent`` -- the generate phase runs core's agent loop
(``core.rollout.agent_loop.agent_generate``): each turn ends at a ``</tool_call>`` or EOS, the tools run in the sandbox
(``core.tools``), their answers are appended as tokens and the model goes on. Tool-answer tokens are attended but
masked out of the loss (``response_mask`` 0), so every phase below trains only on the model's own tokens. The
reward sees the model's text and ``extra_info["num_turns"]`` / ``["num_tool_calls"]`` (reward.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

from core.config import AlgoConfig
from core.loop import (Roles, Timer, advantages, generate, logprobs,
                       reward_kl_penalty, score, step_metrics, update)
from core.protocol import Batch

HERE = Path(__file__).resolve().parent


def step(roles: Roles, draw: Callable[[], Batch], cfg: AlgoConfig, reward_fn: Callable, update_actor: bool = True,
         kl_ctrl=None) -> tuple[Batch, dict[str, float]]:
    """One step on the next prompt batch (``draw()``); returns the trained batch and the step's metrics (with
    ``agent/*``: turns, tool calls, tool errors, the share of tool tokens)."""
    timer = Timer()
    with timer("step"):
        # 1. n multi-turn rollouts per prompt: model turns, tool calls run in the sandbox, tool answers as tokens
        batch = generate(roles, draw(), cfg.sampling, timer)
        # 2. score each conversation's model text (and its turn count: reward.py); the outcome on its last token
        scored = score(roles, batch, cfg, reward_fn, timer)
        # 3. log-probs of the model's tokens under the actor (and the reference when the run has one); the rows of
        #    the actor's first mini-batch are left to its update's own forward when nothing reads them first
        batch = logprobs(roles, batch, cfg, timer, update_actor, kl_ctrl)
        # 4. KL to the reference as a reward penalty, only when algo.kl_in_reward.coef > 0
        kl = reward_kl_penalty(batch, kl_ctrl, cfg)
        # 5. advantages: each conversation's score against its group's (algo.adv)
        advantages(batch, cfg, timer)
        # 6. policy update on the model's tokens (tool tokens masked) and the weight sync to the rollout engine
        updates = update(roles, batch, cfg, timer, update_actor)
    return batch, step_metrics(batch, updates | kl, timer, scored.num_failed, cfg)


def main(argv: list[str] | None = None) -> int:
    from core.run import main as run

    return run(argv, config_dir=HERE, make_step=lambda cfg, sections: step)


if __name__ == "__main__":
    sys.exit(main())
