"""``actor.strategy`` / ``critic.strategy: megatron`` through the whole trainer (``fit`` on a recipe config, Ray, 2
ranks, fp32, PPO with GAE and an adaptive KL-in-reward): the actor, the reference and the critic on Megatron-core at
TP 2, and the actor and reference over 2 pipeline stages, give the same step metrics as FSDP2 over 2 DP ranks --
generation after each weight sync, log-probs, values, KL, both updates -- and a run resumed from the Megatron
checkpoints continues exactly as the run that was not stopped."""

import json

import pytest

pytest.importorskip("megatron.core")

from tests.test_checkpoint import fit_run as run, write_run  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.mark.heavy  # ~40 s; test_megatron_actor / _critic cover TP2 against FSDP in make test
def test_megatron_tp2_run_equals_fsdp_and_resumes_exactly(ray_module_session, tmp_path, tiny_model_dir):
    conf = write_run(tmp_path, tiny_model_dir, total_steps=4, save_freq=2, critic=True, backend="ray")
    # one mini-batch per step: FSDP's 2 DP ranks and Megatron's one DP group of 2 TP ranks then train on the same
    # rows per optimizer step (with 2 mini-batches the DP split decides which rows share one)
    one_mini = ("actor.ppo_mini_batch_size=8", "critic.ppo_mini_batch_size=8")
    megatron = ("actor.strategy=megatron", "actor.megatron.tp=2", "critic.strategy=megatron", "critic.megatron.tp=2",
                *one_mini)
    mg = run(conf, tmp_path / "megatron", *megatron)
    fsdp = run(conf, tmp_path / "fsdp", *one_mini)
    assert sorted(mg) == sorted(fsdp) == [1, 2, 3, 4]
    for s in mg:
        assert sorted(mg[s]) == sorted(fsdp[s]), s
        for k, v in fsdp[s].items():
            if isinstance(v, float) and not k.startswith(("timing_s/", "perf/")):
                assert mg[s][k] == pytest.approx(v, rel=1e-3, abs=1e-4), (s, k, mg[s][k], v)
    # two pipeline stages for the actor and the reference (the critic on FSDP2: colocated Megatron roles share one
    # layout): the same metrics again
    pp = run(conf, tmp_path / "pipeline", "actor.strategy=megatron", "actor.megatron.pp=2", *one_mini,
             "trainer.save_freq=0")
    for s in pp:
        for k, v in fsdp[s].items():
            if isinstance(v, float) and not k.startswith(("timing_s/", "perf/", "sync/")):
                assert pp[s][k] == pytest.approx(v, rel=1e-3, abs=1e-4), (s, k, pp[s][k], v)
    # the engine generated from the synced Megatron weights: the trainer's log-probs of its samples match them
    assert mg[4]["rollout/logprob_diff_max"] < 1e-4 and mg[4]["actor/grad_norm"] > 0 and mg[4]["critic/grad_norm"] > 0
    # a run resumed from the Megatron checkpoint after step 2 (each TP rank's shard, optimizer, RNG) goes on exactly
    resumed = run(conf, tmp_path / "resumed", *megatron,
                  f"trainer.resume_mode={tmp_path / 'megatron' / 'checkpoints' / 'step_000002'}")
    assert sorted(resumed) == [3, 4] and all(resumed[s] == mg[s] for s in (3, 4))
    saved = json.loads((tmp_path / "megatron" / "config.json").read_text())
    assert [saved[r]["strategy"] for r in ("actor", "critic")] == ["megatron", "megatron"]
