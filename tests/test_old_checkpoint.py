"""A checkpoint written by an older version of the code resumes with today's: ``tests/fixtures/checkpoint_v1`` (made
by ``tests/fixtures/make_checkpoint_v1.py``, before the training and rollout engines moved to ``core/train`` and
``core/rollout``) is step 3 of a 4-step GRPO run; resumed here, step 4 has the recorded metrics again. (The step 4
row was recorded anew when the sampler's uniforms became a hash of each sequence's seed and token index, which
draws other tokens from the same RNG state; the checkpoint files are the old layout's, untouched.)"""

import shutil
import sys
from pathlib import Path

import pytest

from core import checkpoint
from core.report import read_metrics

FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(FIXTURES))
from make_checkpoint_v1 import MODEL, run_config  # noqa: E402

# wall times and memory readings differ between any two runs
VOLATILE = ("timing_s/", "perf/", "sync/")  # a resumed run's first weight sync is full


def test_a_checkpoint_of_the_old_layout_resumes_to_the_metrics_it_was_saved_with(tmp_path):
    from core.models import tiny_random_model
    from core.run import load_run_config
    from core.trainer import fit

    model = tiny_random_model(tmp_path / "model", **MODEL)  # the config and tokenizer; the weights come from the checkpoint
    out = tmp_path / "out"
    shutil.copytree(FIXTURES / "checkpoint_v1" / "step_000003", checkpoint.checkpoint_dir(out) / "step_000003")
    (checkpoint.checkpoint_dir(out) / checkpoint.LATEST).write_text("step_000003")
    fit(load_run_config(run_config(tmp_path, model, out, total_steps=4)))

    got = {m["step"]: m for m in read_metrics(out / "metrics.jsonl")}
    want = {m["step"]: m for m in read_metrics(FIXTURES / "checkpoint_v1" / "metrics.jsonl")}
    assert sorted(got) == [4]  # resumed after step 3, not started over
    keys = [k for k in want[4] if not k.startswith(VOLATILE)]
    assert {"actor/lr", "actor/grad_norm", "actor/pg_loss", "reward/mean"} <= set(keys)
    # the same tokens are drawn (the RNG state came back); the CPU kernels' sums differ in the last bits by CPU kind
    for k in keys:
        assert got[4][k] == pytest.approx(want[4][k], rel=1e-4, abs=1e-6), k
