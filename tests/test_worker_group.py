"""Worker groups on real Ray with 2 CPU ranks (gloo): dispatch, placement, collectives, failures."""

import os
import signal
import threading
import time

import warnings

import pytest
import torch
import torch.distributed as dist

from core.config import PlacementConfig, validate
from core.placement import place
from core.protocol import Batch
from core.worker import RoleSpec
from core.worker_group import (LocalWorkerGroup, ResourcePool, WorkerDiedError, WorkerError, WorkerGroup,
                               WorkerTimeoutError)

pytestmark = pytest.mark.ray


class Echo:
    """A tiny role: enough state and methods to observe dispatch from the outside."""

    def __init__(self, ctx, offset: float = 0.0):
        self.ctx, self.offset = ctx, offset
        self.weights = torch.arange(4.0)

    def double(self, batch: Batch) -> Batch:
        n = len(batch)
        return Batch({"y": batch["x"] * 2 + self.offset, "rank": torch.full((n,), self.ctx.rank),
                      "rows_seen": torch.full((n,), n)}, {"uid": batch["uid"]})

    def pid(self) -> int:
        return os.getpid()

    def weights_ptr(self) -> int:
        return self.weights.data_ptr()

    def allreduce_rank_plus_one(self) -> float:
        t = torch.tensor([self.ctx.rank + 1.0])
        dist.all_reduce(t)
        return t.item()

    def fail_on_rank1(self) -> str:
        if self.ctx.rank == 1:
            raise ValueError("bad value in row 3")
        return "ok"

    def fail(self) -> None:
        raise ValueError("always")

    def sleep_rank1_then_allreduce(self, seconds: float) -> float:
        if self.ctx.rank == 1:
            time.sleep(seconds)
        return self.allreduce_rank_plus_one()

    def say(self, text: str) -> None:
        print(f"{text} (print)", flush=True)
        warnings.warn(f"{text} (warning)")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def rank1_exits_during_allreduce(self) -> float:
        if self.ctx.rank == 1:
            import torch.distributed as dist

            time.sleep(0.5)                # rank 0 is inside all_reduce by now
            dist.destroy_process_group()   # its gloo connections close: rank 0's collective fails at once...
            time.sleep(1.0)
            os._exit(1)                    # ...a second before this process dies
        return self.allreduce_rank_plus_one()


class Reader:
    """A second role that reads its colocated sibling's memory."""

    def __init__(self, ctx):
        self.ctx = ctx

    def pid(self) -> int:
        return os.getpid()

    def actor_weights_ptr(self) -> int:
        return self.ctx.colocated["actor"].weights.data_ptr()


@pytest.fixture(scope="module")
def ray_session(ray_shared):
    yield


@pytest.fixture(scope="module")
def echo_group(ray_session):
    group = WorkerGroup(ResourcePool(slots_per_node=2), {"actor": RoleSpec(Echo, {"offset": 0.5})}, timeout_s=120)
    yield group
    group.shutdown()


def x_batch(n: int) -> Batch:
    return Batch({"x": torch.arange(n, dtype=torch.float32)}, {"uid": [f"p{i}" for i in range(n)]})


@pytest.mark.parametrize("n", [5, 1, 4])
def test_dp_split_uneven_batches_are_padded_then_unpadded(echo_group, n):
    out = echo_group.role("actor").dp_split(Echo.double, x_batch(n))
    assert len(out) == n
    assert out["y"].tolist() == [2 * i + 0.5 for i in range(n)]
    assert out["uid"].tolist() == [f"p{i}" for i in range(n)]
    per_rank = (n + 1) // 2  # each rank saw an equal, padded chunk
    assert out["rows_seen"].tolist() == [per_rank] * n
    assert out["rank"].tolist() == [0] * per_rank + [1] * (n - per_rank)


def test_mp_peers_share_a_chunk_and_only_the_first_reports(ray_session):
    group = WorkerGroup(ResourcePool(slots_per_node=2), {"tp": RoleSpec(Echo, mp_size=2)}, timeout_s=120)
    try:
        tp = group.role("tp")
        assert (tp.dp_size, tp.mp_size) == (1, 2)
        out = tp.dp_split(Echo.double, x_batch(5))
        assert out["rank"].tolist() == [0] * 5 and out["rows_seen"].tolist() == [5] * 5
    finally:
        group.shutdown()


def test_allreduce_inside_the_group_sums_over_ranks(echo_group):
    assert echo_group.role("actor").call_all(Echo.allreduce_rank_plus_one) == [3.0, 3.0]


def test_call_rank0_runs_on_rank0_only(echo_group):
    assert echo_group.role("actor").call_rank0(Echo.pid) == echo_group.pids[0]


def test_dispatch_rejects_a_method_of_another_class(echo_group):
    with pytest.raises(TypeError, match="not a method of role 'actor'"):
        echo_group.role("actor").call_all(Reader.pid)


def test_colocated_roles_share_a_process_split_roles_do_not(ray_session):
    cfg = validate(PlacementConfig, {"pools": {"train": {"slots_per_node": 2}, "infer": {"slots_per_node": 2}},
                                     "roles": {"actor": "train", "rollout": "train", "ref": "infer"}})
    placement = place(cfg, {"actor": RoleSpec(Echo), "rollout": RoleSpec(Reader), "ref": RoleSpec(Echo)}, "ray")
    try:
        actor = placement["actor"].call_all(Echo.pid)
        rollout = placement["rollout"].call_all(Reader.pid)
        ref = placement["ref"].call_all(Echo.pid)
        assert actor == rollout and len(set(actor)) == 2
        assert not set(ref) & set(actor) and len(set(ref)) == 2
        # colocated means the same memory: the rollout role sees the actor's tensor itself, not a copy
        assert placement["rollout"].call_all(Reader.actor_weights_ptr) == placement["actor"].call_all(Echo.weights_ptr)
        # each pool is its own torch.distributed world of 2
        assert placement["ref"].call_all(Echo.allreduce_rank_plus_one) == [3.0, 3.0]
    finally:
        placement.shutdown()


def test_a_raising_worker_names_role_rank_method_and_remote_traceback(echo_group):
    with pytest.raises(WorkerError) as info:
        echo_group.role("actor").call_all(Echo.fail_on_rank1)
    err = info.value
    assert (err.role, err.rank, err.method) == ("actor", 1, "Echo.fail_on_rank1")
    assert "role 'actor' rank 1 failed in Echo.fail_on_rank1: ValueError: bad value in row 3" in str(err)
    assert "fail_on_rank1" in err.remote_traceback and "raise ValueError" in err.remote_traceback
    assert echo_group.role("actor").call_all(Echo.allreduce_rank_plus_one) == [3.0, 3.0]  # group still usable


def test_a_killed_worker_is_named_while_its_peer_hangs_in_a_collective(ray_session):
    group = WorkerGroup(ResourcePool(slots_per_node=2), {"actor": RoleSpec(Echo)}, timeout_s=90)
    try:
        victim = group.pids[1]
        threading.Timer(2.0, os.kill, (victim, signal.SIGKILL)).start()
        # rank 0 blocks in all_reduce waiting for rank 1, which is killed while it sleeps: the driver must
        # name rank 1 as dead instead of waiting on rank 0 (a hang until the gloo timeout)
        with pytest.raises(WorkerDiedError) as info:
            group.role("actor").call_all(Echo.sleep_rank1_then_allreduce, 60.0)
        assert (info.value.rank, info.value.role) == (1, "actor")
        assert f"pid {victim}" in str(info.value) and "Echo.sleep_rank1_then_allreduce" in str(info.value)
    finally:
        group.shutdown()


def test_a_peer_that_exits_mid_collective_is_named_not_the_rank_whose_collective_broke(ray_session):
    # rank 0's gloo all_reduce fails ("connection closed by peer") a second before rank 1's process dies, so
    # rank 0's error reaches the driver first: the error must still name the cause, rank 1
    group = WorkerGroup(ResourcePool(nnodes=1, slots_per_node=2), {"actor": RoleSpec(Echo)}, timeout_s=60)
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.role("actor").call_all(Echo.rank1_exits_during_allreduce)
        assert (info.value.rank, info.value.role) == (1, "actor")
    finally:
        group.shutdown()


def test_a_stalled_call_times_out_naming_the_ranks(ray_session):
    group = WorkerGroup(ResourcePool(nnodes=1, slots_per_node=1), {"actor": RoleSpec(Echo)}, timeout_s=1.0)
    try:
        with pytest.raises(WorkerTimeoutError, match=r"no result after 1s from ranks \[0\]"):
            group.role("actor").call_all(Echo.sleep, 30.0)
    finally:
        group.shutdown()


def test_local_backend_runs_the_same_calls_in_this_process():
    group = LocalWorkerGroup({"actor": RoleSpec(Echo, {"offset": 0.5}), "rollout": RoleSpec(Reader)})
    try:
        actor = group.role("actor")
        out = actor.dp_split(Echo.double, x_batch(3))
        assert out["y"].tolist() == [0.5, 2.5, 4.5] and out["rows_seen"].tolist() == [3, 3, 3]
        assert actor.call_all(Echo.pid) == [os.getpid()]
        assert actor.call_all(Echo.allreduce_rank_plus_one) == [1.0]
        assert group.role("rollout").call_all(Reader.actor_weights_ptr) == actor.call_all(Echo.weights_ptr)
        with pytest.raises(WorkerError, match="role 'actor' rank 0 failed in Echo.fail: ValueError: always") as info:
            actor.call_all(Echo.fail)
        assert isinstance(info.value.__cause__, ValueError)  # the original stays chained for pdb
    finally:
        group.shutdown()


def test_worker_output_reaches_the_driver_named_by_group_role_and_rank(tmp_path):
    """init_ray (what every run uses) forwards the workers' prints and warnings to the driver, each line prefixed
    with the worker's group, roles and rank; before, runs passed log_to_driver=False and every worker warning was
    lost. A real Ray session in a subprocess (its own, so this module's session keeps its settings)."""
    import subprocess
    import sys

    script = ("from core.worker import RoleSpec\n"
              "from core.worker_group import ResourcePool, WorkerGroup, init_ray\n"
              "from tests.test_worker_group import Echo\n"
              "import time\n"
              "init_ray(num_cpus=2)\n"
              "g = WorkerGroup(ResourcePool(slots_per_node=2), {'echo': RoleSpec(Echo)}, name='main')\n"
              "g.role('echo').call_all(Echo.say, 'hello from a worker')\n"
              "time.sleep(2)\n"  # the log monitor forwards asynchronously
              "g.shutdown()\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=180,
                         env=dict(os.environ, PYTHONPATH=root))
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    for rank in (0, 1):
        lines = [l for l in text.splitlines() if f"main[echo] rank {rank} pid=" in l]
        assert any("hello from a worker (print)" in l for l in lines), text[-2000:]
        assert any("UserWarning: hello from a worker (warning)" in l for l in lines), text[-2000:]


def test_a_reward_pool_in_the_ray_driver_scores_right_and_is_no_fork_of_it(ray_session, tmp_path):
    """Four reward workers started after ray.init (the driver has Ray's threads) score a custom file's reward
    correctly, and none of them is a fork of the driver: they fork from a forkserver (a fork of a threaded
    process copies its locks in whatever state they were in)."""
    from core.rewards import load_reward_fn, score_batch

    f = tmp_path / "my_reward.py"
    f.write_text("import os, time\n"
                 "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                 "    time.sleep(0.05)  # long enough that the pool spreads the 16 calls over its workers\n"
                 "    return {'score': float(solution_str == ground_truth), 'parent': os.getppid(), 'pid': os.getpid()}\n")
    n = 16
    out = score_batch(load_reward_fn(f), ["d"] * n, [str(i % 3) for i in range(n)], ["1"] * n, num_workers=4)
    assert out.scores.tolist() == [float(i % 3 == 1) for i in range(n)]
    assert os.getpid() not in out.extras["parent"] and len(set(out.extras["pid"])) >= 2


class Interface:
    def who(self) -> str:
        raise NotImplementedError


class Engine(Interface):
    def __init__(self, ctx):
        pass

    def who(self) -> str:
        return "engine"


class Stranger:
    def who(self) -> str:
        return "stranger"


def test_dispatch_through_an_interface_runs_the_roles_own_method():
    """The controller names ``PolicyWorker.compute_logprobs`` whatever engine holds the policy: a method of a base
    class of the role's class dispatches to the role's override; a same-named method of an unrelated class does not."""
    from core.worker_group import LocalWorkerGroup

    group = LocalWorkerGroup({"actor": RoleSpec(Engine)})
    try:
        assert group.role("actor").call_all(Interface.who) == ["engine"]
        with pytest.raises(TypeError, match="not a method of role 'actor'"):
            group.role("actor").call_all(Stranger.who)
    finally:
        group.shutdown()
