"""rdqn's acting head: the reward head's myopic policy, or Agent57's sliding-window UCB bandit that
picks the Q head or the reward head per training episode by the returns each earned."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import tensorflow as tf

from agents.config import Config, validate
from agents.export import PolicyModule
from agents.loop import train
from agents.networks import NetworkConfig, NumpyNetwork, RecurrentNetwork
from agents.policies import EpsilonGreedy, HeadBandit
from agents.rdqn import RDQNConfig
from agents.saved_run import load_run
from envs.config import ConfigError


def test_bandit_tries_each_head_then_scores_by_windowed_mean_and_a_scale_free_bonus() -> None:
    rng = np.random.default_rng(0)
    bandit = HeadBandit(2, window=100, beta=0.0, explore=0.0)
    assert bandit.best() == 0 and list(bandit.choose(3, rng)) == [0, 0, 0]  # nothing seen yet
    bandit.record(np.array([0]), np.array([1.0]))
    assert list(bandit.choose(2, rng)) == [1, 1]  # a head absent from the window goes first
    bandit.record(np.array([1]), np.array([5.0]))
    assert bandit.best() == 1 and list(bandit.choose(2, rng)) == [1, 1]
    for scale in (1.0, 500.0):  # mean + beta * range * sqrt(1 / n): the choice ignores the scale
        bandit = HeadBandit(2, window=100, beta=1.0, explore=0.0)
        bandit.record(np.zeros(16, np.int64), np.full(16, scale))  # head 0: 1 + 1 / 4 = 1.25
        bandit.record(np.array([1]), np.array([0.0]))  # head 1: 0 + 1 = 1.0
        assert list(bandit.choose(1, rng)) == [0]
        bandit.beta = 2.0  # 1.5 against 2.0
        assert list(bandit.choose(1, rng)) == [1] and bandit.best() == 0
    means, counts = bandit.means()
    np.testing.assert_allclose(means, [500.0, 0.0])
    np.testing.assert_array_equal(counts, [16, 1])


def test_bandit_window_forgets_old_episodes_and_explores_at_its_rate() -> None:
    bandit = HeadBandit(2, window=10, beta=0.0, explore=0.5)
    bandit.record(np.ones(6, np.int64), np.full(6, 9.0))  # head 1 was best long ago
    bandit.record(np.zeros(10, np.int64), np.arange(10.0))  # then ten episodes of head 0
    assert len(bandit.arm_history) == 10 and not bandit.arm_history.any()
    means, counts = bandit.means()
    assert means[0] == 4.5 and np.isnan(means[1]) and counts[1] == 0 and bandit.best() == 0
    bandit.record(np.array([1]), np.array([0.0]))  # both heads seen: greedy is head 0 (beta 0)
    arms = bandit.choose(40_000, np.random.default_rng(1))
    assert abs(np.mean(arms == 1) - 0.25) < 0.01  # half are random, half of those head 1
    restored = HeadBandit(2, window=10, beta=0.0, explore=0.5)
    restored.load_state_dict(copy.deepcopy(bandit.state_dict()))
    np.testing.assert_array_equal(restored.arm_history, bandit.arm_history)
    np.testing.assert_array_equal(restored.return_history, bandit.return_history)
    scalars = bandit.scalars()
    assert scalars["charts/bandit_head0_share"] == 0.9 and scalars["charts/bandit_head1_return"] == 0.0


@pytest.mark.parametrize("n_heads", [2, 3])
def test_numpy_mirror_acts_with_the_head_each_row_asks_for(n_heads: int) -> None:
    config = NetworkConfig(units=8, pre_layers=[8], dueling=True, backend="graph")
    net = RecurrentNetwork(config, 3, 4, heads=n_heads)
    mirror = NumpyNetwork(net)
    x = np.random.default_rng(2).standard_normal((4, 2, 3)).astype(np.float32)  # [B, T, F]
    zero, first = net.initial_state(4), tf.zeros((4, 2))
    (want,), _ = net.unroll_segments(tf.constant(x), zero, first, (), all_heads=True)  # [B, T, H, A]
    want = want.numpy()
    assert want.shape == (4, 2, n_heads, 4)
    heads = np.array([0, 1, n_heads - 1, 0])
    state = mirror.initial_state(4)
    for t in range(2):
        got, state = mirror.step(x[:, t], state, heads)
        np.testing.assert_allclose(got, want[np.arange(4), t, heads], atol=1e-5)
    plain, _ = mirror.step(x[:, 0], mirror.initial_state(4))  # no head given: the first for all
    np.testing.assert_allclose(plain, want[:, 0, 0], atol=1e-5)
    assert not np.allclose(want[:, 0, 0], want[:, 0, 1])
    assert not np.allclose(want[:, 0, 1], want[:, 0, -1]) or n_heads == 2


class _HeadNet:
    """Q = one-hot of the head asked for, so the greedy action names the head that acted."""

    def __init__(self, heads: int = 2) -> None:
        self.heads = heads

    def step(self, x, state, head=None):  # noqa: ANN001, ANN201
        n = len(x["obs"])
        head = np.zeros(n, np.int64) if head is None else np.asarray(head)
        return np.eye(self.heads, dtype=np.float32)[head], state


def test_epsilon_greedy_credits_each_episode_to_its_head_and_acts_greedily_with_the_best() -> None:
    bandit = HeadBandit(2, window=50, beta=0.0, explore=1.0)  # every training head at random
    policy = EpsilonGreedy(_HeadNet(), 2, lambda: 0.0, seed=3, bandit=bandit)
    obs, none = {"obs": np.zeros((6, 1), np.float32)}, np.zeros(6, np.float32)
    acted, _ = policy.act(obs, none, none, (), explore=True)
    np.testing.assert_array_equal(acted, policy.arms)  # each env acts with its own head
    assert set(policy.arms) == {0, 1}
    before = policy.arms.copy()
    policy.episode_end(np.array([1, 4]), np.array([2.0, -1.0]))
    np.testing.assert_array_equal(bandit.arm_history, before[[1, 4]])
    policy.episode_start(np.array([False, True, False, False, True, False]))
    keep = [0, 2, 3, 5]
    np.testing.assert_array_equal(policy.arms[keep], before[keep])  # the others keep theirs
    bandit.record(np.array([1, 0]), np.array([10.0, 0.0]))
    greedy, _ = policy.act(obs, none, none, (), explore=False)
    assert policy.greedy_head() == 1 and list(greedy) == [1] * 6
    restored = EpsilonGreedy(_HeadNet(), 2, lambda: 0.0, seed=3, bandit=HeadBandit(2, 50, 0.0, 1.0))
    restored.load_state_dict(policy.state_dict())
    np.testing.assert_array_equal(restored.arms, policy.arms)
    assert restored.greedy_head() == 1
    fixed = EpsilonGreedy(_HeadNet(), 2, lambda: 0.0, seed=3, head=1)
    assert list(fixed.act(obs, none, none, (), explore=True)[0]) == [1] * 6 and fixed.greedy_head() == 1
    # with a twin Q head in slot 1 the bandit's second arm is the reward head in slot 2
    bandit = HeadBandit(2, window=50, beta=0.0, explore=1.0)
    third = EpsilonGreedy(_HeadNet(3), 3, lambda: 0.0, seed=3, bandit=bandit, slots=(0, 2))
    acted, _ = third.act(obs, none, none, (), explore=True)
    np.testing.assert_array_equal(acted, 2 * third.arms)
    third.episode_end(np.arange(6), np.where(third.arms == 1, 5.0, 0.0))
    assert set(third.bandit.arm_history) == {0, 1} and third.greedy_head() == 2


def test_acting_head_settings_are_checked() -> None:
    allowed = r"^agent.acting_head='best' is invalid: allowed q\|reward\|short\|bandit"
    with pytest.raises(ConfigError, match=allowed):
        RDQNConfig(reward_head=1.0, acting_head="best").validate()
    with pytest.raises(ConfigError, match=r"^agent.acting_head=bandit needs a second head: .*reward_head"):
        RDQNConfig(acting_head="bandit").validate()
    RDQNConfig(short_gamma=0.9, acting_head="bandit").validate()  # the short head is a second head
    with pytest.raises(ConfigError, match=r"^agent.acting_head=reward needs the reward head"):
        RDQNConfig(short_gamma=0.9, acting_head="reward").validate()
    with pytest.raises(ConfigError, match=r"^agent.bandit_explore"):
        RDQNConfig(reward_head=1.0, acting_head="bandit", bandit_explore=1.5).validate()
    with pytest.raises(ConfigError, match=r"^agent.bandit_window"):
        RDQNConfig(reward_head=1.0, acting_head="bandit", bandit_window=0).validate()


@pytest.mark.parametrize(
    ("acting", "twin", "short"),
    [("bandit", False, False), ("reward", False, False), ("reward", True, False), ("bandit", True, True)],
)
def test_a_run_keeps_its_bandit_and_exports_the_head_it_acts_with(
    tiny_config: Config, acting: str, twin: bool, short: bool
) -> None:
    """Slots: the Q head, the twin (with twin_q), the reward head, the short head (short_gamma)."""
    config = copy.deepcopy(tiny_config)
    config.agent.reward_head = 1.0
    config.agent.acting_head = acting
    config.agent.twin_q = twin
    config.agent.short_gamma = 0.9 if short else None
    config.agent.bandit_window = 10_000  # every episode of the run stays in the window
    validate(config)
    summary = train(config)
    saved = load_run(config.run_dir, backend="graph")
    if acting == "bandit":  # the checkpoint holds the window: every finished episode, by head
        arms = saved.policy.bandit.arm_history
        assert len(arms) == summary["episodes"] > 0 and set(arms) <= set(range(2 + short))
        assert saved.policy.bandit.heads == 2 + short
        np.testing.assert_array_equal(saved.policy.slots, [0, 1 + twin, 2 + twin][: 2 + short])
    head = saved.policy.greedy_head()
    assert head == 1 + twin or acting == "bandit"
    module = PolicyModule(saved, "online")
    assert module.head == head
    mirror = NumpyNetwork(saved.learner.eval_network("online"))
    obs = np.random.default_rng(4).random((3, module.observation[0].width)).astype(np.float32)
    want, _ = mirror.step(obs, mirror.initial_state(3), np.full(3, head))
    got = module.step(tf.constant(obs), module.initial_state(tf.constant(3, tf.int32))["state"])
    np.testing.assert_allclose(got["q_values"].numpy(), want, atol=1e-5)
    np.testing.assert_array_equal(got["action"].numpy(), want.argmax(axis=-1))
