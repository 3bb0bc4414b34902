"""The tools an agent can call, by name: one signature, ``tool(arguments, limits) -> ToolResult``, each run in the
sandbox (``core.tools.sandbox``): whatever the model sends, the tool answers with text and never raises."""

from __future__ import annotations

import ast
import json
import re
from typing import Callable

from core.algos.registry import Registry
from core.tools.sandbox import SandboxLimits, ToolResult, run_python

Tool = Callable[[dict, SandboxLimits], ToolResult]
TOOLS: Registry[Tool] = Registry("tool", ("arguments", "limits"))


def _argument(arguments: dict, names: tuple[str, ...]) -> str | None:
    for name in names:
        if isinstance(arguments.get(name), str):
            return arguments[name]
    return None


def refused(message: str) -> ToolResult:
    """An answer to a call that was not run (bad or missing arguments, unknown tool, unreadable call)."""
    return ToolResult(message, "error", None, 0.0, "not run")


def notebook_cell(code: str) -> str:
    """Code as a notebook cell runs it, the way ReTool's interpreter does: the first ```python fenced block if the
    text has one, and a last line that is a bare expression printed. Code that does not parse is left alone (the
    sandbox reports its SyntaxError). Example: '```python\\nx = 6\\nx * 7\\n```' -> 'x = 6\\nprint(x * 7)'."""
    fenced = re.search(r"```(?:python|py)?\n(.*?)```", code, re.DOTALL)
    code = (fenced.group(1) if fenced else code).strip("\n")
    try:  # the model's text, parsed in this process: a null byte or deep nesting raises other errors than SyntaxError
        last = ast.parse(code).body[-1:]
    except Exception:  # noqa: BLE001 (left to the sandbox, which reports whatever Python says)
        return code
    if last and isinstance(last[0], ast.Expr) and not (isinstance(last[0].value, ast.Call)
                                                        and getattr(last[0].value.func, "id", None) == "print"):
        node, lines, raw = last[0], code.split("\n"), code.encode()

        def at(line: int, col: int) -> int:  # ast's (line, utf-8 column) -> offset into raw
            return sum(len(x.encode()) + 1 for x in lines[:line - 1]) + col

        start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
        code = (raw[:start] + b"print(" + raw[start:end] + b")" + raw[end:]).decode()
    return code


@TOOLS.register("python", "code_interpreter")
def python(arguments, limits):
    """Run Python code; the answer is what it prints (stdout and stderr), as ReTool's code interpreter: a
    ```python fence is unwrapped and a last bare expression is printed (``notebook_cell``).
    Arguments: {"code": str} (also "input"). Example: {"code": "print(123 * 456)"} -> text '56088\\n';
    {"code": "x = 123\\nx * 456"} -> '56088\\n'."""
    code = _argument(arguments, ("code", "input"))
    if code is None:
        return refused(f'python needs {{"code": "<python source>"}}, got {json.dumps(arguments)[:200]}')
    return run_python(notebook_cell(code), limits)


# evaluated in the sandbox: numbers and + - * / // % ** and parentheses only, no names, no calls
_CALCULATOR = '''
import ast, operator, sys
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
       ast.UAdd: operator.pos}
def ev(node):
    if isinstance(node, ast.Expression):
        return ev(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        return OPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPS:
        return OPS[type(node.op)](ev(node.operand))
    raise ValueError("only numbers and + - * / // % ** ( ) are allowed")
try:
    value = ev(ast.parse(EXPR, mode="eval"))
except Exception as e:
    print(f"error: {type(e).__name__}: {e}")
    sys.exit(1)
print(int(value) if isinstance(value, float) and value.is_integer() else value)
'''


@TOOLS.register("calculator")
def calculator(arguments, limits):
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses (no names, no calls), in the
    sandbox, so a 9**9**9 runs into its time and memory limits, not the worker's. Arguments: {"expression": str}
    (also "expr", "input"). Example: {"expression": "123 * 456"} -> text '56088\\n'; {"expression": "2 +"} ->
    status error, text 'error: SyntaxError: ...'."""
    expression = _argument(arguments, ("expression", "expr", "input"))
    if expression is None:
        return refused(f'calculator needs {{"expression": "<arithmetic>"}}, got {json.dumps(arguments)[:200]}')
    return run_python(f"EXPR = {expression!r}\n{_CALCULATOR}", limits)
