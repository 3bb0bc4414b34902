"""Code RL's reward: the policy's program run against the problem's unit tests, in the tool sandbox
(``core.tools.sandbox``: namespaces of its own by default, ``tools.isolation``), score = share of tests passed.

The ground truth is verl's / PRIME's form (APPS, TACO, CodeContests), a dict or its JSON text::

    {"inputs": [stdin, ...], "outputs": [expected stdout, ...]}                 # standard input / output
    {"fn_name": "add", "inputs": [[1, 2], ...], "outputs": [3, ...]}            # call-based: fn(*args) == output
    optional: "time_limit_s" (per test, default TIME_LIMIT_S)

The program is the response's last fenced code block (```python or ```), else the whole response. Each test is a
fresh sandboxed process with the test's own time limit; a test passes when the program exits 0 and its output
matches: line by line with trailing whitespace ignored, numbers equal to 1e-6 relative (``outputs_match``);
call-based, the JSON of the returned value equals the expected one (tuples as lists). A ground truth that is not
this form, or no tests, scores 0 (``pred`` says why). At most ``MAX_TESTS`` tests run (evenly spread).

Time: up to ``len(tests) * time_limit_s`` per response -- keep ``algo.reward_timeout_s`` above it.
Example: ('```python\\nprint(int(input()) * 2)\\n```', {"inputs": ["2\\n", "5\\n"], "outputs": ["4\\n", "10\\n"]})
-> score 1.0; a program printing 4 always -> 0.5.
"""

from __future__ import annotations

import json
import math
import re

from core.tools.sandbox import SandboxLimits, run_python

TIME_LIMIT_S = 4.0
MAX_TESTS = 32
MAX_OUTPUT_BYTES = 1 << 20
SOURCES = ("code_tests", "codecontests", "apps", "codeforces", "taco")

_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)
_CALL = """
import json as _json, sys as _sys
_args = _json.loads(_sys.stdin.read())
_fn = globals().get({name!r}) or getattr(globals()["Solution"](), {name!r})
print(_json.dumps(_fn(*_args)))
"""


def program(response: str) -> str:
    """The last fenced code block of ``response``, else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def _tokens_equal(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        x, y = float(a), float(b)
    except ValueError:
        return False
    return math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)


def outputs_match(got: str, expected: str) -> bool:
    """Line by line, trailing whitespace and trailing empty lines ignored; tokens equal or numbers within 1e-6."""
    g = [line.rstrip() for line in got.rstrip().split("\n")]
    e = [line.rstrip() for line in str(expected).rstrip().split("\n")]
    if len(g) != len(e):
        return False
    for gl, el in zip(g, e):
        gt, et = gl.split(), el.split()
        if len(gt) != len(et) or not all(_tokens_equal(x, y) for x, y in zip(gt, et)):
            return False
    return True


def _canonical(value):
    return json.loads(json.dumps(value))  # tuples -> lists, as the program's JSON output has them


def _tests(ground_truth) -> tuple[dict | None, str]:
    try:
        gt = json.loads(ground_truth) if isinstance(ground_truth, str) else dict(ground_truth)
        inputs, outputs = list(gt["inputs"]), list(gt["outputs"])
    except (ValueError, TypeError, KeyError) as e:
        return None, f"ground truth is not {{inputs, outputs}}: {type(e).__name__}"
    if not inputs or len(inputs) != len(outputs):
        return None, f"ground truth has {len(inputs)} inputs and {len(outputs)} outputs"
    return gt, ""


def compute_score(solution_str: str, ground_truth) -> dict:
    """{"score": share of tests passed, "acc": all passed, "pred": a one-line summary}."""
    gt, why = _tests(ground_truth)
    if gt is None:
        return {"score": 0.0, "acc": False, "pred": why}
    code, pairs = program(solution_str), list(zip(gt["inputs"], gt["outputs"]))
    if len(pairs) > MAX_TESTS:
        pairs = [pairs[round(i * (len(pairs) - 1) / (MAX_TESTS - 1))] for i in range(MAX_TESTS)]
    limits = SandboxLimits(timeout_s=float(gt.get("time_limit_s", TIME_LIMIT_S)), max_output_bytes=MAX_OUTPUT_BYTES)
    name = gt.get("fn_name")
    passed, first_failure = 0, ""
    for i, (stdin, expected) in enumerate(pairs):
        if name:
            r = run_python(code + "\n" + _CALL.format(name=name), limits, stdin=json.dumps(stdin))
            try:
                ok = r.ok and _canonical(json.loads(r.text.strip().split("\n")[-1])) == _canonical(expected)
            except (ValueError, IndexError):
                ok = False
        else:
            r = run_python(code, limits, stdin=str(stdin))
            ok = r.ok and outputs_match(r.text, expected)
        passed += ok
        if not ok and not first_failure:
            first_failure = f"; test {i + 1} failed ({'wrong output' if r.ok else r.status})"
    return {"score": passed / len(pairs), "acc": passed == len(pairs),
            "pred": f"{passed}/{len(pairs)} tests passed{first_failure}"}
