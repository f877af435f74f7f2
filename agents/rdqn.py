"""Recurrent DQN learner (R2D2 family): burn-in, stored state, double Q, n-step, soft targets."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import keras
import numpy as np
import tensorflow as tf

from agents.agent import StepCounter, register, validate_common
from agents.compiled import CompiledStep
from agents.networks import (
    NetworkConfig,
    NumpyNetwork,
    RecurrentNetwork,
    input_spec,
    obs_fields,
    split_state,
    time_slice,
)
from agents.optim import FusedAdam
from agents.policies import EpsilonGreedy, HeadBandit, extra_features, extras_width
from agents.returns import huber, masked_mean, rescale, td_targets, unrescale
from agents.target import TargetUpdater
from envs.config import ConfigError, EnvConfig, check, finite
from envs.spaces import Observation, vector_observation

if TYPE_CHECKING:
    from agents.config import Config
    from envs.make import EnvSpec

log = logging.getLogger("recurrl")


@dataclass
class RDQNConfig:
    """Recurrent DQN hyperparameters (``agent=rdqn``)."""

    # Prioritized sequence replay (replay.priority_exponent > 0) is supported.
    supports_priorities: ClassVar[bool] = True

    # Agent family; selects the learner.
    kind: str = "rdqn"
    # Preset label (conf/agent/<name>.yaml): names run directories and summaries.
    name: str = "rdqn"
    # Discount factor, in [0, 1].
    gamma: float = 0.98
    # Steps of lookahead in the TD target (>= 1). With td_lambda set, the lookahead of the last
    # trace step (the window holds n_step rows past the trace; earlier steps see further).
    n_step: int = 3
    # Peng's Q(lambda) targets in [0, 1] instead of n-step ones: each trace step's target mixes its
    # 1-, 2-, ... step returns with weights (1 - lambda) lambda^(n-1), up to the window's end
    # (agents.returns.lambda_targets). Small lambda keeps the target close to the one-step one,
    # whose only sampled reward is the step's own, while still carrying some credit several steps
    # back. null = n-step targets.
    td_lambda: float | None = None
    # Adam learning rate.
    lr: float = 1e-3
    # Anneal the learning rate linearly from lr to lr_end over lr_decay_updates updates, then keep
    # lr_end (later updates move the weights less); null = constant lr.
    lr_end: float | None = None
    lr_decay_updates: int = 25_000
    # Adam's epsilon. Keras' default 1e-7 lets Adam take full lr-sized steps even when the TD
    # errors (and so the gradients) are tiny; R2D2 uses 1e-3, which damps those steps.
    adam_epsilon: float = 1e-7
    # Sequences per update.
    batch_size: int = 32
    # EMA rate of the target network, in (0, 1]; 1 with a period gives hard copies.
    tau: float = 0.01
    # Optimiser steps between target updates.
    target_update_period: int = 1
    # EMA rate of a third copy of the Q-network, the average, in (0, 1] (null: none kept). It
    # follows the online weights after every update, like the target but at its own (slower) rate,
    # and only evaluation and export act with it (eval.network=average): a policy averaged over
    # about 1 / average_tau updates, which does not follow the online weights into a short dip.
    average_tau: float | None = None
    # Double DQN: the online network picks the bootstrap action, the target scores it.
    double_q: bool = True
    # Clipped double Q for discrete actions (after Fujimoto et al. 2018): a second Q head on the
    # same torso; both heads learn one target whose bootstrap value is the smaller of the two
    # target heads' values of the first online head's greedy action. Counters the overestimation
    # that a max over noisy values compounds through a long discount. Acting, evaluation and export
    # use the first head.
    twin_q: bool = False
    # Auxiliary reward prediction (as UNREAL's, Jaderberg et al. 2017), >= 0: a second head on the
    # shared torso learns the immediate reward of the action taken, E[r_t | history, a_t] (a Q
    # head with a discount of 0), and the loss gains this weight times its Huber loss. Its gradient
    # trains the recurrent state toward what the next reward depends on, whatever the discount of
    # the head that acts: where an action decides only its own step's reward (popgym CountRecall),
    # a long discount buries that in bootstrapped value; this head sees it alone. Acting,
    # evaluation and export use the first head unless acting_head says otherwise. Logged as
    # losses/reward_head. With twin_q it is a third head. 0 = off.
    reward_head: float = 0.0
    # A short-discount Q head, in [0, 1) (null: none): one more head on the shared torso learns the
    # same n-step (or lambda) return as the Q head but with this discount, bootstrapped from its
    # own target head at its own online greedy action (double Q), with h(x) if value_rescaling and
    # the anchor if target_anchor; its Huber TD loss joins the loss at weight 1 (logged as
    # losses/short_head). Agent57's family of discounts, here two: a long one for tasks whose
    # failures come long after their cause, a short one for tasks whose sparse rewards a long
    # discount lets the values run away on. The TD errors reported and prioritised are the Q head's.
    short_gamma: float | None = None
    # Which head acts, in training and greedy evaluation and export: q (the Q head), reward (the
    # reward head: the myopic policy argmax_a E[r_t | history, a]), short (the short-discount
    # head), or bandit: Agent57's meta-controller (Badia et al. 2020) picks one of the heads (the
    # Q head and those of reward and short present) per env per training episode by a
    # sliding-window UCB over the returns each head's episodes earned, and greedy acting uses the
    # head of highest windowed mean return. Where the best discount differs between tasks (an
    # answer that decides only its own step's reward against a pole that falls 300 steps after a
    # drift starts), the one preset then keeps each policy and each task's returns choose. reward
    # needs agent.reward_head > 0, short agent.short_gamma, bandit either. Logged as charts/bandit_*
    # (head k: the k-th of q, reward, short present).
    acting_head: str = "q"
    # The bandit's window of training episodes, its UCB bonus (times the window's return range)
    # and the share of episodes that take a uniformly random head.
    bandit_window: int = 160
    bandit_beta: float = 1.0
    bandit_explore: float = 0.2
    # Huber loss threshold on the TD error.
    huber_delta: float = 1.0
    # Global gradient-norm clip.
    max_grad_norm: float = 10.0
    # Epsilon-greedy exploration: linear decay from start to end over decay_steps env steps.
    epsilon_start: float = 1.0
    epsilon_end: float = 0.01
    epsilon_decay_steps: int = 5000
    # Ape-X exploration ladder instead of the decay: env i of N acts with the fixed
    # eps_i = 0.4 ** (1 + 7 i / (N - 1)).
    epsilon_ladder: bool = False
    # Learn Q in R2D2's rescaled space h(x) = sign(x)(sqrt(|x| + 1) - 1) + 1e-3 x: bootstrap values
    # are mapped back with h^-1 before the n-step (or lambda) target, which is then mapped with h.
    value_rescaling: bool = False
    # Advantage learning (Bellemare et al. 2016), in [0, 1): the TD target loses
    # alpha * (max_a Q_target(s, a) - Q_target(s, a_taken)), which widens the gap between the
    # greedy action and the others where the returns of both saturate. 0 = off.
    advantage_learning: float = 0.0
    # Functional regularisation toward the target network (after Piche et al. 2021), >= 0: the
    # loss gains anchor * mean over trace steps and actions of (Q(s, a) - Q_target(s, a))^2, in
    # the space Q is learned in. It holds every action's value, not only the replayed one's, near
    # the slowly moving EMA, so updates elsewhere do not drift the values of actions that are
    # rarely taken. Logged as losses/anchor. 0 = off.
    target_anchor: float = 0.0
    # Which actions the anchor holds: all, or others (every action but the one taken, whose value
    # the TD loss already trains; the mean is then over the others).
    target_anchor_actions: str = "all"
    # Every this many updates, log R2D2's representational drift of the stored states: the mean
    # |Q| difference at the end of burn-in between unrolling from the stored state and from zeros
    # (charts/staleness_q, and relative to mean |Q|: charts/staleness_q_rel). 0 = off.
    staleness_every: int = 50

    def validate(self) -> None:
        """Range checks of these fields; raises :class:`ConfigError` naming the first bad key."""
        validate_common(self)
        for key in ("epsilon_start", "epsilon_end"):
            val = getattr(self, key)
            check(finite(val) and 0 <= val <= 1, f"agent.{key}", val, "[0, 1]")
        check(self.epsilon_decay_steps >= 1, "agent.epsilon_decay_steps", self.epsilon_decay_steps, ">= 1")
        check(self.huber_delta > 0, "agent.huber_delta", self.huber_delta, "> 0")
        if self.lr_end is not None:
            check(finite(self.lr_end) and self.lr_end > 0, "agent.lr_end", self.lr_end, "> 0 or null")
        eps = self.adam_epsilon
        check(finite(eps) and eps > 0, "agent.adam_epsilon", eps, "> 0")
        check(self.lr_decay_updates >= 1, "agent.lr_decay_updates", self.lr_decay_updates, "integers >= 1")
        alpha = self.advantage_learning
        check(finite(alpha) and 0 <= alpha < 1, "agent.advantage_learning", alpha, "[0, 1)")
        anchor = self.target_anchor
        check(finite(anchor) and anchor >= 0, "agent.target_anchor", anchor, ">= 0 (0 = off)")
        which = self.target_anchor_actions
        check(which in ("all", "others"), "agent.target_anchor_actions", which, "all|others")
        weight = self.reward_head
        check(finite(weight) and weight >= 0, "agent.reward_head", weight, ">= 0 (0 = off)")
        short = self.short_gamma
        if short is not None:
            check(finite(short) and 0 <= short < 1, "agent.short_gamma", short, "[0, 1) or null")
        heads = ("q", "reward", "short", "bandit")
        check(self.acting_head in heads, "agent.acting_head", self.acting_head, "|".join(heads))
        needs = {
            "reward": (bool(weight), "the reward head: set agent.reward_head > 0"),
            "short": (short is not None, "the short-discount head: set agent.short_gamma"),
            "bandit": (
                bool(weight) or short is not None,
                "a second head: set agent.reward_head > 0 or agent.short_gamma",
            ),
        }
        have, what = needs.get(self.acting_head, (True, ""))
        if not have:
            raise ConfigError(f"agent.acting_head={self.acting_head} needs {what}, or allowed q")
        check(self.bandit_window >= 1, "agent.bandit_window", self.bandit_window, "integers >= 1")
        beta = self.bandit_beta
        check(finite(beta) and beta >= 0, "agent.bandit_beta", beta, ">= 0")
        explore = self.bandit_explore
        check(finite(explore) and 0 <= explore <= 1, "agent.bandit_explore", explore, "[0, 1]")
        every = self.staleness_every
        check(every >= 0, "agent.staleness_every", every, "integers >= 0 (0 = off)")

    def validate_network(self, network: NetworkConfig) -> None:
        """Any network settings suit a Q-network."""

    def validate_for_env(self, env: EnvConfig, spec: EnvSpec) -> None:
        """One Q-value per action needs a discrete action space."""
        if not spec.discrete:
            raise ConfigError(
                f"agent=rdqn needs a discrete action space but env.id={env.id!r} is continuous; "
                "use agent=rddpg or agent=rtd3"
            )


def epsilon_ladder(num_envs: int) -> np.ndarray:
    """Ape-X's fixed per-env epsilons ``0.4 ** (1 + 7 i / (N - 1))``: ``[N]``, from 0.4 down to 0.4**8."""
    if num_envs == 1:
        return np.array([0.4])
    return 0.4 ** (1.0 + 7.0 * np.arange(num_envs) / (num_envs - 1))


def epsilon_at(config: RDQNConfig, env_steps: int) -> float:
    """Linear decay from ``epsilon_start`` to ``epsilon_end`` over ``epsilon_decay_steps`` env steps."""
    frac = min(env_steps / config.epsilon_decay_steps, 1.0)
    return config.epsilon_start + frac * (config.epsilon_end - config.epsilon_start)


class RDQNLearner:
    """Owns ``online_q``, ``target_q`` and the optimiser; :meth:`step` is one update.

    A batch (from :class:`agents.replay.SequenceReplay`) holds ``[B, L]`` rows with
    ``L = burn_in + trace_length + n_step``: burn-in rows only warm the state, trace rows carry the
    loss, the last ``n_step`` rows only provide bootstrap values.
    """

    def __init__(
        self,
        config: RDQNConfig,
        network: NetworkConfig,
        observation: Observation | int,
        num_actions: int,
        burn_in: int,
        trace_length: int,
        importance_weights: bool = False,
    ) -> None:
        """``observation``: the env's leaves (an int: one flat vector of that size);
        ``importance_weights``: batches carry ``weight`` ``[B]`` (prioritized replay) that scales
        each sequence's loss."""
        self.config = config
        self.importance_weights = bool(importance_weights)
        self.burn_in, self.trace_length = int(burn_in), int(trace_length)
        self.seq_len = self.burn_in + self.trace_length + config.n_step
        if isinstance(observation, int | np.integer):
            observation = vector_observation(int(observation))
        self.observation, self.num_actions = tuple(observation), num_actions
        self.inputs = list(network.inputs)
        # Per-step inputs: the observation leaves, and extras (the one-hot previous action and the
        # previous reward) if network.inputs asks for them.
        self.extras_dim = extras_width(num_actions, self.inputs)
        # Head slots: the Q head, then those present of the twin of clipped double Q, the reward
        # predictor and the short-discount Q head.
        heads = 1 + int(config.twin_q)
        self.reward_slot = self.short_slot = None
        if config.reward_head:
            self.reward_slot, heads = heads, heads + 1
        if config.short_gamma is not None:
            self.short_slot, heads = heads, heads + 1
        kw = {"extras_dim": self.extras_dim, "normalize": True, "heads": heads}
        self.online_q = RecurrentNetwork(network, self.observation, num_actions, name="online_q", **kw)
        self.target_q = RecurrentNetwork(network, self.observation, num_actions, name="target_q", **kw)
        self.targets = TargetUpdater([(self.online_q, self.target_q)])
        self.targets.copy()  # the first TD targets must come from the same function as Q
        self.average_q: RecurrentNetwork | None = None
        self.averager: TargetUpdater | None = None
        if config.average_tau is not None:  # built last: the other networks' seeded weights stay
            self.average_q = RecurrentNetwork(network, self.observation, num_actions, name="average_q", **kw)
            self.averager = TargetUpdater([(self.online_q, self.average_q)])
            self.averager.copy()
        self.ladder: np.ndarray | None = None  # per-env epsilons when agent.epsilon_ladder is on
        self.bandit: HeadBandit | None = None  # the acting policy's head bandit (agent.acting_head)
        lr = config.lr
        if config.lr_end is not None:  # evaluated at the optimizer's iterations (checkpointed)
            lr = keras.optimizers.schedules.PolynomialDecay(config.lr, config.lr_decay_updates, config.lr_end)
        self.optimizer = FusedAdam(learning_rate=lr, epsilon=config.adam_epsilon)
        self.optimizer.build(self.online_q.trainable_variables)
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.state_dim = sum(self.online_q.state_sizes)
        b, length = config.batch_size, self.seq_len
        inputs = input_spec(self.observation, self.extras_dim, b, length)  # leaves and extras
        self.input_keys = tuple(inputs)
        spec = {
            **inputs,
            "action": tf.TensorSpec([b, length], tf.int32),
            "state": tf.TensorSpec([b, self.state_dim], tf.float32),
            **{
                k: tf.TensorSpec([b, length], tf.float32)
                for k in ("reward", "terminated", "truncated", "first", "valid")
            },
        }
        if self.importance_weights:
            spec["weight"] = tf.TensorSpec([b], tf.float32)
        # autograph off: the step is plain TF ops (a tf.cond for the target period), traced once.
        self._step = tf.function(self._train_step, input_signature=[spec], autograph=False)
        self._run_step = CompiledStep(self._step)
        self._run_staleness = CompiledStep(
            tf.function(self._staleness, input_signature=[spec], autograph=False)
        )
        # Optimiser steps so far; read from `updates` at the first step (a resume restores it).
        self.calls: int | None = None

    def replay_fields(self) -> dict[str, tuple[tuple[int, ...], type]]:
        """Per-row fields this learner needs from replay besides the common ones."""
        fields = {**obs_fields(self.observation), "action": ((), np.int32)}
        if self.inputs:  # the Actor writes both; prev_action is one-hot, all zero at an episode start
            fields["prev_action"] = ((self.num_actions,), np.float32)
            fields["prev_reward"] = ((), np.float32)
        return fields

    def trackables(self) -> dict[str, object]:
        """Objects a checkpoint must hold to resume this learner exactly."""
        objects = {
            "online_q": self.online_q,
            "target_q": self.target_q,
            "optimizer": self.optimizer,
            "updates": self.updates,
        }
        if self.average_q is not None:
            objects["average_q"] = self.average_q
        return objects

    def networks(self) -> list[RecurrentNetwork]:
        """Every network whose input normalisation follows the observation statistics."""
        return [self.online_q, self.target_q] + ([self.average_q] if self.average_q is not None else [])

    def eval_network(self, which: str) -> RecurrentNetwork:
        """The Q-network a greedy evaluation acts with: ``online``, ``target`` (the EMA) or
        ``average`` (the slower EMA that ``agent.average_tau`` keeps)."""
        nets = {"online": self.online_q, "target": self.target_q}
        if self.average_q is not None:
            nets["average"] = self.average_q
        if which not in nets:
            raise ValueError(f"eval network {which!r} is unknown: allowed {'|'.join(nets)}")
        return nets[which]

    def sync_policy(self, policy) -> None:
        """Refresh the acting policy's numpy mirror from the online network."""
        policy.net.sync()

    def schedule_scalars(self, env_steps: int) -> dict[str, float]:
        """Exploration schedule values to log (the ladder's mean, smallest and largest epsilon),
        and the head bandit's per-head mean return and share."""
        bandit = self.bandit.scalars() if self.bandit is not None else {}
        if self.ladder is not None:
            return {
                "charts/epsilon": float(self.ladder.mean()),
                "charts/epsilon_min": float(self.ladder.min()),
                "charts/epsilon_max": float(self.ladder.max()),
                **bandit,
            }
        return {"charts/epsilon": epsilon_at(self.config, env_steps), **bandit}

    def features(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Network inputs from replay rows: the observation leaves ``[B, L, ...]`` and, with
        ``network.inputs``, ``extras`` ``[B, L, X]``."""
        inputs = {leaf.name: batch[leaf.name] for leaf in self.observation}
        if self.inputs:
            inputs["extras"] = extra_features(batch["prev_action"], batch["prev_reward"], self.inputs, None)
        return inputs

    def step(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One optimiser step (and target update) on a batch; returns numpy metrics.

        Metrics: ``loss``, ``q_mean``, ``grad_norm`` (and with ``target_anchor``, ``anchor``) scalars;
        ``td_error`` and ``mask`` ``[B, T]``.
        """
        feed = {k: batch[k] for k in self._run_step.spec if k not in self.input_keys}
        feed.update(self.features(batch))
        if self.calls is None:
            self.calls = int(self.updates.numpy())
        self.calls += 1
        every = self.config.staleness_every
        staleness = self._run_staleness(feed) if every and self.calls % every == 0 else {}
        return {**self._run_step(feed), **staleness}

    def _staleness(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Q at the end of burn-in (step ``max(burn_in, 1) - 1``) unrolled from the stored state and
        from zeros, over sequences that do not start an episode (there both states are zero)."""
        w = max(self.burn_in, 1)
        obs = time_slice({k: batch[k] for k in self.input_keys}, 0, w)
        first = batch["first"][:, :w]
        stored = split_state(batch["state"], self.online_q.state_sizes)
        q_stored, _ = self.online_q.unroll(obs, stored, first)
        q_zero, _ = self.online_q.unroll(obs, self.online_q.initial_state(self.config.batch_size), first)
        weight = (1.0 - batch["first"][:, 0]) * batch["valid"][:, w - 1]  # [B]
        diff = tf.reduce_mean(tf.abs(q_stored[:, -1] - q_zero[:, -1]), axis=-1)  # [B]
        scale = tf.reduce_mean(tf.abs(q_stored[:, -1]), axis=-1)  # [B]
        total = tf.maximum(tf.reduce_sum(weight), 1.0)
        mean_diff = tf.reduce_sum(weight * diff) / total
        mean_scale = tf.reduce_sum(weight * scale) / total
        return {
            "charts/staleness_q": mean_diff,
            "charts/staleness_q_rel": mean_diff / tf.maximum(mean_scale, 1e-6),
        }

    def _train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        cfg, bi, tl = self.config, self.burn_in, self.trace_length
        twin, aux, short = cfg.twin_q, bool(cfg.reward_head), self.short_slot is not None
        obs, first = {k: batch[k] for k in self.input_keys}, batch["first"]
        state = split_state(batch["state"], self.online_q.state_sizes)
        q_heads = slice(0, 2) if twin else 0  # the Q head(s) among all heads' outputs [B, L, H, A]
        # [B, L, A]; with twin heads [B, L, 2, A]
        (q_target,), _ = self.target_q.unroll_segments(obs, state, first, (), all_heads=twin or short)
        if short:  # [B, L, A]
            short_target = q_target[:, :, self.short_slot]
        if twin or short:  # the Q head(s) alone
            q_target = q_target[:, :, q_heads]
        variables = self.online_q.trainable_variables
        action = batch["action"][:, bi : bi + tl]  # [B, T]
        with tf.GradientTape() as tape:
            # R2D2 in one unroll: the burn-in warms the stored state; the trace is trained; the last
            # n_step rows, unrolled on from the trace's final state, only pick the double-Q
            # bootstrap action (an argmax: no gradient). The state is stopped between the segments,
            # so no backward runs over the burn-in or the tail.
            stop = None if cfg.double_q else bi + tl  # without double Q no tail is needed
            every = twin or aux or short  # all heads' outputs, [B, T, H, A]
            segments, _ = self.online_q.unroll_segments(
                time_slice(obs, 0, stop), state, first[:, :stop], (bi, bi + tl), all_heads=every
            )
            q_trace, q_tail = segments[1], segments[2]
            if aux or short:  # [B, T, H, A] -> the Q head(s) ([B, T, (2,) A]) and the others' [B, T, A]
                if aux:
                    reward_pred = q_trace[:, :, self.reward_slot]
                if short:
                    short_trace = q_trace[:, :, self.short_slot]
                    short_tail = None if q_tail is None else q_tail[:, :, self.short_slot]
                q_trace = q_trace[:, :, q_heads]
                q_tail = None if q_tail is None else q_tail[:, :, q_heads]
            if twin:  # every head's value of the action taken: [B, T, 2]
                q_taken = tf.gather(q_trace, tf.stack([action, action], axis=2), batch_dims=3)
            else:
                q_taken = tf.gather(q_trace, action, batch_dims=2)  # [B, T]
            # Bootstrap value V(s_j): double DQN scores the online argmax with the target net.
            if cfg.double_q:
                q_online = tf.concat([q_trace, q_tail], axis=1)  # [B, T+n, A] ([B, T+n, 2, A])
                greedy = tf.argmax(q_online[:, :, 0] if twin else q_online, axis=-1, output_type=tf.int32)
                if twin:  # the smaller of the two target heads' values of that action
                    both = tf.gather(q_target[:, bi:], tf.stack([greedy, greedy], axis=2), batch_dims=3)
                    value = tf.reduce_min(both, axis=-1)
                else:
                    value = tf.gather(q_target[:, bi:], greedy, batch_dims=2)
            else:
                value = tf.reduce_max(q_target[:, bi:], axis=-1)  # [B, T+n] ([B, T+n, 2])
                if twin:
                    value = tf.reduce_min(value, axis=-1)
            value = tf.stop_gradient(value)
            if cfg.value_rescaling:  # y = h(the return built on h^-1(Q_target))
                value = unrescale(value)
            # the outcome of each row's action, [B, T+n] each
            outcome = (batch["reward"][:, bi:], batch["terminated"][:, bi:], batch["truncated"][:, bi:])
            target = td_targets(*outcome, value, cfg.gamma, cfg.n_step, cfg.td_lambda, tl)
            if cfg.value_rescaling:
                target = rescale(target)
            if cfg.advantage_learning:  # y - alpha (V(s) - Q(s, a)), both from the target net
                q_now = q_target[:, bi : bi + tl]  # [B, T, A]
                if twin:
                    q_now = q_now[:, :, 0]
                gap = tf.reduce_max(q_now, axis=-1) - tf.gather(q_now, action, batch_dims=2)
                target = target - cfg.advantage_learning * tf.stop_gradient(gap)  # [B, T]
            mask = batch["valid"][:, bi : bi + tl]
            if twin:  # both heads learn the one target; the first head's errors are reported
                td_both = target[:, :, None] - q_taken  # [B, T, 2]
                per_step = huber(td_both[:, :, 0], cfg.huber_delta) + huber(td_both[:, :, 1], cfg.huber_delta)
                td_error, q_taken = td_both[:, :, 0], q_taken[:, :, 0]
            else:
                td_error = target - q_taken  # [B, T]
                per_step = huber(td_error, cfg.huber_delta)  # [B, T]
            if cfg.target_anchor:  # the actions' drift from the target net, [B, T]
                drift = tf.square(q_trace - tf.stop_gradient(q_target[:, bi : bi + tl]))  # [B, T, (2,) A]
                if cfg.target_anchor_actions == "others":
                    others = 1.0 - tf.one_hot(action, self.num_actions)  # [B, T, A]
                    drift = drift * (others[:, :, None] if twin else others)
                    drift = drift * self.num_actions / max(self.num_actions - 1, 1)  # mean over the others
                drift = tf.reduce_mean(drift, axis=[2, 3] if twin else 2)  # over heads and actions
                per_step = per_step + cfg.target_anchor * drift
                anchor_mean = masked_mean(drift, mask)
            if short:  # the short-discount head learns the same return at its own discount: [B, T]
                if cfg.double_q:
                    short_online = tf.concat([short_trace, short_tail], axis=1)  # [B, T+n, A]
                    greedy = tf.argmax(short_online, axis=-1, output_type=tf.int32)
                    value = tf.gather(short_target[:, bi:], greedy, batch_dims=2)
                else:
                    value = tf.reduce_max(short_target[:, bi:], axis=-1)
                value = tf.stop_gradient(value)
                if cfg.value_rescaling:
                    value = unrescale(value)
                short_y = td_targets(*outcome, value, cfg.short_gamma, cfg.n_step, cfg.td_lambda, tl)
                if cfg.value_rescaling:
                    short_y = rescale(short_y)
                short_step = huber(short_y - tf.gather(short_trace, action, batch_dims=2), cfg.huber_delta)
                short_mean = masked_mean(short_step, mask)
                per_step = per_step + short_step
                if cfg.target_anchor:
                    short_drift = tf.square(short_trace - tf.stop_gradient(short_target[:, bi : bi + tl]))
                    if cfg.target_anchor_actions == "others":
                        short_drift = short_drift * others * self.num_actions / max(self.num_actions - 1, 1)
                    per_step = per_step + cfg.target_anchor * tf.reduce_mean(short_drift, axis=2)
            if aux:  # the reward head's error on the action taken, in reward units: [B, T]
                reward_error = batch["reward"][:, bi : bi + tl] - tf.gather(reward_pred, action, batch_dims=2)
                reward_step = huber(reward_error, cfg.huber_delta)
                per_step = per_step + cfg.reward_head * reward_step
                reward_mean = masked_mean(reward_step, mask)
            if self.importance_weights:  # prioritized replay: correct the sampling bias per sequence
                per_step = per_step * batch["weight"][:, None]
            loss = masked_mean(per_step, mask)
            q_mean = masked_mean(q_taken, mask)
        grads = tape.gradient(loss, variables)
        grads, grad_norm = tf.clip_by_global_norm(grads, cfg.max_grad_norm)
        self.optimizer.apply(grads, variables)
        self.updates.assign_add(1)
        due = tf.equal(self.updates % cfg.target_update_period, 0)
        with tf.control_dependencies([self.targets.update_if(due, tf.constant(cfg.tau, tf.float32))]):
            loss = tf.identity(loss)
        if self.averager is not None:  # every update, whatever the target period
            self.averager.update_in_graph(tf.constant(cfg.average_tau, tf.float32))
        metrics = {
            "loss": loss,
            "q_mean": q_mean,
            "grad_norm": grad_norm,
            "td_error": td_error * mask,
            "mask": mask,
        }
        if cfg.target_anchor:
            metrics["anchor"] = anchor_mean
        if aux:
            metrics["reward_head"] = reward_mean
        if short:
            metrics["short_head"] = short_mean
        return metrics


def build_rdqn(config: Config, spec: EnvSpec, counters: StepCounter) -> tuple[RDQNLearner, EpsilonGreedy]:
    """The learner and its epsilon-greedy policy (epsilon read from ``counters.env_steps``)."""
    r = config.replay
    learner = RDQNLearner(
        config.agent,
        config.network,
        spec.observation,
        spec.num_actions,
        r.burn_in,
        r.trace_length,
        importance_weights=r.priority_exponent > 0,
    )
    if config.agent.epsilon_ladder:
        learner.ladder = epsilon_ladder(config.env.num_envs)
        log.info("epsilon ladder over %d envs: %s", len(learner.ladder), np.round(learner.ladder, 5).tolist())
        epsilon = lambda: learner.ladder  # noqa: E731  (one fixed epsilon per env)
    else:
        epsilon = lambda: epsilon_at(config.agent, counters.env_steps)  # noqa: E731
    a = config.agent
    bandit = None
    # The bandit's arms: the Q head (slot 0), then the reward and short-discount heads present.
    slots = [0] + [k for k in (learner.reward_slot, learner.short_slot) if k is not None]
    if a.acting_head == "bandit":
        bandit = HeadBandit(len(slots), a.bandit_window, a.bandit_beta, a.bandit_explore)
    learner.bandit = bandit
    fixed = {"q": 0, "reward": learner.reward_slot, "short": learner.short_slot}
    policy = EpsilonGreedy(
        NumpyNetwork(learner.online_q),
        spec.num_actions,
        epsilon,
        seed=config.seed + 17,
        inputs=config.network.inputs,
        head=fixed.get(a.acting_head, "bandit"),
        bandit=bandit,
        slots=slots,
    )
    return learner, policy


register("rdqn", RDQNConfig, build_rdqn)
