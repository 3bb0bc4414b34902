"""Reward-model training (core/rm_train.py) on a tiny real model: TRL/verl's preference schema read with errors
that name the row, and Bradley-Terry learning a rule it can see (held-out pair accuracy from chance to 1), saved
as a folder that scores the same when loaded again."""

import json

import pytest
import torch

from core.rm_train import load_pairs, main, pair_accuracy, pair_ids


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_pairs_in_text_and_conversation_form_and_bad_rows_named(tmp_path):
    p = write(tmp_path / "p.jsonl", [
        {"prompt": "2 + 2?", "chosen": "4", "rejected": "5"},
        {"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
         "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "go away"}]}])
    assert load_pairs(p) == [([{"role": "user", "content": "2 + 2?"}], "4", "5"),
                             ([{"role": "user", "content": "hi"}], "hello", "go away")]
    with pytest.raises(KeyError, match=r"bad.jsonl: row 2: no key 'rejected'"):
        load_pairs(write(tmp_path / "bad.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"},
                                                  {"prompt": "a", "chosen": "b"}]))
    with pytest.raises(ValueError, match=r"row 1: key 'chosen': a conversation must end with the assistant's turn"):
        load_pairs(write(tmp_path / "turns.jsonl", [{"chosen": [{"role": "user", "content": "x"}], "rejected": "y"}]))
    with pytest.raises(KeyError, match=r"row 1: no 'prompt'"):
        load_pairs(write(tmp_path / "noprompt.jsonl", [{"chosen": "b", "rejected": "c"}]))


def rule_pairs(path, numbers):
    """Chosen answers end with '!', rejected ones with '?': a rule in the last token, which the score reads."""
    return write(path, [{"prompt": f"{a} + {a}?", "chosen": f"it is {2 * a}!", "rejected": f"it is {2 * a + 1}?"}
                        for a in numbers])


def test_bradley_terry_learns_a_visible_rule_and_the_folder_scores_the_same(tmp_path, tiny_model_dir, capsys):
    from core.train.reward_model import load_reward_model
    from core.models import load_tokenizer

    train, val = rule_pairs(tmp_path / "train.jsonl", range(40)), rule_pairs(tmp_path / "val.jsonl", range(50, 66))
    out = tmp_path / "rm"
    assert main(["--model", str(tiny_model_dir), "--train", str(train), "--val", str(val), "--out", str(out),
                 "--epochs", "3", "--lr", "3e-3", "--batch", "8"]) == 0
    h = json.loads((out / "rm_train.json").read_text())
    assert h["val_accuracy_start"] < 0.9 and h["val_accuracy"][-1] == 1.0
    assert h["train_loss"][-1] < h["train_loss"][0]
    assert "held-out pair accuracy" in capsys.readouterr().out
    tok = load_tokenizer(str(out))
    again = pair_accuracy(load_reward_model(str(out)), pair_ids(tok, load_pairs(val)), tok.pad_token_id)
    assert again == 1.0


@pytest.mark.heavy  # two torchrun ranks from a fresh interpreter each (~11 s); the in-process tests above keep the training
def test_two_ranks_under_torchrun_train_as_one_process(tmp_path, tiny_model_dir):
    """FSDP2 data parallelism (gloo, 2 real processes under torchrun): each mini-batch split over the ranks gives
    the one-process loss history, held-out accuracy and weights (fp32: equal up to the order of float sums), and
    the folder names the model's own class, not FSDP2's wrapper."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    train, val = rule_pairs(tmp_path / "train.jsonl", range(32)), rule_pairs(tmp_path / "val.jsonl", range(50, 61))
    args = ["-m", "core.rm_train", "--model", str(tiny_model_dir), "--train", str(train), "--val", str(val),
            "--epochs", "2", "--lr", "3e-3", "--batch", "8", "--dtype", "float32"]
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    runs = {}
    for name, launcher in (("one", []), ("two", ["-m", "torch.distributed.run", "--nproc_per_node", "2"])):
        out = tmp_path / name
        done = subprocess.run([sys.executable, *launcher, *args, "--out", str(out)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = out
    one, two = (json.loads((runs[k] / "rm_train.json").read_text()) for k in ("one", "two"))
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert two["train_loss"] == pytest.approx(one["train_loss"], rel=1e-4)
    assert two["val_accuracy_start"] == one["val_accuracy_start"] and two["val_accuracy"] == one["val_accuracy"]
    w1, w2 = (load_file(runs[k] / "model.safetensors") for k in ("one", "two"))
    # 8 Adam steps of lr 3e-3 move weights by up to ~2e-2; the two runs' weights differ by at most 1.4e-5 (measured)
    moved = max(float((w1[k] - load_file(Path(tiny_model_dir) / "model.safetensors")[k]).abs().max())
                for k in w1 if not k.startswith("score"))
    assert moved > 1e-2
    assert w1.keys() == w2.keys() and all(torch.allclose(w1[k], w2[k], atol=1e-4) for k in w1)
    assert json.loads((runs["two"] / "config.json").read_text())["architectures"] == \
        json.loads((runs["one"] / "config.json").read_text())["architectures"] == ["LlamaForSequenceClassification"]


def test_leaving_the_process_group_frees_the_fsdp_modules_first(tiny_model_dir, monkeypatch):
    """Rank 1 of the torchrun pair above aborted at exit now and then ("terminate called without an active
    exception"): after ``train`` returned, its FSDP2 model lived on in garbage cycles (hooks and states refer back
    to their modules), holding the device mesh and the gloo group, and was freed during the interpreter's shutdown.
    ``leave_process_group`` frees it before the group is destroyed; ``destroy_process_group`` alone leaves it."""
    import gc
    import weakref

    import torch.distributed as dist

    from core.train.reward_model import load_reward_model
    from core.train.sharding import fsdp_wrap
    from core.worker import WorkerContext, free_port, leave_process_group

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)

    def one_step() -> weakref.ref:  # an FSDP2 step whose every reference goes when it returns
        ctx = WorkerContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
        model = fsdp_wrap(load_reward_model(str(tiny_model_dir)), ctx, torch.float32, "none")
        model(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
        return weakref.ref(model)

    gc.disable()  # no automatic collection between the step and the check
    try:
        model = one_step()
        assert model() is not None  # only cycles hold it: what the interpreter's exit used to free
        leave_process_group()
        assert model() is None and not dist.is_initialized()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()
