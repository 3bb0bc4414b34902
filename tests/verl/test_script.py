"""convert-verl: a verl-style run script (written here in verl's manner: environment defaults, derived values, a
launcher in front, probes) runs under the stand-ins, and its final command line is what bash would have run."""

import textwrap

import pytest

from core.cli import main as cli_main
from core.verl.script import ScriptError, recorded_calls, verl_overrides

SCRIPT = textwrap.dedent("""\
    #!/usr/bin/env bash
    set -xeuo pipefail
    ulimit -n 32768
    DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
    NNODES=${NNODES:-1}
    GPUS=${GPUS:-2}
    N=${N:-4}
    PROMPTS=$((GPUS * 4))
    LAUNCH=(python3)
    if [ "${VERL_USE_UV:-1}" = 1 ]; then LAUNCH=(uv run --frozen python3); fi
    python3 -c "import vllm"  || echo "no vllm here"
    "${LAUNCH[@]}" -m verl.trainer.main_ppo \\
        algorithm.adv_estimator=grpo \\
        data.train_files="['$HOME/data/a.parquet', '$HOME/data/b.parquet']" \\
        data.train_batch_size=$PROMPTS \\
        actor_rollout_ref.model.path=SmolLM2-135M-Instruct \\
        actor_rollout_ref.rollout.n=$N \\
        actor_rollout_ref.actor.ppo_mini_batch_size=$((PROMPTS / 2)) \\
        actor_rollout_ref.rollout.name=vllm \\
        trainer.device=$([ "$DEVICE" = gpu ] && echo cuda || echo npu) \\
        trainer.nnodes=$NNODES trainer.n_gpus_per_node=$GPUS "$@"
    """)


@pytest.fixture()
def script(tmp_path):
    path = tmp_path / "run_grpo.sh"
    path.write_text(SCRIPT)
    return path


def test_the_final_command_line_is_read_after_bash_expands_it(script, monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    monkeypatch.delenv("VERL_USE_UV", raising=False)
    calls = recorded_calls(script, env={"GPUS": "8"})
    overrides, launcher = verl_overrides(calls, script)
    assert launcher == "uv run --frozen python3 -m verl.trainer.main_ppo"
    assert overrides == ["algorithm.adv_estimator=grpo", "data.train_files=['/home/u/data/a.parquet', "
                         "'/home/u/data/b.parquet']", "data.train_batch_size=32",
                         "actor_rollout_ref.model.path=SmolLM2-135M-Instruct", "actor_rollout_ref.rollout.n=4",
                         "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.rollout.name=vllm",
                         "trainer.device=cuda", "trainer.nnodes=1", "trainer.n_gpus_per_node=8"]
    assert ["python3", "-c", "import torch_npu"] in calls.calls  # the probe ran, failed, and the script took gpu


def test_a_script_that_calls_no_verl_trainer_is_named(tmp_path):
    path = tmp_path / "prep.sh"
    path.write_text("python3 examples/data_preprocess/gsm8k.py --local_dir ~/data/gsm8k\n")
    with pytest.raises(ScriptError, match="calls no verl trainer .*it called python3"):
        verl_overrides(recorded_calls(path), path)


def test_convert_verl_prints_the_command_and_writes_a_config_that_plans(script, tmp_path, capsys):
    out = tmp_path / "converted"
    assert cli_main(["convert-verl", str(script), "--out", str(out), "--env", "GPUS=2"]) == 0
    text = capsys.readouterr().out
    assert "# verl keys: 10 given, 10 translated, 0 not applicable here, 0 unsupported" in text
    assert "hybridrl train --verl \\\n    algorithm.adv_estimator=grpo \\\n" in text
    config = (out / "config.yaml").read_text()
    assert "ppo_mini_batch_size: 16" in config  # 4 prompts x n=4 (PROMPTS=8, /2)
    assert "slots_per_node: 2" in config and "total_epochs: 30" in config  # verl's default epochs
    rc = cli_main(["plan", str(out), "placement.pools.main.device=cpu", "rollout.backend=embedded",
                   "rollout.tensor_parallel_size=1"])
    assert rc == 0 and "samples per step           32  (= prompts x n=4)" in capsys.readouterr().out


def test_the_corpus_survey_counts_each_outcome(tmp_path, capsys):
    from core.verl.corpus import main as corpus

    (tmp_path / "examples" / "grpo_trainer").mkdir(parents=True)
    (tmp_path / "examples" / "grpo_trainer" / "run_ok.sh").write_text(SCRIPT.replace(
        '"$@"', 'trainer.device=cpu actor_rollout_ref.rollout.name=embedded "$@"'))
    (tmp_path / "examples" / "grpo_trainer" / "run_distill.sh").write_text(
        "python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo distillation.enabled=True\n")
    (tmp_path / "examples" / "grpo_trainer" / "run_moved.sh").write_text("echo moved; exit 1\n")
    assert corpus([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    counts = next(line for line in out.splitlines() if line.startswith("3 scripts: "))
    assert sorted(counts[len("3 scripts: "):].split(", ")) == ["1 no verl run", "1 plans clean", "1 unsupported"]
    assert "run_moved.sh: exits 1 before it calls python: moved" in out
    assert "    1  distillation.enabled: no on-policy distillation" in out
