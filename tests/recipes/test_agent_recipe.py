"""recipes/agent: configs validate, the data is held out by content, the reward is right by hand, the ReTool
script plans, and (slow) the CPU tier reproduces recipes/agent/expected.yaml."""

import json
from pathlib import Path

import pytest

from core.cli import recipe_module
from core.data.dataset import load_rl_parquet
from core.data.retool import ANSWER_FORMAT, CODE_INTERPRETER, RETOOL_SYSTEM
from core.expected import load_expected
from core.rewards import load_reward_fn
from core.run import load_run_config
from tests.recipes.plans import plan
from tests.recipes.tiers import reproduce

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "agent"
EXPECTED = load_expected(RECIPE)


def data_module():
    return recipe_module(RECIPE, "data")


@pytest.mark.parametrize("name", ["config", "retool_qwen32b"])
def test_recipe_configs_validate_as_agent_runs(name):
    from core.checks import check_run
    from core.plan_report import effective_sizes

    cfg = load_run_config(RECIPE, name)
    check_run(cfg)
    assert cfg.rollout.agent.enable and cfg.actor.temperature == cfg.algo.sampling.temperature
    assert "samples per step" in effective_sizes(cfg, dp_size=2)


def test_the_cpu_tier_is_what_expected_yaml_describes():
    cfg = load_run_config(RECIPE, "config")
    assert cfg.trainer.total_steps == EXPECTED["cpu"]["steps"]
    assert cfg.data.train_files == ["outputs/data/agent_mult/train.parquet"]
    assert cfg.data.val_files == ["outputs/data/agent_mult/test.parquet"]
    assert cfg.rollout.agent.tools == ("calculator",)


def test_the_test_problems_are_held_out_by_content(tmp_path):
    data = data_module()
    paths = data.write_mult(tmp_path, train_count=3000, test_count=64)
    train, test = (load_rl_parquet(paths[s]) for s in ("train", "test"))

    def pair(row):  # "What is a * b?" -> (min, max)
        return tuple(sorted(map(int, row["extra_info"]["question"][8:-1].split(" * "))))

    test_pairs, train_pairs = {pair(r) for r in test}, {pair(r) for r in train}
    assert len(test_pairs) == 64 and not test_pairs & train_pairs            # distinct, and never trained on
    assert tuple(sorted(data.EXAMPLE)) not in test_pairs | train_pairs       # the prompt's own example is neither
    assert all(data.held_out(*p) for p in test_pairs) and not any(data.held_out(*p) for p in train_pairs)
    for r in test[:5]:
        a, b = pair(r)
        assert r["ground_truth"] == str(a * b) and data.LOW <= a <= b <= data.HIGH
        assert r["prompt"][:-1] == data.ONE_SHOT and r["prompt"][-1]["content"] == r["extra_info"]["question"]
    # the same files on every machine: the split and the draw depend only on the seed
    again = data.write_mult(tmp_path / "again", train_count=3000, test_count=64)
    assert [r["prompt"] for r in load_rl_parquet(again["test"])] == [r["prompt"] for r in test]


def test_reward_by_hand():
    fn = load_reward_fn(RECIPE / "reward.py")
    mult = "hybridrl/agent_mult"
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "123 * 456"}}</tool_call>'
    assert fn(mult, call + "The answer is 56088.", "56088")["score"] == 1.0
    assert fn(mult, call + "The answer is 56,088.", "56088")["score"] == 1.0
    assert fn(mult, "123 * 456 = 56088", "56088")["score"] == 1.0            # right without the tool counts
    assert fn(mult, call, "56088")["score"] == 0.0                          # numbers inside the call do not
    assert fn(mult, call + "The answer is 5608.", "56088")["score"] == 0.0
    # ReTool: +1 right; wrong: -1 raised 0.1 per tool round (num_turns - 1), capped at -0.6
    assert fn("aime24", "so \\boxed{204}", "204", {"num_turns": 1})["score"] == 1.0
    assert fn("aime24", "so \\boxed{205}", "204", {"num_turns": 1})["score"] == -1.0
    assert fn("math_dapo", "\\boxed{7}", "204", {"num_turns": 4})["score"] == pytest.approx(-0.7)
    assert fn("math_dapo", "\\boxed{7}", "204", {"num_turns": 8})["score"] == pytest.approx(-0.6)
    assert fn("aime24", "no box", "204", {"num_turns": 2})["score"] == pytest.approx(-0.9)


def test_retool_data_is_verl_s_prompt_with_the_tool_in_the_system_message(tmp_path):
    data = data_module()
    (tmp_path / "aime24").mkdir()
    (tmp_path / "aime24" / "test.jsonl").write_text(json.dumps({"problem": "Find x.", "answer": 204}) + "\n")
    (tmp_path / "dapo.jsonl").write_text(json.dumps({"problem": "What is 1 + 1?", "answer": "2"}) + "\n")
    paths = data.write_retool(str(tmp_path / "dapo.jsonl"), tmp_path, tmp_path / "out")
    aime, train = load_rl_parquet(paths["aime24"]), load_rl_parquet(paths["train"])
    assert aime[0]["prompt"] == [{"role": "system", "content": RETOOL_SYSTEM},
                                 {"role": "user", "content": "Find x." + ANSWER_FORMAT}]
    assert aime[0]["ground_truth"] == "204" and aime[0]["data_source"] == "aime24"
    assert train[0]["prompt"][1]["content"].endswith("What is 1 + 1?\n\nRemember to put your answer on its own "
                                                     "line after \"Answer:\"." + ANSWER_FORMAT)
    assert json.dumps(CODE_INTERPRETER) in RETOOL_SYSTEM and "<tool_call>" in RETOOL_SYSTEM


def test_full_scale_script_plans_and_fits(capsys):
    """The ReTool yaml, planned: it composes and validates, and the capacity plan fits 2 x 8 GPUs."""
    rc, out = plan(capsys, "agent", "retool_qwen32b")
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2.5-32B-Instruct on 16 cuda rank(s)" in out
    assert "samples per step           8192" in out
    assert out.rstrip().endswith("fits")


@pytest.mark.slow
def test_cpu_tier_reproduces_expected_yaml(tmp_path):
    """The real CPU tier (about 5 minutes on 2 cores with bf16): SmolLM2-135M-Instruct with a calculator."""
    reproduce(RECIPE, EXPECTED["cpu"], tmp_path, "recipes/agent cpu tier")
    assert (tmp_path / "curves.png").is_file() and (tmp_path / "val_generations.jsonl").is_file()
