"""agents/rdqn.py: the R2D2 options (value rescaling, dueling head, epsilon ladder)."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from agents import sequence_kernels
from agents.config import Config
from agents.loop import Counters, build_agent
from agents.networks import NetworkConfig, NumpyNetwork, RecurrentNetwork
from agents.rdqn import RDQNConfig, RDQNLearner, epsilon_ladder
from envs import describe_env
from envs.config import ConfigError
from tests.helpers import rdqn_batch


def test_epsilon_ladder_matches_ape_x() -> None:
    eps = epsilon_ladder(8)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4**8)
    np.testing.assert_allclose(eps, [0.4 ** (1 + 7 * i / 7) for i in range(8)])
    assert np.all(np.diff(eps) < 0) and epsilon_ladder(1).tolist() == [0.4]


def test_ladder_policy_explores_each_env_at_its_own_rate(tiny_config: Config) -> None:
    config = copy.deepcopy(tiny_config)
    config.agent.epsilon_ladder = True
    config.env.num_envs = 4
    learner, policy = build_agent(config, describe_env(config.env), Counters())
    np.testing.assert_allclose(policy.epsilon(), epsilon_ladder(4))
    assert learner.schedule_scalars(0)["charts/epsilon_max"] == pytest.approx(0.4)
    # 4 envs acting 4000 times: each env's share of random actions follows its own epsilon.
    obs = np.zeros((4, 2), np.float32)
    greedy, _ = policy.act(obs, np.zeros((4, 2)), np.zeros(4), policy.net.initial_state(4), explore=False)
    changed = np.zeros(4)
    for _ in range(4000):
        action, _ = policy.act(obs, np.zeros((4, 2)), np.zeros(4), policy.net.initial_state(4), explore=True)
        changed += action != greedy
    np.testing.assert_allclose(changed / 4000, epsilon_ladder(4) / 2, atol=0.03)  # 2 actions: half differ
    # Which envs explore, exactly: a draw just below each env's epsilon explores, just above does not.
    eps = epsilon_ladder(4)

    class Draws:
        def __init__(self, u: np.ndarray) -> None:
            self.u = u

        def random(self, n: int) -> np.ndarray:
            return self.u

        def integers(self, low: int, high: int, n: int) -> np.ndarray:
            return 1 - greedy  # a random action is the other one

    for u, explores in (
        (0.99 * eps, [True] * 4),
        (1.01 * eps, [False] * 4),
        (eps[[1, 1, 3, 3]], [True, False, True, False]),
    ):
        policy.rng = Draws(np.asarray(u))
        action, _ = policy.act(obs, np.zeros((4, 2)), np.zeros(4), policy.net.initial_state(4), explore=True)
        assert ((action != greedy) == np.array(explores)).all(), (u, action, greedy)


def test_dueling_head_removes_the_advantage_mean_and_mirrors_in_numpy() -> None:
    cfg = NetworkConfig(units=8, pre_layers=[8], dueling=True, backend="graph")
    net = RecurrentNetwork(cfg, 3, 4, name="online_q")
    assert "online_q/value_head/kernel" in [v.path for v in net.trainable_variables]
    x = tf.random.stateless_normal([2, 5, 3], seed=[1, 2])
    q, _ = net.unroll(x, net.initial_state(2), tf.zeros([2, 5]))
    assert q.shape == (2, 5, 4)
    h, _ = sequence_kernels.unroll(net.core, net.encoder(x), net.initial_state(2), tf.zeros([2, 5]))
    value = net.value_head(h)  # [B, T, 1]
    np.testing.assert_allclose(tf.reduce_mean(q, axis=-1, keepdims=True), value, atol=1e-5)
    mirror = NumpyNetwork(net)
    out, _ = mirror.step(x[:, 0].numpy(), mirror.initial_state(2))
    np.testing.assert_allclose(out, q[:, 0], atol=1e-5)


@pytest.mark.parametrize("rescaling", [False, True])
def test_value_rescaling_changes_the_target_not_the_shapes(rescaling: bool) -> None:
    """y = h(n-step return built on h^-1(Q_target(s', a*))) with a* the online greedy action,
    against a reference computed here in numpy; without rescaling, y is the plain n-step target."""
    from agents.returns import n_step_targets

    eps = 1e-3

    def h(x: np.ndarray) -> np.ndarray:
        return np.sign(x) * (np.sqrt(np.abs(x) + 1.0) - 1.0) + eps * x

    def h_inv(x: np.ndarray) -> np.ndarray:
        root = (np.sqrt(1.0 + 4.0 * eps * (np.abs(x) + 1.0 + eps)) - 1.0) / (2.0 * eps)
        return np.sign(x) * (root**2 - 1.0)

    cfg = RDQNConfig(batch_size=4, n_step=2, gamma=0.9, value_rescaling=rescaling)
    learner = RDQNLearner(cfg, NetworkConfig(units=8, pre_layers=[8], backend="graph"), 3, 2, 1, 3)
    online, target = learner.online_q, learner.target_q
    # Target values of several units, where h^-1 is far from the identity.
    kernel = np.random.default_rng(3).normal(scale=8.0, size=target.head.kernel.shape)
    target.head.kernel.assign(kernel.astype(np.float32))
    batch = rdqn_batch(learner, 4, 3, 2, seed=0)
    batch["reward"] *= 20.0
    obs, first, zero = tf.constant(batch["obs"]), tf.constant(batch["first"]), online.initial_state(4)
    q_on = online.unroll(obs, zero, first)[0].numpy()[:, 1:]  # [B, T + n, A] after 1 burn-in step
    q_tg = target.unroll(obs, zero, first)[0].numpy()[:, 1:]
    value = np.take_along_axis(q_tg, q_on.argmax(-1)[..., None], axis=-1)[..., 0]  # [B, T + n]
    assert np.abs(value).max() > 3.0
    taken = np.take_along_axis(q_on[:, :3], batch["action"][:, 1:4, None], axis=-1)[..., 0]  # [B, T]
    outcome = [batch[k][:, 1:] for k in ("reward", "terminated", "truncated")]
    metrics = learner.step(batch)
    assert metrics["td_error"].shape == (4, 3) and np.isfinite(metrics["loss"])
    if rescaling:
        want = h(np.asarray(n_step_targets(*outcome, h_inv(value), 0.9, 2))) - taken
        without_inverse = h(np.asarray(n_step_targets(*outcome, value, 0.9, 2))) - taken
        assert np.abs(want - without_inverse).max() > 0.1  # the test tells h^-1 from the identity
    else:
        want = np.asarray(n_step_targets(*outcome, value, 0.9, 2)) - taken
    np.testing.assert_allclose(metrics["td_error"], want, rtol=1e-4, atol=1e-4)


def test_advantage_learning_lowers_the_target_by_alpha_times_the_action_gap() -> None:
    cfg = RDQNConfig(batch_size=4, n_step=2)
    net = NetworkConfig(units=8, pre_layers=[8], backend="graph")
    al = RDQNLearner(dataclasses.replace(cfg, advantage_learning=0.5), net, 3, 2, 1, 3)
    plain = RDQNLearner(cfg, net, 3, 2, 1, 3)
    plain.online_q.set_weights(al.online_q.get_weights())
    plain.target_q.set_weights(al.target_q.get_weights())
    batch = rdqn_batch(plain, 4, 3, 2, seed=2)
    q, _ = al.target_q.unroll(batch["obs"], al.target_q.initial_state(4), batch["first"])
    q = np.asarray(q)[:, 1:4]  # the trace after 1 burn-in step: [B, T, A]
    taken = np.take_along_axis(q, batch["action"][:, 1:4, None], axis=-1)[..., 0]
    gap = q.max(axis=-1) - taken  # [B, T], >= 0 and > 0 where the action taken is not greedy
    assert (gap > 0).any()
    want = plain.step(batch)["td_error"] - 0.5 * gap
    np.testing.assert_allclose(al.step(batch)["td_error"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ConfigError, match=r"agent.advantage_learning"):
        RDQNConfig(advantage_learning=1.0).validate()


@pytest.mark.parametrize("which", ["all", "others"])
def test_target_anchor_adds_the_actions_squared_drift_from_the_target(which: str) -> None:
    cfg = RDQNConfig(batch_size=4, n_step=2)
    net = NetworkConfig(units=8, pre_layers=[8], backend="graph")
    anchored_cfg = dataclasses.replace(cfg, target_anchor=2.0, target_anchor_actions=which)
    anchored = RDQNLearner(anchored_cfg, net, 3, 3, 1, 3)  # 3 actions: 'others' are two
    plain = RDQNLearner(cfg, net, 3, 3, 1, 3)
    rng = np.random.default_rng(4)
    # The target starts as a copy, so the term starts at 0: move the target away from the online.
    moved = [
        w + 0.1 * rng.standard_normal(w.shape).astype(w.dtype) if w.dtype == np.float32 else w
        for w in anchored.target_q.get_weights()
    ]
    for learner in (anchored, plain):
        learner.online_q.set_weights(anchored.online_q.get_weights())
        learner.target_q.set_weights(moved)
    batch = rdqn_batch(plain, 4, 3, 3, seed=3)

    def q_of(network: RecurrentNetwork) -> np.ndarray:  # the trace after 1 burn-in step: [B, T, A]
        q, _ = network.unroll(batch["obs"], network.initial_state(4), batch["first"])
        return np.asarray(q)[:, 1:4]

    drift = (q_of(anchored.online_q) - q_of(anchored.target_q)) ** 2  # [B, T, A]
    if which == "others":  # the action taken is left out of the mean
        taken = np.eye(3, dtype=bool)[batch["action"][:, 1:4]]
        drift = np.where(taken, 0.0, drift).sum(axis=-1) / 2
    else:
        drift = drift.mean(axis=-1)  # [B, T]
    mask = batch["valid"][:, 1:4]
    want = (drift * mask).sum() / mask.sum()
    assert want > 1e-4
    out, base = anchored.step(batch), plain.step(batch)
    np.testing.assert_allclose(out["anchor"], want, rtol=1e-4)
    np.testing.assert_allclose(out["loss"], base["loss"] + 2.0 * want, rtol=1e-4)
    np.testing.assert_allclose(out["td_error"], base["td_error"], atol=1e-6)  # the target is unchanged
    assert "anchor" not in base
    with pytest.raises(ConfigError, match=r"agent.target_anchor"):
        RDQNConfig(target_anchor=-0.1).validate()
    with pytest.raises(ConfigError, match=r"agent.target_anchor_actions"):
        RDQNConfig(target_anchor_actions="taken").validate()


@pytest.mark.parametrize("twin", [False, True])
def test_reward_head_predicts_the_immediate_reward_beside_an_unchanged_td_loss(twin: bool) -> None:
    """The reward head's Huber error on the reward of the action taken joins the loss with its
    weight; the Q head's TD errors are those of the same network without it (with clipped double Q:
    of the same two Q heads, the reward head a third); acting follows the first head; repeated
    steps on one batch shrink the prediction error."""
    cfg = RDQNConfig(batch_size=4, n_step=2, lr=0.01, twin_q=twin)
    net = NetworkConfig(units=8, pre_layers=[8], dueling=True, backend="graph")
    aux = RDQNLearner(dataclasses.replace(cfg, reward_head=0.5), net, 3, 3, 1, 3)
    plain = RDQNLearner(cfg, net, 3, 3, 1, 3)
    assert aux.online_q.heads == 2 + twin and plain.online_q.heads == 1 + twin
    assert aux.reward_slot == 1 + twin and plain.reward_slot is None
    for src, dst in ((aux.online_q, plain.online_q), (aux.target_q, plain.target_q)):
        by_path = {v.path: v for v in src.trainable_variables}  # the input statistics start equal
        for v in dst.trainable_variables:
            v.assign(by_path[v.path])
    batch = rdqn_batch(plain, 4, 3, 3, seed=8)
    batch["reward"] = np.float32([1.0, -1.0, 0.5])[batch["action"]]  # a function of the action taken
    zero, first = aux.online_q.initial_state(4), tf.constant(batch["first"])
    (q_all,), _ = aux.online_q.unroll_segments(tf.constant(batch["obs"]), zero, first, (), all_heads=True)
    predicted = np.take_along_axis(q_all.numpy()[:, 1:4, -1], batch["action"][:, 1:4, None], axis=-1)[..., 0]
    error = np.abs(batch["reward"][:, 1:4] - predicted)
    huber = np.where(error <= 1.0, 0.5 * error**2, error - 0.5)  # agent.huber_delta = 1
    want = huber.mean()  # every row valid
    out, base = aux.step(batch), plain.step(batch)
    np.testing.assert_allclose(out["reward_head"], want, rtol=1e-4)
    np.testing.assert_allclose(out["loss"], base["loss"] + 0.5 * want, rtol=1e-4)
    np.testing.assert_allclose(out["td_error"], base["td_error"], atol=1e-6)
    assert "reward_head" not in base
    mirror = NumpyNetwork(aux.online_q)
    acted, _ = mirror.step(batch["obs"][:, 0], mirror.initial_state(4))
    step_one = tf.constant(batch["obs"][:, :1])
    (q_new,), _ = aux.online_q.unroll_segments(step_one, zero, first[:, :1], (), all_heads=True)
    np.testing.assert_allclose(acted, q_new.numpy()[:, 0, 0], atol=1e-5)
    for _ in range(50):
        last = aux.step(batch)["reward_head"]
    assert last < 0.2 * want
    with pytest.raises(ConfigError, match=r"^agent.reward_head"):
        RDQNConfig(reward_head=-1.0).validate()


@pytest.mark.parametrize("rescale", [False, True])
def test_short_discount_head_learns_what_a_q_head_of_that_discount_learns(rescale: bool) -> None:
    """With agent.short_gamma the loss is the Q head's TD loss plus the short head's, and the short
    head's is exactly the TD loss of a one-headed learner whose discount is short_gamma and whose
    Q head holds the short head's weights; the TD errors reported stay the Q head's."""
    cfg = RDQNConfig(batch_size=4, n_step=2, gamma=0.9, lr=0.01, value_rescaling=rescale)
    net = NetworkConfig(units=8, pre_layers=[8], dueling=True, backend="graph")
    both = RDQNLearner(dataclasses.replace(cfg, short_gamma=0.5), net, 3, 3, 1, 3)
    long = RDQNLearner(cfg, net, 3, 3, 1, 3)
    short = RDQNLearner(dataclasses.replace(cfg, gamma=0.5), net, 3, 3, 1, 3)
    assert both.online_q.heads == 2 and both.short_slot == 1 and both.reward_slot is None
    for name in ("online_q", "target_q"):
        mine = {v.path: v for v in getattr(long, name).trainable_variables}
        for v in getattr(short, name).trainable_variables:  # same torso, its own (different) heads
            if "/head/" not in v.path and "/value_head/" not in v.path:
                v.assign(mine[v.path])
        theirs = {v.path: v for v in getattr(short, name).trainable_variables}
        for v in getattr(both, name).trainable_variables:  # the twin slot holds the short head
            source = theirs if "/twin_" in v.path else mine
            v.assign(source[v.path.replace("/twin_", "/")])
    batch = rdqn_batch(long, 4, 3, 3, seed=9)
    out, base, other = both.step(batch), long.step(batch), short.step(batch)
    assert not np.allclose(base["loss"], other["loss"])
    np.testing.assert_allclose(out["short_head"], other["loss"], rtol=1e-4)
    np.testing.assert_allclose(out["loss"], base["loss"] + other["loss"], rtol=1e-4)
    np.testing.assert_allclose(out["td_error"], base["td_error"], atol=1e-6)
    with pytest.raises(ConfigError, match=r"^agent.short_gamma=1.0 is invalid"):
        RDQNConfig(short_gamma=1.0).validate()
    with pytest.raises(ConfigError, match=r"^agent.acting_head=short needs the short-discount head"):
        RDQNConfig(acting_head="short").validate()


def test_td_lambda_learner_at_lambda_0_and_1_matches_the_one_and_n_step_learners() -> None:
    """lambda = 0 trains on one-step targets whatever the window; lambda = 1 gives the last trace step
    the n-step target and earlier steps longer returns."""
    net = NetworkConfig(units=8, pre_layers=[8], backend="graph")
    cfg = RDQNConfig(batch_size=4, n_step=3, gamma=0.9)

    def pair(lam: float, plain_n: int) -> tuple[RDQNLearner, RDQNLearner]:
        lam_learner = RDQNLearner(dataclasses.replace(cfg, td_lambda=lam), net, 3, 2, 1, 3)
        plain = RDQNLearner(dataclasses.replace(cfg, n_step=plain_n), net, 3, 2, 1, 3)
        plain.online_q.set_weights(lam_learner.online_q.get_weights())
        plain.target_q.set_weights(lam_learner.target_q.get_weights())
        return lam_learner, plain

    lam0, one = pair(0.0, 1)
    batch = rdqn_batch(lam0, 4, 3, 2, seed=5)  # L = 1 + 3 + 3 rows
    batch["terminated"][1, 2] = 1.0
    batch["first"][1, 3] = 1.0
    short = {k: v[:, : one.seq_len] if v.ndim > 1 and k != "state" else v for k, v in batch.items()}
    got, want = lam0.step(batch)["td_error"], one.step(short)["td_error"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    lam1, n3 = pair(1.0, 3)
    got, want = lam1.step(batch)["td_error"], n3.step(batch)["td_error"]
    np.testing.assert_allclose(got[:, -1], want[:, -1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[0, 0], want[0, 0])  # step 0 looks 5 steps ahead, not 3


def test_learning_rate_anneals_linearly_then_holds() -> None:
    cfg = RDQNConfig(batch_size=4, n_step=2, lr=1e-3, lr_end=1e-4, lr_decay_updates=4)
    learner = RDQNLearner(cfg, NetworkConfig(units=8, pre_layers=[8], backend="graph"), 3, 2, 1, 3)
    batch = rdqn_batch(learner, 4, 3, 2, seed=3)
    seen = []
    for _ in range(6):
        seen.append(float(learner.optimizer._get_current_learning_rate()))
        learner.step(batch)
    np.testing.assert_allclose(seen, [1e-3, 7.75e-4, 5.5e-4, 3.25e-4, 1e-4, 1e-4], rtol=1e-5)
    with pytest.raises(ConfigError, match=r"agent.lr_end"):
        RDQNConfig(lr_end=0.0).validate()


def test_adam_epsilon_damps_the_steps_of_small_gradients() -> None:
    """Adam's first step moves every weight with a gradient by about lr when epsilon is tiny; a
    large epsilon scales the step by |g| / epsilon instead."""
    net = NetworkConfig(units=8, pre_layers=[8], backend="graph")
    moved, start = {}, None
    for eps in (1e-7, 10.0):
        learner = RDQNLearner(RDQNConfig(batch_size=4, n_step=2, lr=1e-3, adam_epsilon=eps), net, 3, 2, 1, 3)
        if start is None:
            start = learner.online_q.get_weights()
        learner.online_q.set_weights(start)  # both learners start from the same weights
        learner.step(rdqn_batch(learner, 4, 3, 2, seed=5))
        after = learner.online_q.get_weights()
        moved[eps] = max(float(np.abs(a - b).max()) for a, b in zip(after, start, strict=True))
    assert learner.optimizer.epsilon == 10.0
    np.testing.assert_allclose(moved[1e-7], 1e-3, rtol=1e-2)
    assert moved[10.0] < 0.1 * moved[1e-7]
    with pytest.raises(ConfigError, match=r"agent.adam_epsilon"):
        RDQNConfig(adam_epsilon=0.0).validate()


def test_importance_weights_scale_each_sequence_loss() -> None:
    """loss = sum_b w_b sum_t huber(delta_bt) mask_bt / sum mask: each sequence's terms scaled by its
    weight, the normaliser unchanged."""
    cfg = RDQNConfig(batch_size=4, n_step=2)
    net = NetworkConfig(units=8, pre_layers=[8], backend="graph")
    weighted = RDQNLearner(cfg, net, 3, 2, 1, 3, importance_weights=True)
    plain = RDQNLearner(cfg, net, 3, 2, 1, 3)
    plain.online_q.set_weights(weighted.online_q.get_weights())
    plain.target_q.set_weights(weighted.target_q.get_weights())
    batch = rdqn_batch(plain, 4, 3, 2, seed=1)
    batch["reward"] *= 3.0  # some TD errors past the Huber loss's quadratic part
    out = plain.step(batch)
    td, mask = out["td_error"], out["mask"]
    per_step = np.where(np.abs(td) <= 1.0, 0.5 * td**2, np.abs(td) - 0.5)
    assert (np.abs(td) > 1.0).any() and (np.abs(td) < 1.0).any()
    w = np.array([1.0, 0.5, 0.25, 0.0], np.float32)
    want = (w[:, None] * per_step * mask).sum() / mask.sum()
    got = weighted.step({**batch, "weight": w})["loss"]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(out["loss"], (per_step * mask).sum() / mask.sum(), rtol=1e-5)


def test_prioritized_run_checkpoints_and_resumes(tiny_config: Config) -> None:
    from agents.config import load_run_config
    from agents.loop import train

    tiny_config.replay.priority_exponent = 0.9
    first = train(copy.deepcopy(tiny_config))
    with np.load(f"{tiny_config.run_dir}/ckpt/state-400.npz") as state:
        leaves = state["replay/priority/leaves"]
        assert (leaves > 0).sum() > 0 and not np.allclose(leaves[leaves > 0], leaves[leaves > 0][0])
    resumed = train(load_run_config(tiny_config.run_dir, ["train.total_env_steps=600"]))
    assert resumed["updates"] == first["updates"] + 50 and resumed["status"] == "finished"


def test_staleness_is_the_q_gap_between_stored_and_zero_state_at_the_end_of_burn_in() -> None:
    """Measured every ``staleness_every`` updates: by hand from two unrolls of the online network
    (before the update of the same call); zero when the stored states are zero; sequences that
    start an episode are left out."""
    cfg = RDQNConfig(batch_size=4, n_step=2, staleness_every=2)
    learner = RDQNLearner(cfg, NetworkConfig(units=8, pre_layers=[8], backend="graph"), 3, 2, 2, 3)
    batch = rdqn_batch(learner, 4, 3, 2, seed=3)
    assert "charts/staleness_q" not in learner.step(batch)  # call 1 of 2
    batch["state"] = np.random.default_rng(4).normal(size=batch["state"].shape).astype(np.float32)
    batch["first"][1, 0] = 1.0  # this sequence starts an episode: its stored state is not stale
    q = learner.online_q
    stored = tuple(tf.constant(s) for s in np.split(batch["state"], 2, axis=1))
    obs, first = tf.constant(batch["obs"][:, :2]), tf.constant(batch["first"][:, :2])
    q_stored = q.unroll(obs, stored, first)[0].numpy()[:, -1]
    q_zero = q.unroll(obs, q.initial_state(4), first)[0].numpy()[:, -1]
    expected = np.abs(q_stored - q_zero).mean(axis=1)[[0, 2, 3]].mean()
    metrics = learner.step(batch)  # call 2: measured
    assert metrics["charts/staleness_q"] > 0
    np.testing.assert_allclose(metrics["charts/staleness_q"], expected, rtol=1e-5)
    rel = expected / np.abs(q_stored).mean(axis=1)[[0, 2, 3]].mean()
    np.testing.assert_allclose(metrics["charts/staleness_q_rel"], rel, rtol=1e-5)
    learner.step(batch)
    batch["state"][:] = 0.0
    assert learner.step(batch)["charts/staleness_q"] == 0.0
    # A learner restored at update 5 (a resumed run) measures at update 6, as the run it continues.
    restored = RDQNLearner(cfg, NetworkConfig(units=8, pre_layers=[8], backend="graph"), 3, 2, 2, 3)
    restored.updates.assign(5)
    assert "charts/staleness_q" in restored.step(batch)


@pytest.mark.parametrize("dueling", [False, True])
def test_twin_q_bootstraps_from_the_smaller_target_head_at_the_online_greedy_action(dueling: bool) -> None:
    """Clipped double Q: the target's bootstrap value is min over the two target heads of the value
    of head 0's online argmax; the reported TD error is head 0's; both heads and their EMA twins
    move; acting (the numpy mirror) follows head 0."""
    from agents.returns import n_step_targets

    cfg = RDQNConfig(batch_size=4, n_step=2, gamma=0.9, twin_q=True)
    net_cfg = NetworkConfig(units=8, pre_layers=[8], dueling=dueling, backend="graph")
    learner = RDQNLearner(cfg, net_cfg, 3, 2, 1, 3)
    online, target = learner.online_q, learner.target_q
    assert online.heads == 2 and "target_q/twin_head/kernel" in [v.path for v in target.trainable_variables]
    batch = rdqn_batch(learner, 4, 3, 2, seed=6)
    obs, first, zero = tf.constant(batch["obs"]), tf.constant(batch["first"]), online.initial_state(4)
    (q_on,), _ = online.unroll_segments(obs, zero, first, (), all_heads=True)  # [B, L, 2, A]
    q_on = q_on.numpy()
    assert q_on.shape == (4, 6, 2, 2)
    np.testing.assert_allclose(online.unroll(obs, zero, first)[0].numpy(), q_on[:, :, 0], atol=1e-6)
    greedy = q_on[:, 1:, 0].argmax(axis=-1)  # rows after the 1 burn-in step: [B, T + n]
    # Give the target's heads weights that disagree both ways, so the min picks from each head
    # somewhere (drawn until they do: the rest of the network's starting weights vary with test order).
    rng = np.random.default_rng(7)
    for _ in range(50):
        for layer in (target.head, target.twin_head, target.value_head, target.twin_value_head):
            if layer is not None:
                layer.kernel.assign(rng.normal(size=layer.kernel.shape).astype(np.float32))
        (q_tg,), _ = target.unroll_segments(obs, zero, first, (), all_heads=True)
        # [B, T + n, 2]: both target heads' values of the online greedy action
        both = np.take_along_axis(q_tg.numpy()[:, 1:], greedy[:, :, None, None], axis=-1)[..., 0]
        if (both[..., 0] < both[..., 1]).any() and (both[..., 1] < both[..., 0]).any():
            break
    assert (both[..., 0] < both[..., 1]).any() and (both[..., 1] < both[..., 0]).any()
    y = n_step_targets(
        *(batch[k][:, 1:] for k in ("reward", "terminated", "truncated")), both.min(-1), 0.9, 2
    )
    taken = np.take_along_axis(q_on[:, 1:4, 0], batch["action"][:, 1:4, None], axis=-1)[..., 0]
    before = {v.path: v.numpy() for v in (*online.trainable_variables, *target.trainable_variables)}
    metrics = learner.step(batch)
    np.testing.assert_allclose(metrics["td_error"], np.asarray(y) - taken, rtol=1e-5, atol=1e-5)
    for name in ("head", "twin_head"):  # both heads learn; each target head tracks its own online head
        on, tg = getattr(online, name).kernel, getattr(target, name).kernel
        assert not np.allclose(on.numpy(), before[on.path])
        want = before[tg.path] + cfg.tau * (on.numpy() - before[tg.path])
        np.testing.assert_allclose(tg.numpy(), want, rtol=1e-5, atol=1e-6)
    mirror = NumpyNetwork(online)
    out, _ = mirror.step(batch["obs"][:, 0], mirror.initial_state(4))
    (q_new,), _ = online.unroll_segments(obs[:, :1], zero, first[:, :1], (), all_heads=True)
    np.testing.assert_allclose(out, q_new.numpy()[:, 0, 0], atol=1e-5)
