"""Shared fixtures: quiet TF logs, tiny configs."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from agents.config import Config  # noqa: E402
from envs.config import EnvConfig  # noqa: E402


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
