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
from agents import native as native_ops
from agents.cells import CELLS, RecurrentCore, State, core_weights, numpy_core_step


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
    # Normalised observations are clipped to [-obs_clip, obs_clip].
    obs_clip: float = 5.0
    # LayerNorm between each dense layer (pre, post) and its ReLU, as in PQN (Gallici et al. 2024).
    layer_norm: bool = False
    # Implementation of the learner's recurrence and LayerNorm dense layers (agents/kernels.py):
    # auto | native (C++ ops, lstm only, CPU) | graph | scan. auto takes native where the ops load
    # and TF sees no GPU, else graph where the cell has one, else scan.
    backend: str = "auto"


LN_EPSILON = 1e-3


class DenseReLU(keras.layers.Dense):
    """``relu(dense(x))`` or, with ``layer_norm``, ``relu(LayerNorm(dense(x)))``: ``[..., I] -> [..., O]``.

    A Dense subclass, so ``kernel``/``bias`` (and variable paths ``<layer>/kernel``) stay those of
    a plain Dense; the LayerNorm scale and offset are ``<layer>/ln_gamma``, ``<layer>/ln_beta``.
    ``native`` (the network's :class:`agents.kernels.KernelChoice` ``dense == "native"``) runs a
    LayerNorm layer as one fused C++ op each way (``agents/native/dense_op.cc``) instead of about
    15 TF ops; same values and gradients to float32 round-off.
    """

    def __init__(
        self, units: int, layer_norm: bool = False, name: str | None = None, native: bool = False
    ) -> None:
        super().__init__(units, activation="relu", name=name)
        self.layer_norm = bool(layer_norm)
        self.native = bool(native) and self.layer_norm  # only the LayerNorm layer has a native op

    def build(self, input_shape) -> None:
        super().build(input_shape)
        if self.layer_norm:
            self.ln_gamma = self.add_weight(shape=(self.units,), initializer="ones", name="ln_gamma")
            self.ln_beta = self.add_weight(shape=(self.units,), initializer="zeros", name="ln_beta")

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        if not self.layer_norm:
            return super().call(inputs)
        weights = [tf.convert_to_tensor(w) for w in (self.kernel, self.bias, self.ln_gamma, self.ln_beta)]
        if self.native:
            return dense_ln_relu_native(inputs, *weights)
        kernel, bias, gamma, beta = weights
        y = tf.matmul(inputs, kernel) + bias  # [..., O]
        mean, var = tf.nn.moments(y, axes=[-1], keepdims=True)
        y = (y - mean) * tf.math.rsqrt(var + LN_EPSILON) * gamma + beta
        return tf.nn.relu(y)


def dense_stack(
    widths: list[int], prefix: str, layer_norm: bool, choice: kernels.KernelChoice
) -> list[DenseReLU]:
    """``DenseReLU`` layers named ``<prefix>_<i>``, running the dense kernel of ``choice``."""
    native = choice.dense == "native"
    return [DenseReLU(n, layer_norm, f"{prefix}_{i}", native) for i, n in enumerate(widths)]


def dense_ln_relu_native(
    inputs: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor, gamma: tf.Tensor, beta: tf.Tensor
) -> tf.Tensor:
    """``relu(LayerNorm(inputs kernel + bias) gamma + beta)`` by the native ops: ``[..., I] -> [..., O]``.

    ``kernel`` ``[I, O]``; ``bias``, ``gamma``, ``beta`` ``[O]``. Raises
    :class:`agents.native.NativeUnavailable` if the ops cannot load.
    """
    ops = native_ops.load()

    @tf.custom_gradient
    def run(inputs, kernel, bias, gamma, beta):
        out, yhat, rstd = ops.recurrl_dense_ln_forward(inputs, kernel, bias, gamma, beta, epsilon=LN_EPSILON)

        def grad(dout):
            dx, dkernel, dbias, dgamma, dbeta = ops.recurrl_dense_ln_backward(
                dout, inputs, kernel, gamma, yhat, rstd, out
            )
            return dx, dkernel, dbias, dgamma, dbeta

        return out, grad

    return run(inputs, kernel, bias, gamma, beta)


def numpy_dense_relu(layer: DenseReLU) -> tuple[np.ndarray, ...]:
    """A :class:`DenseReLU`'s weights for :func:`numpy_dense_relu_step`: kernel, bias[, gamma, beta]."""
    weights = [np.asarray(layer.kernel), np.asarray(layer.bias)]
    if layer.layer_norm:
        weights += [np.asarray(layer.ln_gamma), np.asarray(layer.ln_beta)]
    return tuple(weights)


def numpy_dense_relu_step(weights: tuple[np.ndarray, ...], x: np.ndarray) -> np.ndarray:
    """numpy :class:`DenseReLU`: ``[B, I] -> [B, O]``."""
    y = x @ weights[0] + weights[1]
    if len(weights) == 4:
        mean = y.mean(axis=-1, keepdims=True)
        var = ((y - mean) ** 2).mean(axis=-1, keepdims=True)
        y = (y - mean) / np.sqrt(var + LN_EPSILON) * weights[2] + weights[3]
    return np.maximum(y, 0.0)


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
        self.pre = dense_stack(config.pre_layers, "pre", config.layer_norm, self.kernels)
        self.core = RecurrentCore(
            config.cell, config.units, config.reset_after, self.kernels.recurrence, name="core"
        )
        self.post = dense_stack(config.post_layers, "post", config.layer_norm, self.kernels)
        self.head = keras.layers.Dense(output_dim, activation=output_activation, name="head")
        # Build every layer under this model's name so variable paths read "<name>/<layer>/<var>"
        # and online/target twins pair by path.
        width = self.input_dim
        self.norm_dim = int(norm_dim) if config.normalize_obs else 0
        if self.norm_dim:  # the model's own weights: paths "<name>/input_mean", "<name>/input_std"
            kw = {"shape": (self.norm_dim,), "trainable": False}
            self.input_mean = self.add_weight(initializer="zeros", name="input_mean", **kw)
            self.input_std = self.add_weight(initializer="ones", name="input_std", **kw)
        with keras.name_scope(self.name):
            for layer in self.pre:
                layer.build((None, width))
                width = layer.units
            self.core.build((None, None, width))
            width = config.units
            for layer in self.post:
                layer.build((None, width))
                width = layer.units
            self.head.build((None, width))
        self.built = True

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Sizes of the recurrent state tuple (``()`` for mlp)."""
        return self.core.state_sizes

    def initial_state(self, batch_size: int) -> State:
        """Zero state: tuple of ``[B, U]``."""
        return self.core.initial_state(batch_size)

    def unroll(self, inputs: tf.Tensor, state: State, reset: tf.Tensor) -> tuple[tf.Tensor, State]:
        """``inputs`` ``[B, T, F]``, ``state`` tuple of ``[B, U]``, ``reset`` ``[B, T]`` -> ``[B, T, O]``."""
        x = self.normalize(inputs)
        for layer in self.pre:
            x = layer(x)
        x, final_state = self.core.unroll(x, state, reset)
        for layer in self.post:
            x = layer(x)
        return self.head(x), final_state

    def normalize(self, inputs: tf.Tensor) -> tf.Tensor:
        """Apply the running observation normalisation to the first ``norm_dim`` features."""
        if not self.norm_dim:
            return inputs
        clip = self.config.obs_clip
        obs = tf.clip_by_value((inputs[..., : self.norm_dim] - self.input_mean) / self.input_std, -clip, clip)
        return tf.concat([obs, inputs[..., self.norm_dim :]], axis=-1)

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
        self.norm_dim = getattr(self.network, "norm_dim", 0)
        if self.norm_dim:
            self.norm = (np.asarray(self.network.input_mean), np.asarray(self.network.input_std))
            self.obs_clip = self.network.config.obs_clip
        self.pre = [numpy_dense_relu(layer) for layer in self.network.pre]
        self.core = core_weights(self.network.core)
        self.post = [numpy_dense_relu(layer) for layer in self.network.post]
        self.head = dense(self.network.head)

    def initial_state(self, batch_size: int) -> tuple[np.ndarray, ...]:
        """Zero state: tuple of ``[B, U]`` float32 arrays."""
        return tuple(np.zeros((batch_size, s), np.float32) for s in self.state_sizes)

    def step(self, x: np.ndarray, state: tuple[np.ndarray, ...]) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """``x`` ``[B, F]`` -> outputs ``[B, O]`` and the next state."""
        x = np.asarray(x, np.float32)
        if self.norm_dim:
            mean, std = self.norm
            obs = np.clip((x[:, : self.norm_dim] - mean) / std, -self.obs_clip, self.obs_clip)
            x = np.concatenate([obs, x[:, self.norm_dim :]], axis=1)
        for weights in self.pre:
            x = numpy_dense_relu_step(weights, x)
        x, state = numpy_core_step(self.cell, self.core, x, state, self.reset_after)
        for weights in self.post:
            x = numpy_dense_relu_step(weights, x)
        w, b = self.head
        out = x @ w + b
        if self.activation == "tanh":
            out = np.tanh(out)
        elif self.activation != "linear":
            raise ValueError(f"unsupported head activation {self.activation}")
        return out.astype(np.float32, copy=False), state
