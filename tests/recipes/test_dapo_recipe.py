"""recipes/dapo/train.py on a tiny real model (local backend): dynamic sampling draws more gen batches when groups
do not vary, keeps exactly train_groups groups, and the overlong metrics follow the shaping formula."""

import sys
from pathlib import Path

import pytest

from core.data.prepare import write_parquet
from core.cli import recipe_module
from core.run import load_recipe_config

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "dapo"


def dapo_module():
    return recipe_module(RECIPE)


def tiny_dapo_run(tmp_path: Path, model_dir: Path, train_groups: int, extra: str = "") -> Path:
    rows = [{"data_source": "t", "prompt": [{"role": "user", "content": f"{a} + {a}?"}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(2 * a)}, "extra_info": {"index": a}} for a in range(16)]
    write_parquet(rows, tmp_path / "train.parquet")
    # acc varies with the sampled text: some groups vary, some do not
    (tmp_path / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                        "    acc = sum(map(ord, solution_str)) % 3 == 0\n"
                                        "    return {'score': float(acc), 'acc': acc}\n")
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "config.yaml").write_text(f"""
trainer: {{backend: local, total_steps: 2, output_dir: {tmp_path / 'out'}}}
data: {{train_files: ["{tmp_path / 'train.parquet'}"], prompts_per_step: 2, train_prompts_per_step: {train_groups}}}
use_ref: false
actor: {{model: "{model_dir}", dtype: float32, ppo_mini_batch_size: {4 * train_groups}, micro_batch_size: 4,
        loss: {{clip_low: 0.2, clip_high: 0.28, dual_clip_c: 10.0}}, optim: {{lr: 0.001}}}}
rollout: {{model: "{model_dir}", dtype: float32, max_prompt_length: 32}}
algo: {{sampling: {{n: 4, temperature: 1.0, max_new_tokens: 6}}}}
reward: {{path: "{tmp_path / 'reward.py'}"}}
dapo: {{filter_metric: acc, max_num_gen_batches: 20, overlong_buffer: 4,
       overlong_penalty: 1.0}}
{extra}""")
    return conf


def test_dynamic_sampling_keeps_train_groups_from_several_gen_batches(tmp_path, tiny_model_dir):
    from core.trainer import fit

    dapo = dapo_module()
    cfg, sections = load_recipe_config(tiny_dapo_run(tmp_path, tiny_model_dir, train_groups=3),
                                       sections={"dapo": dapo.DAPOConfig})
    assert cfg.data.train_prompts_per_step == 3 and cfg.actor.loss.clip_high == 0.28
    assert sections["dapo"].filter_metric == "acc" and sections["dapo"].overlong_buffer == 4
    history = fit(cfg, dapo.make_step(cfg, sections))
    for m in history:
        # 2 prompts per gen batch can give at most 2 groups: 3 groups always take 2 or more gen batches
        assert m["dapo/num_gen_batches"] >= 2 and 0 < m["dapo/kept_group_frac"] <= 1
        # max_new_tokens 6, buffer 4: every response longer than 2 tokens is penalised, a 6-token one by -1
        assert m["dapo/overlong_frac"] > 0 and -1 <= m["dapo/overlong_penalty_mean"] < 0
        assert "actor/grad_norm" in m
        # core's step metrics, which the recipe's first copy of the step had lost
        for key in ("response_length/clip_ratio", "rollout/logprob_diff_mean", "reward/num_failed",
                    "perf/throughput_tokens_per_s", "timing_s/gen", "timing_s/update_actor"):
            assert key in m, key


@pytest.mark.parametrize("on_stale", ["drop", "wait"])
def test_dynamic_sampling_draws_more_groups_from_a_stream(tmp_path, tiny_model_dir, on_stale):
    """trainer.async.mode=streaming: each of a step's draws takes the stream's next finished groups (a redraw gets
    fresh groups, admitted at the current version); every trained sample within max_staleness."""
    from core.trainer import fit

    dapo = dapo_module()
    conf = tiny_dapo_run(tmp_path, tiny_model_dir, train_groups=3)
    cfg, sections = load_recipe_config(conf, overrides=[
        "trainer.async.mode=streaming", "trainer.async.max_staleness=1", f"trainer.async.on_stale={on_stale}",
        "trainer.total_steps=3", "trainer.async.overlap_steps=4", "trainer.async.chunk_steps=2"],
        sections={"dapo": dapo.DAPOConfig})
    history = fit(cfg, dapo.make_step(cfg, sections))
    assert len(history) == 3
    for m in history:
        assert m["dapo/num_gen_batches"] >= 2 and m["rollout/staleness_max"] <= 1
        assert m["rollout/stale_dropped"] == 0 or on_stale == "drop"
    assert max(m["rollout/staleness_max"] for m in history) == 1        # later steps train on groups made ahead


def test_a_step_that_cannot_find_varying_groups_says_so(tmp_path, tiny_model_dir):
    from core.trainer import fit

    dapo = dapo_module()
    conf = tiny_dapo_run(tmp_path, tiny_model_dir, train_groups=3)
    cfg, sections = load_recipe_config(conf, overrides=["dapo.max_num_gen_batches=1"], sections={"dapo": dapo.DAPOConfig})
    with pytest.raises(RuntimeError, match=r"dapo: 1 gen batches kept only \d of 3 groups"):
        fit(cfg, dapo.make_step(cfg, sections))


@pytest.mark.parametrize("name", ["config", "demo_cpu", "qwen32b"])
def test_recipe_configs_validate_with_dapos_settings(name):
    from core.plan_report import effective_sizes
    from core.roles import role_specs

    cfg, sections = load_recipe_config(RECIPE, name, sections={"dapo": dapo_module().DAPOConfig})
    assert (cfg.actor.loss.clip_low, cfg.actor.loss.clip_high, cfg.actor.loss.dual_clip_c) == (0.2, 0.28, 10.0)
    assert cfg.actor.loss_agg_mode == "token-mean" and cfg.actor.kl_loss_coef == 0 and "ref" not in role_specs(cfg)
    assert f"samples per step           {cfg.data.train_prompts_per_step * cfg.algo.sampling.n}" in effective_sizes(cfg, 2)
    assert sections["dapo"].filter_metric == "acc" and Path(cfg.reward.path) == RECIPE / "reward.py"


def test_dapo_math_rows_from_hub_rows_and_raw_records_deduplicated():
    from core.data import dapo_math as data
    hub_row = {"data_source": "math_dapo", "prompt": [{"role": "user", "content": "Solve ... 1+1 ... Answer:"}],
               "ability": "MATH", "reward_model": {"ground_truth": "2", "style": "rule-lighteval/MATH_v2"},
               "extra_info": {"index": "a"}}
    raw = {"problem": "What is 3 * 4?", "answer": " 12 "}
    rows = data.dapo_math_rows([hub_row, dict(hub_row), raw, dict(raw)], "f.jsonl")
    assert len(rows) == 2                                   # the repeats are dropped
    assert rows[0]["prompt"][0]["content"] == "Solve ... 1+1 ... Answer:" and rows[0]["reward_model"]["ground_truth"] == "2"
    assert rows[1]["prompt"][0]["content"] == data.TEMPLATE_DAPO.format(question="What is 3 * 4?")
    assert rows[1]["reward_model"]["ground_truth"] == "12" and {r["data_source"] for r in rows} == {"math_dapo"}
    with pytest.raises(ValueError, match=r"f.jsonl: row 2: no answer"):
        data.dapo_math_rows([raw, {"problem": "x"}], "f.jsonl")


def test_the_recipe_reward_scores_dapo_data_by_the_answer_line():
    reward = recipe_module(RECIPE, "reward")
    assert reward.compute_score("aime24", "so it is 204.\nAnswer: 204", "204")["score"] == 1.0
    assert reward.compute_score("math_dapo", "the answer is 204", "204")["score"] == -1.0   # no Answer: line
    assert reward.compute_score("hybridrl/arith", "#### 12", "12")["score"] == 1.0


def run_qwen32b(*args):
    import subprocess

    return subprocess.run(["bash", str(RECIPE / "run_qwen32b.sh"), "--dry-run", *args], capture_output=True,
                          text=True, env={**__import__("os").environ, "PY": sys.executable}, timeout=120)


def plan_qwen32b(capsys, *overrides) -> tuple[int, str]:
    """``hybridrl plan dapo --config-name qwen32b <overrides>`` in this process: (exit code, what it printed)."""
    from core.cli import main

    capsys.readouterr()
    rc = main(["plan", str(RECIPE), "--config-name", "qwen32b", *overrides])
    return rc, capsys.readouterr().out


def test_run_qwen32b_dry_run_fits_on_16_nodes_and_not_on_one(capsys):
    out = run_qwen32b()  # the script itself, once
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FSDP2 world size 128, offload idle" in out.stdout and "rollout vllm TP 4 x 32 replicas" in out.stdout
    assert out.stdout.rstrip().endswith("fits")
    # one node: the sharded state is 16 P / 8 = 65.5 GB per GPU while training (offload=idle parks it only while
    # the rollout runs); the plan says why, and what offload=full would need
    rc, text = plan_qwen32b(capsys, "trainer.nnodes=1")
    assert rc == 1
    assert "DOES NOT FIT" in text and "train phase needs 117.4 GB per GPU, more than the 76.0 GB" in text
    assert "hint: with offload=full" in text and "655 GB host per node: it fits" in text
    # offload=full on one node: the node must hold 655 GB of offloaded state and sleeping weights
    rc, text = plan_qwen32b(capsys, "trainer.nnodes=1", "actor.offload=full", "placement.pools.main.host_memory_gb=512")
    assert rc == 1 and "host memory: 655 GB per node" in text, text


def test_each_gen_batch_of_a_step_samples_with_its_own_seed():
    """A step's redraws (dynamic sampling) once reused the step's seed, replaying the first draw's uniforms. The
    first draw keeps the step's seed; later ones move past every rank's replica offset."""
    from core.config import SamplingParams
    from core.rollout.engine import replica_seed

    train = dapo_module()
    base = SamplingParams(n=4, seed=7)
    seeds = [train.gen_batch_sampling(base, g).seed for g in (1, 2, 3)]
    assert seeds[0] == 7 and len(set(seeds)) == 3
    per_rank = {s + replica_seed(r, 1) for s in seeds for r in range(512)}   # what each rank's engine uses
    assert len(per_rank) == 3 * 512
