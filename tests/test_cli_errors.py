"""A user's mistakes on the command line, as ``hybridrl plan|train`` answers them: one line on stderr naming the key,
where its value was set and the fix, exit code 2, no traceback, Ray never started (each row is a real ``hybridrl``
call in this process: ``core.cli.main``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.cli import main

RECIPE = "grpo"
ROOT = Path(__file__).resolve().parents[1]


def answer(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    got = capsys.readouterr()
    return rc, got.out, got.err


# (overrides, what the one line must contain). Every row: exit code 2, one line, the key named.
ROWS = [
    (["actor.optim.lrr=1e-6"], ["actor.optim.lrr: unknown key; did you mean 'lr'?",
                                "set on the command line: actor.optim.lrr=1e-6"]),
    (["critc.model=x"], ["critc: unknown key; did you mean 'critic'?"]),
    (["algo.adv.estimator=grpoo"], ["algo.adv.estimator='grpoo' is no advantage estimator; did you mean 'grpo'?",
                                    "set on the command line"]),
    (["actor.loss.name=vanila"], ["actor.loss.name='vanila'", "did you mean 'vanilla'?"]),
    (["actor.kl_loss_type=k4"], ["actor.kl_loss_type='k4'", "known:"]),
    (["data.prompts_per_step=-8"], ["data.prompts_per_step: must be >= 1, got -8"]),
    (["actor.ppo_mini_batch_size=-16"], ["actor.ppo_mini_batch_size: must be >= 1, got -16"]),
    (["actor.micro_batch_size=0"], ["actor.micro_batch_size: must be >= 1, got 0"]),
    (["actor.ppo_epochs=0"], ["actor.ppo_epochs: must be >= 1"]),
    (["actor.optim.lr=-1e-6"], ["actor.optim.lr: must be >= 0"]),
    (["algo.sampling.top_p=1.5"], ["algo.sampling.top_p: must be <= 1, got 1.5"]),
    (["algo.sampling.temperature=-1"], ["algo.sampling.temperature: must be >= 0"]),
    (["algo.sampling.n=0"], ["algo.sampling.n: must be >= 1"]),
    (["algo.adv.gamma=1.5"], ["algo.adv.gamma: must be <= 1"]),
    (["rollout.gpu_memory_utilization=1.2"], ["rollout.gpu_memory_utilization: must be <= 1"]),
    (["trainer.save_freq=-1"], ["trainer.save_freq: must be >= 0"]),
    (["trainer.total_steps=ten"], ["trainer.total_steps: expected int, got 'ten'"]),
    (["actor.micro_batch_size=abc"], ["actor.micro_batch_size: expected int, got 'abc'"]),
    (["trainer.backend=rayy"], ["trainer.backend: must be one of 'ray', 'local', got 'rayy'; did you mean 'ray'?"]),
    (["rollout.backend=vlm"], ["rollout.backend: must be one of", "did you mean 'vllm'?"]),
    (["placement.pools.main.device=gpu"], ["placement.pools.main.device: must be one of 'cpu', 'cuda', got 'gpu'"]),
    (["tools.isolation=none"], ["tools.isolation: must be one of 'namespaces', 'process'"]),
    (["data.truncation=middle"], ["data.truncation='middle': one of error, left, right"]),
    (["placement.roles.actor=nopool"], ["placement.roles names unknown pool(s) {'actor': 'nopool'}"]),
    (["use_critic=true"], ["use_critic is true but algo.adv.estimator='grpo' never reads the critic's values"]),
    (["rollout.agent.enable=true", "rollout.agent.tools=[pythn]"], ["rollout.agent.tools names unknown tool(s) ['pythn']",
                                                                    "did you mean 'python'?"]),
    (["reward.path=/nonexistent/reward.py"], ["reward.path: /nonexistent/reward.py not found"]),
    (["actor.model=./no/such/model", "rollout.model=./no/such/model"], ["problems", "actor.model: ./no/such/model not found"]),
    (["trainer.output_dir=/etc/hostname"], ["trainer.output_dir: /etc/hostname is a file, not a folder"]),
    (["data.train_files=["], ["does not parse"]),
]


@pytest.mark.parametrize("overrides,says", ROWS, ids=[" ".join(r[0]) for r in ROWS])
def test_a_mistake_is_one_line_with_the_key_its_source_and_the_fix(capsys, overrides, says):
    rc, out, err = answer(capsys, "plan", RECIPE, *overrides)
    assert rc == 2, (out, err)
    assert err.startswith("hybridrl: ") and "Traceback" not in err, err
    multi = "problems in the run config" in err
    assert multi or err.count("\n") == 1, err  # one line (several problems: one line each)
    for s in says:
        assert s in err, (s, err)


def test_where_a_value_was_set_a_file_and_line_or_the_command_line(capsys, tmp_path):
    (tmp_path / "config.yaml").write_text("trainer:\n  total_steps: 2\ndata:\n  prompts_per_step: -8\n")
    rc, _, err = answer(capsys, "plan", str(tmp_path))
    assert rc == 2 and err.strip().endswith(f"(set in {tmp_path / 'config.yaml'}:4)"), err
    rc, _, err = answer(capsys, "plan", str(tmp_path), "data.prompts_per_step=0")
    assert rc == 2 and "(set on the command line: data.prompts_per_step=0)" in err, err


def test_the_override_named_is_the_one_that_gave_the_value():
    """The key itself before the section holding it, the closest section before a wider one, the last of equals."""
    from core.config.errors import where_set

    given = ["placement.pools.main={nnodes: 2, slots_per_node: 8}", "++placement.pools.main.gpu_memory_gb=0",
             "placement={pools: {}}", "actor.optim.lr=1", "actor.optim.lr=2"]
    assert where_set("placement.pools.main.gpu_memory_gb", given, None) == \
        "set on the command line: placement.pools.main.gpu_memory_gb=0"
    assert where_set("placement.pools.main.nnodes", given, None) == \
        "set on the command line: placement.pools.main={nnodes: 2, slots_per_node: 8}"
    assert where_set("placement.pools", given, None) == "set on the command line: placement={pools: {}}"
    assert where_set("actor.optim.lr", given, None) == "set on the command line: actor.optim.lr=2"
    assert where_set("actor.optim", given, None) == "set on the command line: actor.optim.lr=2"
    assert where_set("critic.optim.lr", given, None) == "core's default"


def test_a_reward_file_that_does_not_parse_or_lacks_the_function_is_named_with_its_line(capsys, tmp_path):
    bad = tmp_path / "reward.py"
    bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                   "    return 1.0 if solution_str == ground_truth else 0\n\ndef other(:\n    pass\n")
    rc, _, err = answer(capsys, "plan", RECIPE, f"reward.path={bad}")
    assert rc == 2 and f"reward.path: {bad}:4: invalid syntax" in err and err.count("\n") == 1, err
    bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    rc, _, err = answer(capsys, "plan", RECIPE, f"reward.path={bad}", "reward.name=compute_scor")
    assert rc == 2 and f"reward.name: 'compute_scor' is not defined in {bad}; did you mean 'compute_score'?" in err


def test_missing_data_warns_a_plan_and_stops_a_run_before_ray(capsys):
    rc, out, _ = answer(capsys, "plan", RECIPE, "data.train_files=[/nonexistent/train.parquet]")
    assert rc == 0 and "warning: data.train_files: /nonexistent/train.parquet not found; grpo's data.py writes " \
                       "gsm8k/, arith_v2/ under a data folder, not nonexistent/" in out, out
    # a run: refused in a fresh interpreter that never starts Ray (this test process may hold the tests' Ray)
    code = ("import sys, ray\nfrom core.cli import main\n"
            "rc = main(['train', 'grpo', 'data.train_files=[/nonexistent/train.parquet]'])\n"
            "print(rc, ray.is_initialized())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.stdout.split() == ["2", "False"], r.stdout + r.stderr[-2000:]
    assert r.stderr.startswith("hybridrl: data.train_files: /nonexistent/train.parquet not found"), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_debug_shows_the_traceback(capsys):
    from core.config.errors import ConfigError

    with pytest.raises(ConfigError, match="did you mean 'lr'"):
        main(["plan", RECIPE, "actor.optim.lrr=1e-6", "--debug"])
