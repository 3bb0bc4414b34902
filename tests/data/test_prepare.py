"""Data preparation from jsonl to verl-schema parquet, bad rows, and loading a parquet made the way verl makes it."""

import json

import pandas as pd
import pytest

from core.data.dataset import load_rl_parquet
from core.data.prepare import DEFAULT_SRC, make_rows, prepare
from core.rewards import default_compute_score


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_gsm8k_rows_follow_the_verl_schema(tmp_path):
    write_jsonl(tmp_path / "src" / "gsm8k" / "test.jsonl", [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A 1,000 question", "answer": "...\n#### 1,000"}])
    paths = prepare("gsm8k", tmp_path / "src", tmp_path / "out", ["test"],
                    template="{question}\nLet's think step by step and output the final answer after \"####\".")
    df = pd.read_parquet(paths["test"])
    assert list(df.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = df.iloc[1]
    assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
    assert row["reward_model"] == {"style": "rule", "ground_truth": "1000"}
    assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == 1
    assert list(row["prompt"])[0]["role"] == "user" and "step by step" in list(row["prompt"])[0]["content"]


def test_math_rows_take_the_last_boxed_answer_and_score_by_it(tmp_path):
    write_jsonl(tmp_path / "src" / "math" / "train.jsonl", [
        {"problem": "What is $\\frac{1}{2}+\\frac{1}{2}$?", "solution": "It is $\\boxed{1}$.", "level": "Level 1"},
        {"problem": "Simplify $\\sqrt{8}$.", "solution": "First \\boxed{x}, finally $\\boxed{2\\sqrt{2}}$."}])
    df = pd.read_parquet(prepare("math", tmp_path / "src", tmp_path / "out", ["train"])["train"])
    assert df["data_source"].tolist() == ["lighteval/MATH"] * 2
    assert [r["ground_truth"] for r in df["reward_model"]] == ["1", "2\\sqrt{2}"]
    assert default_compute_score("lighteval/MATH", "so \\boxed{2\\sqrt{2}}", "2\\sqrt{2}")["score"] == 1.0


def test_bad_rows_name_file_and_row_or_are_counted(tmp_path):
    src = tmp_path / "src" / "gsm8k" / "train.jsonl"
    write_jsonl(src, [{"question": "ok", "answer": "#### 1"}, {"question": "", "answer": "#### 2"},
                      {"question": "no marker", "answer": "2"}, {"answer": "#### 3"}])
    with pytest.raises(ValueError, match=rf"{src}: row 2: empty or missing question"):
        prepare("gsm8k", tmp_path / "src", tmp_path / "out", ["train"])
    assert not (tmp_path / "out" / "gsm8k" / "train.parquet").exists()  # nothing half-written
    paths = prepare("gsm8k", tmp_path / "src", tmp_path / "out", ["train"], skip_bad=True)
    assert len(pd.read_parquet(paths["train"])) == 1
    rows, skipped = make_rows("gsm8k", "train", [{"question": "q", "answer": "x"}], "mem", skip_bad=True)
    assert (rows, skipped) == ([], 1)
    with pytest.raises(ValueError, match=r"mem: row 1: GSM8K answer has no '####'"):
        make_rows("gsm8k", "train", [{"question": "q", "answer": "x"}], "mem")


def test_invalid_json_names_the_line(tmp_path):
    f = tmp_path / "aime24" / "test.jsonl"
    f.parent.mkdir(parents=True)
    f.write_text('{"problem": "p", "answer": 1}\n{oops\n')
    with pytest.raises(ValueError, match=rf"{f}:2: not valid JSON"):
        prepare("aime24", tmp_path, tmp_path / "out")


@pytest.mark.skipif(not (DEFAULT_SRC / "gsm8k" / "test.jsonl").is_file(), reason="../shared/data not present")
@pytest.mark.parametrize("name,n,truth0", [("gsm8k", 1319, "18"), ("aime24", 30, None), ("amc23", 40, "27"),
                                           ("minerva_math", 272, None)])
def test_shared_datasets_prepare_cleanly(tmp_path, name, n, truth0):
    paths = prepare(name, out=tmp_path, splits=["test"])
    rows = load_rl_parquet(paths["test"])
    assert len(rows) == n and all(r["ground_truth"] for r in rows)
    if truth0:
        assert rows[0]["ground_truth"] == truth0


def test_a_verl_made_gsm8k_parquet_loads_unchanged(tmp_path):
    """The exact columns and nesting verl's examples/data_preprocess/gsm8k.py writes."""
    instruction = 'Let\'s think step by step and output the final answer after "####".'
    verl_rows = [{"data_source": "openai/gsm8k",
                  "prompt": [{"role": "user", "content": "Natalia sold 48 clips... " + instruction}],
                  "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"},
                  "extra_info": {"split": "train", "index": 0, "answer": "48/2 = 24 ... #### 72",
                                 "question": "Natalia sold 48 clips..."}}]
    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_rows).to_parquet(path)
    rows = load_rl_parquet(path)
    assert rows[0]["ground_truth"] == "72" and rows[0]["prompt"][0]["content"].endswith(instruction)
    assert default_compute_score(rows[0]["data_source"], "... #### 72", rows[0]["ground_truth"])["score"] == 1.0


def test_schema_errors_name_file_row_and_key(tmp_path):
    path = tmp_path / "bad.parquet"
    pd.DataFrame([{"data_source": "x", "prompt": [{"role": "user", "content": "q"}], "reward_model": {"style": "rule", "ground_truth": "1"}},
                  {"data_source": "x", "prompt": [], "reward_model": {"style": "rule", "ground_truth": "1"}}]).to_parquet(path)
    with pytest.raises(ValueError, match=rf"{path}: row 2: key 'prompt' must be a non-empty chat list"):
        load_rl_parquet(path)


def test_overlong_prompts_are_named_at_load_or_dropped_or_truncated(tmp_path, tiny_model_dir):
    """Prompt lengths are checked once at load, before Ray: an overlong prompt names its file, row and length (it
    used to fail inside a rollout worker, after Ray and model loading); verl's filter and truncation options."""
    from core.data.dataset import fit_prompt_lengths
    from core.data.prepare import write_parquet
    from core.models import load_tokenizer

    path = tmp_path / "d.parquet"
    write_parquet([{"data_source": "d", "prompt": [{"role": "user", "content": "x" * n}],
                    "reward_model": {"ground_truth": "1"}} for n in (2, 60, 3, 90)], path)
    rows, tok = load_rl_parquet(path), load_tokenizer(str(tiny_model_dir))
    lengths = [len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True,
                                           return_dict=False)) for r in rows]
    limit = sorted(lengths)[1]                                            # rows 2 and 4 are longer
    with pytest.raises(ValueError, match=rf"2 prompt\(s\) longer than rollout.max_prompt_length={limit} tokens: "
                                         rf"{path}: row 2: {lengths[1]} tokens; {path}: row 4: {lengths[3]} tokens"):
        fit_prompt_lengths(rows, tok, limit)
    kept, note = fit_prompt_lengths(rows, tok, limit, filter_overlong=True)
    assert [r["where"] for r in kept] == [f"{path}: row 1", f"{path}: row 3"] and note.startswith("2 of 4 prompts")
    for side in ("left", "right"):
        cut, _ = fit_prompt_lengths(rows, tok, limit, truncation=side)
        full = tok.apply_chat_template(rows[3]["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
        assert cut[3]["prompt_ids"] == (full[-limit:] if side == "left" else full[:limit])
        assert cut[0]["prompt_ids"] == tok.apply_chat_template(rows[0]["prompt"], add_generation_prompt=True,
                                                               tokenize=True, return_dict=False)


def test_the_rollout_generates_from_truncated_prompt_ids(tiny_model_dir):
    from core.config import RolloutConfig, SamplingParams
    from core.loop import prompts_from_rows
    from core.rollout.worker import RolloutWorker
    from core.config import RolloutConfig, SamplingParams
    from core.worker import RoleSpec
    from core.worker_group import LocalWorkerGroup

    rows = [{"prompt": [{"role": "user", "content": "x" * 80}], "data_source": "d", "ground_truth": "1",
             "extra_info": {}, "prompt_ids": [5, 6, 7, 8]}]
    group = LocalWorkerGroup({"rollout": RoleSpec(RolloutWorker, {"cfg": RolloutConfig(
        model=str(tiny_model_dir), dtype="float32", max_prompt_length=4)})})
    try:
        out = group.role("rollout").call_rank0(RolloutWorker.generate, prompts_from_rows(rows),
                                               SamplingParams(temperature=0, max_new_tokens=3))
    finally:
        group.shutdown()
    assert out["prompts"].tolist() == [[5, 6, 7, 8]]
