"""Environment construction, POMDP wrappers, NEXT_STEP autoreset and env faults."""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import envs.make
from agents.actor import evaluate
from envs import EnvConfig, describe_env, describe_non_finite, has_time_limit, make_env, make_vec_env
from envs.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def test_mask_obs_drops_velocities() -> None:
    env = make_env(EnvConfig(id="CartPole-v1", mask_obs=[1, 3]), seed=0)
    full = make_env(EnvConfig(id="CartPole-v1"), seed=0)
    obs, _ = env.reset(seed=5)
    full_obs, _ = full.reset(seed=5)
    assert env.observation_space.shape == (2,)
    np.testing.assert_array_equal(obs, full_obs[[0, 2]])


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_flicker_zeros_whole_observation_at_rate_p(p: float) -> None:
    env = make_env(EnvConfig(id="CartPole-v1", flicker=p), seed=0)
    env.reset(seed=0)
    env.action_space.seed(0)
    n, zeros = 4000, 0
    for _ in range(n):
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        zeros += int(not obs.any())
        if term or trunc:
            env.reset()
    sd = (n * p * (1 - p)) ** 0.5
    assert abs(zeros - n * p) < 4 * sd  # Binomial(n, p); a rate off by a fifth is 6-10 sd away


def test_obs_noise_is_additive_gaussian() -> None:
    clean = make_env(EnvConfig(id="recurrl/CueMemory-v0"), seed=0)
    noisy = make_env(EnvConfig(id="recurrl/CueMemory-v0", obs_noise=0.1), seed=0)
    diffs = []
    for s in range(2000):
        a, _ = clean.reset(seed=s)
        b, _ = noisy.reset(seed=s)
        diffs.append(b - a)
    diffs = np.array(diffs)  # [2000, 2]: 4000 draws, the std's standard error about 0.0011
    assert abs(diffs.mean()) < 0.006 and abs(diffs.std() - 0.1) < 0.005


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
    obs, r2, term2, trunc2, _ = vec.step(np.zeros(3, np.int64))  # ignored action, first
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


class _SpacesEnv(gym.Env):
    """A one-step env with the given spaces; records the last action it received."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, observation_space: gym.spaces.Space, action_space: gym.spaces.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space
        self.received: list[Any] = []

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:  # seeded resets repeat their observations (check_env tests that)
            self.observation_space.seed(seed)
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.received.append(action)
        return self.observation_space.sample(), 0.0, True, False, {}


def _register(env_id: str, obs: gym.spaces.Space, act: gym.spaces.Space) -> str:
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=lambda: _SpacesEnv(obs, act))
    return env_id


def test_discrete_action_start_is_shifted() -> None:
    """``Discrete(3, start=-1)``: agent index a reaches the env as a - 1 (-1, 0, 1), never 2."""
    env_id = _register("test/StartMinusOne-v0", gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(3, start=-1))
    config = EnvConfig(id=env_id, max_episode_steps=5)
    assert describe_env(config).num_actions == 3
    env = make_env(config, seed=0)
    assert env.action_space == gym.spaces.Discrete(3)
    for a in (0, 1, 2):
        env.reset()
        env.step(a)
    assert env.unwrapped.received == [-1, 0, 1]
    _check_env_strictly(env)
    assert env.spec is not None and gym.make(env.spec).action_space == gym.spaces.Discrete(3)


@pytest.mark.parametrize(
    ("obs", "act", "needle"),
    [
        (gym.spaces.Text(5), gym.spaces.Discrete(2), "observation space is Text(1, 5, charset=0123456789"),
        (gym.spaces.Box(0, 1, (2, 3, 4, 5)), gym.spaces.Discrete(2), "cannot encode: allowed Box (rank 1-3)"),
        (
            gym.spaces.Dict({"a": gym.spaces.Discrete(2), "note": gym.spaces.Text(4)}),
            gym.spaces.Discrete(2),
            "observation leaf 'obs.note' is Text",
        ),
        (gym.spaces.Box(-1, 1, (2,)), gym.spaces.MultiDiscrete([100, 100]), "10000 joint actions, allowed"),
        (
            gym.spaces.Box(-1, 1, (2,)),
            gym.spaces.Box(np.arange(6, dtype=np.float32).reshape(2, 3), 9),
            "unsupported action space",
        ),
    ],
)
def test_unsupported_spaces_are_one_line(obs: gym.spaces.Space, act: gym.spaces.Space, needle: str) -> None:
    env_id = _register(f"test/Spaces{abs(hash((str(obs), str(act))))}-v0", obs, act)
    with pytest.raises(ConfigError) as info:
        describe_env(EnvConfig(id=env_id, max_episode_steps=5))
    assert f"env.id='{env_id}'" in str(info.value) and needle in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_time_limit_warns_once_naming_the_key(caplog, monkeypatch) -> None:
    monkeypatch.setattr(envs.make, "_warned_no_time_limit", set())
    with caplog.at_level(logging.WARNING):
        bounded = [make_env(EnvConfig(id=i)) for i in ("CartPole-v1", "recurrl/CueMemory-v0")]
        capped = make_env(EnvConfig(id="recurrl/NoTimeLimit-v0", max_episode_steps=7))
        assert not caplog.records
        endless = make_env(EnvConfig(id="recurrl/NoTimeLimit-v0"))
        make_vec_env(EnvConfig(id="recurrl/NoTimeLimit-v0"), seed=0, num_envs=2)
    assert all(has_time_limit(e) for e in (*bounded, capped)) and not has_time_limit(endless)
    assert len(caplog.records) == 1 and "env.max_episode_steps" in caplog.records[0].getMessage()
    for _ in range(7):
        *_, terminated, truncated, _ = capped.step(0)
    assert truncated and not terminated


class _FirstActionPolicy:
    """Always action 0; a one-unit zero state stands in for a network."""

    net = SimpleNamespace(initial_state=lambda n: (np.zeros((n, 1), np.float32),))

    def act(self, obs, prev_action, prev_reward, state, explore):  # noqa: ANN001, ANN201
        return np.zeros(len(obs["obs"]), np.int64), state


def test_evaluate_without_time_limit_reports_capped_returns(caplog) -> None:
    """Reward 1 per step and no end: each return is the step cap, not NaN, with one warning."""
    vec = make_vec_env(EnvConfig(id="recurrl/NoTimeLimit-v0", max_episode_steps=None), seed=0, num_envs=3)
    with caplog.at_level(logging.WARNING, logger="agents.actor"):
        returns = evaluate(vec, _FirstActionPolicy(), seed=0, max_steps=25)
    np.testing.assert_array_equal(returns, [25.0, 25.0, 25.0])
    (record,) = [r for r in caplog.records if r.name == "agents.actor"]
    assert "3 of 3" in record.getMessage() and "env.max_episode_steps" in record.getMessage()
    caplog.clear()
    vec = make_vec_env(EnvConfig(id="recurrl/NoTimeLimit-v0", max_episode_steps=10), seed=0, num_envs=3)
    np.testing.assert_array_equal(evaluate(vec, _FirstActionPolicy(), seed=0, max_steps=25), [10.0] * 3)
    assert not [r for r in caplog.records if r.name == "agents.actor"]


def test_describe_non_finite_names_value_and_env() -> None:
    obs, reward = np.zeros((4, 3), np.float32), np.ones(4, np.float32)
    assert describe_non_finite(obs, reward) is None
    obs[2, 1], obs[1, 2] = np.inf, -np.inf
    assert describe_non_finite(obs, reward) == "non-finite observation -inf at obs index 2 from env 1"
    reward[3] = np.nan
    assert describe_non_finite(obs, reward) == "non-finite reward nan from env 3"


@pytest.mark.parametrize("what", ["reward", "obs"])
def test_nan_env_is_caught_at_the_step_it_starts(what: str) -> None:
    vec = make_vec_env(EnvConfig(id="recurrl/NaNReward-v0", kwargs={"nan_after": 4, "what": what}), 0, 2)
    found = []
    for _ in range(6):
        obs, reward, *_ = vec.step(np.zeros(2, np.int64))
        found.append(describe_non_finite(obs, reward))
    assert found[:3] == [None] * 3 and all(f is not None for f in found[3:])
    assert f"non-finite {'reward' if what == 'reward' else 'observation'} nan" in found[3]
    assert found[3].endswith("from env 0")


SHIPPED = [
    EnvConfig(id="recurrl/CueMemory-v0"),
    EnvConfig(id="recurrl/CueMemoryContinuous-v0"),
    EnvConfig(id="recurrl/NaNReward-v0", kwargs={"nan_after": 1000}),
    EnvConfig(id="recurrl/NoTimeLimit-v0", max_episode_steps=50),
    EnvConfig(id="recurrl/CueMemory-v0", flicker=0.5, obs_noise=0.5),
    EnvConfig(id="CartPole-v1", max_episode_steps=50, time_limit_terminal=True),
] + [
    EnvConfig(id=env_id, **{key: value})
    for env_id, mask in (("CartPole-v1", [1, 3]), ("Pendulum-v1", [2]))
    for key, value in (("mask_obs", mask), ("flicker", 0.3), ("obs_noise", 0.1))
]


def test_time_limit_terminal_ends_cut_episodes_as_terminated() -> None:
    """With env.time_limit_terminal the step the time limit cuts reports terminated, not truncated;
    without it the same step is truncated. Episodes that end on their own are unchanged."""
    ends = {}
    for flag in (False, True):
        env = make_env(EnvConfig(id="CartPole-v1", max_episode_steps=6, time_limit_terminal=flag), seed=0)
        flags = [env.step(i % 2)[2:4] for i in range(6)]  # alternate pushes: the pole stays up
        assert flags[:5] == [(False, False)] * 5
        ends[flag] = flags[5]
        names = [w.name for w in gym.make(env.spec).spec.additional_wrappers]
        assert ("TimeLimitAsTerminal" in names) == flag  # rebuilt from its spec with the wrapper
    assert ends == {False: (False, True), True: (True, False)}
    env = make_env(EnvConfig(id="CartPole-v1", max_episode_steps=500, time_limit_terminal=True), seed=0)
    steps, done = 0, (False, False)
    while not any(done):  # always pushing right: the pole falls within a few dozen steps
        done = env.step(1)[2:4]
        steps += 1
    assert done == (True, False) and steps < 100


# Advice about the base envs' own design (CartPole's infinite velocity bounds, Pendulum's [-2, 2]
# torque) and about checking a wrapped env; anything else the checker says fails the test.
ADVISORY = ("is different from the unwrapped", "infinity. This is probably", "symmetric and normalized")


def _check_env_strictly(env: gym.Env) -> None:
    """gymnasium's check_env, with any warning outside ``ADVISORY`` counted as a failure."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    unexpected = [str(w.message) for w in caught if not any(a in str(w.message) for a in ADVISORY)]
    assert not unexpected


@pytest.mark.parametrize("config", SHIPPED, ids=lambda c: f"{c.id}-{c.mask_obs}-{c.flicker}-{c.obs_noise}")
def test_shipped_envs_pass_check_env_and_rebuild_from_spec(config: EnvConfig) -> None:
    env = make_env(config, seed=0)
    _check_env_strictly(env)
    rebuilt = gym.make(env.spec)
    names = [w.name for w in env.spec.additional_wrappers]
    assert [w.name for w in rebuilt.spec.additional_wrappers] == names
    assert rebuilt.observation_space == env.observation_space
    np.testing.assert_array_equal(env.reset(seed=3)[0], rebuilt.reset(seed=3)[0])
    action = env.action_space.sample()
    np.testing.assert_array_equal(env.step(action)[0], rebuilt.step(action)[0])


def _docker_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins (``!`` re-includes); a match on a directory
    excludes what is under it. ``**`` spans directories, ``*`` and ``?`` do not."""
    excluded = False
    for raw in patterns:
        negate, pattern = raw.startswith("!"), raw.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if re.fullmatch(f"{regex}(/.*)?", path):
            excluded = not negate
    return excluded


def test_dockerignore_keeps_secrets_out_of_the_image() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [x.strip() for x in lines if x.strip() and not x.startswith("#")]
    for secret in (".env", ".env.local", "prod.env", "conf/.env", "deploy/db.env", "secrets/db_password.txt"):
        assert _docker_excludes(secret, patterns), secret
    for kept in ("agents/actor.py", "envs/make.py", "conf/env/cartpole.yaml", "pyproject.toml", "README.md"):
        assert not _docker_excludes(kept, patterns), kept
