"""A fast rejection filter for symbolic answers: LaTeX arithmetic evaluated at fixed real points, linear time.

``differ(a, b)`` is True only when both strings parse completely under the strict grammar below and their values
differ at one of three fixed points by more than float error can explain; then math-verify cannot call them
equal, and ``is_equiv`` may answer False without it. Anything else (unparsable, equal at the points, any doubt)
is False and math-verify decides. A wrong True is a bug; ``evaluate`` returning None is always safe.

Grammar (spaces, ``\\,`` ``\\;`` ``\\:`` ``\\quad`` ``\\ `` ignored; ``\\left``/``\\right`` before a bracket dropped; a
trailing unit word dropped twice, as math-verify does: ``x + 2 t`` is x + 2 there)::

    expr  := mp (('+' | '-') mp)*                  mp := unary (('*' | \\cdot | \\times | '/') unary)*
    unary := ('+' | '-') unary | power+            (juxtaposition: implicit product, binds tighter than * and /)
    power := atom ['^' ('{' expr '}' | digit | letter | greek | \\pi)]
    atom  := number | name[_sub] | \\pi | e | I | (expr) | [expr] | {expr} | \\frac{expr}{expr} | \\frac DD
             | \\sqrt{expr} | \\sqrt[expr]{expr} | fn[^k] (expr) | fn[^k] arg
    arg   := factors joined by juxtaposition, * and /, up to the next + - or function (\\sin x y is sin(xy) there)
    fn    := \\sin \\cos \\tan \\ln \\exp \\arcsin \\arccos \\arctan   name := letter | greek | \\dot{x} | \\ddot{x} | \\hat{x}
             | name' | name^{\\prime} | \\frac{dx}{dt} | \\frac{d^2x}{dt^2} | I(n)

Why it is safe: every reading is math-verify's own (latex2sympy, lowercase symbols): ``e`` is Euler's number and
``E`` the variable ``e``, ``M`` and ``m`` one variable, ``\\Omega`` is ``\\omega``, ``\\Pi`` is pi, ``x_{0}`` is
``x_0``, ``I`` the imaginary unit and ``i`` a variable, ``\\sin^2 x`` is sin(x)**2; ``f(x)`` is an undefined function
there and a product here, one substitution on both sides, which keeps every identity (so is ``I(0)``, a function at a
number there: one variable here). Names merge where math-verify's differ (``x_{\\text{red}}`` and ``x_{red}``): an
identity of the finer reading holds in the coarser. Two readings are the mathematics' rather than math-verify's,
and there ``differ`` may reject what math-verify accepts: a derivative (``\\frac{dx}{dt}``, ``y'``, ``\\dot{x}``) is a
variable of its own, where math-verify evaluates ``\\frac{dx}{dt}`` of a symbol to 0 and reads ``y'`` as ``y``.
Where its reading is another or is ambiguous, None: ``1/2x`` (a product after ``/``: 1/(2x)
there), adjacent numeric factors (``2 3`` is 5, ``2\\frac12`` 5/2 there), ``a^b^c``, ``x^23``, ``x^-1``,
``\\sin(x)^2``, ``\\sin^{-1} x`` (arcsin), ``\\sqrt`` inside an argument without brackets, ``f(x)^2``, ``x^2(y)``,
``I(x)``, ``2E3``, ``d x``, ``\\frac{d}{dx}``, ``\\gamma``, ``\\dot x``,
``\\log`` (base 10 there, yet ``e^{\\log t}`` is t), ``x_e`` and letters its lexer takes as a name (``tr``,
``gcd``: no parse there), text math-verify's normalisation rewrites ("and",
"inf", ``}12``), any other command or character (``=`` ``,`` ``|`` ``!`` ``\\pm``
``\\infty`` ``\\text``), over 300 characters, nesting over 60, overflow, division by zero. A lone variable never
differs (math-verify compares names there: ``E`` equals ``e``, ``\\mu`` equals ``m u``). The points are real (each
variable 0.3 to 3.1 from a stable hash of its name): math-verify's symbols are real and sympy proves identities
that hold on a branch cut only (``\\sqrt{-x^2} = \\sqrt{-1}\\sqrt{x^2}``), false beside it. Exact reals stay floats,
so a negative real takes the principal side as in sympy; each value carries a first-order error bound that a
difference must exceed 1000-fold, so cancellation never reads as a difference, and a value within its error of a
cut or of 0 has none. Equations: ``core.rewards.equations``.
"""

from __future__ import annotations

import cmath
import functools
import math
import re
import zlib

from core.rewards.latex_tokens import CLOSE, FUNCS, NAMES, REWRITTEN, call_text, strip_units, tokens

MAX_CHARS, MAX_DEPTH = 300, 60
TOL = 2e-6  # relative, and absolute below 1: math-verify rounds a float answer to 6 places (|a - b| < 1e-6)
EPS, SAFETY, INF = 1e-15, 1e3, float("inf")


def _doubt(a, ea) -> bool:
    """The principal branch at ``a`` is in doubt: 0 within its error, or a complex value within its error of the
    negative reals (an exact real is a float: on the principal side, as in sympy)."""
    return abs(a) <= ea or isinstance(a, complex) and a.real < 0 and abs(a.imag) <= ea


def _pow(a, b, ea, eb, exact: bool):
    if exact:  # an integer exponent: no branch
        n = int(b.real)
        v = a ** n
        if n >= 0:
            return v, n * (abs(a) + ea) ** max(n - 1, 0) * ea + EPS * n * abs(v)
        return v, INF if abs(a) <= ea else -n * abs(v) * (ea / (abs(a) - ea) + EPS)
    if _doubt(a, ea):
        return a ** b, INF
    v = complex(a) ** b if isinstance(a, float) and a < 0 else a ** b
    lg = abs(cmath.log(a))
    return v, abs(v) * (abs(b) * ea / (abs(a) - ea) + lg * eb + EPS * (1 + abs(b) * lg))


def _func(name, a, ea):
    m = math if isinstance(a, float) and (a > 0 or name != "ln") else cmath
    if name == "ln":
        v = m.log(a)
        return v, INF if _doubt(a, ea) else ea / (abs(a) - ea) + EPS * (1 + abs(v))
    if name.startswith("arc"):  # on or near a branch cut (real |a| >= 1; imaginary |a| >= 1 for arctan): no value
        z = complex(a)
        on_cut = abs(z.real) <= ea and abs(z.imag) >= 1 - ea if name == "arctan" else \
            abs(z.imag) <= ea and abs(z.real) >= 1 - ea
        v = getattr(cmath, "a" + name[3:])(z)
        v = v.real if v.imag == 0 else v
        if on_cut:
            return v, INF
        slope = 1 / abs(1 + z * z) if name == "arctan" else 1 / abs(cmath.sqrt(1 - z * z))
        return v, slope * ea + EPS * (1 + abs(v))
    v = getattr(m, name)(a)
    slope = {"exp": abs(v), "tan": abs(1 + v * v), "sin": abs(m.cos(a)) + ea, "cos": abs(m.sin(a)) + ea}[name]
    return v, slope * (ea + EPS * (1 + abs(a)))


def _arith(op, f, g):
    def run(p):
        (a, ea), (b, eb) = f(p), g(p)
        if op == "*":
            return a * b, abs(a) * eb + abs(b) * ea + ea * eb + EPS * abs(a * b)
        if op == "/":
            v = a / b
            return v, (ea + abs(v) * eb) / (abs(b) - eb) + EPS * abs(v) if abs(b) > eb else INF
        v = a + b if op == "+" else a - b
        return v, ea + eb + EPS * abs(v)
    return run


FACTOR = ("num", "var", "pi", "e", "I", "(", "[", "{", "cmd")


class _Parser:
    """Recursive descent over the tokens, building closures point -> (value, error bound). Each rule returns
    (closure, info); info: rat (numbers only), int (an integer literal), atom (a letter or constant, maybe a
    function name there), atom_pow (one raised), simple (an atom or its power), call (a group holding a simple
    one: an argument there), bare (a lone variable), len (factors of a juxtaposition)."""

    def __init__(self, toks, opaque: bool = False):
        self.t, self.i, self.depth, self.opaque = toks, 0, 0, opaque

    def peek(self, k=0):
        return self.t[self.i + k][0] if self.i + k < len(self.t) else None

    def take(self, kind):
        if kind is None or self.peek() != kind:
            raise ValueError(kind)
        self.i += 1
        return self.t[self.i - 1]

    def nest(self, rule):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ValueError("too deep")
        out = rule()
        self.depth -= 1
        return out

    def expr(self):
        return self.nest(lambda: self.ops(("+", "-"), lambda: self.ops(("*", "/"), self.unary)))

    def ops(self, ops, operand):
        f, info = operand()
        while self.peek() in ops:
            op = self.take(self.peek())[0]
            g, ginfo = operand()
            if op == "/" and ginfo.get("len", 1) > 1:
                raise ValueError("1/2x")  # 1/(2x) in math-verify, (1/2)x to a reader
            f, info = _arith(op, f, g), {"rat": info["rat"] and ginfo["rat"]}
        return f, info

    def unary(self):
        if self.peek() in ("+", "-"):
            neg = self.take(self.peek())[0] == "-"
            f, info = self.nest(self.unary)
            info = {**info, "simple": False, "bare": info.get("bare") and not neg}
            return ((lambda p: (lambda r: (-r[0], r[1]))(f(p))) if neg else f), info
        f, infos = self.juxtaposition(argument=False)
        return f, {**infos[1], "len": 1} if len(infos) == 2 else {"rat": False, "len": len(infos) - 1}

    def juxtaposition(self, argument: bool):
        r"""Factors side by side (an implicit product) and their infos after a leading {}. ``argument``: a function's
        argument without brackets -- up to the next function or ``e``, no ``\sqrt`` (math-verify's reading changes
        with its place: ``\sin \sqrt{x} y`` is sin(sqrt(x) y), ``\sin x \sqrt{y}`` sqrt(y) sin(x))."""
        factors, infos = [], [{}]
        while self.peek() in FACTOR and not (argument and self.t[self.i] in _FNS):
            if argument and (self.t[self.i] == ("cmd", "sqrt") or self.t[self.i] == ("cmd", "frac") and factors):
                raise ValueError("sqrt in an argument")
            if argument and self.peek() == "e":  # \sin x e is e sin(x) there: e ends the argument
                if not factors:
                    raise ValueError("e opens an argument")
                break
            start = self.i
            f, info = self.power(infos[-1])
            if infos[-1].get("rat") and info["rat"]:
                raise ValueError("mixed number")  # 2 3 -> 5, 2\frac12 -> 5/2 in math-verify
            if self.opaque and info.get("call") and infos[-1].get("atom") and self.t[start] == ("(",):
                if self.t[start - 1][0] != "var":
                    raise ValueError("a call of a constant")
                name = call_text(self.t, self.t[start - 1][1], start + 1, self.i - 1)  # f(0): one variable
                factors[-1], infos[-1] = (lambda p, n=name: (p[n], 0.0)), {"rat": False}
                continue
            factors.append(f)
            infos.append(info)
        if not factors:
            raise ValueError("operand expected")
        f = factors[0]
        for g in factors[1:]:
            f = _arith("*", f, g)
        return f, infos

    def power(self, before):
        f, info = self.atom()
        call = info.get("call") and (before.get("atom") or before.get("atom_pow"))
        if call and before.get("atom_pow"):
            raise ValueError("x^2(y)")  # x(y)**2 in math-verify
        if self.peek() != "^":
            return f, info
        if call:
            raise ValueError("f(x)^2")  # (f(x))**2 in math-verify
        self.i += 1
        k = self.peek()
        if k == "{":
            g, ginfo = self.group("{")
        elif k in ("var", "pi") and "_" not in self.t[self.i][-1] or k == "num" and len(self.t[self.i][1]) == 1:
            g, ginfo = self.atom()
        else:
            raise ValueError("exponent")  # x^23, x^-1, x^a_1, x^(2), x^e
        if self.peek() == "^":
            raise ValueError("a^b^c")
        exact = ginfo.get("int", False)
        return (lambda p: (lambda a, b: _pow(a[0], b[0], a[1], b[1], exact))(f(p), g(p))), \
            {"rat": info["rat"] and ginfo["rat"], "atom_pow": info.get("atom"), "simple": info.get("simple")}

    def group(self, open_):
        self.take(open_)
        f, info = self.expr()
        self.take(CLOSE[open_])
        return f, {**info, "atom": False, "len": 1, "simple": False, "call": info.get("simple", False)}

    def atom(self):
        k = self.peek()
        if k in ("(", "[", "{"):
            return self.group(k)
        tok = self.take(k)
        if k == "num":
            v, exact = float(tok[1]), "." not in tok[1] and len(tok[1]) <= 15
            return (lambda p: (v, 0.0 if exact else EPS * v)), {"rat": True, "int": exact, "simple": True}
        if k == "var":
            bare = "(" not in tok[1] and "/" not in tok[1]  # I(0), dx/dt: no symbol there
            return (lambda p, n=tok[1]: (p[n], 0.0)), {"rat": False, "atom": True, "bare": bare, "simple": True}
        if k in ("pi", "e"):
            v = math.pi if k == "pi" else math.e
            return (lambda p: (v, EPS * 3)), {"rat": False, "atom": True, "simple": True}
        if k == "I":
            return (lambda p: (1j, 0.0)), {"rat": False, "simple": True}
        if k != "cmd":
            raise ValueError("operand expected")
        if tok[1] == "frac":
            num, ninfo = self.group("{")
            if self.peek(1) == "var" and self.t[self.i + 1][1] == "d":
                raise ValueError("d/dx")
            den, dinfo = self.group("{")
            return _arith("/", num, den), {"rat": ninfo["rat"] and dinfo["rat"]}
        if tok[1] == "sqrt":
            n = self.group("[")[0] if self.peek() == "[" else (lambda p: (2.0, 0.0))
            a = self.group("{")[0]
            return (lambda p: (lambda x, m: _pow(x[0], 1 / m[0], x[1], m[1] / abs(m[0]) ** 2, False))(a(p), n(p))), \
                {"rat": False}
        n = self.fn_power()
        if self.peek() == "(":  # \sin(x) y: sin(x) times y
            a = self.group("(")[0]
            if self.peek() == "^":
                raise ValueError("sin(x)^2")
        elif self.peek() in FACTOR:  # \sin 2x/3 y: sin(2x/3 y), to the next + or - or function, as math-verify
            a = self.ops(("*", "/"), self.fn_arg)[0]
            if self.peek() not in (None, "+", "-", ")", "]", "}", "e") and self.t[self.i] not in _FNS:
                raise ValueError("sin x y")
        else:
            raise ValueError("function argument")  # \sin -x
        f = (lambda p, name=tok[1]: (lambda x: _func(name, x[0], x[1]))(a(p)))
        if n:
            f = (lambda p, g=f: (lambda x: _pow(x[0], n, x[1], 0.0, True))(g(p)))
        return f, {"rat": False}

    def fn_power(self) -> int:
        r"""``\sin^2 x`` is sin(x)**2; ``\sin^{-1} x`` (arcsin there) and any other exponent: no parse."""
        if self.peek() != "^":
            return 0
        self.i += 1
        braced = self.peek() == "{"
        if braced:
            self.i += 1
        tok = self.take("num")
        if braced:
            self.take("}")
        if not tok[1].isdigit() or not 0 < int(tok[1]) < 10 or len(tok[1]) > 1 and not braced:
            raise ValueError("sin^k")
        return int(tok[1])

    def fn_arg(self):
        f, infos = self.juxtaposition(argument=True)
        return f, {"rat": False, "len": len(infos) - 1}


_FNS = frozenset(("cmd", f) for f in FUNCS)


@functools.lru_cache(maxsize=8192)
def compiled(s: str, units: bool = True, opaque: bool = False):
    """(closure point -> (value, error bound), is a lone variable) for ``s``, or None when ``s`` is outside the
    grammar. ``units=False``: ``s`` is part of a text whose trailing unit word is already stripped. ``opaque``: a
    call ``f(t)`` is one variable named by its text (``latex_tokens.call_text``), as an equation needs: a product
    f*t keeps identities but not solution sets (f(0) would be 0)."""
    if len(s) > MAX_CHARS or REWRITTEN.search(s) or NAMES.search(re.sub(r"\\[a-zA-Z]+", " ", s)):
        return None
    toks = tokens(strip_units(s) if units else s)
    if not toks:
        return None
    parser = _Parser(toks, opaque)
    try:
        f, info = parser.expr()
    except (ValueError, IndexError, RecursionError):
        return None
    return (f, bool(info.get("bare"))) if parser.i == len(toks) else None


def run(c, point) -> tuple[complex, float] | None:
    """A compiled text's (value, error bound) at ``point``, or None (overflow, division by zero, not finite)."""
    try:
        v, e = c[0](point)
    except (OverflowError, ZeroDivisionError, ValueError, KeyError, RecursionError):
        return None
    return (complex(v), e) if cmath.isfinite(v) and not math.isnan(e) else None


def evaluate(s: str, point: dict[str, complex]) -> complex | None:
    """The value of ``s`` with variables from ``point`` (keys: lowercase names such as ``x``, ``x_0``, ``v_max``,
    ``omega``, ``hbar``), or None: outside the grammar, a missing variable, overflow, division by zero.
    Example: evaluate('\\frac{1}{s+a}', {'s': 1, 'a': 1}) -> (0.5+0j)."""
    try:
        c = compiled(s) if isinstance(s, str) else None
        r = run(c, point) if c else None
    except Exception:  # never raises
        return None
    return r[0] if r else None


class Point(dict):
    """Fixed point ``k``: each variable a positive real from a stable hash of its name (not stored: an answer may
    name any number of variables)."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def __missing__(self, name):
        h = zlib.crc32(f"{self.k}:{name}".encode())
        return (1.15, 0.3, 2.2)[self.k] + (0.7, 0.55, 0.9)[self.k] * (h & 0xFFFF) / 65536


POINTS = tuple(Point(k) for k in range(3))


def differ(a: str, b: str, units: bool = True) -> bool:
    """True only when ``a`` and ``b`` both evaluate, finite, at all three points, neither is a lone variable, and
    at one point they differ by more than ``TOL * max(1, |a|, |b|)`` and ``SAFETY`` times their error bounds."""
    try:
        ca, cb = compiled(a, units), compiled(b, units)
        if ca is None or cb is None or ca[1] or cb[1]:
            return False
        found = False
        for p in POINTS:
            ra, rb = run(ca, p), run(cb, p)
            if ra is None or rb is None:
                return False
            d = abs(ra[0] - rb[0])
            found = found or d > TOL * max(1.0, abs(ra[0]), abs(rb[0])) and d > SAFETY * (ra[1] + rb[1])
        return found
    except Exception:
        return False
