"""``python -m core.verl.docs > docs/coming-from-verl.md``: the "coming from verl" page, generated from the key table
(``core.verl.keys``) so the page and the translation cannot disagree (a test compares them)."""

from __future__ import annotations

import sys

from core.verl.keys import RULES, TABLE, _NONE

INTRO = """# Coming from verl

A verl command line runs here as it is: `hybridrl train --verl <verl's overrides>` (and `hybridrl plan --verl`
for the memory plan) reads verl's keys with verl's meaning -- batch sizes in verl's units, epochs, GPU counts, and
verl's defaults where a key is left out -- and translates them into this framework's config. A verl run script
(here one of verl's examples, from a checkout of verl):

```text
hybridrl convert-verl verl/examples/grpo_trainer/run_qwen3_8b_fsdp.sh --out runs/qwen3_grpo
hybridrl plan runs/qwen3_grpo          # the config, its effective batch sizes and its memory plan
hybridrl train runs/qwen3_grpo
```

`convert-verl` runs the script with stand-ins for `python`, `uv`, `ray`, ... first on `PATH` (nothing trains or
downloads), takes the overrides of its last `verl.trainer.main_ppo` call, and prints the same run as `hybridrl
train --verl ...` and as a config in this framework's keys. Every key given is accounted for before anything
starts: translated, *not applicable* (a knob of verl's machinery with no job here: listed, changes nothing) or
*unsupported* (a feature this framework does not have: the run refuses it, one line each naming why).

What carries over unchanged: verl-schema parquet (`prompt`, `data_source`, `reward_model.ground_truth`), a custom
reward's `compute_score(data_source, solution_str, ground_truth, extra_info)`, the registry names (advantage
estimators, policy losses, KL kinds, loss aggregations) and verl's numerical conventions.

## Three traps, handled

- **Mini-batches count prompts in verl, samples here.** `actor_rollout_ref.actor.ppo_mini_batch_size=4` with
  `rollout.n=4` is `actor.ppo_mini_batch_size=16` here (verl multiplies by n inside its worker). A verl value
  given to our key directly would be silently 4x smaller; `--verl` converts it.
- **Epochs, not steps.** `trainer.total_epochs=15` is 15 passes over the data: `trainer.total_epochs` here too,
  steps = epochs x floor(rows / train_batch_size), counted when the data is loaded (verl's drop-last dataloader);
  `trainer.total_training_steps` wins when set, as in verl.
- **GPU counts make the pool.** `trainer.n_gpus_per_node` and `trainer.nnodes` (and `trainer.device`) become
  `placement.pools.main` (every role on it, verl's global pool). Our own `trainer.n_gpus_per_node` is only a name
  for a yaml to interpolate; set in a config that does not use it, a run warns that nothing reads it.

Other differences in meaning: verl's `test_freq <= 0` disables validation; here the held-out set is still scored
before the first and after the last step. `data.train_max_samples` takes a random N rows in verl, the first N
here. `actor_rollout_ref.actor.clip_ratio` does nothing in verl (its `clip_ratio_low/high`, 0.2 unless set, win);
set those. The reference exists when a KL needs it (`use_kl_loss`, `use_kl_in_reward`); a critic when
`critic.enable`, else when the estimator is `gae` -- verl's rules.

## Every key
"""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def page() -> str:
    """The whole page: the introduction, the conversion rules, then every key of the table by kind."""
    out = [INTRO, "| verl key | verl default | here | how |", "|---|---|---|---|"]
    for k in TABLE:
        if k.kind in ("same", "converted"):
            default = "" if k.default is _NONE else f"`{k.default}`"
            how = "" if k.rule == "same" else f"{k.rule}: {RULES[k.rule]}"
            note = "; ".join(x for x in (how, k.note) if x)
            out.append(f"| `{k.verl}` | {_cell(default)} | {', '.join(f'`{o}`' for o in k.ours)} | {_cell(note)} |")
    for kind, title in (("not_applicable", "Not applicable here (accepted, listed, change nothing)"),
                        ("unsupported", "Unsupported (a run refuses them, naming why)")):
        out += ["", f"## {title}", "", "| verl key | why |", "|---|---|"]
        out += [f"| `{k.verl}` | {_cell(k.note)}"
                + (f" (accepted: {', '.join(f'`{a}`' for a in k.accepts)})" if k.accepts else "") + " |"
                for k in TABLE if k.kind == kind]
    out += ["", "A verl key in none of these tables is refused as unknown, with the nearest key that is.", ""]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(page())
