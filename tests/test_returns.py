"""n-step and lambda-return double-DQN targets and the masked Huber loss against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from agents.networks import NetworkConfig
from agents.rdqn import RDQNConfig, RDQNLearner
from agents.returns import huber, lambda_targets, masked_mean, n_step_targets
from tests.helpers import rdqn_batch


def test_n_step_targets_by_hand() -> None:
    g = 0.5
    # One sequence, L = 6 rows, n = 2 -> targets for T = 4 steps.
    reward = tf.constant([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    terminated = tf.constant([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])  # ends after row 2's action
    truncated = tf.constant([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])  # time limit after row 4's action
    value = tf.constant([[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]])
    got = n_step_targets(reward, terminated, truncated, value, g, 2).numpy()[0]
    want = [
        1 + g * 2 + g**2 * 30,  # t=0: two rewards, bootstrap from row 2
        2 + g * 3,  # t=1: episode terminates at row 2: no bootstrap
        3,  # t=2: terminates right away
        4 + g * 5 + g**2 * 60,  # t=3: truncated at row 4 -> bootstrap the final obs (row 5)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_truncated_and_terminated_together_is_terminal() -> None:
    one = tf.ones([1, 2])
    got = n_step_targets(one, one, one, 100 * one, 0.9, 1).numpy()
    np.testing.assert_allclose(got, [[1.0]])


def test_lambda_targets_by_hand() -> None:
    g, lam = 0.5, 0.25
    reward = tf.constant([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    terminated = tf.constant([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0]])  # ends after row 2's action
    truncated = tf.constant([[0.0, 0.0, 0.0, 0.0, 1.0, 0.0]])  # time limit after row 4's action
    value = tf.constant([[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]])
    got = lambda_targets(reward, terminated, truncated, value, g, lam, 4).numpy()[0]
    g4 = 5 + g * 60  # truncated: only the final observation's value
    g3 = 4 + g * ((1 - lam) * 50 + lam * g4)
    g2 = 3.0  # terminated: nothing after it
    g1 = 2 + g * ((1 - lam) * 30 + lam * g2)
    g0 = 1 + g * ((1 - lam) * 20 + lam * g1)
    np.testing.assert_allclose(got, [g0, g1, g2, g3], rtol=1e-6)


def test_lambda_targets_are_the_lambda_weighted_mix_of_n_step_targets() -> None:
    """Backward recursion == forward definition (1 - lam) sum_n lam^(n-1) y^(n), the longest n-step
    target that fits in the window taking the remaining weight; lam = 0 is the one-step target."""
    rng = np.random.default_rng(0)
    b, length, trace, g = 3, 9, 6, 0.9
    reward = rng.normal(size=(b, length)).astype(np.float32)
    value = rng.normal(size=(b, length)).astype(np.float32)
    terminated = (rng.random((b, length)) < 0.1).astype(np.float32)
    truncated = (rng.random((b, length)) < 0.1).astype(np.float32)
    assert terminated.any() and truncated.any()
    ys = {n: n_step_targets(reward, terminated, truncated, value, g, n).numpy() for n in range(1, length)}
    for lam in (0.0, 0.3, 1.0):
        got = lambda_targets(reward, terminated, truncated, value, g, lam, trace).numpy()
        want = np.zeros((b, trace))
        for t in range(trace):
            longest = length - 1 - t
            for n in range(1, longest):
                want[:, t] += (1 - lam) * lam ** (n - 1) * ys[n][:, t]
            want[:, t] += lam ** (longest - 1) * ys[longest][:, t]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    one_step = lambda_targets(reward, terminated, truncated, value, g, 0.0, trace).numpy()
    np.testing.assert_allclose(one_step, ys[1][:, :trace], rtol=1e-6)


def test_huber_and_masked_mean() -> None:
    x = tf.constant([[0.5, -3.0, 2.0]])
    np.testing.assert_allclose(huber(x, 1.0).numpy(), [[0.125, 2.5, 1.5]])
    mask = tf.constant([[1.0, 1.0, 0.0]])
    np.testing.assert_allclose(masked_mean(huber(x, 1.0), mask).numpy(), (0.125 + 2.5) / 2)
    assert masked_mean(x, tf.zeros_like(x)).numpy() == 0.0


def test_learner_double_dqn_n_step_loss_by_hand() -> None:
    """The learner's TD errors equal a numpy double-DQN n-step computation on the same Q-values."""
    cfg = RDQNConfig(gamma=0.9, n_step=2, batch_size=2, tau=0.5, huber_delta=100.0)
    learner = RDQNLearner(cfg, NetworkConfig(units=4, pre_layers=[]), 3, 3, burn_in=1, trace_length=3)
    for v in learner.target_q.trainable_variables:  # make target differ from online
        v.assign(v * 1.5 + 0.1)
    batch = rdqn_batch(learner, batch_size=2, obs_dim=3, num_actions=3, seed=3)
    batch["terminated"][0, 2] = 1.0
    batch["first"][0, 4] = 1.0
    batch["valid"][0, 3] = 0.0
    zero = learner.online_q.initial_state(2)
    q_on = learner.online_q.unroll(batch["obs"], zero, batch["first"])[0].numpy()
    q_tg = learner.target_q.unroll(batch["obs"], zero, batch["first"])[0].numpy()
    g, bi, T = 0.9, 1, 3
    want = np.zeros((2, T))
    for b in range(2):
        for t in range(T):
            s = bi + t
            ret, disc, alive = 0.0, 1.0, True
            for k in range(2):
                ret += disc * batch["reward"][b, s + k]
                disc *= g
                if batch["terminated"][b, s + k]:
                    alive = False
                    break
            if alive:
                j = s + 2
                ret += disc * q_tg[b, j, q_on[b, j].argmax()]
            want[b, t] = (ret - q_on[b, s, batch["action"][b, s]]) * batch["valid"][b, s]
    metrics = learner.step(batch)
    np.testing.assert_allclose(metrics["td_error"], want, rtol=1e-4, atol=1e-5)
    mask = batch["valid"][:, 1:4]
    np.testing.assert_allclose(metrics["loss"], (0.5 * want**2 * mask).sum() / mask.sum(), rtol=1e-4)


def test_value_rescaling_and_its_inverse() -> None:
    from agents.returns import rescale, unrescale

    x = tf.constant(np.concatenate([np.linspace(-1e4, 1e4, 2001), [0.0, 1e-3, -1e-3, 0.5]]), tf.float64)
    np.testing.assert_allclose(rescale(unrescale(x)).numpy(), x.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(unrescale(rescale(x)).numpy(), x.numpy(), rtol=1e-9, atol=1e-9)
    # h(x) by hand: sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x
    assert float(rescale(tf.constant(3.0, tf.float64))) == pytest.approx(1.0 + 3e-3)
    assert float(rescale(tf.constant(-8.0, tf.float64))) == pytest.approx(-2.0 - 8e-3)
