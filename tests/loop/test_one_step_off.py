"""One-step-off-policy async training (core/one_step_off.py, ``trainer.async``) through the whole trainer (``fit``,
Ray, the actor and reference on one pool, the rollout on another):

- with the overlap off, the async machinery (prompts drawn ahead, generations started without waiting, versions,
  checkpointed samples) gives the synchronous loop's metrics exactly;
- with it on, step 1 is the synchronous one and every later step trains on samples exactly one update stale
  (their engine log-probs no longer match the actor's), and a run resumed from a checkpoint goes on exactly as the
  uninterrupted one (the samples generated ahead are in the checkpoint)."""

import pytest

from tests.test_checkpoint import fit_run as run, write_run

pytestmark = pytest.mark.ray

SPLIT = ("placement.pools.main={nnodes: 1, slots_per_node: 1}", "placement.pools.gen={nnodes: 1, slots_per_node: 1}",
         "placement.roles={actor: main, ref: main, rollout: gen}")
OFF_POLICY_KEYS = ("rollout/policy_version", "rollout/staleness_mean", "rollout/staleness_max",
                   "rollout/partial_frac", "rollout/ratio_dev/")


def without(metrics: dict, keys=OFF_POLICY_KEYS) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(keys)}


@pytest.mark.heavy  # three Ray runs, ~35 s
def test_one_step_off_equals_the_synchronous_loop_without_overlap_and_is_one_step_stale_with_it(
        ray_module_session, tmp_path, tiny_model_dir):
    conf = write_run(tmp_path, tiny_model_dir, total_steps=3, save_freq=2, backend="ray")
    # the synchronous loop with the truncated IS a one-step-off run turns on by default (trainer.async.tis_cap)
    sync = run(conf, tmp_path / "sync", *SPLIT, "algo.tis_cap=2.0")
    seq = run(conf, tmp_path / "seq", *SPLIT, "trainer.async.mode=one_step_off", "trainer.async.overlap=false")
    assert sorted(seq) == sorted(sync) == [1, 2, 3]
    assert all(seq[s]["rollout/staleness_max"] == 0 for s in seq)
    assert all(without(seq[s]) == sync[s] for s in sync)                      # exactly, every metric
    assert all(sync[s]["rollout/logprob_diff_max"] < 1e-4 for s in sync)     # the engine has the actor's weights

    ahead = run(conf, tmp_path / "ahead", *SPLIT, "trainer.async.mode=one_step_off")
    assert [ahead[s]["rollout/policy_version"] for s in (1, 2, 3)] == [0, 0, 1]
    assert [ahead[s]["rollout/staleness_max"] for s in (1, 2, 3)] == [0, 1, 1]
    assert all(ahead[s]["rollout/staleness_mean"] == ahead[s]["rollout/staleness_max"] for s in ahead)
    assert without(ahead[1]) == sync[1]                                      # step 1: the same samples and update
    # later steps sample from the weights before the last update: the engine's log-probs are not the actor's
    assert all(ahead[s]["rollout/logprob_diff_max"] > 1e-3 for s in (2, 3))
    assert all(0 < ahead[s]["rollout/tis_weight_mean"] for s in (2, 3))

    resumed = run(conf, tmp_path / "resumed", *SPLIT, "trainer.async.mode=one_step_off",
                  f"trainer.resume_mode={tmp_path / 'ahead' / 'checkpoints' / 'step_000002'}")
    assert sorted(resumed) == [3] and resumed[3] == ahead[3]
