"""The README's "Using it" commands compose, validate and build their env, as written.

Each ``python -m scripts.train ...`` line of that code block is split like a shell would split it
and composed with Hydra's compose API (same overrides, no training). Then the typed config goes
through ``scripts.train.to_config`` (which loads ``resume=`` runs), ``agents.config.validate``,
``describe_env`` and ``validate_for_env``. ``-m`` sweeps compose once per swept value.

Two placeholders need something real, and only they are substituted:
- ``<date_time>`` in ``resume=runs/cartpole_p-rdqn/<date_time>``: a run directory made here
  (under a temporary working directory) holding the default run's ``config.json``;
- ``mypkg.envs:MyEnv-v0``: ``envs.faults:recurrl/NoTimeLimit-v0``, a shipped env imported through
  the same ``module:Env-v0`` form whose ``size`` kwarg sets the observation size.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shlex
from enum import Enum
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

import scripts.train as cli
from agents.config import Config, validate, validate_for_env
from envs import describe_env

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
RUN_PLACEHOLDER = "<date_time>"
ENV_PLACEHOLDER, ENV_STAND_IN = "mypkg.envs:MyEnv-v0", "envs.faults:recurrl/NoTimeLimit-v0"


def readme_commands() -> list[str]:
    """The ``python -m scripts.train`` lines of the README's first code block under "Using it"."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"^## Using it\n.*?^```\w*\n(.*?)^```", text, re.M | re.S)
    assert block, "README.md has no code block under '## Using it'"
    lines = [line.strip() for line in block.group(1).splitlines()]
    return [line for line in lines if line.startswith("python -m scripts.train")]


def _override_lists(command: str) -> list[list[str]]:
    """Hydra overrides of one command (shell-split, comments dropped); a ``-m`` sweep gives one
    list per combination of swept values."""
    args = shlex.split(command, comments=True)[3:]
    multirun = "-m" in args or "--multirun" in args
    args = [a for a in args if a not in ("-m", "--multirun")]
    if not multirun:
        return [args]
    choices = []
    for arg, override in zip(args, OverridesParser.create().parse_overrides(args), strict=True):
        if override.is_sweep_override():
            choices.append([f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()])
        else:
            choices.append([arg])
    return [list(combo) for combo in itertools.product(*choices)]


def _compose(overrides: list[str], output_dir: Path) -> Config:
    """Typed config as ``scripts.train.main`` would get it (Hydra's runtime filled in by hand)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    cfg.hydra.runtime.output_dir = str(output_dir)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cli.to_config(cfg)


def test_readme_lists_the_commands() -> None:
    commands = readme_commands()
    assert len(commands) >= 5
    assert any(RUN_PLACEHOLDER in c for c in commands) and any(ENV_PLACEHOLDER in c for c in commands)


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_composes_and_validates(command: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    if RUN_PLACEHOLDER in command:
        stamp = "2026-01-01_00-00-00"
        command = command.replace(RUN_PLACEHOLDER, stamp)
        run_dir = Path(re.search(r"resume=(\S+)", command).group(1))
        run_dir.mkdir(parents=True)
        original = dataclasses.asdict(_compose([], tmp_path / "first"))
        (run_dir / "config.json").write_text(json.dumps(original))
    command = command.replace(ENV_PLACEHOLDER, ENV_STAND_IN)
    for overrides in _override_lists(command):
        config = _compose(overrides, tmp_path / "out")
        validate(config)
        validate_for_env(config, describe_env(config.env))
        _assert_values_reached(overrides, config)


def _assert_values_reached(overrides: list[str], config: Config) -> None:
    """Every ``key.path=value`` (and ``seed=``) of the line holds in the typed config."""
    node = OmegaConf.structured(config)
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.key_or_group
        if "." not in key and key != "seed":
            continue  # group selections (agent=, env=) and resume= are checked by composing
        got = OmegaConf.select(node, key)
        got = got.name if isinstance(got, Enum) else got
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == override.value(), f"{override.input_line}: typed config has {got!r}"
