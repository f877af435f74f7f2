"""Recurrent DDPG / TD3: networks, targets, the TD3 target, delayed updates, a smoke run, memory."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from agents.config import Config, EvalConfig, TrainConfig, validate, validate_for_env
from agents.loop import Counters, train
from agents.networks import NetworkConfig, NumpyNetwork
from agents.policies import ActionScaler
from agents.rddpg import RDDPGConfig, RDDPGLearner, build_rddpg
from agents.replay import ReplayConfig
from envs import describe_env
from envs.config import ConfigError, EnvConfig
from envs.make import EnvSpec
from tests.helpers import event_tags

LOW, HIGH = np.array([-2.0, 0.0], np.float32), np.array([2.0, 3.0], np.float32)


def make_learner(**agent) -> RDDPGLearner:
    network = NetworkConfig(cell="lstm", units=16, pre_layers=[16], post_layers=[16], inputs=["prev_action"])
    config = RDDPGConfig(batch_size=4, **agent)
    return RDDPGLearner(
        config, network, observation=3, action_low=LOW, action_high=HIGH, burn_in=2, trace_length=5
    )


def random_batch(learner: RDDPGLearner, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b, length, a = learner.config.batch_size, learner.seq_len, learner.action_dim
    actions = rng.uniform(LOW, HIGH, (b, length, a)).astype(np.float32)
    zeros = np.zeros((b, length), np.float32)
    return {
        "obs": rng.normal(size=(b, length, learner.observation[0].width)).astype(np.float32),
        "action": actions,
        "prev_action": np.roll(actions, 1, axis=1),
        "prev_reward": rng.normal(size=(b, length)).astype(np.float32),
        "state": rng.normal(size=(b, learner.state_dim)).astype(np.float32) * 0.1,
        "reward": rng.normal(size=(b, length)).astype(np.float32),
        "terminated": zeros,
        "truncated": zeros,
        "first": zeros,
        "valid": np.ones((b, length), np.float32),
    }


def weights(model) -> list[np.ndarray]:
    return [np.array(v) for v in model.trainable_variables]


def test_actor_actions_inside_bounds():
    config = Config(
        agent=RDDPGConfig(exploration_noise=5.0),
        env=EnvConfig(id="Pendulum-v1", num_envs=3),
        network=NetworkConfig(
            units=8, pre_layers=[8], post_layers=[8], inputs=["prev_action", "prev_reward"]
        ),
    )
    spec = EnvSpec(3, False, 2, LOW, HIGH)
    counters = Counters(env_steps=10_000)
    learner, policy = build_rddpg(config, spec, counters)
    for layer in learner.online_actor.encoder.pre:  # large weights: saturate the tanh head
        layer.kernel.assign(layer.kernel * 100.0)
    policy.net.sync()
    state = policy.net.initial_state(3)
    for explore, steps in ((True, 10_000), (True, 0), (False, 10_000)):
        counters.env_steps = steps  # 0: random actions before learning_starts
        obs = np.random.default_rng(0).normal(size=(3, 3)) * 50
        action, _ = policy.act(obs, np.zeros((3, 2)), np.zeros(3), state, explore=explore)
        assert action.shape == (3, 2)
        assert (action >= LOW).all() and (action <= HIGH).all()
    scaler = ActionScaler(LOW, HIGH)
    np.testing.assert_allclose(scaler.to_env(np.array([[-1.0, 1.0]])), [[-2.0, 3.0]])
    np.testing.assert_allclose(
        scaler.from_env(scaler.to_env(np.array([[0.3, -0.7]]))), [[0.3, -0.7]], atol=1e-6
    )


@pytest.mark.parametrize("shared_core", [False, True])
def test_critic_shapes_and_targets_start_equal(shared_core):
    learner = make_learner(twin_critics=True, shared_core=shared_core)
    b, t, u = 4, 7, 16
    x = {"obs": tf.random.normal([b, t, 3]), "extras": tf.random.normal([b, t, 2])}
    h, state = learner.online_critic.encode(x, learner.online_critic.initial_state(b), tf.zeros([b, t]))
    assert h.shape == (b, t, u) and [s.shape for s in state] == [(b, u), (b, u)]
    q = learner.online_critic.q(h, tf.zeros([b, t, 2]))
    assert len(q) == 2 and all(qi.shape == (b, t) for qi in q)
    assert learner.online_actor.policy(h).shape == (b, t, 2)
    for online, target in (
        (learner.online_actor, learner.target_actor),
        (learner.online_critic, learner.target_critic),
    ):
        for w_online, w_target in zip(weights(online), weights(target), strict=True):
            np.testing.assert_array_equal(w_online, w_target)


def test_soft_updates_match_closed_form_for_actor_and_critic():
    learner = make_learner(twin_critics=True)
    pairs = [(learner.online_actor, learner.target_actor), (learner.online_critic, learner.target_critic)]
    for online, _ in pairs:
        for v in online.trainable_variables:
            v.assign(v + 1.0)
    before = [(weights(o), weights(t)) for o, t in pairs]
    tau, k = 0.1, 5
    for _ in range(k):
        learner.targets(tau)
    for (_, target), (w_online, w_target0) in zip(pairs, before, strict=True):
        for o, t0, t in zip(w_online, w_target0, weights(target), strict=True):
            np.testing.assert_allclose(t, o + (1 - tau) ** k * (t0 - o), rtol=1e-5, atol=1e-6)
    learner.targets(1.0)
    for online, target in pairs:
        for o, t in zip(weights(online), weights(target), strict=True):
            np.testing.assert_array_equal(o, t)


@pytest.mark.parametrize("shared_core", [False, True])
def test_average_actor_starts_as_a_copy_and_follows_the_online_actor_after_every_update(shared_core):
    learner = make_learner(tau=0.1, target_update_period=3, average_tau=0.25, shared_core=shared_core)
    assert learner.eval_network("average") is learner.average_actor
    assert learner.average_actor in learner.networks()
    before = weights(learner.online_actor)
    for w, b in zip(weights(learner.average_actor), before, strict=True):
        np.testing.assert_array_equal(w, b)
    learner.step(random_batch(learner))
    after = weights(learner.online_actor)
    assert any(not np.allclose(a, b) for a, b in zip(after, before, strict=True))
    for t, b in zip(weights(learner.target_actor), before, strict=True):  # period 3: not yet moved
        np.testing.assert_array_equal(t, b)
    for avg, b, a in zip(weights(learner.average_actor), before, after, strict=True):
        np.testing.assert_allclose(avg, 0.75 * b + 0.25 * a, rtol=1e-5, atol=1e-6)


def test_td3_target_is_min_of_twins_with_clipped_smoothing():
    learner = make_learner(twin_critics=True, target_noise=0.2, noise_clip=0.3, gamma=0.9)
    for v in learner.target_critic.q_heads[1].trainable_variables:  # make the twins disagree
        v.assign(v + 0.5)
    batch = random_batch(learner)
    b, length = batch["reward"].shape
    x = {k: tf.constant(v) for k, v in learner.features(batch).items()}
    state = tuple(tf.constant(s) for s in np.split(batch["state"], 2, axis=1))
    first = tf.zeros([b, length])
    noise = np.random.default_rng(1).normal(size=(b, length, 2)).astype(np.float32) * 2.0  # often > clip
    value = learner.bootstrap_value(x, state, first, tf.constant(noise)).numpy()
    # By hand: the target actor's action, plus noise clipped to +-0.3, clipped to [-1, 1].
    h_actor, _ = learner.target_actor.encode(x, state, first)
    mu = learner.target_actor.policy(h_actor).numpy()
    action = np.clip(mu + np.clip(noise, -0.3, 0.3), -1.0, 1.0)
    h_critic, _ = learner.target_critic.encode(x, learner.target_critic.initial_state(b), first)
    q1, q2 = (q.numpy() for q in learner.target_critic.q(h_critic, tf.constant(action)))
    assert np.abs(q1 - q2).min() > 0  # the min below really picks
    np.testing.assert_allclose(value, np.minimum(q1, q2), rtol=1e-5, atol=1e-5)
    # One-step target at trace step t (n_step=1): y_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}).
    from agents.returns import n_step_targets

    terminated = np.zeros((b, length), np.float32)
    terminated[:, 3] = 1.0
    y = n_step_targets(batch["reward"], terminated, np.zeros_like(terminated), value, 0.9, 1).numpy()
    expected = batch["reward"][:, :-1] + 0.9 * (1 - terminated[:, :-1]) * np.minimum(q1, q2)[:, 1:]
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_actor_updates_every_policy_delay_critic_updates_without_retracing():
    learner = make_learner(twin_critics=True, target_noise=0.2, policy_delay=3)
    actor_before = weights(learner.online_actor)
    for i in range(1, 8):
        critic_before = weights(learner.online_critic)
        metrics = learner.step(random_batch(learner, seed=i))
        actor_after = weights(learner.online_actor)
        changed = any(not np.array_equal(a, b) for a, b in zip(actor_before, actor_after, strict=True))
        assert changed == (i % 3 == 0), f"update {i}"
        critic_after = weights(learner.online_critic)
        assert any(not np.array_equal(a, b) for a, b in zip(critic_before, critic_after, strict=True))
        actor_before = actor_after
    assert int(learner.critic_optimizer.iterations) == 7 and int(learner.actor_optimizer.iterations) == 2
    assert learner._step.experimental_get_tracing_count() == 1
    assert metrics["critic1_td_error"].shape == metrics["critic2_td_error"].shape == (4, 5)
    assert np.isfinite(metrics["critic_loss"]) and metrics["histogram/policy_action"].shape == (20, 2)


def tiny_config(tmp_path, **train) -> Config:
    return Config(
        agent=RDDPGConfig(batch_size=8, twin_critics=True, target_noise=0.2, policy_delay=2),
        env=EnvConfig(name="pendulum_p", id="Pendulum-v1", mask_obs=[2], num_envs=2, max_episode_steps=50),
        network=NetworkConfig(
            units=16, pre_layers=[16], post_layers=[16], inputs=["prev_action", "prev_reward"]
        ),
        replay=ReplayConfig(capacity=2000, burn_in=2, trace_length=6),
        train=TrainConfig(
            **{
                "total_env_steps": 300,
                "learning_starts": 100,
                "log_every_updates": 10,
                "checkpoint_every_env_steps": 150,
                "progress_bar": False,
                **train,
            }
        ),
        eval=EvalConfig(every_env_steps=150, episodes=2),
        run_dir=str(tmp_path / "run"),
    )


def test_smoke_run_writes_metrics_checkpoint_and_resumes(tmp_path):
    config = tiny_config(tmp_path)
    summary = train(config)
    run_dir = tmp_path / "run"
    assert summary["env_steps"] == 300 and summary["updates"] > 0
    tags = event_tags(run_dir)
    for tag in (
        "td_critic1/abs_mean",
        "td_critic1/histogram",
        "td_critic2/abs_max",
        "td_critic1/by_position/t00-00",
        "losses/actor_loss",
        "losses/critic_loss",
        "losses/q_mean",
        "charts/policy_action",
        "charts/exploration_noise",
        "eval/return_mean",
    ):
        assert tag in tags, tag
    rows = list(csv.DictReader(open(run_dir / "progress.csv")))
    assert [int(r["env_steps"]) for r in rows] == [150, 300]
    assert json.loads((run_dir / "summary.json").read_text())["agent"] == "rddpg"
    assert list((run_dir / "ckpt").glob("complete-300.json"))
    resumed = tiny_config(tmp_path, total_env_steps=400)
    resumed.resume = str(run_dir)
    summary = train(resumed)
    assert summary["env_steps"] == 400 and summary["updates"] > 0


def test_evaluation_with_the_target_actor(tmp_path, monkeypatch):
    asked = []
    eval_network = RDDPGLearner.eval_network
    monkeypatch.setattr(
        RDDPGLearner, "eval_network", lambda self, which: asked.append(which) or eval_network(self, which)
    )
    config = tiny_config(tmp_path, total_env_steps=300)
    config.eval.network = "target"
    validate(config)
    summary = train(config)
    assert [e["env_steps"] for e in summary["evaluations"]] == [150, 300]
    assert all(np.isfinite(e["eval_return_mean"]) for e in summary["evaluations"])
    assert asked == ["target", "target"]


def test_target_eval_network_is_the_ema_actor_in_the_numpy_mirror():
    learner = make_learner(tau=0.5)
    learner.step(random_batch(learner))
    features = learner.features(random_batch(learner, seed=1))
    x = {k: v[:, 0] for k, v in features.items()}  # [B, ...], one step from zero state
    b = x["obs"].shape[0]
    for which, actor in (("online", learner.online_actor), ("target", learner.target_actor)):
        assert learner.eval_network(which) is actor
        mirror = NumpyNetwork(learner.eval_network(which))
        u, _ = mirror.step(x, mirror.initial_state(b))
        step = {k: tf.constant(v[:, None]) for k, v in x.items()}
        h, _ = actor.encode(step, actor.initial_state(b), tf.zeros([b, 1]))
        np.testing.assert_allclose(u, actor.policy(h).numpy()[:, 0], rtol=1e-4, atol=1e-5)
    online, target = (NumpyNetwork(learner.eval_network(w)) for w in ("online", "target"))
    assert not np.allclose(
        online.step(x, online.initial_state(b))[0], target.step(x, target.initial_state(b))[0]
    )


def memory_config(tmp_path, cell: str) -> Config:
    return Config(
        agent=RDDPGConfig(batch_size=32, n_step=1, gamma=0.5, tau=0.05, lr=3e-3, exploration_noise=0.3),
        env=EnvConfig(name="cue", id="recurrl/CueMemoryContinuous-v0", kwargs={"delay": 3}, num_envs=8),
        network=NetworkConfig(cell=cell, units=16, pre_layers=[16], post_layers=[16]),
        replay=ReplayConfig(capacity=20_000, burn_in=3, trace_length=4),
        train=TrainConfig(
            total_env_steps=2400,
            learning_starts=400,
            updates_per_step=0.25,
            log_every_updates=1000,
            checkpoint_every_env_steps=10_000,
            progress_bar=False,
        ),
        eval=EvalConfig(every_env_steps=1200, episodes=50),
        run_dir=str(tmp_path / cell),
    )


@pytest.mark.slow
def test_lstm_learns_continuous_cue_memory_where_mlp_cannot(tmp_path):
    # Reward 1 - |a - cue| at the query step: any memoryless policy averages <= 0 over random cues.
    lstm = train(memory_config(tmp_path, "lstm"))["final_eval_return_mean"]
    mlp = train(memory_config(tmp_path, "mlp"))["final_eval_return_mean"]
    assert lstm > 0.7, lstm
    assert mlp < 0.4, mlp


def test_td_lambda_critic_targets_at_lambda_0_and_1_match_the_one_and_n_step_ones():
    """lambda = 0 gives every trace step the one-step target whatever the window; lambda = 1 gives
    the last trace step the n-step target and earlier ones longer returns (TD3 twins on)."""

    def pair(lam: float, plain_n: int) -> tuple[RDDPGLearner, RDDPGLearner]:
        lam_learner = make_learner(n_step=3, gamma=0.9, td_lambda=lam, twin_critics=True)
        plain = make_learner(n_step=plain_n, gamma=0.9, twin_critics=True)
        for name in ("online_actor", "online_critic", "target_actor", "target_critic"):
            getattr(plain, name).set_weights(getattr(lam_learner, name).get_weights())
        return lam_learner, plain

    lam0, one = pair(0.0, 1)
    batch = random_batch(lam0, seed=4)  # L = 2 + 5 + 3 rows
    batch["terminated"][1, 4] = 1.0
    batch["first"][1, 5] = 1.0
    short = {k: v[:, : one.seq_len] if k != "state" else v for k, v in batch.items()}
    got, want = lam0.step(batch), one.step(short)
    for key in ("critic1_td_error", "critic2_td_error"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)
    lam1, n3 = pair(1.0, 3)
    got, want = lam1.step(batch)["critic1_td_error"], n3.step(batch)["critic1_td_error"]
    np.testing.assert_allclose(got[:, -1], want[:, -1], rtol=1e-5, atol=1e-5)
    assert not np.allclose(got[0, 0], want[0, 0])  # step 0 looks 7 steps ahead, not 3


@pytest.mark.parametrize(
    "agent, network, message",
    [
        ({"policy_delay": 0}, {}, "agent.policy_delay=0 is invalid"),
        ({"exploration_noise": -0.1}, {}, "agent.exploration_noise=-0.1 is invalid"),
        ({"target_noise": -1.0}, {}, "agent.target_noise=-1.0 is invalid"),
        ({"noise_clip": -0.5}, {}, "agent.noise_clip=-0.5 is invalid"),
        ({"exploration": "uniform"}, {}, "agent.exploration='uniform' is invalid"),
        ({}, {"post_layers": []}, "network.post_layers=[] is invalid"),
        ({}, {"inputs": ["prev_obs"]}, "network.inputs=['prev_obs'] is invalid"),
    ],
)
def test_bad_agent_values_fail_in_one_line(agent, network, message):
    config = Config(agent=RDDPGConfig(**agent), network=NetworkConfig(**{"post_layers": [8], **network}))
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
        validate(config)
    assert "\n" not in str(err.value)


def test_unbounded_actions_need_action_scale():
    config = Config(agent=RDDPGConfig(), env=EnvConfig(id="Pendulum-v1"))
    validate_for_env(config, describe_env(config.env))
    inf = np.array([np.inf], np.float32)
    with pytest.raises(ConfigError, match="set env.action_scale"):
        validate_for_env(config, EnvSpec(3, False, 1, -inf, inf))
    config.env.action_scale = 0.0
    with pytest.raises(ConfigError, match="env.action_scale=0.0 is invalid"):
        validate_for_env(config, EnvSpec(3, False, 1, -inf, inf))


def test_cli_rtd3_on_discrete_env_is_one_line_error(tmp_path):
    cmd = [sys.executable, "-m", "scripts.train", "agent=rtd3", "env=cartpole_p", f"hydra.run.dir={tmp_path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "use agent=rdqn" in errors[0], proc.stderr[-2000:]


def test_rddpg_presets_compose_and_reject_typos():
    from hydra import compose, initialize
    from omegaconf import OmegaConf

    import scripts.train  # noqa: F401  (registers the structured schemas)

    with initialize(version_base="1.3", config_path="../conf"):
        default = OmegaConf.to_object(compose("config"))
        rtd3 = OmegaConf.to_object(compose("config", overrides=["agent=rtd3", "env=pendulum_p"]))
        rddpg = OmegaConf.to_object(compose("config", overrides=["agent=rddpg", "env=pendulum"]))
        with pytest.raises(Exception, match="learnin_rate"):
            compose("config", overrides=["agent=rtd3", "agent.learnin_rate=1"])
    assert default.agent.kind == "rdqn" and default.env.name == "cartpole_p"
    assert isinstance(rtd3.agent, RDDPGConfig) and isinstance(rddpg.agent, RDDPGConfig)
    assert (rddpg.agent.twin_critics, rddpg.agent.target_noise, rddpg.agent.policy_delay) == (False, 0.0, 1)
    assert (rtd3.agent.twin_critics, rtd3.agent.target_noise > 0, rtd3.agent.policy_delay) == (True, True, 2)
    assert (default.agent.name, rddpg.agent.name, rtd3.agent.name) == ("rdqn", "rddpg", "rtd3")
    assert rtd3.env.id == "Pendulum-v1" and rtd3.env.mask_obs == [2] and rddpg.env.mask_obs == []
    # Every agent preset turns LayerNorm on in its dense layers; the schema default stays off.
    assert default.network.layer_norm and rtd3.network.layer_norm and rddpg.network.layer_norm
    assert NetworkConfig().layer_norm is False
    # Each agent preset sets its own replay ratio and budget; an agent switch drops the other's.
    assert (default.train.updates_per_step, default.train.total_env_steps) == (0.25, 50_000)
    assert rtd3.train.updates_per_step == rddpg.train.updates_per_step == 1.0
    assert rtd3.train.total_env_steps == rddpg.train.total_env_steps == 15_000
    for config in (rtd3, rddpg):
        validate(config)
        validate_for_env(config, describe_env(config.env))


def test_numpy_policy_matches_the_tf_actor_step_by_step():
    learner = make_learner()
    for net in learner.networks():  # non-trivial observation statistics
        mean, std = net.encoder.stats["obs"]
        mean.assign([0.5, -0.2, 0.1])
        std.assign([2.0, 0.5, 1.5])
    batch = random_batch(learner)
    x = learner.features(batch)  # leaves and extras, [B, L, ...]
    state = tuple(np.split(batch["state"], 2, axis=1))
    length = x["obs"].shape[1]
    h, _ = learner.online_actor.encode(
        {k: tf.constant(v) for k, v in x.items()}, tuple(map(tf.constant, state)), tf.zeros([4, length])
    )
    expected = learner.online_actor.policy(h).numpy()
    _, policy = build_rddpg(
        Config(agent=learner.config, network=learner.online_actor.config),
        EnvSpec(3, False, 2, LOW, HIGH),
        Counters(),
    )
    policy.net.network = learner.online_actor
    policy.net.sync()
    for t in range(length):
        u, state = policy.net.step({k: v[:, t] for k, v in x.items()}, state)
        np.testing.assert_allclose(u, expected[:, t], rtol=1e-4, atol=1e-5)


def test_ou_noise_restarts_at_episode_starts_and_is_checkpointed():
    from agents.actor import Actor
    from agents.policies import OUNoise
    from envs import make_vec_env

    noise = OUNoise(0.3, 0.15, np.random.default_rng(0))
    for _ in range(5):
        noise((3, 2))
    saved = noise.state_dict()
    noise.reset(np.array([True, False, True]))
    assert (noise.x[[0, 2]] == 0).all() and (noise.x[1] != 0).all()
    noise.load_state_dict(saved)
    np.testing.assert_array_equal(noise.x, saved["ou_x"])

    # The Actor tells the policy which envs start an episode (exploring steps only).
    env_config = EnvConfig(name="cue", id="recurrl/CueMemoryContinuous-v0", kwargs={"delay": 1}, num_envs=2)
    config = Config(
        agent=RDDPGConfig(exploration="ou"),
        env=env_config,
        network=NetworkConfig(units=4, pre_layers=[], post_layers=[4]),
    )
    counters = Counters(env_steps=10**6)  # past learning_starts: noise, not uniform actions
    _, policy = build_rddpg(config, describe_env(env_config), counters)
    starts = []
    original = policy.episode_start
    policy.episode_start = lambda envs: (starts.append(envs.copy()), original(envs))
    actor = Actor(make_vec_env(env_config, seed=0), policy, seed=0)
    for _ in range(6):
        actor.step(explore=True)
    actor.step(explore=False)
    # Episodes here: 2 steps + the final-observation row, so starts at steps 0 and 3 (and 6: greedy).
    assert len(starts) == 2 and all(s.all() for s in starts)
    # The policy's own noise restarts where an episode starts, and its state is what it saves.
    policy.noise.x = np.full((2, 1), 0.5, np.float32)
    original(np.array([True, False]))
    np.testing.assert_array_equal(policy.noise.x, [[0.0], [0.5]])
    _, fresh = build_rddpg(config, describe_env(env_config), counters)
    fresh.load_state_dict(policy.state_dict())
    np.testing.assert_array_equal(fresh.noise.x, [[0.0], [0.5]])
