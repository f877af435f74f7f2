"""Environment construction, POMDP wrappers and NEXT_STEP autoreset."""

from __future__ import annotations

import numpy as np
import pytest

from envs import EnvConfig, describe_env, make_env, make_vec_env
from envs.config import ConfigError


def test_mask_obs_drops_velocities() -> None:
    env = make_env(EnvConfig(id="CartPole-v1", mask_obs=[1, 3]), seed=0)
    full = make_env(EnvConfig(id="CartPole-v1"), seed=0)
    obs, _ = env.reset(seed=5)
    full_obs, _ = full.reset(seed=5)
    assert env.observation_space.shape == (2,)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])


def test_flicker_zeros_whole_observation_at_rate_p() -> None:
    env = make_env(EnvConfig(id="CartPole-v1", flicker=0.5), seed=0)
    env.reset(seed=0)
    zeros = 0
    for _ in range(400):
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        zeros += int(not obs.any())
        if term or trunc:
            env.reset()
    assert 140 < zeros < 260  # Binomial(400, 0.5): mean 200, sd 10


def test_obs_noise_is_additive_gaussian() -> None:
    clean = make_env(EnvConfig(id="recurrl/CueMemory-v0"), seed=0)
    noisy = make_env(EnvConfig(id="recurrl/CueMemory-v0", obs_noise=0.1), seed=0)
    diffs = []
    for s in range(200):
        a, _ = clean.reset(seed=s)
        b, _ = noisy.reset(seed=s)
        diffs.append(b - a)
    diffs = np.array(diffs)
    assert abs(diffs.mean()) < 0.02 and 0.08 < diffs.std() < 0.12


def test_kwargs_and_module_prefixed_ids() -> None:
    env = make_env(EnvConfig(id="envs.memory:recurrl/CueMemory-v0", kwargs={"delay": 7}), seed=0)
    steps = 0
    env.reset(seed=0)
    while True:
        _, _, term, trunc, _ = env.step(0)
        steps += 1
        if term or trunc:
            break
    assert steps == 8


def test_vec_env_next_step_autoreset() -> None:
    """The step after an episode ends returns a reset observation with reward 0."""
    vec = make_vec_env(EnvConfig(id="recurrl/CueMemory-v0", kwargs={"delay": 1}), seed=0, num_envs=3)
    _, r0, term0, _, _ = vec.step(np.zeros(3, np.int64))
    obs, r1, term1, _, _ = vec.step(np.zeros(3, np.int64))  # query step: episode ends
    assert term1.all() and not term0.any()
    obs, r2, term2, trunc2, _ = vec.step(np.zeros(3, np.int64))  # ignored action, reset
    assert (r2 == 0).all() and not term2.any() and not trunc2.any()
    assert (np.abs(obs[:, 0]) == 1).all()  # first observation of a new episode shows the cue


def test_describe_env() -> None:
    spec = describe_env(EnvConfig(id="CartPole-v1", mask_obs=[1, 3]))
    assert (spec.obs_dim, spec.discrete, spec.num_actions) == (2, True, 2)
    spec = describe_env(EnvConfig(id="Pendulum-v1"))
    assert not spec.discrete and spec.num_actions == 1 and spec.action_high[0] == 2.0


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (EnvConfig(id="NoSuchEnv-v0"), "env.id='NoSuchEnv-v0'"),
        (EnvConfig(id="nosuchmodule:Env-v0"), "env.id='nosuchmodule:Env-v0'"),
        (EnvConfig(id="CartPole-v1", mask_obs=[4]), "env.mask_obs=[4] has index 4 outside [0, 3]"),
        (EnvConfig(id="recurrl/CueMemory-v0", kwargs={"nope": 1}), "env.kwargs"),
    ],
)
def test_bad_env_config_is_one_line(config: EnvConfig, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_env(config)
    assert needle in str(info.value) and "\n" not in str(info.value)
