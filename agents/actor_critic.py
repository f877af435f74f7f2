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

from agents import kernels
from agents.cells import RecurrentCore, State
from agents.networks import NetworkConfig, dense_stack


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
        input_dim: int,
        action_dim: int,
        actor: bool,
        num_critics: int,
        name: str,
        norm_dim: int = 0,
    ) -> None:
        """``norm_dim``: leading input features (the observation) to normalise, 0 for none."""
        super().__init__(name=name)
        self.config = config
        self.input_dim, self.action_dim = int(input_dim), int(action_dim)
        self.norm_dim = int(norm_dim) if config.normalize_obs else 0
        if self.norm_dim:  # running statistics pushed by agents.normalizer (as RecurrentNetwork)
            kw = {"shape": (self.norm_dim,), "trainable": False}
            self.input_mean = self.add_weight(initializer="zeros", name="input_mean", **kw)
            self.input_std = self.add_weight(initializer="ones", name="input_std", **kw)
        self.kernels = kernels.for_network(config)  # decided once; the layers follow it
        self.pre = dense_stack(config.pre_layers, "pre", config.layer_norm, self.kernels)
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
            width = _build_stack(self.pre, self.input_dim)
            self.core.build((None, None, width))
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

    def encode(self, inputs: tf.Tensor, state: State, reset: tf.Tensor) -> tuple[tf.Tensor, State]:
        """History features: ``inputs`` ``[B, T, F]``, ``reset`` ``[B, T]`` -> ``[B, T, U]``, final state."""
        x = inputs
        if self.norm_dim:
            clip = self.config.obs_clip
            obs = (x[..., : self.norm_dim] - self.input_mean) / self.input_std
            x = tf.concat([tf.clip_by_value(obs, -clip, clip), x[..., self.norm_dim :]], axis=-1)
        for layer in self.pre:
            x = layer(x)
        return self.core.unroll(x, state, reset)

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

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        """Keras entry point: the actor's actions from a zero state, ``[B, T, F] -> [B, T, A]``."""
        shape = tf.shape(inputs)
        h, _ = self.encode(inputs, self.initial_state(shape[0]), tf.zeros(shape[:2], inputs.dtype))
        return self.policy(h)
