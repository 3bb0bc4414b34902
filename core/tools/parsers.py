"""Tool-call parsers: one model turn's text -> the tool calls it makes. A registry with one signature,
``parser(text) -> list[ToolCall]``; a call whose body does not parse comes back with ``error`` set (the agent
loop answers it with that error, as it answers a failing tool), never as an exception."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from core.algos.registry import Registry


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict = field(default_factory=dict)
    # why the call could not be read (bad JSON, no name); empty when it parsed
    error: str = ""


ToolCallParser = Callable[[str], list[ToolCall]]
TOOL_CALL_PARSERS: Registry[ToolCallParser] = Registry("tool-call parser", ("text",))

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _calls_from_json(body: str) -> list[ToolCall]:
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return [ToolCall("", {}, f"the tool call is not JSON ({e.msg} at character {e.pos}): {body.strip()[:200]}")]
    out = []
    for item in value if isinstance(value, list) else [value]:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            out.append(ToolCall("", {}, f"a tool call needs a \"name\" string: {json.dumps(item)[:200]}"))
            continue
        args = item.get("arguments", item.get("parameters", {}))
        if isinstance(args, str):  # some models send the arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                args = {"input": args}
        out.append(ToolCall(item["name"], args if isinstance(args, dict) else {"input": args}))
    return out


@TOOL_CALL_PARSERS.register("hermes")
def hermes(text):
    """Hermes / Qwen2.5 / SmolLM2 convention: each call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
    SmolLM2 writes a JSON list of calls inside one pair of tags, which gives each of them. Text outside the tags
    is the model's own. Shapes: one string in, a list of ToolCall out (empty: no call, the turn is an answer).
    Example: 'Let me compute. <tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call>'
    -> [ToolCall(name='python', arguments={'code': 'print(2**10)'}, error='')]; '<tool_call>{oops</tool_call>' ->
    one ToolCall with error "the tool call is not JSON (...)"."""
    return [call for body in _HERMES.findall(text) for call in _calls_from_json(body)]
