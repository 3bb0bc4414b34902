"""Tool-call parsers (core/tools/parsers.py): the Hermes convention, SmolLM2's list form, and unreadable calls
returned as errors for the model, by hand."""

from core.tools.parsers import TOOL_CALL_PARSERS, ToolCall

hermes = TOOL_CALL_PARSERS["hermes"]


def test_calls_in_tags_and_none_outside():
    text = ('I will compute. <tool_call>{"name": "python", "arguments": {"code": "print(2**10)"}}</tool_call> and '
            '<tool_call>\n{"name": "calculator", "arguments": "{\\"expr\\": \\"3*4\\"}"}\n</tool_call>')
    assert hermes(text) == [ToolCall("python", {"code": "print(2**10)"}), ToolCall("calculator", {"expr": "3*4"})]
    assert hermes("The answer is 42.") == [] and hermes("<tool_call>{}") == []  # unclosed: not a call yet


def test_smollm2_writes_a_list_of_calls_in_one_tag():
    text = '<tool_call>[{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "mul", "parameters": {"a": 3}}]</tool_call>'
    assert hermes(text) == [ToolCall("add", {"a": 1, "b": 2}), ToolCall("mul", {"a": 3})]


def test_unreadable_calls_come_back_as_errors():
    bad, nameless = hermes("<tool_call>{oops}</tool_call><tool_call>{\"arguments\": {}}</tool_call>")
    assert bad.name == "" and bad.error.startswith("the tool call is not JSON (Expecting property name")
    assert nameless.error == 'a tool call needs a "name" string: {"arguments": {}}'
