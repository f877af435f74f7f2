"""Recurrent DDPG with TD3 options (``agent=rddpg``, preset ``agent=rtd3``).

Heess et al.'s recurrent DDPG with Fujimoto et al.'s three TD3 fixes, on the same sequence replay,
burn-in, stored state and n-step returns as :mod:`agents.rdqn`. One compiled step per batch::

    a'_j = clip(mu'(h_j) + clip(N(0, target_noise^2), -noise_clip, noise_clip), -1, 1)
    V(s_j) = min_i Q'_i(h_j, a'_j)                       # min over twin critics (one if not twin)
    y_t = n-step return + gamma^n V(s_{t+n})             # agents.returns.n_step_targets
        (or Peng's lambda-return with agent.td_lambda)   # agents.returns.lambda_targets
    critic loss = sum_i mean_valid (y_t - Q_i(h_t, a_t))^2
    actor loss  = mean_valid -Q_1(h_t, mu(h_t)) + c pre_t^2    # every policy_delay updates
    targets <- targets + tau * (online - targets)        # every target_update_period updates

Actions are in ``[-1, 1]`` inside the learner (replay keeps env units; see agents.policies).
The critic never acts, so no critic state is recorded: a separate critic core starts every sampled
sequence from zeros and is warmed by the burn-in; the actor (and a shared core) starts from the
stored state, or zeros with ``replay.initial_state=zero``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import tensorflow as tf

from agents.actor_critic import ActorCriticNetwork, actor_and_critic, trained_by_each_loss
from agents.agent import StepCounter, register, validate_common
from agents.compiled import CompiledStep
from agents.networks import NetworkConfig, NumpyNetwork, input_spec, obs_fields, split_state, time_slice
from agents.optim import FusedAdam
from agents.policies import (
    ActionScaler,
    DeterministicPolicy,
    GaussianNoise,
    OUNoise,
    extras_width,
    network_inputs,
)
from agents.returns import masked_mean, td_targets
from agents.target import TargetUpdater
from envs.config import ConfigError, EnvConfig, check, finite
from envs.spaces import Observation, vector_observation

if TYPE_CHECKING:
    from agents.config import Config
    from envs.make import EnvSpec


@dataclass
class RDDPGConfig:
    """Recurrent DDPG / TD3 hyperparameters (``agent=rddpg``; ``agent=rtd3`` turns TD3 on)."""

    # Agent family; selects the learner.
    kind: str = "rddpg"
    # Preset label (conf/agent/<name>.yaml): names run directories and summaries.
    name: str = "rddpg"
    # Discount factor, in [0, 1].
    gamma: float = 0.99
    # Steps of lookahead in the TD target (>= 1). With td_lambda set, the lookahead of the last
    # trace step (the window holds n_step rows past the trace; earlier steps see further).
    n_step: int = 2
    # Peng's Q(lambda) targets in [0, 1] instead of n-step ones: each trace step's target mixes its
    # 1-, 2-, ... step returns with weights (1 - lambda) lambda^(n-1), up to the window's end
    # (agents.returns.lambda_targets). null = n-step targets.
    td_lambda: float | None = None
    # Adam learning rate of actor and critic, unless actor_lr / critic_lr set their own.
    lr: float = 1e-3
    # Actor learning rate (null: agent.lr).
    actor_lr: float | None = None
    # Critic learning rate (null: agent.lr).
    critic_lr: float | None = None
    # Sequences per update.
    batch_size: int = 64
    # EMA rate of every target network, in (0, 1]; 1 with a period gives hard copies.
    tau: float = 0.01
    # Optimiser steps between target updates.
    target_update_period: int = 1
    # EMA rate of a third copy of the actor, the average, in (0, 1] (null: none kept). It follows
    # the online actor after every update, like the target but at its own (slower) rate, and only
    # evaluation and export act with it (eval.network=average).
    average_tau: float | None = None
    # Global gradient-norm clip, applied to actor and critic gradients separately.
    max_grad_norm: float = 10.0
    # Exploration noise added to the actor's action: gaussian | ou (Ornstein-Uhlenbeck).
    exploration: str = "gaussian"
    # Noise std in units of the action half-range (0.1 on [-2, 2] is a std of 0.2).
    exploration_noise: float = 0.1
    # OU only: mean reversion per step, in (0, 1].
    ou_theta: float = 0.15
    # TD3: two critic heads (on the critic's core), bootstrap from the smaller target value.
    twin_critics: bool = False
    # TD3 target policy smoothing: std of noise on the target action (half-range units; 0 = off).
    target_noise: float = 0.0
    # TD3: the smoothing noise is clipped to [-noise_clip, noise_clip].
    noise_clip: float = 0.5
    # TD3: one actor update every policy_delay critic updates (targets follow target_update_period).
    policy_delay: int = 1
    # One recurrent core for actor and critic (trained by the critic loss only) instead of two.
    shared_core: bool = False
    # Weight of mean(pre_tanh^2) in the actor loss. Tiny inside tanh's linear range; keeps an
    # early critic's one-signed dQ/da from pinning the head at +-1, where its gradient vanishes.
    preactivation_penalty: float = 1e-3

    def validate(self) -> None:
        """Range checks of these fields; raises :class:`ConfigError` naming the first bad key."""
        validate_common(self)
        for key in ("actor_lr", "critic_lr"):
            val = getattr(self, key)
            check(val is None or (finite(val) and val > 0), f"agent.{key}", val, "> 0 or null (agent.lr)")
        check(self.exploration in ("gaussian", "ou"), "agent.exploration", self.exploration, "gaussian|ou")
        for key in ("exploration_noise", "target_noise", "noise_clip", "preactivation_penalty"):
            val = getattr(self, key)
            check(finite(val) and val >= 0, f"agent.{key}", val, ">= 0")
        check(finite(self.ou_theta) and 0 < self.ou_theta <= 1, "agent.ou_theta", self.ou_theta, "(0, 1]")
        check(self.policy_delay >= 1, "agent.policy_delay", self.policy_delay, "integers >= 1")

    def validate_network(self, network: NetworkConfig) -> None:
        """The critic joins the action after the core, in the post layers: it needs at least one."""
        layers = list(network.post_layers)
        allowed = "at least one layer for agent=rddpg/rtd3 (the critic joins the action there)"
        check(len(layers) >= 1, "network.post_layers", layers, allowed)
        check(
            not network.dueling,
            "network.dueling",
            network.dueling,
            "false for agent=rddpg/rtd3 (Q-networks only)",
        )

    def validate_for_env(self, env: EnvConfig, spec: EnvSpec) -> None:
        """A continuous action box with finite bounds (or ``env.action_scale``)."""
        if spec.discrete:
            raise ConfigError(
                f"agent=rddpg/rtd3 needs a continuous (Box) action space but env.id={env.id!r} "
                "is discrete; use agent=rdqn"
            )
        scale = env.action_scale
        check(scale is None or (finite(scale) and scale > 0), "env.action_scale", scale, "> 0 or null")
        low, high = spec.action_low, spec.action_high
        if not (np.isfinite(low).all() and np.isfinite(high).all() and (high > low).all()):
            raise ConfigError(
                f"env.id={env.id!r} has action bounds low={low.tolist()} high={high.tolist()}; "
                "set env.action_scale=<half-range> (actions then lie in [-scale, scale])"
            )


def _batch_spec(inputs: dict[str, tf.TensorSpec], b: int, length: int, a: int, state_dim: int) -> dict:
    """The compiled step's input: network ``inputs`` (leaves, extras), actions ``[B, L, A]`` in [-1, 1]."""
    return {
        **inputs,
        "action": tf.TensorSpec([b, length, a], tf.float32),
        "state": tf.TensorSpec([b, state_dim], tf.float32),
        **{
            k: tf.TensorSpec([b, length], tf.float32)
            for k in ("reward", "terminated", "truncated", "first", "valid")
        },
    }


class RDDPGLearner:
    """Owns online/target actor and critic(s) and both optimisers; :meth:`step` is one update.

    A batch holds ``[B, L]`` rows, ``L = burn_in + trace_length + n_step`` (as for rdqn): burn-in rows
    only warm the state, trace rows carry the losses, the last ``n_step`` rows only bootstrap.
    """

    def __init__(
        self,
        config: RDDPGConfig,
        network: NetworkConfig,
        observation: Observation | int,
        action_low: np.ndarray,
        action_high: np.ndarray,
        burn_in: int,
        trace_length: int,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.inputs = list(network.inputs)
        self.burn_in, self.trace_length = int(burn_in), int(trace_length)
        self.seq_len = self.burn_in + self.trace_length + config.n_step
        if isinstance(observation, int | np.integer):
            observation = vector_observation(int(observation))
        self.observation, self.action_dim = tuple(observation), len(action_low)
        self.scaler = ActionScaler(action_low, action_high)
        a = self.action_dim
        self.extras_dim = extras_width(a, self.inputs)
        critics = 2 if config.twin_critics else 1
        self.online_actor, self.online_critic = actor_and_critic(
            network, self.observation, self.extras_dim, a, critics, config.shared_core, "online"
        )
        self.target_actor, self.target_critic = actor_and_critic(
            network, self.observation, self.extras_dim, a, critics, config.shared_core, "target"
        )
        pairs = {(self.online_actor, self.target_actor), (self.online_critic, self.target_critic)}
        self.targets = TargetUpdater(sorted(pairs, key=lambda p: p[0].name))
        self.targets.copy()  # the first TD targets come from the same functions as the online nets
        self.average_actor: ActorCriticNetwork | None = None
        self.averager: TargetUpdater | None = None
        if config.average_tau is not None:  # built last: the other networks' seeded weights stay
            self.average_actor, _ = actor_and_critic(
                network, self.observation, self.extras_dim, a, critics, config.shared_core, "average"
            )
            self.averager = TargetUpdater([(self.online_actor, self.average_actor)])
            self.averager.copy()
        self.actor_variables, self.critic_variables = trained_by_each_loss(
            self.online_actor, self.online_critic
        )
        self.actor_optimizer = FusedAdam(learning_rate=config.actor_lr or config.lr)
        self.critic_optimizer = FusedAdam(learning_rate=config.critic_lr or config.lr)
        self.actor_optimizer.build(self.actor_variables)
        self.critic_optimizer.build(self.critic_variables)
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.noise_rng = tf.random.Generator.from_seed(seed)
        self._actor_grad_norm = tf.Variable(0.0, trainable=False)
        self.state_dim = sum(self.online_actor.state_sizes)
        inputs = input_spec(self.observation, self.extras_dim, config.batch_size, self.seq_len)
        self.input_keys = tuple(inputs)
        spec = _batch_spec(inputs, config.batch_size, self.seq_len, a, self.state_dim)
        self._step = tf.function(self._train_step, input_signature=[spec])
        self._run_step = CompiledStep(self._step)

    def replay_fields(self) -> dict[str, tuple[tuple[int, ...], type]]:
        """Per-row fields this learner needs from replay besides the common ones."""
        fields = {**obs_fields(self.observation), "action": ((self.action_dim,), np.float32)}
        if self.inputs:  # the Actor writes prev_action and prev_reward together
            fields["prev_action"] = ((self.action_dim,), np.float32)
            fields["prev_reward"] = ((), np.float32)
        return fields

    def trackables(self) -> dict[str, object]:
        """Objects a checkpoint must hold to resume this learner exactly."""
        models = (self.online_actor, self.target_actor, self.online_critic, self.target_critic)
        nets = {m.name: m for m in models + ((self.average_actor,) if self.average_actor is not None else ())}
        return {
            **nets,
            "actor_optimizer": self.actor_optimizer,
            "critic_optimizer": self.critic_optimizer,
            "updates": self.updates,
            "target_noise_rng": self.noise_rng,
        }

    def networks(self) -> list[ActorCriticNetwork]:
        """Every network whose input normalisation follows the observation statistics."""
        return list(
            {id(m): m for m in self.trackables().values() if isinstance(m, ActorCriticNetwork)}.values()
        )

    def eval_network(self, which: str) -> ActorCriticNetwork:
        """The actor a greedy evaluation acts with: ``online``, ``target`` (the EMA actor) or
        ``average`` (the slower EMA that ``agent.average_tau`` keeps)."""
        nets = {"online": self.online_actor, "target": self.target_actor}
        if self.average_actor is not None:
            nets["average"] = self.average_actor
        if which not in nets:
            raise ValueError(f"eval network {which!r} is unknown: allowed {'|'.join(nets)}")
        return nets[which]

    def sync_policy(self, policy: DeterministicPolicy) -> None:
        """Refresh the acting policy's numpy mirror from the online actor."""
        policy.net.sync()

    def schedule_scalars(self, env_steps: int) -> dict[str, float]:
        """Exploration noise scale (std in half-range units) to log."""
        return {"charts/exploration_noise": self.config.exploration_noise}

    def features(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Network inputs from replay rows: the observation leaves ``[B, L, ...]`` and, with
        ``network.inputs``, ``extras`` ``[B, L, X]``."""
        obs = {leaf.name: batch[leaf.name] for leaf in self.observation}
        return network_inputs(
            obs, batch.get("prev_action"), batch.get("prev_reward"), self.inputs, self.scaler
        )

    def step(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One critic step (and actor step every ``policy_delay``), then the target update.

        Metrics: ``critic_loss``, ``actor_loss``, ``q_mean``, grad norms; ``critic<i>_td_error``
        and ``critic<i>_mask`` ``[B, T]`` per critic; ``histogram/policy_action`` (valid steps).
        """
        feed = {k: batch[k] for k in ("state", "reward", "terminated", "truncated", "first", "valid")}
        feed.update(self.features(batch))
        feed["action"] = self.scaler.from_env(batch["action"])
        return self._run_step(feed)

    def bootstrap_value(self, x: tf.Tensor, state: tuple, first: tf.Tensor, noise: tf.Tensor) -> tf.Tensor:
        """``V(s_j) = min_i Q'_i(h_j, clip(mu'(h_j) + clip(noise)))`` from the targets: ``[B, L]``.

        ``noise`` ``[B, L, A]`` is the (unclipped) target-policy smoothing noise.
        """
        cfg = self.config
        h, _ = self.target_actor.encode(x, state, first)
        smoothing = tf.clip_by_value(noise, -cfg.noise_clip, cfg.noise_clip)
        action = tf.clip_by_value(self.target_actor.policy(h) + smoothing, -1.0, 1.0)
        if not cfg.shared_core:
            h, _ = self.target_critic.encode(x, self.target_critic.initial_state(tf.shape(first)[0]), first)
        q = self.target_critic.q(h, action)
        return tf.stop_gradient(tf.reduce_min(tf.stack(q), axis=0))

    def _train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        cfg, bi, tl = self.config, self.burn_in, self.trace_length
        x, first, action = {k: batch[k] for k in self.input_keys}, batch["first"], batch["action"]
        actor_state = split_state(batch["state"], self.online_actor.state_sizes)
        noise = cfg.target_noise * self.noise_rng.normal(tf.shape(action))
        value = self.bootstrap_value(x, actor_state, first, noise)  # [B, L]
        outcome = (batch["reward"][:, bi:], batch["terminated"][:, bi:], batch["truncated"][:, bi:])
        target = td_targets(*outcome, value[:, bi:], cfg.gamma, cfg.n_step, cfg.td_lambda, tl)  # [B, T]
        critic_state = actor_state if cfg.shared_core else self.online_critic.initial_state(cfg.batch_size)
        if bi > 0:  # R2D2 burn-in: warm the online states, no gradient
            _, critic_state = self.online_critic.encode(time_slice(x, 0, bi), critic_state, first[:, :bi])
            critic_state = tf.nest.map_structure(tf.stop_gradient, critic_state)
            if not cfg.shared_core:
                _, actor_state = self.online_actor.encode(time_slice(x, 0, bi), actor_state, first[:, :bi])
                actor_state = tf.nest.map_structure(tf.stop_gradient, actor_state)
        trace_x, trace_first = time_slice(x, bi, bi + tl), first[:, bi : bi + tl]
        mask = batch["valid"][:, bi : bi + tl]
        with tf.GradientTape(persistent=True) as tape:
            h_critic, _ = self.online_critic.encode(trace_x, critic_state, trace_first)  # [B, T, U]
            q_taken = self.online_critic.q(h_critic, action[:, bi : bi + tl])  # list of [B, T]
            td_errors = [target - q for q in q_taken]
            critic_loss = tf.add_n([masked_mean(tf.square(d), mask) for d in td_errors])
            if cfg.shared_core:
                h_actor = tf.stop_gradient(h_critic)
            else:
                h_actor, _ = self.online_actor.encode(trace_x, actor_state, trace_first)
            preactivation = self.online_actor.policy_preactivation(h_actor)  # [B, T, A]
            policy_action = tf.tanh(preactivation)
            q_policy = self.online_critic.q(tf.stop_gradient(h_critic), policy_action, index=0)[0]
            penalty = tf.reduce_mean(tf.square(preactivation), axis=-1)
            actor_loss = masked_mean(cfg.preactivation_penalty * penalty - q_policy, mask)
        grads = tape.gradient(critic_loss, self.critic_variables)
        grads, critic_grad_norm = tf.clip_by_global_norm(grads, cfg.max_grad_norm)
        self.critic_optimizer.apply(grads, self.critic_variables)
        self.updates.assign_add(1)
        # The actor gradient is taken outside the tf.cond (the fused RNN gradient needs static
        # shapes, which a cond branch hides); only applying it is delayed.
        grads = tape.gradient(actor_loss, self.actor_variables)
        grads, actor_grad_norm = tf.clip_by_global_norm(grads, cfg.max_grad_norm)
        if self.updates % cfg.policy_delay == 0:  # TD3 delayed policy update (a tf.cond)
            self.actor_optimizer.apply(grads, self.actor_variables)
            self._actor_grad_norm.assign(actor_grad_norm)
        if self.updates % cfg.target_update_period == 0:
            self.targets.update_in_graph(tf.constant(cfg.tau, tf.float32))
        if self.averager is not None:  # every update, whatever the target period
            self.averager.update_in_graph(tf.constant(cfg.average_tau, tf.float32))
        metrics = {
            "critic_loss": critic_loss,
            "actor_loss": actor_loss,
            "q_mean": masked_mean(q_taken[0], mask),
            "critic_grad_norm": critic_grad_norm,
            "actor_grad_norm": tf.identity(self._actor_grad_norm),
            "histogram/policy_action": tf.boolean_mask(policy_action, mask > 0),
        }
        for i, d in enumerate(td_errors):
            metrics[f"critic{i + 1}_td_error"] = d * mask
            metrics[f"critic{i + 1}_mask"] = mask
        return metrics


def build_rddpg(
    config: Config, spec: EnvSpec, counters: StepCounter
) -> tuple[RDDPGLearner, DeterministicPolicy]:
    """The learner and its noisy deterministic policy (uniform actions until ``learning_starts``)."""
    a, r = config.agent, config.replay
    learner = RDDPGLearner(
        a,
        config.network,
        spec.observation,
        spec.action_low,
        spec.action_high,
        r.burn_in,
        r.trace_length,
        seed=config.seed + 31,
    )
    rng = np.random.default_rng(config.seed + 17)
    if a.exploration == "ou":
        noise = OUNoise(a.exploration_noise, a.ou_theta, rng)
    else:
        noise = GaussianNoise(a.exploration_noise, rng)
    learning_starts = config.train.learning_starts
    policy = DeterministicPolicy(
        NumpyNetwork(learner.online_actor),
        learner.scaler,
        config.network.inputs,
        noise,
        random_actions=lambda: counters.env_steps < learning_starts,
        rng=rng,
    )
    return learner, policy


register("rddpg", RDDPGConfig, build_rddpg)
