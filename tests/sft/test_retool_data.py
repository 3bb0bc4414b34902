"""ReTool's cold-start data (core.data.retool, recipes/sft's retool_sft): a ReTool-SFT record in the hub's form becomes
a conversation in the form the agent recipe's ReTool run produces -- its system prompt listing the tool, code as
code_interpreter calls, the interpreter's output as tool turns, the answer last -- and a malformed record is named."""

import json
from pathlib import Path

import pytest

from core.cli import recipe_module
from core.data.dataset import load_rl_parquet
from core.data.retool import ANSWER_FORMAT, RETOOL_SYSTEM, sft_messages
from tests.recipes.plans import plan

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "sft"
RECORD = {"messages": [
    {"role": "user", "content": "Solve the problem with code when it helps.\n\n*user question:*\nWhat is 6 x 7?"
                                "<answer>"},
    {"role": "assistant", "content": "I will compute it.\n<code>\n```python\nprint(6 * 7)\n```\n</code>\n"
                                     "<interpreter>\n42\n</interpreter>\nCheck once more.<code>print(42 // 6)</code>"
                                     "<interpreter>7</interpreter>\nSo <answer>\\boxed{42}</answer>"}]}


def call(code: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "code_interpreter", "arguments": {"code": code}}}]


def test_a_record_becomes_the_rl_stages_conversation():
    assert sft_messages(RECORD, "r") == [
        {"role": "system", "content": RETOOL_SYSTEM},
        {"role": "user", "content": "What is 6 x 7?"},
        {"role": "assistant", "content": "I will compute it.", "tool_calls": call("print(6 * 7)")},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "Check once more.", "tool_calls": call("print(42 // 6)")},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "So \\boxed{42}"}]


@pytest.mark.parametrize("content, why", [
    ("<code>print(1)</code> and no output", "a <code> block without the <interpreter> output after it"),
    ("<code>print(1)", "<code> without </code>"),
])
def test_a_malformed_record_is_named(content, why):
    bad = {"messages": [RECORD["messages"][0], {"role": "assistant", "content": content}]}
    with pytest.raises(ValueError, match=f"^retool.jsonl row 3: {why}"):
        sft_messages(bad, "retool.jsonl row 3")
    with pytest.raises(ValueError, match="expected messages"):
        sft_messages({"messages": [{"role": "user", "content": "no marker"}]}, "x")


def test_the_dataset_writes_sft_rows_from_a_local_file(tmp_path):
    (tmp_path / "aime24").mkdir()
    (tmp_path / "aime24" / "test.jsonl").write_text(json.dumps({"problem": "Find x.", "answer": 204}) + "\n")
    (tmp_path / "retool.jsonl").write_text(json.dumps(RECORD) + "\n")
    paths = recipe_module(RECIPE, "data").write_retool_sft(tmp_path / "out", str(tmp_path / "retool.jsonl"),
                                                                tmp_path)
    (row,) = load_rl_parquet(paths["train"])
    assert row["messages"] == sft_messages(RECORD, "r") and row["prompt"] == row["messages"][:2]
    (aime,) = load_rl_parquet(paths["aime24"])
    assert aime["prompt"] == [{"role": "system", "content": RETOOL_SYSTEM},
                              {"role": "user", "content": "Find x." + ANSWER_FORMAT}]


def test_the_cold_start_plans_and_fits(capsys):
    """ReTool's cold start at full scale (2 x 8 GPUs of 80 GB), the first stage of the SFT -> RL pipeline."""
    rc, out = plan(capsys, "sft", "retool_qwen32b")
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2.5-32B-Instruct on 16 cuda rank(s)" in out and "<= 16384 tokens each" in out
    assert out.rstrip().endswith("fits")
