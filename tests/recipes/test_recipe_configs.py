"""A recipe's yaml states only what differs from what it builds on: ``config.yaml`` from core's defaults
(``core.config.RunConfig``, the one place they live), a variant (``defaults: [config, _self_]``) from its recipe's
``config.yaml``. A key that restates the value it would have anyway says why, in its comment (which names the
default). Relations (``${...}``) are never restatements."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from core.config import RunConfig, validate
from core.run import load_recipe_config

ROOT = Path(__file__).resolve().parents[2]
YAMLS = sorted(p for p in ROOT.glob("recipes/*/*.yaml") if p.name != "expected.yaml")
WHY = re.compile(r"default", re.I)


def _field(section, key: str):
    for name in (key, f"{key}_"):
        if dataclasses.is_dataclass(section) and any(f.name == name for f in dataclasses.fields(section)):
            return getattr(section, name)
    return None


def _plain(v):
    if dataclasses.is_dataclass(v):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return {k: _plain(x) for k, x in v.items()} if isinstance(v, dict) else v


def _same(value, base) -> bool:
    if dataclasses.is_dataclass(base) and isinstance(value, dict):  # a partial section: the rest is base's anyway
        return all(_field(base, k) is not None and _same(v, _field(base, k)) for k, v in value.items())
    return _plain(value) == _plain(base)


def restated(text: str, base) -> list[str]:
    """The keys of a yaml ``text`` whose value is ``base``'s (a RunConfig) with no comment saying why."""
    lines, found = text.split("\n"), []

    def why(line: int) -> bool:
        """The key's own comment, or the comment lines right above it, name the default."""
        above = line
        while above and lines[above - 1].lstrip().startswith("#"):
            above -= 1
        return any(WHY.search(text) for text in [lines[line].partition("#")[2], *lines[above:line]])

    def walk(node, section, path):
        for k, v in node.value:
            b = _field(section, k.value)
            if b is None:
                continue
            if isinstance(v, yaml.MappingNode) and not v.flow_style and dataclasses.is_dataclass(b):
                walk(v, b, f"{path}{k.value}.")
                continue
            value = yaml.safe_load(yaml.serialize(v))
            if "${" not in str(value) and _same(value, b) and not why(k.start_mark.line):
                found.append(f"{path}{k.value} (line {k.start_mark.line + 1})")

    walk(yaml.compose(text), base, "")
    return found


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_recipe_yaml_states_only_what_differs(path):
    text = path.read_text()
    parents = (yaml.safe_load(text) or {}).get("defaults") or []
    parents = [p for p in parents if p != "_self_"]
    assert len(parents) <= 1, f"{path}: one parent at most"
    base = (load_recipe_config(path.parent, parents[0], sections=_sections(path.parent))[0] if parents
            else validate(RunConfig, {}))
    assert not restated(text, base), f"{path.relative_to(ROOT)} restates: {restated(text, base)}"


def _sections(folder: Path) -> dict[str, type]:
    """A recipe's own sections (DAPO's ``dapo:``, PRIME's ``prime:``) as their dataclasses."""
    from core.cli import recipe_module

    if not (folder / "train.py").is_file():  # core's step: RunConfig's sections only
        return {}
    module = recipe_module(folder)
    return {name: getattr(module, cls) for name, cls in (("dapo", "DAPOConfig"), ("prime", "PRIMEConfig"))
            if hasattr(module, cls)}


def test_the_check_finds_a_restated_default():
    text = "trainer:\n  total_steps: 5\n  seed: 0\nactor:\n  optim:\n    lr: 1.0e-6  # core's default, stated on purpose\n"
    assert restated(text, validate(RunConfig, {})) == ["trainer.seed (line 3)"]


def test_a_partial_section_keeps_its_own_defaults_for_the_rest():
    """A section whose default differs from its class's (the greedy held-out sampling, the critic's and the PRM's
    optimizers) reads the keys a yaml leaves out from that default -- as if the section were absent -- not from the
    class: ``val_sampling: {n: 2}`` was sampled at temperature 1.0 and cut at 256 tokens, ``critic.optim:
    {warmup_steps: 3}`` trained at the actor's 1e-6."""
    cfg = validate(RunConfig, {"algo": {"val_sampling": {"n": 2}}, "critic": {"optim": {"warmup_steps": 3}},
                               "implicit_prm": {"optim": {"lr": 1e-6}}})
    absent = validate(RunConfig, {})
    assert cfg.algo.val_sampling == dataclasses.replace(absent.algo.val_sampling, n=2)
    assert (cfg.algo.val_sampling.temperature, cfg.algo.val_sampling.max_new_tokens) == (0.0, 0)
    assert cfg.critic.optim == dataclasses.replace(absent.critic.optim, warmup_steps=3)
    assert cfg.implicit_prm.optim == dataclasses.replace(absent.implicit_prm.optim, lr=1e-6)


SCRIPTS = sorted(ROOT.glob("recipes/*/run_*.sh"))
_RUN = re.compile(r'-m core\.cli train "\$here" --config-name "?(\$?\w+)"?')


def script_configs(script: Path) -> list[str]:
    """The yamls a run script can train: its ``--config-name`` (a variable: each value the script assigns it)."""
    text = script.read_text()
    names = _RUN.findall(text)
    out = []
    for name in names:
        if name.startswith("$"):
            var = name[1:]
            out += re.findall(rf'\b{var}="?\$\{{{var}:-(\w+)\}}"?', text) + re.findall(rf"\b{var}=(\w+)\b", text)
        else:
            out.append(name)
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_run_script_is_hybridrl_train_of_a_yaml(script):
    """One way in: every script runs ``hybridrl train <its recipe> --config-name <yaml>``, so ``hybridrl plan <recipe>
    --config-name <yaml>`` reaches every run, the full-scale ones included (or ``hybridrl train --verl`` of verl keys
    that all translate: ``plan --verl`` reaches it)."""
    if "-m core.cli train --verl" in script.read_text():  # verl's keys: `hybridrl plan --verl` reaches the run
        from core.verl.translate import translate

        keys = re.findall(r"^    ([a-z_.]+=\S+) \\$", script.read_text(), re.M)
        keys = [k.replace("'", "") for k in keys]  # bash's quotes
        assert len(keys) > 10 and translate(keys).unsupported == [], script.name
        return
    names = script_configs(script)
    assert names, f"{script.name} does not run `core.cli train \"$here\" --config-name <yaml>`"
    for name in names:
        assert (script.parent / f"{name}.yaml").is_file(), f"{script.name} names {name}.yaml, which is not there"
