"""Config loading: a Hydra/OmegaConf (or plain dict) tree -> validated, frozen dataclasses (``core.config.schema``).

Validation happens once, at start-up; the result is frozen, so nothing can change it while a run goes on.
"""

from __future__ import annotations

import dataclasses
import keyword
import types
import typing
from typing import Any, TypeVar

from core.config.algo import (AdvantageConfig, AlgoConfig, KLInRewardConfig, PFPPOConfig, PolicyLossConfig,
                              SamplingParams)
from core.config.roles import (OFFLOAD_MODES, STRATEGIES, ActorConfig, AgentConfig, CriticConfig, ImplicitPRMConfig,
                               LoraConfig, MegatronConfig, OptimConfig, RewardModelConfig, RolloutConfig,
                               check_offload_mode)
from core.config.run import DataConfig, RewardConfig, RunConfig, ToolsConfig
from core.config.schema import AsyncConfig, PlacementConfig, PoolConfig, TrainerConfig

T = TypeVar("T")

__all__ = ["validate", "RunConfig", "TrainerConfig", "DataConfig", "PlacementConfig", "PoolConfig", "ActorConfig",
           "OptimConfig", "AgentConfig", "CriticConfig", "RewardModelConfig", "RolloutConfig", "AlgoConfig",
           "SamplingParams", "AdvantageConfig", "PolicyLossConfig", "KLInRewardConfig", "RewardConfig", "OFFLOAD_MODES",
           "check_offload_mode", "MegatronConfig", "ImplicitPRMConfig", "STRATEGIES", "LoraConfig", "AsyncConfig", "PFPPOConfig",
           "ToolsConfig"]


def validate(schema: type[T], tree: Any, where: str = "config") -> T:
    """Build ``schema`` from ``tree`` (dict or OmegaConf node): defaults fill what is absent; an unknown key or a
    value of the wrong type raises ``ValueError`` naming its full path (``where`` prefixes it, e.g. a file)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(tree, (DictConfig, ListConfig)):
            tree = OmegaConf.to_container(tree, resolve=True)
    except ImportError:
        pass
    return _build(schema, tree if tree is not None else {}, where)


def _yaml_key(field_name: str) -> str:
    return field_name[:-1] if keyword.iskeyword(field_name[:-1]) else field_name


def _field_default(tp: type, name: str) -> Any:
    """The default of ``tp``'s field ``name`` when it is a dataclass instance (a section's own defaults), else None."""
    f = next(f for f in dataclasses.fields(tp) if f.name == name)
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return value if dataclasses.is_dataclass(value) and not isinstance(value, type) else None


def _build(tp: Any, value: Any, path: str, base: Any = None) -> Any:
    """``base``: the value this section has when absent (its parent's default, e.g. ``algo.val_sampling``'s greedy
    SamplingParams): the keys a partial section leaves out come from it, not from the section class's defaults."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{path}: expected a mapping for {tp.__name__}, got {value!r}")
        # a key that is a Python keyword (trainer.async) is the field with a trailing underscore (async_)
        value = {f"{k}_" if isinstance(k, str) and keyword.iskeyword(k) else k: v for k, v in value.items()}
        hints = typing.get_type_hints(tp)
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(value) - fields)
        if unknown:
            raise ValueError(f"{path}: unknown key(s) {unknown}; {tp.__name__} has {sorted(fields)}")
        kwargs = {k: _build(hints[k], v, f"{path}.{_yaml_key(k)}",
                            getattr(base, k) if base is not None else _field_default(tp, k)) for k, v in value.items()}
        if base is not None:
            kwargs = {f: getattr(base, f) for f in fields if f not in kwargs} | kwargs
        try:
            return tp(**kwargs)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path}: {e}") from None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return _build(a, value, path, base)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{path}: {value!r} matches none of {args}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{path}: must be one of {list(args)}, got {value!r}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path}: expected a list, got {value!r}")
        return origin(_build(args[0] if args else Any, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{path}: expected a mapping, got {value!r}")
        return {k: _build(args[1] if args else Any, v, f"{path}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and (not isinstance(value, tp) or (tp is not bool and isinstance(value, bool))):
        raise ValueError(f"{path}: expected {tp.__name__}, got {value!r}")
    return value
