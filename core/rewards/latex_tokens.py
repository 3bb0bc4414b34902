"""The lexer of ``core.rewards.latex_eval``: LaTeX math into tokens, read as math-verify (latex2sympy) reads it, or
None where its reading is another or ambiguous (the reasons are in ``latex_eval``'s docstring)."""

from __future__ import annotations

import functools
import re

GREEK = frozenset("alpha beta delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi rho sigma "
                  "tau upsilon phi varphi chi psi omega Delta Theta Lambda Xi Sigma Upsilon Phi Psi Omega hbar".split())
FUNCS = frozenset("sin cos tan ln exp arcsin arccos arctan".split())
_NAME = r"(?:[a-zA-Z]|\\[a-zA-Z]+)"  # a letter or a Greek command


def _sub(tag: str) -> str:  # x_0, x_{max}, x_{\text{max}} (one name here, two there: a merge is safe); x_e: no parse
    return (rf"_(?:\{{(?P<{tag}1>[a-zA-Z0-9]+)\}}|\{{\\text ?\{{(?P<{tag}2>[a-zA-Z0-9]+)\}}\}}"
            rf"|(?P<{tag}3>[a-df-zA-Z0-9])(?![a-zA-Z0-9]))")


_TOKEN = re.compile(
    r"(?P<skip>\s+|\\(?:[,;: ]|q?quad(?![a-zA-Z])))|(?P<num>\d+(?:\.\d+)?)"
    rf"|(?P<deriv>\\[dt]?frac\s*\{{\s*d(?:\^\{{?(?P<n1>[2-9])\}}?)?\s*(?P<dx>{_NAME}(?:{_sub('ds')})?)\s*\}}"
    rf"\s*\{{\s*d\s*(?P<dy>{_NAME})\s*(?:\^\{{?(?P<n2>[2-9])\}}?)?\s*\}})"
    r"|\\[dtc]?frac(?P<f1>\d)(?P<f2>\d)(?!\d)"
    rf"|\\(?P<acc>d?dot|hat)\{{\s*(?P<acx>{_NAME})\s*\}}(?:{_sub('as')})?"
    r"|(?P<prime>'+|\^\s*\{\s*(?:\\prime\s*)+\}|\^\s*\\prime(?![a-zA-Z]))"
    rf"|\\(?P<cmd>[a-zA-Z]+)(?:{_sub('cs')})?|(?P<letter>[a-zA-Z])(?:{_sub('ls')})?|(?P<op>[-+*/^()\[\]{{}}])")
REWRITTEN = re.compile(r"(?<![a-zA-Z])(?:and|or)(?![a-zA-Z])|inf|percent|pct|(?<!\\)sqrt|\d\s*[eE]\s*[-+]?\s*\d"
                        r"|\}\s?\d[\d.]|\\(?:left|right)(?![()\[\]])")
NAMES = re.compile(r"tr|gcd|lcm|floor|ceil|eye|zeros|ones|cols|rows|diag|norm|rank|rref|stack|null|matrix|orth|eig|svd"
                    r"|ar[cst]")  # letters math-verify's lexer takes as one name (\operatorname's): no parse there
_CMDS = {"cdot": ("*",), "times": ("*",), "pi": ("pi",), "Pi": ("pi",), "sqrt": ("cmd", "sqrt"),
         **{f: ("cmd", "frac") for f in ("frac", "dfrac", "tfrac", "cfrac")}, **{f: ("cmd", f) for f in FUNCS}}
CLOSE = {"(": ")", "[": "]", "{": "}"}


@functools.cache
def units_pattern() -> re.Pattern:
    """math-verify strips a trailing unit word (`` t``, `` m``, ``2 d``) twice; so do we (``strip_units``)."""
    try:
        from latex2sympy2_extended.math_normalization import units_regex
        return units_regex
    except ImportError:  # no math-verify: nothing to disagree with
        return re.compile(r"(?!)")


def strip_units(s: str) -> str:
    s = s.replace("\\left", "").replace("\\right", "").replace("\\ ", " ")
    for _ in range(2):  # as math-verify's normalisation: a unit word at the end, twice, never to nothing
        t = units_pattern().sub(r"\1", s)
        if t and t != s:
            s = t
    return s


def tokens(s: str) -> list[tuple] | None:
    out, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if m is None:
            return None
        pos = m.end()
        g = m.groupdict()
        sub = next((v for k, v in g.items() if v and k[-1] in "123" and k[:2] in ("as", "cs", "ls")), "")
        if g["skip"]:
            continue
        if g["num"]:
            out.append(("num", g["num"]))
        elif g["deriv"]:  # dx/dt: a quantity of its own (math-verify's sympy evaluates it to 0 for a symbol x)
            n1, n2, dx, dy = g["n1"] or "", g["n2"] or "", g["dx"], g["dy"]
            if n1 != n2 or any(v.startswith("\\") and v[1:].split("_")[0] not in GREEK for v in (dx, dy)):
                return None
            out.append(("var", f"d{n1}{dx}/d{dy}{n2}".replace("\\", "").replace("{", "").replace("}", "").lower()))
        elif g["f1"]:  # \frac12
            out += [("cmd", "frac"), ("{",), ("num", g["f1"]), ("}",), ("{",), ("num", g["f2"]), ("}",)]
        elif g["acc"]:  # \dot{x}: a symbol of its own there too
            if g["acx"].startswith("\\") and g["acx"][1:] not in GREEK:
                return None
            out.append(("var", (f"{g['acc']}{{{g['acx']}}}" + (f"_{sub}" if sub else "")).lower()))
        elif g["prime"]:  # y', y^{\prime}: a derivative, its own quantity (math-verify reads y' as y, y^{\prime} as
            if not out or out[-1][0] != "var":  # y**prime: neither is the mathematics)
                return None
            out[-1] = ("var", out[-1][1] + "'" * max(g["prime"].count("'"), g["prime"].count("\\prime")))
        elif g["cmd"] in GREEK:
            out.append(("var", (g["cmd"] + (f"_{sub}" if sub else "")).lower()))
        elif g["cmd"] in ("left", "right") and not sub:
            continue  # a bracket follows (REWRITTEN)
        elif g["cmd"]:
            if sub or g["cmd"] not in _CMDS:
                return None
            out.append(_CMDS[g["cmd"]])
        elif g["letter"]:  # I: imaginary there, I(0) a function, I(x+1) a product, I^2 read as I; d x: dx there
            letter, call = g["letter"], re.match(r"\((\d{1,15})\)", s[pos:])
            if letter == "I" and call and not sub:  # I(0): an undefined function at a number, one value
                out.append(("var", f"I({int(call.group(1))})"))
                pos += call.end()
                continue
            if letter == "I" and (sub or re.match(r"\s*[({\[^]", s[pos:])) or letter in "eE" and sub or (
                    letter == "d" and not sub and re.match(r"\s*\\?[a-zA-Z]", s[pos:])):
                return None
            out.append(("e",) if letter == "e" else ("I",) if letter == "I" else
                       ("var", (letter + (f"_{sub}" if sub else "")).lower()))
        elif g["op"]:
            out.append((g["op"],))
    return out


def call_text(toks: list[tuple], name: str, i: int, j: int) -> str:
    """The name of the variable a call ``name(toks[i:j])`` stands for in an equation (``core.rewards.equations``)."""
    return f"{name}(" + " ".join("".join(t) for t in toks[i:j]) + ")"


def calls(toks: list[tuple]) -> dict[str, set[str]] | None:
    """name -> the argument texts it is applied to (``f(1)``, ``y(0)``, ``\\theta(t)``: functions there); None when
    no symbol stands outside every call (``y(0) = 1``: math-verify has nothing to solve for and calls any two such
    equations equal; ``i``, the imaginary unit in its equations, is no symbol either)."""
    found: dict[str, set[str]] = {}
    plain, i = False, 0
    while i < len(toks):
        t = toks[i]
        if t[0] == "var" and i + 1 < len(toks) and toks[i + 1] == ("(",):
            level, j = 0, i + 1
            while j < len(toks):
                level += (toks[j][0] in "([{" and len(toks[j]) == 1) - (toks[j][0] in ")]}" and len(toks[j]) == 1)
                if level == 0:
                    break
                j += 1
            found.setdefault(t[1], set()).add(call_text(toks, t[1], i + 2, j))
            i = j + 1
            continue
        if t[0] == "var" and "(" in t[1]:
            found.setdefault(t[1], set()).add("")
        elif t[0] == "var" and t[1] != "i":
            plain = True
        i += 1
    return found if plain else None
