"""``hybridrl new <name> --from <recipe>``: a recipe copied as the start of a new algorithm, pointing at itself.

The copy is a plain folder beside the source (a new algorithm starts by copying, never by subclassing):

- every self-reference is rewritten: ``recipes/<src>`` paths, ``outputs/<src>...`` output folders, tracker
  project / experiment names and the ``hybridrl train|plan <src>`` commands in scripts and docstrings. Rewards
  load from the recipe's own folder (a relative ``reward.path``), so the copy scores with its own ``reward.py``.
  Registry names that happen to equal the recipe's (``estimator: grpo``) and data sources are left alone;
- ``expected.yaml`` is reset to "not measured" (the source's bounds are not the copy's results), and the README
  becomes a stub that says where the copy came from;
- then the copy's ``train.py`` runs 2 steps on a tiny random model (local backend, a few arithmetic prompts, a
  reward that varies with the text so every step has a gradient), and its ``reward.py`` scores one sample: a
  broken copy fails here, in seconds, with its output.
"""

from __future__ import annotations

import datetime
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

TEXT = (".yaml", ".yml", ".sh", ".py", ".md", ".txt")


def rewrite(text: str, src: str, name: str) -> str:
    """The copy's self-references: ``recipes/<src>``, ``outputs/<src>…``, tracker names, ``hybridrl … <src>``.

    >>> rewrite("path: recipes/grpo/x\\noutput_dir: outputs/grpo_cpu\\nestimator: grpo", "grpo", "myalgo")
    'path: recipes/myalgo/x\\noutput_dir: outputs/myalgo_cpu\\nestimator: grpo'
    """
    s = re.escape(src)
    text = re.sub(rf"\brecipes/{s}\b", f"recipes/{name}", text)
    text = re.sub(rf"\boutputs/{s}(?=[_\-/.\s\"']|$)", f"outputs/{name}", text, flags=re.M)
    text = re.sub(rf"^(\s*(?:experiment_name|project_name):\s*[\"']?){s}(?=[_\-\s\"']|$)", rf"\g<1>{name}", text,
                  flags=re.M)
    return re.sub(rf"\bhybridrl (train|plan) {s}\b", rf"hybridrl \1 {name}", text)


def new_recipe(name: str, source: Path, check: bool = True, out=print) -> Path:
    """Copy ``source`` to ``<recipes>/<name>``, rewrite it, reset its results; run the tiny check unless told not."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise SystemExit(f"hybridrl new: {name!r} is no recipe name: use lower-case letters, digits and _")
    dest = source.parent / name
    if dest.exists():
        raise SystemExit(f"hybridrl new: {dest} exists already; pick another name or remove it")
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "outputs", "*.pyc"))
    changed = []
    for path in sorted(dest.rglob("*")):
        if path.is_file() and path.suffix in TEXT and path.name not in ("README.md", "expected.yaml"):
            old = path.read_text()
            new = rewrite(old, source.name, name)
            if new != old:
                path.write_text(new)
                changed.append(path.name)
    today = datetime.date.today().isoformat()
    (dest / "expected.yaml").write_text(
        f"# Not measured: copied from recipes/{source.name} by `hybridrl new` on {today}; the source's bounds are not\n"
        f"# this recipe's results. Add a tier (format: core/expected.py; recipes/{source.name}/expected.yaml shows one)\n"
        "# once a run has measured it.\n{}\n")
    (dest / "README.md").write_text(
        f"# {name}\n\nCopied from `recipes/{source.name}` by `hybridrl new` on {today}. Results: **not measured** "
        f"(`expected.yaml` is empty).\n\n```bash\nhybridrl train {name} --dry-run     # the config and its memory plan\n"
        f"hybridrl train {name} trainer.total_steps=2\n```\n\nThe step is `train.py`'s `step`: change the phase that "
        f"differs. The source's design notes and results: `recipes/{source.name}/README.md`.\n")
    out(f"copied recipes/{source.name} to {dest}; rewrote self-references in {', '.join(changed) or 'no file'}; "
        "reset expected.yaml and README.md")
    if check:
        tiny_check(dest, out)
    return dest


def tiny_overrides(tmp: Path, model: Path, teacher: bool = False) -> list[str]:
    """Hydra overrides that make any recipe's run tiny: local backend, 2 steps of 2 prompts x 2 samples of 4 tokens,
    the tiny ``model`` in fp32 for every role (``teacher``: the distillation teacher's too), ``tmp``'s data and
    reward (``++``: set whether the yaml has the key)."""
    sizes = {"trainer.backend": "local", "trainer.total_steps": 2, "trainer.output_dir": tmp / "out",
             "trainer.save_freq": 0, "trainer.test_freq": 0, "trainer.logger": "[jsonl]",
             "data.train_files": f"[{tmp / 'train.parquet'}]", "data.val_files": "[]", "data.limit": 0,
             "data.prompts_per_step": 2, "data.train_prompts_per_step": 2, "data.truncation": "left",
             "algo.sampling.n": 2, "algo.sampling.max_new_tokens": 4, "rollout.max_prompt_length": 48,
             "reward.path": tmp / "reward.py", "reward.name": "compute_score"}
    for role in ("actor", "rollout", "critic") + (("teacher",) if teacher else ()):
        sizes |= {f"{role}.model": model, f"{role}.dtype": "float32"}
    for role in ("actor", "critic"):
        sizes |= {f"{role}.ppo_mini_batch_size": 4, f"{role}.micro_batch_size": 2, f"{role}.max_tokens_per_micro": 0}
    return [f"++{k}={v}" for k, v in sizes.items()]


def tiny_data(tmp: Path, conversations: bool = False) -> None:
    """8 arithmetic prompts and a reward that varies with the text (a random model's groups then have a gradient);
    ``conversations``: each row also holds its whole conversation (``messages``: the question and its answer), for
    a step that trains on them (SFT)."""
    from core.data.prepare import write_parquet

    rows = [{"data_source": "hybridrl/arith", "prompt": [{"role": "user", "content": f"{a} + {a} = ?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * a)},
             "extra_info": {"index": a}} for a in range(1, 9)]
    if conversations:
        rows = [r | {"messages": r["prompt"] + [{"role": "assistant", "content": r["reward_model"]["ground_truth"]}]}
                for r in rows]
    write_parquet(rows, tmp / "train.parquet")
    (tmp / "reward.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    score = sum(map(ord, solution_str)) % 7 / 7\n    return {'score': score, 'acc': score >= 0.5}\n")


def _loss_key(m: dict) -> str:
    """What a step row reports: an RL step's reward, a supervised step's loss ('' for the validation row)."""
    return "reward/mean" if "reward/mean" in m else "sft/nll_loss" if "sft/nll_loss" in m else ""


def tiny_check(folder: Path, out=print) -> None:
    """2 steps of the recipe's train.py on a tiny random model, and its reward on one sample; raises on failure."""
    from core.models import tiny_random_model

    with tempfile.TemporaryDirectory(prefix=f"hybridrl-new-{folder.name}-") as tmp:
        tmp = Path(tmp)
        model = tiny_random_model(tmp / "model")
        train = folder / "train.py"  # a step that reads the rows' conversations (SFT's) gets them
        tiny_data(tmp, conversations=train.is_file() and '"messages"' in train.read_text())
        config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
        teacher = bool((config.get("teacher") or {}).get("model"))  # a distillation recipe: its teacher tiny too
        cmd = [sys.executable, "-m", "core.cli", "train", str(folder), *tiny_overrides(tmp, model, teacher)]
        run = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
        if run.returncode != 0:
            raise SystemExit(f"hybridrl new: the copy's 2-step tiny run failed (exit {run.returncode}):\n"
                             f"{' '.join(cmd)}\n{run.stderr[-4000:]}")
        from core.report import read_metrics

        steps = read_metrics(tmp / "out" / "metrics.jsonl")
    out(f"tiny check: {folder.name}/train.py ran {len(steps)} steps on a tiny random model: " + "; ".join(
        f"step {m['step']} {_loss_key(m)} {m[_loss_key(m)]:.3f} actor/grad_norm {m.get('actor/grad_norm', 0.0):.4f}"
        for m in steps if _loss_key(m)))
    reward = folder / "reward.py"
    if reward.is_file():
        from core.rewards import load_reward_fn

        got = load_reward_fn(str(reward), "compute_score")("hybridrl/arith", "2 + 2 = 4. #### 4", "4")
        out(f"tiny check: {folder.name}/reward.py scores '2 + 2 = 4. #### 4' against 4: {got}")
