"""Sequence networks: dense layers -> recurrent core -> dense layers -> head.

One :class:`RecurrentNetwork` serves as Q-network (head ``[A]`` Q-values), actor (tanh head) and
critic (input ``[obs, action]``, head ``[1]``). Training unrolls it over ``[B, T, F]``;
:class:`NumpyNetwork` mirrors its weights for acting one step at a time without TF dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from agents import kernels
from agents.core import CELLS, RecurrentCore, State, core_weights, numpy_core_step
from agents.encoder import Encoder, NumpyEncoder, dense_stack, numpy_dense_relu, numpy_dense_relu_step
from envs.config import check


@dataclass
class NetworkConfig:
    """Architecture shared by every network of an agent."""

    # Core: lstm | gru | lstm_peephole | mlp (mlp has no memory: the baseline).
    cell: str = "lstm"
    # Width of the core (hidden state size).
    units: int = 64
    # Widths of ReLU dense layers before the core.
    pre_layers: list[int] = field(default_factory=lambda: [64])
    # Widths of ReLU dense layers after the core.
    post_layers: list[int] = field(default_factory=list)
    # GRU only: apply the reset gate after the recurrent matmul (Keras and cuDNN default).
    reset_after: bool = True
    # Extra per-step inputs: any of prev_action, prev_reward (zeros at an episode's first step;
    # a discrete previous action is one-hot, a continuous one scaled to [-1, 1]).
    inputs: list[str] = field(default_factory=list)
    # Scale observations by running mean/std before the first layer (agents/normalizer.py).
    normalize_obs: bool = True
    # Q-networks only: separate value and advantage streams after the post layers (dueling head).
    dueling: bool = False
    # Normalised observations are clipped to [-obs_clip, obs_clip].
    obs_clip: float = 5.0
    # LayerNorm between each dense layer (pre, post) and its ReLU, as in PQN (Gallici et al. 2024).
    layer_norm: bool = False
    # Implementation of the learner's recurrence and LayerNorm dense layers (agents/kernels.py):
    # auto | native (C++ ops, lstm only, CPU) | graph | scan. auto takes native where the ops load
    # and TF sees no GPU, else graph where the cell has one, else scan.
    backend: str = "auto"

    def validate(self) -> None:
        """Range checks of these fields; one-line :class:`envs.config.ConfigError` naming the key."""
        check(self.cell in CELLS, "network.cell", self.cell, "one of " + "|".join(CELLS))
        extras = ("prev_action", "prev_reward")
        inputs = list(self.inputs)
        check(all(i in extras for i in inputs), "network.inputs", inputs, "any of " + "|".join(extras))
        check(self.units >= 1, "network.units", self.units, "integers >= 1")
        for key in ("pre_layers", "post_layers"):
            widths = list(getattr(self, key))
            check(all(w >= 1 for w in widths), f"network.{key}", widths, "widths >= 1")
        check(self.backend in kernels.BACKENDS, "network.backend", self.backend, "|".join(kernels.BACKENDS))
        allowed = f"auto|graph|scan for cell={self.cell}"
        check(self.backend != "native" or self.cell == "lstm", "network.backend", self.backend, allowed)


class RecurrentNetwork(keras.Model):
    """``[B, T, F]`` inputs -> ``[B, T, O]`` outputs, with a recurrent state carried between calls."""

    def __init__(
        self,
        config: NetworkConfig,
        input_dim: int,
        output_dim: int,
        output_activation: str | None = None,
        name: str = "network",
        norm_dim: int = 0,
    ) -> None:
        """``norm_dim``: leading input features to normalise (the observation), 0 for none."""
        super().__init__(name=name)
        if config.cell not in CELLS:
            raise ValueError(f"unknown cell {config.cell!r}")
        self.config = config
        self.input_dim = int(input_dim)
        self.output_dim = int(output_dim)
        self.kernels = kernels.for_network(config)  # decided once; the layers follow it
        self.encoder = Encoder(config, self.input_dim, norm_dim, self.kernels)
        self.core = RecurrentCore(
            config.cell, config.units, config.reset_after, self.kernels.recurrence, name="core"
        )
        self.post = dense_stack(config.post_layers, "post", config.layer_norm, self.kernels)
        self.head = keras.layers.Dense(output_dim, activation=output_activation, name="head")
        # Dueling (Wang et al. 2016): ``head`` is the advantage stream, ``value_head`` the value.
        self.value_head = keras.layers.Dense(1, name="value_head") if config.dueling else None
        # Build every layer under this model's name so variable paths read "<name>/<layer>/<var>"
        # and online/target twins pair by path.
        with keras.name_scope(self.name):
            self.encoder.build()
            self.core.build((None, None, self.encoder.output_dim))
            width = config.units
            for layer in self.post:
                layer.build((None, width))
                width = layer.units
            self.head.build((None, width))
            if self.value_head is not None:
                self.value_head.build((None, width))
        self.built = True

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Sizes of the recurrent state tuple (``()`` for mlp)."""
        return self.core.state_sizes

    def initial_state(self, batch_size: int) -> State:
        """Zero state: tuple of ``[B, U]``."""
        return self.core.initial_state(batch_size)

    def unroll(self, inputs: tf.Tensor, state: State, first: tf.Tensor) -> tuple[tf.Tensor, State]:
        """``inputs`` ``[B, T, F]``, ``state`` tuple of ``[B, U]``, ``first`` ``[B, T]`` -> ``[B, T, O]``."""
        x, final_state = self.core.unroll(self.encoder(inputs), state, first)
        for layer in self.post:
            x = layer(x)
        if self.value_head is None:
            return self.head(x), final_state
        advantage = self.head(x)  # [B, T, A]: mean removed, so value and advantage are identifiable
        q = self.value_head(x) + advantage - tf.reduce_mean(advantage, axis=-1, keepdims=True)
        return q, final_state

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        """Keras entry point: unroll from a zero state with no resets; ``[B, T, F] -> [B, T, O]``."""
        shape = tf.shape(inputs)
        out, _ = self.unroll(inputs, self.initial_state(shape[0]), tf.zeros(shape[:2], dtype=inputs.dtype))
        return out


def flat_state(state: tuple[np.ndarray, ...], batch_size: int) -> np.ndarray:
    """Concatenate a state tuple into ``[B, S]`` (``S = 0`` for mlp) for storage in replay."""
    if not state:
        return np.zeros((batch_size, 0), np.float32)
    return np.concatenate(state, axis=1)


def split_state(flat: np.ndarray | tf.Tensor, sizes: tuple[int, ...]) -> tuple:
    """Inverse of :func:`flat_state`: ``[B, S]`` -> tuple of ``[B, U]``."""
    out, start = [], 0
    for s in sizes:
        out.append(flat[:, start : start + s])
        start += s
    return tuple(out)


class NumpyNetwork:
    """A numpy mirror of a :class:`RecurrentNetwork` for stepping many envs one step at a time.

    Call :meth:`sync` after the learner changes the weights. ``step`` takes ``[B, F]`` inputs and
    the state tuple, returns ``[B, O]`` outputs (head activation applied) and the next state.
    """

    def __init__(self, network: RecurrentNetwork) -> None:
        self.network = network
        self.cell = network.config.cell
        self.reset_after = network.config.reset_after
        self.state_sizes = network.state_sizes
        self.activation = network.head.activation.__name__ if network.head.activation else "linear"
        self.sync()

    def sync(self) -> None:
        """Copy the current weights out of the Keras network."""
        dense = lambda layer: (np.asarray(layer.kernel), np.asarray(layer.bias))  # noqa: E731
        self.encoder = NumpyEncoder(self.network.encoder)
        self.core = core_weights(self.network.core)
        self.post = [numpy_dense_relu(layer) for layer in self.network.post]
        self.head = dense(self.network.head)
        value_head = getattr(self.network, "value_head", None)
        self.value_head = dense(value_head) if value_head is not None else None

    def initial_state(self, batch_size: int) -> tuple[np.ndarray, ...]:
        """Zero state: tuple of ``[B, U]`` float32 arrays."""
        return tuple(np.zeros((batch_size, s), np.float32) for s in self.state_sizes)

    def step(self, x: np.ndarray, state: tuple[np.ndarray, ...]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``x`` ``[B, F]`` -> outputs ``[B, O]`` and the next state."""
        x, state = numpy_core_step(self.cell, self.core, self.encoder.step(x), state, self.reset_after)
        for weights in self.post:
            x = numpy_dense_relu_step(weights, x)
        w, b = self.head
        out = x @ w + b
        if self.value_head is not None:
            out = (x @ self.value_head[0] + self.value_head[1]) + (out - out.mean(axis=-1, keepdims=True))
        if self.activation == "tanh":
            out = np.tanh(out)
        elif self.activation != "linear":
            raise ValueError(f"unsupported head activation {self.activation}")
        return out.astype(np.float32, copy=False), state
