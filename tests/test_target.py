"""Target networks: exact copy at build, EMA closed form, tau=1 copies, tau=0 no-op, path pairing."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from agents.networks import NetworkConfig, RecurrentNetwork
from agents.rdqn import RDQNConfig, RDQNLearner
from agents.target import TargetUpdater, pair_variables
from tests.helpers import rdqn_batch


def _pair(cell: str = "lstm") -> tuple[RecurrentNetwork, RecurrentNetwork, TargetUpdater]:
    cfg = NetworkConfig(cell=cell, units=5, pre_layers=[4])
    online = RecurrentNetwork(cfg, 3, 2, name="online_q")
    target = RecurrentNetwork(cfg, 3, 2, name="target_q")
    return online, target, TargetUpdater([(online, target)])


def _weights(net: RecurrentNetwork) -> dict[str, np.ndarray]:
    return {v.path.split("/", 1)[1]: np.asarray(v).copy() for v in net.trainable_variables}


def test_learner_target_starts_as_exact_copy() -> None:
    learner = RDQNLearner(RDQNConfig(), NetworkConfig(units=8), 4, 2, burn_in=2, trace_length=3)
    online, target = _weights(learner.online_q), _weights(learner.target_q)
    assert online.keys() == target.keys() and len(online) >= 7
    for k in online:
        np.testing.assert_array_equal(online[k], target[k])


def test_average_network_starts_as_a_copy_and_follows_the_online_one_after_every_update() -> None:
    """The average is a second EMA at its own rate: after one update (the target's period is 3, so
    the target has not moved) ``average = (1 - a) * online_before + a * online_after``."""
    cfg = RDQNConfig(tau=0.1, target_update_period=3, average_tau=0.25, lr=0.01)
    learner = RDQNLearner(cfg, NetworkConfig(units=8), 4, 2, burn_in=2, trace_length=3)
    assert learner.eval_network("average") is learner.average_q
    assert learner.average_q in learner.networks() and learner.trackables()["average_q"] is learner.average_q
    before = _weights(learner.online_q)
    for name, w in _weights(learner.average_q).items():
        np.testing.assert_array_equal(w, before[name])
    learner.step(rdqn_batch(learner, 32, 4, 2, seed=0))
    after, average = _weights(learner.online_q), _weights(learner.average_q)
    target = _weights(learner.target_q)
    assert any(not np.allclose(after[k], before[k]) for k in after)
    for name in before:
        np.testing.assert_array_equal(target[name], before[name], err_msg=name)
        want = 0.75 * before[name] + 0.25 * after[name]
        np.testing.assert_allclose(average[name], want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_no_average_network_unless_asked() -> None:
    learner = RDQNLearner(RDQNConfig(), NetworkConfig(units=8), 4, 2, burn_in=2, trace_length=3)
    assert learner.average_q is None and "average_q" not in learner.trackables()
    with pytest.raises(ValueError, match="allowed online\\|target$"):
        learner.eval_network("average")


@pytest.mark.parametrize("cell", ["lstm", "gru", "lstm_peephole", "mlp"])
def test_k_soft_updates_match_closed_form(cell: str) -> None:
    online, target, updater = _pair(cell)
    w_online, w_target0 = _weights(online), _weights(target)
    assert any(not np.allclose(w_online[k], w_target0[k]) for k in w_online)
    tau, k = 0.1, 7
    for _ in range(k):
        updater(tau)
    got = _weights(target)
    for name in w_online:  # online + (1 - tau)^k (target_0 - online)
        want = w_online[name] + (1 - tau) ** k * (w_target0[name] - w_online[name])
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert any("recurrent_kernel" in n for n in got) == (cell != "mlp")


def test_tau_one_copies_and_tau_zero_changes_nothing() -> None:
    online, target, updater = _pair()
    before = _weights(target)
    updater(0.0)
    for k, v in _weights(target).items():
        np.testing.assert_array_equal(v, before[k])
    updater(1.0)
    for k, v in _weights(target).items():
        np.testing.assert_array_equal(v, _weights(online)[k])


def _seed(net: RecurrentNetwork) -> tuple[object, np.ndarray]:
    """The one int64 seed variable Keras 3 keeps for the network's recurrent cell, and its value."""
    (seed,) = [v for v in net.non_trainable_variables if v.dtype == "int64"]
    return seed, np.asarray(seed).copy()


def test_integer_seed_state_is_never_averaged_or_copied() -> None:
    online, target, updater = _pair("lstm")
    (online_seed, o0), (target_seed, t0) = _seed(online), _seed(target)
    assert not np.array_equal(o0, t0)  # different seeds, so averaging or copying would show
    w_online, w_target0 = _weights(online), _weights(target)
    updater(0.5)
    np.testing.assert_array_equal(np.asarray(target_seed), t0)
    np.testing.assert_array_equal(np.asarray(online_seed), o0)
    for name, w in _weights(target).items():  # the update did run on the float weights
        np.testing.assert_allclose(w, (w_online[name] + w_target0[name]) / 2, rtol=1e-6, atol=1e-7)
    assert all(v.dtype.startswith("float") for pair in updater.soft_pairs + updater.copy_pairs for v in pair)


def test_pairing_is_by_path_and_rejects_mismatch() -> None:
    online = RecurrentNetwork(NetworkConfig(units=5, pre_layers=[4]), 3, 2, name="online_q")
    wider = RecurrentNetwork(NetworkConfig(units=6, pre_layers=[4]), 3, 2, name="target_q")
    with pytest.raises(ValueError, match="online"):
        pair_variables(online, wider)
    deeper = RecurrentNetwork(NetworkConfig(units=5, pre_layers=[4, 4]), 3, 2, name="target_q")
    with pytest.raises(ValueError, match="differ"):
        pair_variables(online, deeper)
    target = RecurrentNetwork(NetworkConfig(units=5, pre_layers=[4]), 3, 2, name="target_q")
    for o, t in pair_variables(online, target):
        assert o.path.split("/", 1)[1] == t.path.split("/", 1)[1]


def test_learner_hard_copies_every_period_with_tau_one() -> None:
    """tau=1 with target_update_period=3: the target jumps to the online net every 3rd step only."""
    cfg = RDQNConfig(tau=1.0, target_update_period=3, batch_size=4, n_step=1)
    learner = RDQNLearner(cfg, NetworkConfig(units=8), 2, 2, burn_in=1, trace_length=3)
    batch = rdqn_batch(learner, batch_size=4, obs_dim=2, num_actions=2, seed=0)
    initial = _weights(learner.target_q)
    for i in range(1, 7):
        learner.step(batch)
        online, target = _weights(learner.online_q), _weights(learner.target_q)
        equal = all(np.array_equal(online[k], target[k]) for k in online)
        assert equal == (i % 3 == 0), i
        if i < 3:
            assert all(np.array_equal(initial[k], target[k]) for k in target)


def test_update_if_runs_only_when_due() -> None:
    online, target, updater = _pair()
    step = tf.function(lambda due: updater.update_if(due, tf.constant(0.5)))
    before, w_online = _weights(target), _weights(online)
    assert not bool(step(tf.constant(False)))
    for k, v in _weights(target).items():
        np.testing.assert_array_equal(v, before[k])
    assert bool(step(tf.constant(True)))
    for k, v in _weights(target).items():
        np.testing.assert_allclose(v, 0.5 * (before[k] + w_online[k]), rtol=1e-6, atol=1e-7)
