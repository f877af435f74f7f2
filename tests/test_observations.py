"""Every observation space recurrl encodes, end to end: the cue memory task seen through each one
trains, stores its observations raw in replay, and a Dict-image run checkpoints and resumes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from agents.config import Config, validate
from agents.loop import train
from agents.metrics import read_progress
from agents.networks import NetworkConfig
from agents.rdqn import RDQNConfig
from agents.replay import ReplayConfig
from envs import EnvConfig, describe_env
from envs.memory import OBS_TYPES

pytestmark = pytest.mark.train


def _config(tmp_path: Path, obs_type: str, steps: int = 400, **env) -> Config:
    return Config(
        agent=RDQNConfig(batch_size=8, n_step=2),
        env=EnvConfig(
            name=f"cue_{obs_type}",
            id="recurrl/CueMemory-v0",
            kwargs={"delay": 2, "obs_type": obs_type, **env.pop("kwargs", {})},
            num_envs=4,
            **env,
        ),
        network=NetworkConfig(units=16, pre_layers=[16]),
        replay=ReplayConfig(capacity=2000, burn_in=1, trace_length=3),
        train=dataclasses.replace(
            Config().train,
            total_env_steps=steps,
            learning_starts=100,
            updates_per_step=0.25,
            checkpoint_every_env_steps=200,
            progress_bar=False,
        ),
        eval=dataclasses.replace(Config().eval, every_env_steps=200, episodes=4),
        run_dir=str(tmp_path / obs_type),
    )


@pytest.mark.parametrize("obs_type", OBS_TYPES)
def test_each_observation_type_trains_a_few_hundred_steps(tmp_path: Path, obs_type: str) -> None:
    config = _config(tmp_path, obs_type)
    validate(config)
    summary = train(config)
    assert summary["status"] == "finished" and summary["env_steps"] == 400 and summary["updates"] > 50
    assert all(np.isfinite(e["eval_return_mean"]) for e in summary["evaluations"])
    state = np.load(Path(config.run_dir) / "ckpt" / "state-400.npz")
    spec = describe_env(config.env)
    for leaf in spec.observation:  # raw, in the leaf's own dtype: uint8 images stay uint8
        stored = state[f"replay/data/{leaf.name}"]
        assert stored.dtype == np.dtype(leaf.dtype) and stored.shape[2:] == leaf.shape


def test_multi_discrete_actions_are_one_joint_discrete(tmp_path: Path) -> None:
    """MultiDiscrete([2, 3]) becomes Discrete(6); the env receives the unravelled pair. With
    env.success_return the evaluations also give the success rate (returns here are +-1)."""
    config = _config(tmp_path, "dict", kwargs={"action_type": "multi_discrete"}, success_return=0.5)
    spec = describe_env(config.env)
    assert spec.discrete and spec.num_actions == 6
    summary = train(config)
    assert summary["status"] == "finished"
    for row in read_progress(Path(config.run_dir) / "progress.csv"):
        assert row["eval_success_rate"] == pytest.approx((row["eval_return_mean"] + 1) / 2)


def test_image_dict_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """A Dict observation with an image leaf: a resumed run continues from the checkpoint with its
    observation statistics and replay intact."""
    config = _config(tmp_path, "image", steps=200)
    train(config)
    resumed = _config(tmp_path, "image", steps=400)
    resumed.resume = resumed.run_dir = config.run_dir
    summary = train(resumed)
    assert summary["env_steps"] == 400 and [e["env_steps"] for e in summary["evaluations"]] == [200, 400]
    state = np.load(Path(config.run_dir) / "ckpt" / "state-400.npz")
    assert state["obs_norm/count"][0] == 400 * 7 * 7  # every pixel of every env step
