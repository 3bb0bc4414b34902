"""Every registry entry documents its math: a paper or reference, tensor shapes, and a worked example."""

import pytest

from core.algos import ADVANTAGES, AGGREGATIONS, KL_KINDS, OFF_POLICY, POLICY_LOSSES

ENTRIES = [(reg.kind, name, reg[name]) for reg in (ADVANTAGES, POLICY_LOSSES, KL_KINDS, AGGREGATIONS, OFF_POLICY)
           for name in reg.names()]


@pytest.mark.parametrize("kind,name,fn", ENTRIES, ids=[f"{k}:{n}" for k, n, _ in ENTRIES])
def test_docstring_has_math_paper_shapes_example(kind, name, fn):
    doc = fn.__doc__
    assert "Example" in doc, f"{kind} {name}: no worked example"
    assert "Paper" in doc or "Reference" in doc, f"{kind} {name}: no paper/reference"
    assert "(B" in doc or "Keys:" in doc, f"{kind} {name}: no tensor shapes/keys"
    assert any(op in doc for op in ("=", "->")), f"{kind} {name}: no formula"
