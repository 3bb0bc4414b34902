"""Supervised fine-tuning data: conversations as token ids with a loss mask on the assistant's tokens only.

Two row formats, both read from .jsonl or .parquet:

- OpenAI messages: ``{"messages": [{role, content, tool_calls?}, ...], "tools": [...]?}`` -- system, user,
  assistant and tool turns (TRL's and verl's multi-turn SFT format).
- verl's single-turn SFT columns: a prompt column and a response column (``prompt_key`` / ``response_key``, each a
  text, or a dict whose ``prompt_dict_key`` / ``response_dict_key`` holds the text, as verl's ``extra_info``
  question and answer), read as one user turn and one assistant turn.

A conversation's ids are laid out as a rollout meets them, token in, token out: the chat template's text up to an
assistant turn's generation prompt, tokenised (the prompt the model is given), then the turn's own text tokenised
alone (what the model writes: mask 1 -- its text and tool calls, up to and including the end-of-turn token it must
learn to emit; what the template adds after it, a newline, is not), then the next context, and so on. Tokenising
the whole text at once can merge tokens across a turn's boundary (Llama-3's ``\n\n`` before a reply that opens
with ``<``) into ids the model never sees at inference. Everything but the assistant's turns -- system, user, tool
answers, the template's headers -- is context (mask 0), as the agent loop masks tool answers in RL. A template
that renders an earlier turn differently once a later one follows (not prefix-stable: e.g. one that drops earlier
reasoning) would put the mask on the wrong tokens: refused, naming the row and the turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from core.data.prepare import read_jsonl


@dataclass(frozen=True)
class Sample:
    ids: list[int]
    mask: list[int]        # 1 on the tokens the loss trains (the assistant's), 0 on context


def _text(tokenizer, messages: list[dict], tools, generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                         tokenize=False)


def conversation_sample(tokenizer, messages: list[dict], tools: list | None = None, eos_ids=(),
                        where: str = "conversation") -> Sample:
    """The ids of ``messages`` as the model meets them in a rollout, and the mask of its assistant turns' tokens.
    ``eos_ids``: the ids that end a turn (default: the tokenizer's EOS); ``where`` names the row in errors."""
    if not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"{where}: messages must be a non-empty list of {{role, content}} turns")
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: no assistant turn, nothing to train")
    eos = set(eos_ids) or {tokenizer.eos_token_id}
    ids: list[int] = []
    mask: list[int] = []
    done = ""  # the text whose ids are in ``ids``

    def extend(text: str, k: int, trained: bool) -> None:
        nonlocal done
        if not text.startswith(done):
            raise ValueError(f"{where}: the chat template is not prefix-stable at messages[{k}] (with it, an earlier "
                             "turn renders differently), so the assistant's tokens cannot be told from the context; "
                             "train on conversations that end before it instead")
        piece = tokenizer(text[len(done):], add_special_tokens=False)["input_ids"]
        ends = [i for i, t in enumerate(piece) if t in eos] if trained else []
        cut = ends[-1] + 1 if ends else len(piece) if trained else 0
        ids.extend(piece)
        mask.extend([1] * cut + [0] * (len(piece) - cut))
        done = text

    for k, m in enumerate(messages):
        if m["role"] == "assistant":
            extend(_text(tokenizer, messages[:k], tools, True), k, False)      # the context and its generation prompt
            extend(_text(tokenizer, messages[:k + 1], tools, False), k, True)  # the turn, as the model writes it
    extend(_text(tokenizer, messages, tools, False), len(messages) - 1, False)
    return Sample(ids, mask)


def _column(value, key: str, sub: str | None, where: str) -> str:
    if isinstance(value, dict) and sub:
        value = value.get(sub)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {key}{'.' + sub if sub else ''} must be a text, got {type(value).__name__}")
    return value


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a .parquet or .jsonl file (``core.data.prepare.read_jsonl``: a bad line is an error naming the
    file and line)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"SFT data {path}: not found")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return read_jsonl(path)


def conversations(rows: list[dict], source: str, messages_key: str = "messages", prompt_key: str = "prompt",
                  response_key: str = "response", prompt_dict_key: str | None = None,
                  response_dict_key: str | None = None) -> list[tuple[list[dict], list | None]]:
    """Each row's (messages, tools): its ``messages_key`` column, else its prompt and response columns."""
    out = []
    for n, row in enumerate(rows):
        where = f"{source} row {n}"
        if messages_key in row and row[messages_key] is not None:
            messages = [dict(m) for m in row[messages_key]]
            tools = row.get("tools")
            out.append((messages, json.loads(tools) if isinstance(tools, str) else tools))
        elif prompt_key in row and response_key in row:
            out.append(([{"role": "user", "content": _column(row[prompt_key], prompt_key, prompt_dict_key, where)},
                         {"role": "assistant", "content": _column(row[response_key], response_key, response_dict_key,
                                                                where)}], None))
        else:
            raise ValueError(f"{where}: neither a {messages_key!r} column nor {prompt_key!r} and {response_key!r} "
                             f"(it has {sorted(row)})")
    return out
