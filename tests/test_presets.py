"""Every env preset for another package (popgym, MiniGrid, ALE) runs through ``scripts.train``,
checkpoints, and resumes to a longer budget; the POMDP wrappers act on their Box leaves."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from envs import EnvConfig, make_env
from envs.config import ConfigError
from tests.helpers import TINY_TRAIN_OVERRIDES, run_cli

pytestmark = pytest.mark.train

# Preset -> the agent it needs (the continuous pendulum goes to rtd3).
PRESETS = {
    "popgym_repeat_previous": "rdqn",
    "popgym_count_recall": "rdqn",
    "popgym_autoencode": "rdqn",
    "popgym_stateless_cartpole": "rdqn",
    "popgym_noisy_pendulum": "rtd3",
    "minigrid_memory": "rdqn",
    "atari_pong": "rdqn",
}
SMALL = [o for o in TINY_TRAIN_OVERRIDES if not o.startswith("env=")]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_trains_checkpoints_and_resumes(capsys, tmp_path: Path, preset: str) -> None:
    run = tmp_path / "run"
    base = [f"agent={PRESETS[preset]}", f"env={preset}", *SMALL, "env.num_envs=2", "eval.episodes=2"]
    if preset == "atari_pong":  # Pong episodes last thousands of steps: cap them for the test
        base += ["network.pre_layers=[16]", "env.max_episode_steps=100"]
    code, err = run_cli(capsys, [*base, "train.total_env_steps=200"], run)
    assert code == 0, err
    code, err = run_cli(capsys, [f"resume={run}", "train.total_env_steps=400"], run)
    assert code == 0, err
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["env_steps"] == 400 and summary["updates"] > 0
    assert [e["env_steps"] for e in summary["evaluations"]] == [200, 400]


def test_atari_time_limit_counts_agent_steps() -> None:
    # Under the preprocessing each agent step is 4 frames (and up to 30 no-op frames start an
    # episode): env.max_episode_steps counts the agent's steps, as Atari's usual 27000 does.
    pytest.importorskip("ale_py")
    config = EnvConfig(
        id="ale_py:ALE/Pong-v5", kwargs={"frameskip": 1}, preprocessing="atari", max_episode_steps=50
    )
    env = make_env(config, seed=0)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated) and steps < 60:
        _, _, terminated, truncated, _ = env.step(0)
        steps += 1
    assert (steps, terminated, truncated) == (50, False, True)
    env.close()


def test_flicker_and_noise_act_on_the_image_leaf_of_a_dict_observation() -> None:
    base = {"id": "minigrid:MiniGrid-MemoryS7-v0", "drop_keys": ["mission"], "max_episode_steps": 245}
    flicker = make_env(EnvConfig(**base, flicker=0.5), seed=0)
    images = [flicker.step(0)[0] for _ in range(200)]
    dark = np.mean([not img["image"].any() for img in images])
    assert 0.35 < dark < 0.65  # the image is zeroed about half the time; the heading passes through
    assert {img["direction"] for img in images} <= set(range(4))
    noisy = make_env(EnvConfig(**base, obs_noise=3.0), seed=0)
    obs = noisy.step(0)[0]
    assert obs["image"].dtype == np.uint8 and noisy.observation_space.contains(obs)
    clean = make_env(EnvConfig(**base), seed=0)
    assert not np.array_equal(obs["image"], clean.step(0)[0]["image"])


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"mask_obs": [0]}, "env.mask_obs=[0] applies to a flat Box observation"),
        ({"drop_keys": ["missing"]}, "env.drop_keys has 'missing', not a key"),
        ({"drop_keys": []}, "leave a Dict key out with env.drop_keys=[mission]"),
    ],
)
def test_dict_observation_settings_are_checked_with_one_line(overrides: dict, needle: str) -> None:
    config = {"id": "minigrid:MiniGrid-MemoryS7-v0", "drop_keys": ["mission"], "max_episode_steps": 245}
    with pytest.raises(ConfigError) as info:
        make_env(EnvConfig(**{**config, **overrides}))
    assert needle in str(info.value) and "\n" not in str(info.value)


def _normalised_views(config: EnvConfig, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """``steps`` images ``[N, 7, 7, C]`` of a random walk and the same normalised and clipped as the
    encoder does with statistics over all of them."""
    from agents.networks import NetworkConfig
    from agents.normalizer import ObsNormalizer
    from envs.spaces import observation_leaves

    env = make_env(config, seed=0)
    rng = np.random.default_rng(0)
    images = []
    for _ in range(steps):
        obs, _, terminated, truncated, _ = env.step(int(rng.integers(3)))  # left, right, forward
        images.append(obs["image"])
        if terminated or truncated:
            env.reset()
    env.close()
    images = np.stack(images)
    normalizer = ObsNormalizer(observation_leaves(env.observation_space))
    normalizer.update({"obs.image": images})  # the only leaf it normalises
    moments = normalizer.moments["obs.image"]
    clip = NetworkConfig().obs_clip
    return images, np.clip((images - moments.mean) / moments.std, -clip, clip)


def test_minigrid_onehot_gives_goal_and_lava_channels_of_their_own() -> None:
    """MiniGrid's view holds category indices as one ordinal feature per cell: normalised as the
    encoder does, the goal (8) and lava (9) of LavaGapS5 are neighbouring values at the top of the
    object channel, at or near its clip. MiniGrid's one-hot view (env.preprocessing=minigrid_onehot)
    gives each category a 0/1 channel of its own, the same walk cell for cell."""
    from minigrid.core.constants import OBJECT_TO_IDX

    goal, lava = OBJECT_TO_IDX["goal"], OBJECT_TO_IDX["lava"]
    base = {"id": "minigrid:MiniGrid-LavaGapS5-v0", "drop_keys": ["mission"], "max_episode_steps": 100}
    images, normed = _normalised_views(EnvConfig(**base), 400)
    objects = images[..., 0]
    goal_value, lava_value = normed[..., 0][objects == goal], normed[..., 0][objects == lava]
    assert goal_value.size and lava_value.size
    assert 0 < lava_value[0] - goal_value[0] < 1 and lava_value[0] > 4  # one feature, half a std apart

    onehot, normed = _normalised_views(EnvConfig(**base, preprocessing="minigrid_onehot"), 400)
    assert onehot.shape[1:] == (7, 7, 20) and onehot.dtype == np.uint8
    assert np.array_equal(onehot[..., :11].argmax(-1), objects)  # the same walk, one-hot
    assert set(np.unique(onehot)) == {0, 1}
    goal_cell, lava_cell = normed[onehot[..., goal] == 1][0], normed[onehot[..., lava] == 1][0]
    assert goal_cell[goal] > 0 > goal_cell[lava] and lava_cell[lava] > 0 > lava_cell[goal]


def test_minigrid_onehot_refuses_other_envs_with_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        make_env(EnvConfig(id="CartPole-v1", preprocessing="minigrid_onehot"))
    message = str(info.value)
    assert message.startswith("env.preprocessing=minigrid_onehot wraps MiniGrid envs") and "\n" not in message
