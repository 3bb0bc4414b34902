"""``core.config.ranges.check_fields``: a config class built in Python is checked against its fields' ``Range`` and
``Literal`` types as ``validate`` checks one read from YAML, and no ``__post_init__`` repeats those checks by hand."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import types
import typing

import pytest

import core.config.algo
import core.config.roles
import core.config.run
import core.config.schema
from core.config import (ActorConfig, AgentConfig, AlgoConfig, AsyncConfig, ConfigError, ImplicitPRMConfig, LoraConfig,
                         MegatronConfig, OptimConfig, PoolConfig, RewardModelConfig, RolloutConfig, RunConfig,
                         SamplingParams, ToolsConfig, TrainerConfig, validate)
from core.config.ranges import _checks, check_fields

MODULES = (core.config.schema, core.config.algo, core.config.roles, core.config.run)
CLASSES = sorted({c for m in MODULES for c in vars(m).values() if dataclasses.is_dataclass(c) and isinstance(c, type)
                  and c.__module__ == m.__name__}, key=lambda c: c.__name__)


@pytest.mark.parametrize("build, message", [
    (lambda: PoolConfig(nnodes=0), "nnodes: must be >= 1, got 0"),
    (lambda: PoolConfig(slots_per_node=0), "slots_per_node: must be >= 1, got 0"),
    (lambda: PoolConfig(device="tpu"), "device: must be one of 'cpu', 'cuda', got 'tpu'; did you mean 'cpu'?"),
    (lambda: AsyncConfig(tis_cap=-1.0), "tis_cap: must be >= 0, got -1.0"),
    (lambda: TrainerConfig(backend="slurm"), "backend: must be one of 'ray', 'local', got 'slurm'"),
    (lambda: TrainerConfig(backend="rayy"), "backend: must be one of 'ray', 'local', got 'rayy'; did you mean 'ray'?"),
    (lambda: TrainerConfig(tracker_mode="cloud"), "tracker_mode: must be one of 'offline', 'online', got 'cloud'"),
    (lambda: TrainerConfig(save_keep=-1), "save_keep: must be >= 0, got -1"),
    (lambda: TrainerConfig(total_steps=-2), "total_steps: must be >= 0, got -2"),
    (lambda: RolloutConfig(gpu_memory_utilization=1.5), "gpu_memory_utilization: must be <= 1, got 1.5"),
    (lambda: RolloutConfig(gpu_memory_utilization=0.0), "gpu_memory_utilization: must be > 0, got 0.0"),
    (lambda: RolloutConfig(tensor_parallel_size=0), "tensor_parallel_size: must be >= 1, got 0"),
    (lambda: RolloutConfig(backend="trt"), "backend: must be one of 'embedded', 'vllm', 'sglang', got 'trt'"),
    (lambda: SamplingParams(top_p=0), "top_p: must be > 0, got 0"),
    (lambda: SamplingParams(n=0), "n: must be >= 1, got 0"),
    (lambda: MegatronConfig(pp=0), "pp: must be >= 1, got 0"),
    (lambda: LoraConfig(alpha=0.0), "alpha: must be > 0, got 0.0"),
    (lambda: OptimConfig(lr=-1e-3), "lr: must be >= 0, got -0.001"),
    (lambda: ActorConfig(ulysses_sp=0), "ulysses_sp: must be >= 1, got 0"),
    (lambda: ActorConfig(positive_nll_coef=-0.1), "positive_nll_coef: must be >= 0, got -0.1"),
    (lambda: RewardModelConfig(max_tokens_per_micro=0), "max_tokens_per_micro: must be >= 1, got 0"),
    (lambda: ImplicitPRMConfig(beta=0.0), "beta: must be > 0, got 0.0"),
    (lambda: AgentConfig(tool_timeout_s=0.0), "tool_timeout_s: must be > 0, got 0.0"),
    (lambda: AlgoConfig(tis_cap=-0.5), "tis_cap: must be >= 0, got -0.5"),
    (lambda: ToolsConfig(isolation="none"), "isolation: must be one of 'namespaces', 'process', got 'none'"),
])
def test_direct_construction_is_checked(build, message):
    with pytest.raises(ValueError) as e:
        build()
    assert str(e.value) == message


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_defaults_construct(cls):
    cls()


def test_validate_words_it_the_same():
    """The YAML path (``_build``'s type check) and the hook say the same after the dotted key."""
    with pytest.raises(ConfigError, match=r"^rollout.gpu_memory_utilization: must be <= 1, got 1.5$"):
        validate(RunConfig, {"rollout": {"gpu_memory_utilization": 1.5}})
    with pytest.raises(ValueError, match=r"^gpu_memory_utilization: must be <= 1, got 1.5$"):
        RolloutConfig(gpu_memory_utilization=1.5)


def test_yaml_key_and_optional():
    @dataclasses.dataclass(frozen=True)
    class C:
        import_: core.config.ranges.PositiveInt = 1
        cap: core.config.ranges.Unit | None = None

        def __post_init__(self):
            check_fields(self)

    C(), C(cap=0.5)
    with pytest.raises(ValueError, match=r"^import: must be >= 1, got 0$"):
        C(import_=0)
    with pytest.raises(ValueError, match=r"^cap: must be <= 1, got 2$"):
        C(cap=2)


def test_a_bad_default_is_not_skipped():
    """The hook skips a value that is its field's default only when that default passes the check itself."""
    @dataclasses.dataclass(frozen=True)
    class Bad:
        n: core.config.ranges.PositiveInt = 0

        def __post_init__(self):
            check_fields(self)

    with pytest.raises(ValueError, match=r"^n: must be >= 1, got 0$"):
        Bad()


def test_cross_field_checks_stay():
    with pytest.raises(ValueError, match="the embedded engine has no tensor parallelism"):
        RolloutConfig(tensor_parallel_size=2)
    RolloutConfig(backend="vllm", tensor_parallel_size=2)
    with pytest.raises(ValueError, match=r"actor.ulysses_sp=2: > 1 only with actor.strategy=fsdp"):
        ActorConfig(strategy="megatron", ulysses_sp=2)
    with pytest.raises(ValueError, match=r"placement.roles names unknown pool"):
        validate(RunConfig, {"placement": {"roles": {"actor": "gpu"}}})


# --- no hand-written twin of a type-level check ------------------------------------------------------------------

def _post_init(cls) -> ast.FunctionDef | None:
    fn = cls.__dict__.get("__post_init__")
    return ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0] if fn else None


def _is_hook(node) -> bool:
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "check_fields")


def _field_of(node, loops: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The field(s) an expression reads: ``self.f`` or ``getattr(self, name)`` with ``name`` a loop over strings."""
    if isinstance(node, ast.Attribute) and getattr(node.value, "id", None) == "self":
        return (node.attr,)
    if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) >= 2
            and getattr(node.args[0], "id", None) == "self"):
        arg = node.args[1]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return (arg.value,)
        if isinstance(arg, ast.Name):
            return loops.get(arg.id, ())
    return ()


def _constant(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


_OPS = {ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b,
        ast.GtE: lambda a, b: a >= b, ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b}
_FLIP = {ast.Lt: ast.Gt, ast.LtE: ast.GtE, ast.Gt: ast.Lt, ast.GtE: ast.LtE, ast.Eq: ast.Eq, ast.NotEq: ast.NotEq}


def _bounds(r):
    """The one-sided predicates of range ``r``: a hand-written comparison equal to one of them (or to its negation)
    on the values around the bound is its twin (``nnodes < 1``, ``nnodes <= 0``, ``x > 0`` for ``(0, 1]``)."""
    if r.low is not None:
        yield r.low, (lambda x: x > r.low) if r.open_low else (lambda x: x >= r.low)
    if r.high is not None:
        yield r.high, lambda x: x <= r.high


def _base_type(tp):
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        tp = args[0]
    return typing.get_args(tp)[0] if typing.get_origin(tp) is typing.Annotated else tp


def _twins(cls) -> list[str]:
    """``Class.field: comparison`` for each comparison in ``cls.__post_init__`` (the hook call aside) that repeats a
    ``Range`` or ``Literal`` of that field's type."""
    fn = _post_init(cls)
    if fn is None:
        return []
    constrained = {name: (ranges, choices) for name, _, _, ranges, choices, _ in _checks(cls)}
    types_ = typing.get_type_hints(cls, include_extras=True)
    loops: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            names = _constant(node.iter)
            if isinstance(names, (tuple, list)) and all(isinstance(n, str) for n in names):
                loops[node.target.id] = tuple(names)
    found = set()
    for node in (n for s in fn.body if not _is_hook(s) for n in ast.walk(s)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for left, op, right in zip(operands, node.ops, operands[1:]):
            fields, other, op_t = _field_of(left, loops), right, type(op)
            if not fields:
                fields, other, op_t = _field_of(right, loops), left, _FLIP.get(type(op))
            c = _constant(other)
            for name in (f for f in fields if f in constrained):
                ranges, choices = constrained[name]
                twin = (choices is not None and op_t in (ast.In, ast.NotIn) and isinstance(c, (tuple, list, set))
                        and set(c) == set(choices))
                if op_t in _OPS and isinstance(c, (int, float)) and not isinstance(c, bool):
                    step = 1 if _base_type(types_[name]) is int else 0.5
                    for b, ok in (bound for r in ranges for bound in _bounds(r)):
                        points = [b + k * step for k in range(-3, 4)]
                        mine = [_OPS[op_t](x, c) for x in points]
                        twin |= mine in ([ok(x) for x in points], [not ok(x) for x in points])
                if twin:
                    found.add(f"{cls.__name__}.{name}: {ast.unparse(node)}")
    return sorted(found)


def test_the_detector_finds_twins():
    """The check below is not vacuous: it finds the kinds of twins this module's classes used to have."""
    @dataclasses.dataclass(frozen=True)
    class Old:
        nnodes: core.config.ranges.PositiveInt = 1
        share: core.config.ranges.UnitOpen = 0.5
        device: core.config.schema.Literal["cpu", "cuda"] = "cpu"
        tp: core.config.ranges.PositiveInt = 1

        def __post_init__(self):
            check_fields(self)
            if self.device not in ("cpu", "cuda") or self.nnodes <= 0:
                raise ValueError("no")
            if not 0 < self.share <= 1:
                raise ValueError("no")
            for name in ("tp",):
                if getattr(self, name) < 1:
                    raise ValueError("no")
            if self.tp > 1 and self.device == "cpu":  # a rule across fields: not a twin
                raise ValueError("cross")

    assert _twins(Old) == ["Old.device: self.device not in ('cpu', 'cuda')", "Old.nnodes: self.nnodes <= 0",
                           "Old.share: 0 < self.share <= 1", "Old.tp: getattr(self, name) < 1"]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_no_hand_written_twin_of_a_type_check(cls):
    assert _twins(cls) == []


@pytest.mark.parametrize("cls", [c for c in CLASSES if _checks(c)], ids=lambda c: c.__name__)
def test_constrained_classes_call_the_hook_first(cls):
    fn = _post_init(cls)
    assert fn is not None and _is_hook(fn.body[0]), f"{cls.__name__}.__post_init__ must start with check_fields(self)"
