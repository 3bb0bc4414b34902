"""A rollout replica lost mid-run (``core.replicas``): its process SIGKILLed, its rows go to the replicas left and
the run goes on -- named in the log and metrics -- with the samples the lost replica would have drawn (each row
seeded by its index in the batch), so a whole run's metrics equal the uninterrupted run's (fp32, same seeds). The
run stops, named and resumable, when fewer than ``rollout.min_replicas`` are left."""

import os
import signal
import time

import pytest
import torch

from core.protocol import Batch
from core.rollout import packed
from core.replicas import RolloutReplicas
from core.worker import RoleSpec
from core.worker_group import ResourcePool, WorkerDiedError, WorkerGroup
from tests.test_checkpoint import fit_run, write_run

pytestmark = pytest.mark.ray


class Sampler:
    """A stand-in for the rollout role: each row's output depends on its ``prompt_index`` only, and says which
    rank produced it."""

    def __init__(self, ctx):
        self.ctx = ctx

    def generate(self, prompts: Batch) -> Batch:
        n = len(prompts)
        return Batch({"y": prompts["prompt_index"] * 10, "rank": torch.full((n,), self.ctx.rank)})

    def pid(self) -> int:
        return os.getpid()

    def slow_generate(self, prompts: Batch, seconds: float) -> Batch:
        time.sleep(seconds)
        return self.generate(prompts)


def wait_dead(pid: int) -> None:
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def test_a_chunk_whose_replica_dies_runs_on_another_and_too_few_left_stops_the_run(ray_module_session):
    group = WorkerGroup(ResourcePool(slots_per_node=3), {"rollout": RoleSpec(Sampler)}, timeout_s=60)
    try:
        said = []
        replicas = RolloutReplicas(group.role("rollout"), min_replicas=1, log=said.append)
        prompts = Batch({"x": torch.zeros(6)})
        assert replicas.dp_split(Sampler.generate, prompts)["rank"].tolist() == [0, 0, 1, 1, 2, 2]
        victim = group.pids[1]
        pending = replicas.dp_split_async(Sampler.slow_generate, prompts, 2.0)
        os.kill(victim, signal.SIGKILL)                      # mid-call
        out = pending()
        assert out["y"].tolist() == [0, 10, 20, 30, 40, 50]   # every row, in order, as without the loss
        assert out["rank"].tolist() == [0, 0, 0, 0, 2, 2]     # replica 1's rows ran on replica 0
        assert replicas.live == [0, 2] and replicas.metrics() == {"rollout/replicas_lost": 1.0,
                                                                   "rollout/groups_requeued": 2.0}
        assert len(said) == 1 and "rollout replica 1 (rank 1) lost in Sampler.slow_generate" in said[0]
        assert f"pid {victim}" in said[0] and "2 prompt row(s) re-queued on replica 0" in said[0]
        assert "2 of 3 rollout replicas left" in said[0]
        assert replicas.dp_split(Sampler.generate, Batch({"x": torch.zeros(3)}))["rank"].tolist() == [0, 0, 2]
        assert replicas.call_all(Sampler.pid) == [group.pids[0], group.pids[2]]
        assert group.config_reads() == set()                 # the group's own calls skip the lost rank

        replicas.min_replicas = 2
        os.kill(group.pids[2], signal.SIGKILL)
        wait_dead(group.pids[2])
        with pytest.raises(WorkerDiedError, match=r"1 of 3 rollout replicas left, fewer than rollout.min_replicas=2"):
            replicas.dp_split(Sampler.generate, prompts)
    finally:
        group.shutdown()


def test_padding_rows_of_a_lost_chunk_are_not_counted_as_requeued(ray_module_session):
    group = WorkerGroup(ResourcePool(slots_per_node=3), {"rollout": RoleSpec(Sampler)}, timeout_s=60)
    try:
        replicas = RolloutReplicas(group.role("rollout"), log=lambda _: None)
        # 5 rows over 3 replicas: padded to 6, chunks [0, 1], [2, 3], [4, 0 again]; replica 2 holds one real row
        pending = replicas.dp_split_async(Sampler.slow_generate, Batch({"x": torch.zeros(5)}), 2.0)
        os.kill(group.pids[2], signal.SIGKILL)
        out = pending()
        assert out["y"].tolist() == [0, 10, 20, 30, 40] and out["rank"].tolist() == [0, 0, 1, 1, 0]
        assert replicas.metrics() == {"rollout/replicas_lost": 1.0, "rollout/groups_requeued": 1.0}
    finally:
        group.shutdown()


SPLIT = ("placement.pools.main={nnodes: 1, slots_per_node: 1}", "placement.pools.gen={nnodes: 1, slots_per_node: 2}",
         "placement.roles={actor: main, rollout: gen}")
REPLICAS = ("rollout/replicas_lost", "rollout/groups_requeued")
ROUNDING = ("rollout/logprob_diff_mean", "rollout/logprob_diff_max")


@pytest.mark.heavy  # six Ray runs, ~2 min
@pytest.mark.parametrize("mode", ["sync", "one_step_off", "streaming"])
def test_a_run_that_loses_a_rollout_replica_ends_with_the_uninterrupted_metrics(ray_module_session, tmp_path,
                                                                                tiny_model_dir, mode, capsys):
    """2 rollout replicas on a pool of their own; rank 1 SIGKILLed at the start of step 2 (one step off: while it
    generates step 3's samples ahead). The run ends; the log names the loss; every step's metrics equal the
    uninterrupted run's, but the two counters of the loss. Streaming at staleness 0: the lost groups start again
    at the version they started at, with their seeds."""
    from core.loop import step
    from core.run import load_run_config
    from core.trainer import fit
    from tests.test_checkpoint import read_metrics, steady

    conf = write_run(tmp_path, tiny_model_dir, total_steps=4, save_freq=0, backend="ray")
    opts = (*SPLIT, f"trainer.async.mode={mode}") + (
        ("trainer.async.max_staleness=0", "trainer.async.overlap_steps=4") if mode == "streaming" else ())
    whole = fit_run(conf, tmp_path / "whole", *opts)
    killed, steps = [], []

    def step_fn(roles, draw, algo, reward_fn, **kw):
        steps.append(1)
        if len(steps) == 2:
            killed.append(roles.rollout.group.pids[1])
            os.kill(killed[0], signal.SIGKILL)
            wait_dead(killed[0])
        return step(roles, draw(), algo, reward_fn, **kw)

    out = tmp_path / "lost"
    fit(load_run_config(conf, overrides=[f"trainer.output_dir={out}", *opts]), step_fn=step_fn)
    lost = steady(read_metrics(out / "metrics.jsonl"))
    said = capsys.readouterr()
    assert killed and "rollout replica 1 (rank 1) lost" in said.out + said.err
    assert sorted(lost) == sorted(whole) == [1, 2, 3, 4]
    assert [lost[s]["rollout/replicas_lost"] for s in (1, 2, 3, 4)] == [0, 1, 1, 1]
    assert sum(lost[s]["rollout/groups_requeued"] for s in lost) >= (mode != "one_step_off")
    differ = {(s, k): (lost[s][k], whole[s][k]) for s in whole for k in whole[s]
              if k not in REPLICAS and lost[s][k] != whole[s][k]}
    if packed.kernel_usable(torch.float32):  # a row decodes alike in any batch: every metric equal, bit for bit
        assert differ == {}, differ
    # on torch's kernels the same samples and rewards exactly, but not the engine's own log-probs: a replica running
    # more rows decodes in batches of another shape, whose fp32 sums round otherwise in the last bits -- in the
    # synchronous loop they feed only the rollout-vs-trainer gap, in the async modes also the importance weights,
    # and through them the losses (to ~1e-6 relative)
    assert not [k for _, k in differ if k.startswith(("reward/", "response_length/"))], differ
    assert mode != "sync" or {k for _, k in differ} <= set(ROUNDING), differ
    assert all(abs(a - b) <= 1e-5 * max(1.0, abs(b)) for a, b in differ.values()), differ
