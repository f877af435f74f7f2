"""recurrl/SlowCartPole-v0: CartPole that takes at least step_ms per step, and passes gymnasium's checks."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

from envs import EnvConfig, make_env
from tests.test_envs import _check_env_strictly


def test_slow_cartpole_passes_check_env_and_rebuilds_from_its_spec() -> None:
    env = make_env(EnvConfig(name="slow", id="recurrl/SlowCartPole-v0", kwargs={"step_ms": 1}), seed=0)
    _check_env_strictly(env)
    rebuilt = gym.make(env.spec)
    assert rebuilt.unwrapped.step_ms == 1.0 and rebuilt.spec.max_episode_steps == 500


def test_each_step_takes_step_ms_and_matches_cartpole() -> None:
    slow, plain = gym.make("recurrl/SlowCartPole-v0", step_ms=20), gym.make("CartPole-v1")
    obs, _ = slow.reset(seed=3)
    np.testing.assert_array_equal(obs, plain.reset(seed=3)[0])
    start = time.perf_counter()
    for action in (0, 1, 1):
        np.testing.assert_array_equal(slow.step(action)[0], plain.step(action)[0])
    assert time.perf_counter() - start >= 3 * 0.020


@pytest.mark.parametrize("step_ms", [-1, float("nan"), "5"])
def test_bad_step_ms_is_refused(step_ms) -> None:
    with pytest.raises(TypeError, match="step_ms"):
        gym.make("recurrl/SlowCartPole-v0", step_ms=step_ms)
