"""The reward scorers' three tables, in markdown, for a closing note:

1. the hacking probe: scorer x constant / hedged answer -> share scored correct (tests/rewards/test_hacking_probe.py);
2. ours vs Math-Verify on generated answers: counts per data set and the classes where we are wrong
   (tests/rewards/test_math_verify_differential.py);
3. ours vs verl 0.9.1 per claim: verl-correct answers we reject, answers we accept that verl rejects
   (tests/rewards/test_verl_differential.py).

Same generators, subsamples and rules as the tests (``--full``: every gold and row, as the slow tests: hours).
A table whose reference (math-verify, verl) or data (../shared/data) is missing says so instead.

Usage: python bench/reward_tables.py [--full] [--only probe|mv|verl ...]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.rewards import golds as G, references as R  # noqa: E402


def probe_table(full: bool) -> str:
    from tests.rewards import test_hacking_probe as P

    if all(G.data_missing(d) for d in G.DATASETS):
        return f"(skipped: {G.data_missing(G.DATASETS[0])})"
    t = time.perf_counter()
    table, wrong_const, wrong_hedge, slow = P.run_probe(full)
    out = [f"Share of answers scored correct [base rate where not 0]; **!** = differs from the base rate (constants) "
           f"or not 0 (hedges). {time.perf_counter() - t:.0f} s.", "", P.render(table)]
    if wrong_const or wrong_hedge:
        out += ["", f"{len(wrong_const)} constant answers off the base rate, {len(wrong_hedge)} hedges accepted. "
                    f"Examples:"]
        for w in P._first_per(wrong_const, key=lambda w: (w[1], w[5]), k=1):
            out.append(f"- constant {w[1]!r}, {w[0]}, {w[2]} gold {w[3]!r}: {'accepted' if w[5] else 'rejected'}")
        for w in P._first_per(wrong_hedge, key=lambda w: w[1], k=1):
            out.append(f"- hedge {w[1]}, {w[0]}, {w[2]} gold {w[3]!r}: accepted `{w[4]}`")
    if slow:
        out.append(f"- calls over 1 s: {slow[:10]}")
    return "\n".join(out)


def mv_table(full: bool) -> str:
    from tests.rewards import test_math_verify_differential as M

    why = R.missing_module("math_verify")
    if why:
        return f"(skipped: {why})"
    rows, wrong = [], []
    t = time.perf_counter()
    for d in G.ALL_SETS:
        if G.data_missing(d):
            rows.append([d, "(no data)", "", "", "", ""])
            continue
        recs = M.records(d, None if full else M.N_GOLDS[d])
        c = Counter(r.outcome for r in recs)
        rows.append([d, len(recs), *(c[o] for o in R.OUTCOMES)])
        wrong += [r for r in recs if r.outcome in ("theirs-better", "both-wrong")]
    out = [f"Ours (the data set's own data source, `\\boxed{{}}` answers) vs Math-Verify, against each pair's label. "
           f"{time.perf_counter() - t:.0f} s.", "", R.markdown(["data set", "pairs", *R.OUTCOMES], rows)]
    if wrong:
        groups = R.by_class(wrong, key=lambda r: f"{r.outcome}: {r.pair.cls}")
        out += ["", "Classes where we are wrong (theirs-better, both-wrong), all data sets:", ""]
        out.append(R.markdown(["class", "pairs", "example gold", "example answer", "ours", "mv"],
                              [[k, len(v), f"`{R.short(v[0].pair.gold, 30)}`", f"`{R.short(v[0].pair.body, 40)}`",
                                "acc" if v[0].ours else "rej", "acc" if v[0].theirs else "rej"]
                               for k, v in groups.items()]))
    return "\n".join(out)


def verl_table(full: bool) -> str:
    from tests.rewards import test_verl_differential as V

    rows, bad = [], []
    t = time.perf_counter()
    for claim in V.CLAIMS:
        why = V.unavailable(claim)
        if why:
            rows.append([claim.name, f"(skipped: {why})", *[""] * (len(V.HEADER) - 2)])
            continue
        recs = V.records(claim, {d: None for d in G.ALL_SETS} if full else claim.golds)
        rows.append(V.summary_row(claim, recs))
        bad += [(claim.name, r) for r in recs if r.theirs and not r.ours and not V.known_verl_wrong(r.pair)]
    out = [f"Per claim: answers verl 0.9.1 accepts that we reject (label right = our bug; label wrong = verl wrong, "
           f"listed in KNOWN_VERL_WRONG), and the reverse. {time.perf_counter() - t:.0f} s.", "",
           R.markdown(V.HEADER, rows)]
    if bad:
        groups: dict = {}
        for name, r in bad:
            groups.setdefault((name.split(" vs ")[0], f"{r.pair.fmt}/{r.pair.cls}"), []).append(r)
        out += ["", "verl-correct answers we reject, not in KNOWN_VERL_WRONG:", ""]
        out.append(R.markdown(["claim", "class", "answers", "example gold", "example answer"],
                              [[c, k, len(v), f"`{R.short(v[0].pair.gold, 30)}`", f"`{R.short(v[0].pair.body, 40)}`"]
                               for (c, k), v in sorted(groups.items(), key=lambda kv: -len(kv[1]))]))
    return "\n".join(out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--full", action="store_true", help="every gold and row (hours: the tests' slow variants)")
    p.add_argument("--only", nargs="+", choices=["probe", "mv", "verl"], default=["probe", "mv", "verl"])
    a = p.parse_args(argv)
    sections = {"probe": ("Reward-hacking probe", probe_table), "mv": ("Ours vs Math-Verify", mv_table),
                "verl": ("Ours vs verl 0.9.1", verl_table)}
    for key in a.only:
        title, fn = sections[key]
        print(f"\n### {title}\n")
        print(fn(a.full), flush=True)


if __name__ == "__main__":
    main()
