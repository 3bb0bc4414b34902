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
from core.config.errors import ConfigError, did_you_mean
from core.config.ranges import Range
from core.config.roles import (OFFLOAD_MODES, STRATEGIES, ActorConfig, AgentConfig, CriticConfig, ImplicitPRMConfig,
                               LoraConfig, MegatronConfig, OptimConfig, RewardModelConfig, RolloutConfig,
                               TeacherConfig, check_offload_mode)
from core.config.run import DataConfig, RewardConfig, RunConfig, ToolsConfig
from core.config.schema import AsyncConfig, PlacementConfig, PoolConfig, TrainerConfig

T = TypeVar("T")

__all__ = ["validate", "RunConfig", "TrainerConfig", "DataConfig", "PlacementConfig", "PoolConfig", "ActorConfig",
           "OptimConfig", "AgentConfig", "CriticConfig", "RewardModelConfig", "RolloutConfig", "AlgoConfig",
           "SamplingParams", "AdvantageConfig", "PolicyLossConfig", "KLInRewardConfig", "RewardConfig", "OFFLOAD_MODES",
           "check_offload_mode", "MegatronConfig", "ImplicitPRMConfig", "STRATEGIES", "LoraConfig", "AsyncConfig", "PFPPOConfig",
           "ToolsConfig", "TeacherConfig", "ConfigError"]


def validate(schema: type[T], tree: Any, where: str = "config", prefix: str = "") -> T:
    """Build ``schema`` from ``tree`` (dict or OmegaConf node): defaults fill what is absent; an unknown key, a value
    of the wrong type or out of its field's range (``core.config.ranges``) raises ``ConfigError`` naming its dotted
    key (``prefix``: the section's own key, e.g. ``dapo``) -- ``where`` (a file) names a tree that is no mapping."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(tree, (DictConfig, ListConfig)):
            tree = OmegaConf.to_container(tree, resolve=True)
    except ImportError:
        pass
    if tree is not None and not isinstance(tree, dict) and dataclasses.is_dataclass(schema):
        raise ConfigError(f"{prefix or where}: expected a mapping for {schema.__name__}, got {tree!r}", prefix or None)
    return _build(schema, tree if tree is not None else {}, prefix)


def _yaml_key(field_name: str) -> str:
    return field_name[:-1] if keyword.iskeyword(field_name[:-1]) else field_name


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _field_default(tp: type, name: str) -> Any:
    """The default of ``tp``'s field ``name`` when it is a dataclass instance (a section's own defaults), else None."""
    f = next(f for f in dataclasses.fields(tp) if f.name == name)
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return value if dataclasses.is_dataclass(value) and not isinstance(value, type) else None


def _unknown(path: str, unknown: list[str], fields: set[str], schema: type) -> ConfigError:
    keys = sorted(_yaml_key(f) for f in fields)
    hints = [f"{_join(path, k)}: unknown key{did_you_mean(k, keys)}" for k in unknown]
    if not any("did you mean" in h for h in hints):
        hints[-1] += f" ({path or 'the config'} has {', '.join(keys)})"
    return ConfigError("; ".join(hints), _join(path, unknown[0]))


def _build(tp: Any, value: Any, path: str, base: Any = None) -> Any:
    """``path``: the dotted key of ``value`` ("" at the root). ``base``: the value this section has when absent (its
    parent's default, e.g. ``algo.val_sampling``'s greedy SamplingParams): the keys a partial section leaves out
    come from it, not from the section class's defaults."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        built = _build(args[0], value, path, base)
        for r in (m for m in args[1:] if isinstance(m, Range)):
            if (why := r.problem(built)) is not None:
                raise ConfigError(f"{path}: {why}, got {built!r}", path)
        return built
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping (a section of {tp.__name__}), got {value!r}", path)
        # a key that is a Python keyword (trainer.async) is the field with a trailing underscore (async_)
        value = {f"{k}_" if isinstance(k, str) and keyword.iskeyword(k) else k: v for k, v in value.items()}
        hints = typing.get_type_hints(tp, include_extras=True)
        fields = {f.name for f in dataclasses.fields(tp) if f.init}
        unknown = sorted(set(value) - fields, key=str)
        if unknown:
            raise _unknown(path, [_yaml_key(str(k)) for k in unknown], fields, tp)
        kwargs = {k: _build(hints[k], v, _join(path, _yaml_key(k)),
                            getattr(base, k) if base is not None else _field_default(tp, k)) for k, v in value.items()}
        if base is not None:
            kwargs = {f: getattr(base, f) for f in fields if f not in kwargs} | kwargs
        try:
            return tp(**kwargs)
        except (ValueError, TypeError) as e:
            text = str(e)
            raise ConfigError(text if path and text.startswith(path) else f"{path or tp.__name__}: {text}",
                              path or None) from None
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in (a for a in args if a is not type(None)):
            try:
                return _build(a, value, path, base)
            except ConfigError as e:
                errors.append(e)
        if len(errors) == 1:
            raise errors[0]
        raise ConfigError(f"{path}: {value!r} matches none of {args}", path)
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{path}: must be one of {', '.join(map(repr, args))}, got {value!r}"
                              f"{did_you_mean(value, map(str, args))}", path)
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path}: expected a list, got {value!r}", path)
        return origin(_build(args[0] if args else Any, v, f"{path}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}", path)
        return {k: _build(args[1] if args else Any, v, _join(path, k)) for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp in (int, float, str, bool) and (not isinstance(value, tp) or (tp is not bool and isinstance(value, bool))):
        raise ConfigError(f"{path}: expected {'a number' if tp is float else tp.__name__}, got {value!r}", path)
    return value
