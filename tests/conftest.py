"""Shared fixtures (quiet TF logs, tiny configs) and the ``train`` marker.

``train`` marks every test that runs the training loop, so ``-m "not train"`` keeps the unit tests.
It is set here, from what a test does, so test modules need no marker of their own: a test is marked
when it, a fixture it uses, or a test-suite function either of them calls by name, calls
:func:`agents.loop.train` or names ``"scripts.train"`` (the module a subprocess runs).
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from agents.config import Config  # noqa: E402
from envs.config import EnvConfig  # noqa: E402

TESTS = Path(__file__).resolve().parent


def _in_tests(obj: object) -> bool:
    """Whether ``obj`` is a Python function defined in a file under ``tests/``."""
    if not inspect.isfunction(obj):
        return False
    source = inspect.getsourcefile(obj)
    return source is not None and Path(source).resolve().is_relative_to(TESTS)


def _is_train(obj: object) -> bool:
    return getattr(obj, "__module__", None) == "agents.loop" and getattr(obj, "__name__", None) == "train"


def runs_training(func: Callable, seen: set[Callable] | None = None) -> bool:
    """Whether ``func``, or a function under ``tests/`` it calls by name, calls ``agents.loop.train``
    or names ``"scripts.train"``."""
    seen = set() if seen is None else seen
    if func in seen:
        return False
    seen.add(func)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    except (OSError, TypeError, SyntaxError):
        return False
    names = getattr(func, "__globals__", {})
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == "scripts.train":
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            callee = names.get(node.func.id)
            if _is_train(callee) or (_in_tests(callee) and runs_training(callee, seen)):
                return True
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``train`` on every test that runs the training loop (see the module docstring)."""
    for item in items:
        if not isinstance(item, pytest.Function):
            continue
        funcs = [item.function]
        fixture_defs = getattr(item, "_fixtureinfo", None)
        for defs in fixture_defs.name2fixturedefs.values() if fixture_defs else ():
            funcs += [d.func for d in defs if _in_tests(d.func)]
        seen: set[Callable] = set()
        if any(runs_training(func, seen) for func in funcs):
            item.add_marker(pytest.mark.train)


@pytest.fixture
def tiny_config(tmp_path) -> Config:
    """A seconds-long rdqn run on the cue memory task, writing under ``tmp_path``."""
    config = Config(run_dir=str(tmp_path / "run"))
    config.env = EnvConfig(name="cue", id="recurrl/CueMemory-v0", kwargs={"delay": 2}, num_envs=4)
    config.network.units = 16
    config.network.pre_layers = [16]
    config.replay.capacity = 4_000
    config.replay.burn_in = 2
    config.replay.trace_length = 4
    config.agent.batch_size = 8
    config.agent.n_step = 2
    config.agent.epsilon_decay_steps = 200
    config.train.total_env_steps = 400
    config.train.learning_starts = 100
    config.train.updates_per_step = 0.25
    config.train.log_every_updates = 5
    config.train.checkpoint_every_env_steps = 200
    config.train.progress_bar = False
    config.eval.every_env_steps = 200
    config.eval.episodes = 4
    return config


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked ``native`` need the compiled ops: skip them, with the reason, where they cannot load."""
    if item.get_closest_marker("native"):
        from agents import native

        ok, reason = native.available()
        if not ok:
            pytest.skip(f"native ops unavailable: {reason}")
