"""recipes/sft: the traces are correct tool-using answers of training problems only, checked by content against the
held-out problems (a leaked file is refused naming it); the config validates with its own section; and (slow) the
CPU tier reproduces recipes/sft/expected.yaml."""

from pathlib import Path

import pytest

from core.cli import recipe_module
from core.data.agent_mult import held_out, operands, pairs, solution
from core.data.dataset import load_rl_parquet
from core.data.prepare import write_parquet
from core.expected import load_expected
from core.run import load_recipe_config
from tests.recipes.plans import plan
from tests.recipes.tiers import reproduce

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "sft"
EXPECTED = load_expected(RECIPE)


def test_traces_answer_training_problems_only_and_are_checked_against_the_held_out_ones(tmp_path):
    data = recipe_module(RECIPE, "data")
    path = data.write_traces(tmp_path, count=300)["train"]
    rows = load_rl_parquet(path)
    test = {tuple(sorted(p)) for p in pairs("test", 64)}
    for r in rows:
        a, b = operands(r["extra_info"]["question"])
        assert not held_out(a, b) and tuple(sorted((a, b))) not in test
        assert r["messages"] == r["prompt"] + solution(a, b) and str(a * b) in r["messages"][-1]["content"]
    # a file that holds a held-out problem is refused, naming it
    leaked = load_rl_parquet(tmp_path / "agent_mult" / "test.parquet")[:1]
    write_parquet([{"data_source": r["data_source"], "prompt": r["prompt"], "ability": "math",
                    "reward_model": {"style": "rule", "ground_truth": r["ground_truth"]}, "extra_info": r["extra_info"]}
                   for r in leaked], tmp_path / "leak.parquet")
    with pytest.raises(ValueError, match=r"leak\.parquet: 1 problems of .*test\.parquet are in it"):
        data.check_held_out(tmp_path / "leak.parquet", tmp_path / "agent_mult" / "test.parquet")


def test_the_config_validates_and_the_tier_is_what_expected_yaml_describes():
    from core.checks import check_run

    cfg, sections = load_recipe_config(RECIPE, "config", sections=recipe_module(RECIPE, "train").SECTIONS)
    check_run(cfg, own_step=True)
    assert sections["sft"].max_tokens == 320 and cfg.trainer.total_steps == EXPECTED["cpu"]["steps"]
    assert cfg.data.val_files == ["outputs/data/agent_mult/test.parquet"] and cfg.rollout.agent.enable


def test_a_config_the_step_cannot_train_stops_before_ray_naming_the_key():
    from core.config import ConfigError

    train = recipe_module(RECIPE, "train")
    cfg, sections = load_recipe_config(RECIPE, "config", ["actor.ulysses_sp=2"], sections=train.SECTIONS)
    with pytest.raises(ConfigError, match="actor.ulysses_sp=2: set actor.strategy=fsdp and actor.ulysses_sp=1"):
        train.make_step(cfg, sections)
    assert callable(train.make_step(*load_recipe_config(RECIPE, "config", sections=train.SECTIONS)))


def test_s1k_records_become_s1s_form_and_a_bad_one_is_named():
    data = recipe_module(RECIPE, "data")
    rec = {"question": "What is 1 + 1?", "thinking_trajectories": ["one and one", "unused"], "attempt": "2",
           "solution": "2"}
    (row,) = data.s1k_rows([rec], "s1k.jsonl")
    assert row["messages"] == [{"role": "user", "content": "What is 1 + 1?"},
                               {"role": "assistant", "content": "<|im_start|>think\none and one\n<|im_start|>answer\n"
                                                                "Answer: 2"}]
    with pytest.raises(ValueError, match="s1k.jsonl row 2: question, thinking_trajectories and attempt"):
        data.s1k_rows([rec, {"question": "q", "thinking_trajectories": [], "attempt": "a"}], "s1k.jsonl")


def test_the_full_scale_run_plans_and_fits(capsys):
    """s1 at full scale, planned: it composes and validates, and the capacity plan fits 2 x 8 GPUs of 80 GB."""
    rc, out = plan(capsys, "sft", "s1_qwen32b")
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2.5-32B-Instruct on 16 cuda rank(s)" in out and "32768 tokens per micro-batch" in out
    assert out.rstrip().endswith("fits")


@pytest.mark.slow
def test_cpu_tier_reproduces_expected_yaml(tmp_path):
    """The real CPU tier (about 5 minutes on 2 cores with bf16): SFT of SmolLM2-135M-Instruct on 512 traces."""
    reproduce(RECIPE, EXPECTED["cpu"], tmp_path, "recipes/sft cpu tier")
    assert (tmp_path / "curves.png").is_file()


def test_a_resumed_sft_run_continues_with_the_uninterrupted_runs_losses(tmp_path):
    """``hybridrl train sft`` on a tiny model (local backend, fp32): 4 steps straight, against 2 steps that save and
    stop and a second run that resumes from that checkpoint: steps 3 and 4 have the same loss to the last digit (the
    actor, its optimizer, the data position and the RNG all come back)."""
    from core.cli import main
    from core.models import tiny_random_model
    from core.report import read_metrics
    from core.scaffold import tiny_data, tiny_overrides

    model = tiny_random_model(tmp_path / "model")
    tiny_data(tmp_path, conversations=True)

    def run(out: str, steps: int, save: int) -> dict[int, float]:
        args = [a for a in tiny_overrides(tmp_path, model) if not a.startswith(("++trainer.output_dir",
                                                                                 "++trainer.total_steps",
                                                                                 "++trainer.save_freq"))]
        assert main(["train", "sft", *args, f"++trainer.output_dir={tmp_path / out}",
                     f"++trainer.total_steps={steps}", f"++trainer.save_freq={save}"]) == 0
        return {m["step"]: m["sft/nll_loss"] for m in read_metrics(tmp_path / out / "metrics.jsonl")
                if "sft/nll_loss" in m}

    straight = run("straight", 4, 0)
    first = run("resumed", 2, 2)
    resumed = run("resumed", 4, 2)  # resume_mode auto: from step 2's checkpoint
    assert sorted(first) == [1, 2] and sorted(resumed) == [1, 2, 3, 4]
    # it resumed (a fresh run would have moved the first run's metrics.jsonl aside and started from step 1)
    assert (tmp_path / "resumed" / "checkpoints" / "step_000002").is_dir()
    assert not list((tmp_path / "resumed").glob("metrics.*.jsonl"))
    assert [resumed[s] for s in (3, 4)] == [straight[s] for s in (3, 4)], (straight, resumed)
    assert [first[s] for s in (1, 2)] == [straight[s] for s in (1, 2)]
