"""Reward-model training (core/rm_train.py) on a tiny real model: TRL/verl's preference schema read with errors
that name the row, and Bradley-Terry learning a rule it can see (held-out pair accuracy from chance to 1), saved
as a folder that scores the same when loaded again."""

import json

import pytest

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
    from core.engines.reward_model import load_reward_model
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
