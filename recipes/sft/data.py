"""Data for this recipe -> verl-schema parquet under outputs/data (``hybridrl data prepare sft`` writes what a config
names; ``python recipes/sft/data.py --help`` lists the datasets).

  agent_traces  the CPU tier's SFT data: traces of the agent recipes' task (``core.data.agent_mult``: a x b, a, b in
                11..999, with a calculator). Each row is a training problem's prompt (the one-shot conversation and
                the question) and, in a ``messages`` column, that prompt followed by a correct tool-using answer: the
                calculator call, its answer, "The answer is N." Drawn from the training split only and checked by
                content against the held-out problems: no trace's pair, in either order, is one of the test split's
                -> agent_traces/train.parquet
  agent_mult    the task's rows as the agent recipe writes them; the SFT run validates on its 64 held-out problems
                -> agent_mult/{train,test}.parquet
  s1k           the full-scale data (s1, Muennighoff et al. 2025, arXiv:2501.19393): s1K's 1,000 questions with their
                reasoning traces and answers (the hub's simplescaling/s1K, or --src s1k=FILE: a .parquet / .jsonl with
                its columns question, thinking_trajectories, attempt), each a user turn and an assistant turn in s1's
                form (``<|im_start|>think`` ... ``<|im_start|>answer`` ...) -> s1k/train.parquet; AIME 2024 for
                validation (../shared/data beside the checkout, else the hub) -> s1k/aime24.parquet
  retool_sft    ReTool's cold start (Feng et al. 2025, arXiv:2504.11536): ReTool-SFT's code-interleaved traces (the
                hub's JoeYing/ReTool-SFT, or --src retool_sft=FILE: a .parquet / .jsonl of its ``messages``) in the
                form the agent recipe's ReTool run produces -- its system prompt listing the code_interpreter, the
                code as tool calls, the interpreter's output as tool turns (masked) -> retool_sft/train.parquet;
                AIME 2024 with the RL run's prompt -> retool_sft/aime24.parquet
"""

from __future__ import annotations

import sys
from pathlib import Path

from core.data.agent_mult import TEST_COUNT, operands, pairs, row, solution, write_mult
from core.data.prepare import make_rows, read_records, read_table, write_parquet
from core.data.retool import retool_prompt, sft_messages
from core.data.recipe_data import Dataset, data_cli

def traces(count: int, seed: int = 1) -> list[dict]:
    """``count`` SFT rows of training problems (``seed``: which draws; the RL rows are seed 0's); ``write_traces``
    checks the file it writes against the held-out problems."""
    rows = []
    for i, (a, b) in enumerate(pairs("train", count, seed)):
        r = row(a, b, "train", i)
        rows.append(r | {"messages": r["prompt"] + solution(a, b)})
    return rows


def check_held_out(train: Path, test: Path) -> None:
    """By content: no question of ``train`` (its operands, either order) is a question of ``test``."""
    import pandas as pd

    def problems(path: Path) -> set[tuple[int, int]]:
        return {tuple(sorted(operands(e["question"]))) for e in pd.read_parquet(path)["extra_info"]}

    leaked = problems(train) & problems(test)
    if leaked:
        raise ValueError(f"{train}: {len(leaked)} problems of {test} are in it, e.g. {sorted(leaked)[0]}")


def write_traces(out: str | Path, count: int = 512) -> dict[str, Path]:
    path = Path(out) / "agent_traces" / "train.parquet"
    write_parquet(traces(count), path)
    test = write_mult(out)["test"]
    check_held_out(path, test)
    print(f"agent_traces: {count} traces -> {path} (none of the {TEST_COUNT} problems of {test})")
    return {"train": path}


def s1k_rows(records: list[dict], where: str) -> list[dict]:
    """s1K's records as SFT rows: the question as the user's turn; the first reasoning trace and the answer as the
    assistant's, as s1 trains them. Their ``data_source`` names a registered rule (``math``) so a run's checks
    pass; an SFT row is never scored."""
    rows = []
    for i, rec in enumerate(records):
        trace = rec.get("thinking_trajectories")
        trace = list(trace) if trace is not None and not isinstance(trace, str) else [trace]
        if not rec.get("question") or not trace or not trace[0] or rec.get("attempt") is None:
            raise ValueError(f"{where} row {i + 1}: question, thinking_trajectories and attempt are required")
        prompt = [{"role": "user", "content": rec["question"]}]
        answer = f"<|im_start|>think\n{trace[0]}\n<|im_start|>answer\nAnswer: {rec['attempt']}"
        rows.append({"data_source": "math", "prompt": prompt, "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": str(rec.get("solution") or "")},
                     "extra_info": {"split": "train", "index": i},
                     "messages": prompt + [{"role": "assistant", "content": answer}]})
    return rows


def write_s1k(out: str | Path, src: str | None) -> dict[str, Path]:
    records, where = read_table(src or "hub", "simplescaling/s1K")  # the hub, or a .parquet / .jsonl file
    paths = {"train": Path(out) / "s1k" / "train.parquet", "aime24": Path(out) / "s1k" / "aime24.parquet"}
    write_parquet(s1k_rows(records, where), paths["train"])
    aime, aime_where = read_records("aime24", "test", None)
    write_parquet(make_rows("aime24", "test", aime, aime_where)[0], paths["aime24"])
    print(f"s1k: {paths['train']} ({where}), {paths['aime24']} ({aime_where})")
    return paths


def retool_rows(records: list[dict], where: str) -> list[dict]:
    """ReTool-SFT's records as SFT rows: each its conversation in the form the RL stage's agent loop produces
    (``core.data.retool.sft_messages``: ReTool's system prompt, code_interpreter calls, the interpreter's outputs as
    tool turns), its prompt the first two turns. ``data_source`` names a registered rule
    (``math``) so a run's checks pass; an SFT row is never scored."""
    rows = []
    for i, rec in enumerate(records):
        messages = sft_messages(rec, f"{where} row {i + 1}")
        rows.append({"data_source": "math", "prompt": messages[:2], "ability": "math",
                     "reward_model": {"style": "rule", "ground_truth": ""},
                     "extra_info": {"split": "train", "index": i}, "messages": messages})
    return rows


def write_retool_sft(out: str | Path, src: str | None, aime_src: str | Path | None = None) -> dict[str, Path]:
    """``<out>/retool_sft/train.parquet`` and ``aime24.parquet`` (``aime_src``: a folder holding aime24/test.jsonl;
    default ../shared/data beside the checkout, else the hub)."""
    records, where = read_table(src or "hub", "JoeYing/ReTool-SFT")  # the hub, or a .parquet / .jsonl file
    paths = {"train": Path(out) / "retool_sft" / "train.parquet", "aime24": Path(out) / "retool_sft" / "aime24.parquet"}
    write_parquet(retool_rows(records, where), paths["train"])
    aime, aime_where = read_records("aime24", "test", aime_src)
    write_parquet(retool_prompt(make_rows("aime24", "test", aime, aime_where)[0]), paths["aime24"])
    print(f"retool_sft: {paths['train']} ({where}), {paths['aime24']} ({aime_where})")
    return paths


DATASETS = {
    "agent_traces": Dataset(lambda out, src: write_traces(out), "correct tool-using traces of a x b, training "
                                                                "problems only, checked against the held-out ones"),
    "agent_mult": Dataset(lambda out, src: write_mult(out), "a x b with a calculator tool; test held out by content"),
    "s1k": Dataset(write_s1k, "s1K's 1,000 reasoning traces (the hub, or --src s1k=FILE) + AIME 2024, s1's form"),
    "retool_sft": Dataset(write_retool_sft, "ReTool's cold-start traces (the hub, or --src retool_sft=FILE) + AIME "
                                            "2024, as the agent recipe's ReTool run prompts and calls the tool"),
}

if __name__ == "__main__":
    sys.exit(data_cli(DATASETS, __doc__))
