"""Keys a user set that nothing in the run reads: recorded as the driver and every worker read the config
(``core.config.reads``), warned of after the first step -- real runs on a tiny model, locally and on Ray."""

import dataclasses
import pickle
import shutil
from pathlib import Path

import pytest

from core.cli import main as cli_main
from core.config import RolloutConfig, RunConfig, reads, validate
from core.scaffold import tiny_data, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def test_reads_are_recorded_by_key_and_the_hooks_come_off():
    assert reads.stop() == set()  # no run before this one in the process left its recording on
    cfg = validate(RunConfig, {"trainer": {"n_gpus_per_node": 8}})
    reads.label(cfg)
    reads.start(cfg)
    _ = cfg.trainer.total_steps, cfg.placement.pools["main"].slots_per_node, cfg.trainer.async_.mode
    _ = cfg.rollout  # reaching a section is no read of its keys
    with reads.paused():
        dataclasses.asdict(cfg)  # a copy for config.json is no use
    got = reads.stop()
    assert got == {"trainer.total_steps", "placement.pools.main.slots_per_node", "trainer.async.mode"}
    assert "__getattribute__" not in vars(RolloutConfig)  # after stop, reads cost what they did
    assert cfg.trainer.total_steps == 10 and reads.stop() == set()


def test_a_sections_key_survives_pickling_into_a_worker():
    cfg = validate(RunConfig, {})
    reads.label(cfg)
    rollout = pickle.loads(pickle.dumps(cfg.rollout))
    reads.start(rollout)
    _ = rollout.max_batch_size
    assert reads.stop() == {"rollout.max_batch_size"}


def test_unread_counts_a_dict_valued_key_read_whole_and_an_interpolation_as_reads():
    given = {"trainer.runtime_env.working_dir", "critic.optim.lr", "trainer.nnodes", "actor.optim.lr"}
    assert reads.unread(given, {"trainer.runtime_env", "actor.optim.lr"}) == ["critic.optim.lr", "trainer.nnodes"]
    assert reads.interpolated({"placement": {"pools": {"main": {"nnodes": "${trainer.nnodes}"}}}, "x": [1, "a"]}) \
        == {"trainer.nnodes"}
    assert reads.given_keys({"defaults": ["config"], "a": {"b": 1, "c": {"d": [1, 2]}}}) == {"a.b", "a.c.d"}


@pytest.fixture()
def grpo(tmp_path, tiny_model_dir, monkeypatch):
    """A copy of the grpo recipe, tiny data and the tiny model's overrides; the working directory is tmp_path."""
    shutil.copytree(ROOT / "recipes" / "grpo", tmp_path / "recipes" / "grpo", ignore=shutil.ignore_patterns("__pycache__"))
    tiny_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "recipes" / "grpo", tiny_overrides(tmp_path, tiny_model_dir)


def warnings(out: str) -> dict[str, str]:
    lines = [line.split("warning: ", 1)[1] for line in out.splitlines() if "warning: " in line]
    return {line.split(":", 1)[0]: line for line in lines}


# the three cases: a GPU count on a CPU pool; a critic section in a run without a critic; an option the embedded
# rollout engine does not have (vLLM's and SGLang's memory fraction)
CASES = ["trainer.n_gpus_per_node=8", "critic.optim.lr=1e-5", "rollout.gpu_memory_utilization=0.9"]


def test_three_keys_nothing_reads_are_warned_of_in_a_local_run(grpo, capsys):
    recipe, tiny = grpo
    assert cli_main(["train", str(recipe), *tiny, "trainer.total_steps=1", *CASES]) == 0
    warned = warnings(capsys.readouterr().out)
    for case in CASES:
        key = case.split("=")[0]
        assert warned[key] == (f"{key}: set, but nothing in this run reads it, so it changes nothing (set on the "
                               f"command line: {case})")
    # the local backend runs every role in one process: the yaml's pools are not read, and that is said too
    assert "placement.pools.main.slots_per_node" in warned
    # what the run does read is not warned of: the driver's, the step's, the roles'
    for key in ("trainer.total_steps", "actor.optim.lr", "algo.sampling.n", "rollout.max_prompt_length",
                "data.prompts_per_step", "reward.path"):
        assert key not in warned, warned[key]


def test_the_workers_reads_count_in_a_ray_run(grpo, capsys, ray_shared):
    """rollout.max_batch_size is read only by the rollout engine in the worker processes: not warned of, because
    their reads come back; the pools are read on Ray."""
    recipe, tiny = grpo
    argv = ["train", str(recipe), *tiny, "trainer.total_steps=1", "trainer.backend=ray",
            "placement.pools.main.slots_per_node=1", "rollout.max_batch_size=8", *CASES]
    assert cli_main(argv) == 0
    warned = warnings(capsys.readouterr().out)
    assert {c.split("=")[0] for c in CASES} <= set(warned)
    assert "rollout.max_batch_size" not in warned and "placement.pools.main.slots_per_node" not in warned
    assert not any(k.startswith(("actor.", "algo.", "data.")) for k in warned), warned
