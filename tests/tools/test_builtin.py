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


def test_python_runs_code_as_a_notebook_cell_like_retool_s_interpreter():
    """A ```python fence is unwrapped and a last bare expression printed (verl's ReTool tool does both); statements,
    prints and unparsable code are left as written."""
    from core.tools.builtin import notebook_cell

    assert notebook_cell("Let me compute:\n```python\nx = 6\nx * 7\n```\nok") == "x = 6\nprint(x * 7)"
    assert notebook_cell("a = 1; a * 2") == "a = 1; print(a * 2)"
    assert notebook_cell("s = sum([1,\n 2])\n(s *\n 3)  # times three") == "s = sum([1,\n 2])\nprint((s *\n 3))  # times three"
    for code in ("print(1)", "x = 1", "for i in range(2):\n    i", "def (:"):
        assert notebook_cell(code) == code
    assert TOOLS["code_interpreter"]({"code": "```python\nimport math\nmath.factorial(5)\n```"}, LIMITS).text == "120\n"


def test_code_python_cannot_parse_goes_to_the_sandbox_unchanged():
    """Null bytes and absurd nesting make ast.parse raise ValueError / RecursionError / MemoryError, not
    SyntaxError: the tool still answers (with the sandbox's error) instead of raising in the rollout worker."""
    from core.tools.builtin import notebook_cell

    for code in ("print(1)\x00", "(" * 100_000 + ")" * 100_000):
        assert notebook_cell(code) == code
    r = TOOLS["python"]({"code": "x = 1\x00"}, LIMITS)
    assert not r.ok and "null" in r.text.lower()
