"""fit(): a config tree validated into RunConfig, 2 steps on the local backend, one metrics line per step."""

import json

import pytest

from core.config import RunConfig, SamplingParams, validate
from core.trainer import fit
from core.plan_report import effective_sizes
from tests.loop.test_step import KEYS, verl_parquet


def tree(model_dir, data, out):
    return {"trainer": {"backend": "local", "total_steps": 2, "output_dir": str(out)},
            "data": {"train_files": [str(data)], "prompts_per_step": 2},
            "actor": {"model": str(model_dir), "dtype": "float32", "ppo_mini_batch_size": 4, "micro_batch_size": 2,
                      "kl_loss_coef": 0.01, "optim": {"lr": 1e-3}},
            "rollout": {"model": str(model_dir), "dtype": "float32", "max_prompt_length": 128},
            "algo": {"sampling": {"n": 2, "temperature": 1.0, "max_new_tokens": 6}, "adv": {"estimator": "grpo"}}}


def test_fit_writes_one_metrics_line_per_step(tiny_model_dir, tmp_path):
    cfg = validate(RunConfig, tree(tiny_model_dir, verl_parquet(tmp_path / "train.parquet"), tmp_path / "run"))
    history = fit(cfg)
    lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 2] and lines == history
    assert set(KEYS) <= set(lines[0])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["actor"]["optim"]["lr"] == 1e-3


def test_a_fresh_run_starts_a_fresh_metrics_file(tiny_model_dir, tmp_path):
    """Running again into the same output_dir without a checkpoint sets the earlier file aside (it once appended:
    the report then summarised two runs as one); the set-aside file keeps the first run's rows unchanged."""
    t = tree(tiny_model_dir, verl_parquet(tmp_path / "train.parquet"), tmp_path / "run")
    t["trainer"]["total_steps"] = 1
    first = fit(validate(RunConfig, t))
    second = fit(validate(RunConfig, t))
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rows] == [1] and rows == second
    aside = sorted((tmp_path / "run").glob("metrics.*.jsonl"))
    assert len(aside) == 1 and [json.loads(l) for l in aside[0].read_text().splitlines()] == first


def test_config_errors_name_the_key_and_sizes_are_checked(tiny_model_dir, tmp_path):
    bad = tree(tiny_model_dir, "x.parquet", tmp_path)
    bad["actor"]["micro_batch_sise"] = 2
    with pytest.raises(ValueError, match=r"actor.micro_batch_sise: unknown key; did you mean 'micro_batch_size'\?"):
        validate(RunConfig, bad)
    cfg = validate(RunConfig, {**tree(tiny_model_dir, "x.parquet", tmp_path), "data": {"prompts_per_step": 3}})
    with pytest.raises(ValueError, match=r"3 prompts x n=2 = 6\) must be a multiple of actor.ppo_mini_batch_size=4"):
        effective_sizes(cfg, 2)
    text = effective_sizes(validate(RunConfig, tree(tiny_model_dir, "x.parquet", tmp_path)), 2)
    assert "samples per step           4  (= prompts x n=2)" in text and "2 samples of each mini-batch per rank" in text


def test_hydra_config_with_overrides_is_validated(tmp_path):
    import yaml

    from core.run import load_run_config

    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"trainer": {"total_steps": 3}, "actor": {"optim": {"lr": 1e-6}},
                                                         "algo": {"sampling": {"n": 2}}}))
    cfg = load_run_config(tmp_path, overrides=["trainer.total_steps=7", "actor.optim.lr=2e-5", "algo.sampling.n=4"])
    assert (cfg.trainer.total_steps, cfg.actor.optim.lr, cfg.algo.sampling.n) == (7, 2e-5, 4)
    with pytest.raises(ValueError, match=r"trainer.total_steps: expected int, got 'many' \(set on the command line: trainer.total_steps=many\)"):
        load_run_config(tmp_path, overrides=["trainer.total_steps=many"])
    # a typo in an override is named by validation, with the keys that exist (Hydra's own refusal said only
    # "Could not override 'actor.optim.lrr'. To append to your config use +actor.optim.lrr=1")
    with pytest.raises(ValueError, match=r"actor.optim.lrr: unknown key; did you mean 'lr'\?"):
        load_run_config(tmp_path, overrides=["actor.optim.lrr=1"])


def test_validation_runs_before_training_and_after_the_last_step(tiny_model_dir, tmp_path):
    """Step 0 holds the untrained policy's greedy held-out score, equal to scoring a fresh engine's greedy
    responses by hand; the last step's line carries the score after training."""
    from core.rollout.engine import RolloutEngine
    from core.models import load_causal_lm, load_tokenizer
    from core.data.dataset import load_rl_parquet

    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    s = solution_str.replace(' ', '')\n"
                      "    return sum(c.isupper() for c in s) / max(1, len(s))\n")
    val = verl_parquet(tmp_path / "val.parquet", n=3)
    t = tree(tiny_model_dir, verl_parquet(tmp_path / "train.parquet"), tmp_path / "run")
    t["data"] |= {"val_files": [str(val)]}
    t["reward"] = {"path": str(reward)}
    history = fit(validate(RunConfig, t))
    assert [m["step"] for m in history] == [0, 1, 2]
    src = "val/openai/gsm8k/"
    assert set(history[0]) == {"step", "val/reward/mean", "val/response_length/mean", src + "pass@1", src + "avg@1",
                               src + "maj@1", src + "response_length/mean"}
    assert "val/reward/mean" not in history[1] and "val/reward/mean" in history[2]

    engine = RolloutEngine(load_causal_lm(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir)))
    rows = load_rl_parquet(val)
    out = engine.generate(engine.chat_prompt_ids([r["prompt"] for r in rows]),
                          SamplingParams(temperature=0.0, max_new_tokens=6))
    texts = [s.replace(" ", "") for s in engine.decode(out)]
    by_hand = sum(sum(c.isupper() for c in s) / max(1, len(s)) for s in texts) / len(texts)
    assert history[0]["val/reward/mean"] == pytest.approx(by_hand, abs=1e-6) == history[0][src + "avg@1"]
    assert history[0]["val/response_length/mean"] == pytest.approx(float(out["response_mask"].sum(-1).mean()))
    # trainer.log_val_generations (default 4, here 3 rows): the step-0 samples are the engine's greedy responses
    shown = [json.loads(line) for line in (tmp_path / "run" / "val_generations.jsonl").read_text().splitlines()]
    assert [s["step"] for s in shown] == [0, 0, 0, 2, 2, 2]
    whole = engine.tokenizer.batch_decode([r[m > 0] for r, m in zip(out["responses"], out["response_mask"])])
    assert [s["response"] for s in shown[:3]] == whole
    assert [s["question"] for s in shown[:3]] == [r["extra_info"]["question"] for r in rows]  # the data's own


def test_a_run_stops_after_consecutive_nonfinite_gradient_norms(tiny_model_dir, tmp_path):
    """The real step, then the gradient norm it reports made nan from step 2 on (the recipe hook fit() offers):
    the run stops at step 3 (limit 2) naming the steps and the setting, with every row written before."""
    from core.loop import step

    calls = []

    def run_step(roles, draw, *args, **kwargs):
        batch, metrics = step(roles, draw(), *args, **kwargs)
        calls.append(len(calls) + 1)
        return batch, metrics | ({"actor/grad_norm": float("nan")} if len(calls) > 1 else {})

    t = tree(tiny_model_dir, verl_parquet(tmp_path / "train.parquet"), tmp_path / "run")
    t["trainer"] |= {"total_steps": 5, "max_nonfinite_grad_steps": 2}
    with pytest.raises(FloatingPointError, match=r"step 3: the actor's gradient norm was inf/nan for 2 consecutive"):
        fit(validate(RunConfig, t), run_step)
    rows = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in rows] == [1, 2, 3] and rows[0]["actor/nonfinite_grad_frac"] == 0.0
