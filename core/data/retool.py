"""ReTool's prompt and cold-start data (Feng et al. 2025, arXiv:2504.11536), shared by the SFT stage that teaches the
tool protocol (``recipes/sft``) and the RL stage that follows it (``recipes/agent``): both show the model the same
system message listing the tool and the same tool-call format, or the cold start teaches a protocol the RL run never
uses. (The user turns differ as in ReTool's own pipeline: the SFT traces answer ReTool-SFT's questions as stated,
the RL prompts are DAPO-Math's with the answer format.)

``RETOOL_SYSTEM``: Qwen2.5's system prompt listing the code interpreter (the text its chat template renders for
``tools=[CODE_INTERPRETER]``, written out so that any engine and tokenizer see the same prompt). ``retool_prompt``:
rows with it and the answer format. ``sft_messages``: one record of ReTool-SFT (the hub's ``JoeYing/ReTool-SFT``: a
user turn holding "*user question:*" and the question, an assistant turn whose text interleaves ``<code>`` blocks,
``<interpreter>`` outputs and a final ``<answer>``) in the form the RL run's agent loop produces: the system message,
assistant turns with ``code_interpreter`` tool calls, tool turns with the interpreter's output, the final answer.
"""

from __future__ import annotations

import json
import re

ANSWER_FORMAT = "\nThe answer format must be: \\boxed{'The final answer goes here.'}"
CODE_INTERPRETER = {"type": "function", "function": {
    "name": "code_interpreter", "description": "A tool for executing code.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "The code to execute."}},
                   "required": ["code"]}}}
RETOOL_SYSTEM = ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one "
                 "or more functions to assist with the user query.\n\nYou are provided with function signatures within "
                 f"<tools></tools> XML tags:\n<tools>\n{json.dumps(CODE_INTERPRETER)}\n</tools>\n\nFor each function "
                 "call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:"
                 "\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>")
QUESTION_MARK = "*user question:*"
_PYTHON = re.compile(r"```python(.*?)```", re.DOTALL)


def retool_prompt(rows: list[dict]) -> list[dict]:
    """verl-schema rows with ReTool's prompt: the system message above, the user turn plus the answer format."""
    return [r | {"prompt": [{"role": "system", "content": RETOOL_SYSTEM},
                            {"role": "user", "content": r["prompt"][-1]["content"] + ANSWER_FORMAT}]} for r in rows]


def _between(text: str, start: str, stop: str, where: str) -> tuple[str, str, str] | None:
    """(before, inside, after) of the first ``start``...``stop`` block of ``text``; None without one."""
    i = text.find(start)
    if i == -1:
        return None
    j = text.find(stop, i)
    if j == -1:
        raise ValueError(f"{where}: {start} without {stop}")
    return text[:i], text[i + len(start):j], text[j + len(stop):]


def sft_messages(record: dict, where: str) -> list[dict]:
    """One ReTool-SFT record as [system, user, assistant (text + a code_interpreter call), tool (its output), ...,
    assistant (the answer)]; ``where`` names the record in errors."""
    turns = record.get("messages")
    turns = list(turns) if turns is not None else []
    if len(turns) < 2 or QUESTION_MARK not in str(turns[0].get("content", "")) or turns[1].get("role") != "assistant":
        raise ValueError(f"{where}: expected messages [user with {QUESTION_MARK!r} and the question, assistant]")
    question = turns[0]["content"].split(QUESTION_MARK, 1)[1].replace("<answer>", "").replace("</answer>", "").strip()
    # the question as ReTool-SFT states it (with its own answer instruction, tags dropped, as verl's preprocessing
    # keeps it): the RL prompt's DAPO template and ANSWER_FORMAT are not added, the traces answer to this text
    out = [{"role": "system", "content": RETOOL_SYSTEM}, {"role": "user", "content": question}]
    rest = str(turns[1]["content"])
    while rest.strip():
        code = _between(rest, "<code>", "</code>", where)
        if code is None:  # the last turn: the answer, its tags dropped
            answer = _between(rest, "<answer>", "</answer>", where)
            text = rest if answer is None else answer[0] + answer[1] + answer[2]
            out.append({"role": "assistant", "content": text.strip()})
            break
        before, block, rest = code
        found = _PYTHON.findall(block)
        call = {"type": "function", "function": {"name": "code_interpreter",
                                                 "arguments": {"code": (found[0] if found else block).strip()}}}
        out.append({"role": "assistant", "content": before.strip(), "tool_calls": [call]})
        output = _between(rest, "<interpreter>", "</interpreter>", where)
        if output is None:
            raise ValueError(f"{where}: a <code> block without the <interpreter> output after it")
        out.append({"role": "tool", "content": output[1].strip()})
        rest = output[2]
    if out[-1]["role"] != "assistant" or "tool_calls" in out[-1]:
        raise ValueError(f"{where}: the conversation does not end with an answer")
    return out
