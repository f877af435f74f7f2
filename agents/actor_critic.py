"""Recurrent actor and critic networks for continuous control (rddpg / rtd3).

One :class:`ActorCriticNetwork` is a history encoder (dense layers -> recurrent core) with an
optional deterministic actor head and any number of critic heads on top::

    x_t = [obs_t, prev_action_t?, prev_reward_t?]       # network.inputs picks the extras
    h_t = core(pre(x_t), h_{t-1})                        # [B, T, U], the history so far
    mu(h_t)   = tanh(head(post(h_t)))                    # [B, T, A] in [-1, 1]
    Q_i(h_t, a) = head_i(post_i([h_t, a]))               # [B, T]

The critic sees ``[obs features, action]`` at every step, with the action joined *after* the core
(as in Ni et al.'s recurrent TD3): one unroll over the actions actually taken then serves both
``Q(h_t, a_t)`` for the TD loss and ``Q(h_t, mu(h_t))`` for the bootstrap and the actor loss,
without re-running the recurrence for every candidate action. Separate actor and critic cores are
two instances (``actor=True, num_critics=0`` and ``actor=False, num_critics=k``); a shared core is
one instance with both. Twin critics share their critic's core and differ in their post layers and
heads. The actor part has the attribute names :class:`agents.networks.NumpyNetwork` reads
(``pre``, ``core``, ``post``, ``head``), so the same numpy mirror acts with it.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from agents import kernels, sequence_kernels
from agents.core import RecurrentCore, State
from agents.encoder import Encoder, Inputs, dense_stack
from agents.networks import NetworkConfig
from envs.spaces import Observation


def _build_stack(layers: list[keras.layers.Dense], width: int) -> int:
    for layer in layers:
        layer.build((None, width))
        width = layer.units
    return width


class ActorCriticNetwork(keras.Model):
    """History encoder with an optional actor head and ``num_critics`` critic heads."""

    def __init__(
        self,
        config: NetworkConfig,
        observation: Observation | int,
        action_dim: int,
        actor: bool,
        num_critics: int,
        name: str,
        extras_dim: int = 0,
        normalize: bool = False,
    ) -> None:
        """``observation``, ``extras_dim``, ``normalize``: as for a
        :class:`agents.networks.RecurrentNetwork`."""
        super().__init__(name=name)
        self.config = config
        self.action_dim = int(action_dim)
        self.kernels = kernels.for_network(config)  # decided once; the layers follow it
        self.encoder = Encoder(config, observation, extras_dim, self.kernels, normalize)
        self.core = RecurrentCore(
            config.cell, config.units, config.reset_after, self.kernels.recurrence, name="core"
        )
        self.post = dense_stack(config.post_layers, "post", config.layer_norm, self.kernels) if actor else []
        self.head = keras.layers.Dense(action_dim, activation="tanh", name="head") if actor else None
        self.q_posts = [
            dense_stack(config.post_layers, f"q{i + 1}_post", config.layer_norm, self.kernels)
            for i in range(num_critics)
        ]
        self.q_heads = [keras.layers.Dense(1, name=f"q{i + 1}_head") for i in range(num_critics)]
        # Built under this model's name so variable paths read "<name>/<layer>/<var>" and the
        # online/target twins pair by path (agents.target).
        with keras.name_scope(self.name):
            self.encoder.build()
            self.core.build((None, None, self.encoder.output_dim))
            if actor:
                self.head.build((None, _build_stack(self.post, config.units)))
            for post, head in zip(self.q_posts, self.q_heads, strict=True):
                head.build((None, _build_stack(post, config.units + self.action_dim)))
        self.built = True

    @property
    def num_critics(self) -> int:
        return len(self.q_heads)

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Sizes of the recurrent state tuple (``()`` for mlp)."""
        return self.core.state_sizes

    def initial_state(self, batch_size: int) -> State:
        """Zero state: tuple of ``[B, U]``."""
        return self.core.initial_state(batch_size)

    def encode(self, inputs: Inputs | tf.Tensor, state: State, first: tf.Tensor) -> tuple[tf.Tensor, State]:
        """History features: ``inputs`` leaves ``[B, T, ...]`` (or ``[B, T, F]``), ``first`` ``[B, T]``
        -> ``[B, T, U]`` and the final state."""
        return sequence_kernels.unroll(self.core, self.encoder(inputs), state, first)

    def policy(self, h: tf.Tensor) -> tf.Tensor:
        """Deterministic action in ``[-1, 1]``: ``[B, T, U] -> [B, T, A]``."""
        return tf.tanh(self.policy_preactivation(h))

    def policy_preactivation(self, h: tf.Tensor) -> tf.Tensor:
        """The actor head before its tanh: ``[B, T, U] -> [B, T, A]``."""
        for layer in self.post:
            h = layer(h)
        return tf.matmul(h, self.head.kernel) + self.head.bias

    def q(self, h: tf.Tensor, action: tf.Tensor, index: int | None = None) -> list[tf.Tensor]:
        """``Q_i(h, a)`` for every critic head (or only ``index``): list of ``[B, T]``."""
        x0 = tf.concat([h, action], axis=-1)
        heads = range(self.num_critics) if index is None else [index]
        out = []
        for i in heads:
            x = x0
            for layer in self.q_posts[i]:
                x = layer(x)
            out.append(self.q_heads[i](x)[..., 0])
        return out

    def call(self, inputs: Inputs | tf.Tensor) -> tf.Tensor:
        """Keras entry point: the actor's actions from a zero state, ``[B, T, ...] -> [B, T, A]``."""
        shape = tf.shape(tf.nest.flatten(inputs)[0])
        h, _ = self.encode(inputs, self.initial_state(shape[0]), tf.zeros(shape[:2], tf.float32))
        return self.policy(h)


def actor_and_critic(
    config: NetworkConfig,
    observation: Observation | int,
    extras_dim: int,
    action_dim: int,
    num_critics: int,
    shared_core: bool,
    side: str,
) -> tuple[ActorCriticNetwork, ActorCriticNetwork]:
    """One side's (``online`` or ``target``) actor and critic: one instance twice if ``shared_core``.

    Names are ``<side>_actor_critic``, or ``<side>_actor`` and ``<side>_critic`` (built in that
    order, so a seed gives the same weights).
    """
    if shared_core:
        name = f"{side}_actor_critic"
        both = ActorCriticNetwork(config, observation, action_dim, True, num_critics, name, extras_dim, True)
        return both, both
    actor = ActorCriticNetwork(config, observation, action_dim, True, 0, f"{side}_actor", extras_dim, True)
    critic = ActorCriticNetwork(
        config, observation, action_dim, False, num_critics, f"{side}_critic", extras_dim, True
    )
    return actor, critic


def trained_by_each_loss(
    actor: ActorCriticNetwork, critic: ActorCriticNetwork
) -> tuple[list[tf.Variable], list[tf.Variable]]:
    """The online variables the actor loss trains, and those the critic loss trains.

    With a shared core (``actor is critic``) the critic loss shapes the shared history and the actor
    loss trains only the actor's post layers and head, which only read it.
    """
    if actor is not critic:
        return list(actor.trainable_variables), list(critic.trainable_variables)
    actor_variables = [v for layer in [*actor.post, actor.head] for v in layer.trainable_variables]
    ids = {id(v) for v in actor_variables}
    return actor_variables, [v for v in critic.trainable_variables if id(v) not in ids]
