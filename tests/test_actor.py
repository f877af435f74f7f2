"""Actor and EpsilonGreedy: replay rows at episode boundaries, epsilon 0/1, one return per env.

A scripted env and policy make every row predictable: env ``i`` runs episodes of ``LENGTHS[i]``
steps (env 0 ends by termination, env 1 by truncation); the policy's state counts the steps since
it was last zeroed, so it equals the observation's step counter whenever the actor zeroes it at
each episode start. The last two tests do the same with the cue memory env and a real network.
"""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest

from agents.actor import Actor, evaluate
from agents.networks import NetworkConfig, NumpyNetwork, RecurrentNetwork
from agents.policies import EpsilonGreedy
from agents.replay import SequenceReplay
from envs import EnvConfig, make_vec_env

LENGTHS = (3, 2)
NUM_ACTIONS = 3


class StepCountEnv(gym.Env):
    """Observation ``[t, episode]``; reward ``1 + action``; ends after ``length`` steps."""

    def __init__(self, length: int, truncate: bool) -> None:
        self.length, self.truncate = length, truncate
        self.observation_space = gym.spaces.Box(0, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(NUM_ACTIONS)
        self.episode = -1

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return np.array([0, self.episode], np.float32), {}

    def step(self, action):
        self.t += 1
        end = self.t >= self.length
        obs = np.array([self.t, self.episode], np.float32)
        return obs, 1.0 + float(action), end and not self.truncate, end and self.truncate, {}


def _vec_env(lengths: tuple[int, ...] = LENGTHS) -> gym.vector.SyncVectorEnv:
    fns = [lambda n=n, i=i: StepCountEnv(n, truncate=i % 2 == 1) for i, n in enumerate(lengths)]
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)


class CountingNet:
    """State ``([E, 1],)`` that the policy adds one to per step."""

    def initial_state(self, batch_size: int) -> tuple[np.ndarray, ...]:
        return (np.zeros((batch_size, 1), np.float32),)


class ScriptedPolicy:
    """Action ``(t + episode) % NUM_ACTIONS``; records what the actor hands it."""

    def __init__(self) -> None:
        self.net = CountingNet()
        self.seen: list[dict[str, np.ndarray]] = []
        self.starts: list[np.ndarray] = []
        self.ends: list[tuple[np.ndarray, np.ndarray]] = []

    def act(self, obs, prev_action, prev_reward, state, explore):
        self.seen.append({"prev_action": prev_action.copy(), "state": state[0].copy()})
        action = (obs["obs"].sum(axis=1).astype(np.int32)) % NUM_ACTIONS
        return action, (state[0] + 1,)

    def episode_start(self, envs: np.ndarray) -> None:
        self.starts.append(envs.copy())

    def episode_end(self, envs: np.ndarray, returns: np.ndarray) -> None:
        self.ends.append((envs.copy(), returns.copy()))

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Nothing to restore."""


def _replay(num_envs: int) -> SequenceReplay:
    fields = {
        "obs": ((2,), np.float32),
        "action": ((), np.int32),
        "prev_action": ((NUM_ACTIONS,), np.float32),
        "prev_reward": ((), np.float32),
    }
    return SequenceReplay(64 * num_envs, num_envs, 4, fields, state_dim=1, seed=0)


def test_rows_at_episode_boundaries_with_next_step_autoreset() -> None:
    """Each episode of L steps gives L valid rows then its final observation's row (valid 0, no
    reward, no end flags); the row after starts the next episode with a zero state."""
    policy, replay, steps = ScriptedPolicy(), _replay(2), 9
    actor = Actor(_vec_env(), policy, replay, seed=0)
    ended = [actor.step() for _ in range(steps)]
    for env, length in enumerate(LENGTHS):
        d = {k: v[:steps, env] for k, v in replay.data.items()}
        t = np.arange(steps) % (length + 1)  # step inside the episode; t == length: final obs
        episode = np.arange(steps) // (length + 1)
        np.testing.assert_array_equal(d["obs"][:, 0], t)
        np.testing.assert_array_equal(d["obs"][:, 1], episode)
        np.testing.assert_array_equal(d["first"], t == 0)
        np.testing.assert_array_equal(d["valid"], t < length)
        last = t == length - 1
        np.testing.assert_array_equal(d["terminated"], last & (env == 0))
        np.testing.assert_array_equal(d["truncated"], last & (env == 1))
        np.testing.assert_array_equal(d["action"], (t + episode) % NUM_ACTIONS)
        np.testing.assert_array_equal(d["reward"], np.where(t < length, 1.0 + d["action"], 0.0))
        # The state stored is the one *before* the step: zero at a start, then one more per step.
        np.testing.assert_array_equal(d["state"][:, 0], t)
        # The episodes that ended on each step, with return and length over the valid rows only.
        got = [
            (i, s.returns[s.envs.index(env)], s.lengths[s.envs.index(env)])
            for i, s in enumerate(ended)
            if env in s.envs
        ]
        want = [(i, float(d["reward"][i - length + 1 : i + 1].sum()), length) for i in np.flatnonzero(last)]
        assert got == want
    seen_state = np.stack([s["state"][:, 0] for s in policy.seen], axis=1)  # [E, steps]
    np.testing.assert_array_equal(seen_state, replay.data["state"][:steps, :, 0].T)
    # The policy hears of each finished training episode, on the step it ends (e.g. to credit it).
    heard = [(list(envs), list(returns)) for envs, returns in policy.ends]
    assert heard == [(s.envs, s.returns) for s in ended if s.envs]


def test_prev_action_is_one_hot_of_the_last_action_and_zero_at_episode_start() -> None:
    policy, replay, steps = ScriptedPolicy(), _replay(2), 9
    actor = Actor(_vec_env(), policy, replay, seed=0)
    for _ in range(steps):
        actor.step()
    d = {k: v[:steps] for k, v in replay.data.items()}  # [steps, E, ...]
    first = d["first"] > 0
    want = np.eye(NUM_ACTIONS, dtype=np.float32)[np.roll(d["action"], 1, axis=0)]
    want[first] = 0.0
    np.testing.assert_array_equal(d["prev_action"], want)
    want_reward = np.where(first, 0.0, np.roll(d["reward"], 1, axis=0))
    np.testing.assert_array_equal(d["prev_reward"], want_reward)
    # The policy acted on the same previous action that replay stored.
    np.testing.assert_array_equal(np.stack([s["prev_action"] for s in policy.seen]), d["prev_action"])
    assert first.sum(axis=0).tolist() == [3, 3]  # rows 0, 4, 8 and 0, 3, 6


def test_episode_start_is_announced_only_when_exploring() -> None:
    policy = ScriptedPolicy()
    actor = Actor(_vec_env(), policy, replay=None, seed=0)
    firsts = []
    for _ in range(7):
        firsts.append(actor.first > 0)
        actor.step(explore=True)
    assert [s.tolist() for s in policy.starts] == [f.tolist() for f in firsts if f.any()]
    for _ in range(7):
        actor.step(explore=False)
    assert len(policy.starts) == sum(f.any() for f in firsts)


class LinearQ:
    """``q = x @ w`` ``[E, F] @ [F, A]``; records its inputs."""

    def __init__(self, w: np.ndarray) -> None:
        self.w, self.inputs = w, []

    def initial_state(self, batch_size: int) -> tuple[np.ndarray, ...]:
        return ()

    def step(self, inputs: dict[str, np.ndarray], state: tuple) -> tuple[np.ndarray, tuple]:
        x = np.concatenate([inputs["obs"], *([inputs["extras"]] if "extras" in inputs else [])], axis=1)
        self.inputs.append(x)
        return x @ self.w, state


def _greedy_setup(num_envs: int = 6000, seed: int = 0):
    rng = np.random.default_rng(seed)
    net = LinearQ(rng.normal(size=(4, NUM_ACTIONS)))
    obs = rng.normal(size=(num_envs, 4)).astype(np.float32)
    none = np.zeros((num_envs, NUM_ACTIONS), np.float32), np.zeros(num_envs, np.float32)
    return net, {"obs": obs}, none, (obs @ net.w).argmax(axis=1)


def test_epsilon_zero_is_greedy_and_epsilon_one_uniform() -> None:
    net, obs, (prev_a, prev_r), greedy = _greedy_setup()
    zero = EpsilonGreedy(net, NUM_ACTIONS, lambda: 0.0, seed=1)
    action, _ = zero.act(obs, prev_a, prev_r, (), explore=True)
    assert action.dtype == np.int32
    np.testing.assert_array_equal(action, greedy)
    one = EpsilonGreedy(net, NUM_ACTIONS, lambda: 1.0, seed=1)
    action, _ = one.act(obs, prev_a, prev_r, (), explore=True)
    freq = np.bincount(action, minlength=NUM_ACTIONS) / len(action)
    np.testing.assert_allclose(freq, 1 / NUM_ACTIONS, atol=0.03)  # 6000 draws: sd 0.006
    assert abs((action == greedy).mean() - 1 / NUM_ACTIONS) < 0.03  # random, not greedy
    action, _ = one.act(obs, prev_a, prev_r, (), explore=False)
    np.testing.assert_array_equal(action, greedy)  # evaluation ignores epsilon


def test_epsilon_is_read_at_every_call_and_inputs_are_appended() -> None:
    net, obs, _, _ = _greedy_setup(num_envs=5)
    net.w = np.random.default_rng(2).normal(size=(4 + NUM_ACTIONS + 1, NUM_ACTIONS))
    calls = []
    policy = EpsilonGreedy(
        net, NUM_ACTIONS, lambda: calls.append(1) or 0.0, seed=0, inputs=["prev_action", "prev_reward"]
    )
    prev_a = np.eye(NUM_ACTIONS, dtype=np.float32)[[0, 1, 2, 0, 1]]
    prev_r = np.arange(5, dtype=np.float32)
    for _ in range(3):
        policy.act(obs, prev_a, prev_r, (), explore=True)
    assert len(calls) == 3
    expected = np.concatenate([obs["obs"], prev_a, prev_r[:, None]], axis=1)
    np.testing.assert_array_equal(net.inputs[-1], expected)


@pytest.mark.parametrize("max_steps", [100, 3])
def test_evaluate_returns_each_envs_first_episode(max_steps: int, caplog) -> None:
    """One return per env, from its first episode only (env 1 finishes twice meanwhile); an env
    still in its first episode after ``max_steps`` gives the return of those steps, with a warning."""
    lengths = (5, 2)
    with caplog.at_level(logging.WARNING, logger="agents.actor"):
        returns = evaluate(_vec_env(lengths), ScriptedPolicy(), seed=0, max_steps=max_steps)
    assert returns.shape == (2,)
    # Episode 0 takes action t % 3 at step t and earns 1 + action.
    steps = np.minimum(lengths, max_steps)
    np.testing.assert_array_equal(returns, [sum(1 + t % NUM_ACTIONS for t in range(n)) for n in steps])
    cut = "1 of 2 episodes did not end within 3 steps"
    assert [cut in r.getMessage() for r in caplog.records] == ([True] if max_steps == 3 else [])


def test_actor_rows_mark_episode_ends() -> None:
    """With NEXT_STEP autoreset the final observation gets its own row: valid=0, then first=1."""
    env = make_vec_env(EnvConfig(id="recurrl/CueMemory-v0", kwargs={"delay": 2}), seed=0, num_envs=2)
    net = RecurrentNetwork(NetworkConfig(units=4, pre_layers=[]), 2, 2, name="online_q")
    policy = EpsilonGreedy(NumpyNetwork(net), 2, lambda: 0.5, seed=0)
    replay = SequenceReplay(
        64, 2, 4, {"obs": ((2,), np.float32), "action": ((), np.int32)}, state_dim=8, seed=0
    )
    actor = Actor(env, policy, replay, seed=0)
    returns = []
    for _ in range(12):
        returns += actor.step().returns
    d = {k: v[:12, 0] for k, v in replay.data.items()}
    # Episode: 3 steps (obs t=0,1,2; terminated after the query at t=2) + 1 final-observation row.
    np.testing.assert_array_equal(d["first"], [1, 0, 0, 0] * 3)
    np.testing.assert_array_equal(d["valid"], [1, 1, 1, 0] * 3)
    np.testing.assert_array_equal(d["terminated"], [0, 0, 1, 0] * 3)
    assert (d["reward"][[0, 1, 3]] == 0).all() and (np.abs(d["reward"][2::4]) == 1).all()
    assert (np.abs(d["obs"][0::4, 0]) == 1).all()  # cue visible at every episode start
    assert (d["state"][0::4] == 0).all()  # state zeroed at episode start
    assert (d["state"][1::4] != 0).any()  # and carried within the episode
    assert len(returns) == 6  # 3 episodes x 2 envs


def test_actor_previous_action_is_one_hot_and_zero_at_episode_start() -> None:
    """network.inputs for discrete actions: the stored previous action is one-hot, none at a start."""
    env = make_vec_env(EnvConfig(id="recurrl/CueMemory-v0", kwargs={"delay": 2}), seed=0, num_envs=2)
    inputs = ["prev_action", "prev_reward"]
    net = RecurrentNetwork(NetworkConfig(units=4, pre_layers=[], inputs=inputs), 2, 2, name="q", extras_dim=3)
    policy = EpsilonGreedy(NumpyNetwork(net), 2, lambda: 0.5, seed=0, inputs=inputs)
    fields = {
        "obs": ((2,), np.float32),
        "action": ((), np.int32),
        "prev_action": ((2,), np.float32),
        "prev_reward": ((), np.float32),
    }
    replay = SequenceReplay(64, 2, 4, fields, state_dim=8, seed=0)
    actor = Actor(env, policy, replay, seed=0)
    for _ in range(12):
        actor.step()
    d = {k: v[:12, 0] for k, v in replay.data.items()}
    starts = d["first"] == 1
    assert starts.sum() == 3
    assert (d["prev_action"][starts] == 0).all() and (d["prev_reward"][starts] == 0).all()
    rest = np.flatnonzero(~starts)
    np.testing.assert_array_equal(d["prev_action"][rest], np.eye(2)[d["action"][rest - 1]])
    np.testing.assert_array_equal(d["prev_reward"][rest], d["reward"][rest - 1])
