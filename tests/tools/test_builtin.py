"""Built-in tools (core/tools/builtin.py) through the real sandbox: answers, refusals and errors as text."""

from core.tools.builtin import TOOLS
from core.tools.sandbox import SandboxLimits

LIMITS = SandboxLimits(timeout_s=3.0)


def test_python_and_calculator_answer_as_text():
    assert TOOLS["python"]({"code": "print(123 * 456)"}, LIMITS).text == "56088\n"
    assert TOOLS["calculator"]({"expression": "123 * 456"}, LIMITS).text == "56088\n"
    assert TOOLS["calculator"]({"expr": "(7 + 5) / 4"}, LIMITS).text == "3\n"
    assert TOOLS["calculator"]({"input": "10 / 4"}, LIMITS).text == "2.5\n"


def test_the_calculator_refuses_names_calls_and_bad_syntax():
    r = TOOLS["calculator"]({"expression": "__import__('os').getcwd()"}, LIMITS)
    assert r.status == "error" and r.text.startswith("error: ValueError: only numbers and + - * / // % ** ( )")
    r = TOOLS["calculator"]({"expression": "2 +"}, LIMITS)
    assert r.status == "error" and r.text.startswith("error: SyntaxError")
    r = TOOLS["calculator"]({"expression": "9 ** 9 ** 9"}, SandboxLimits(timeout_s=1.0))
    assert r.status in ("timeout", "error") and not r.ok  # contained by the sandbox's limits


def test_missing_arguments_are_named_without_running_anything():
    r = TOOLS["python"]({"source": "print(1)"}, LIMITS)
    assert (r.status, r.isolation) == ("error", "not run")
    assert r.text == 'python needs {"code": "<python source>"}, got {"source": "print(1)"}'
