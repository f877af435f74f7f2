"""The per-step encoder every network starts with, and its numpy mirror for acting.

::

    x_t = [obs_t, extras_t]                          # [B, T, F]: network.inputs adds the extras
    z_t = clip((obs_t - mean) / std, -clip, clip)    # running statistics (agents/normalizer.py)
    e_t = pre_k(... pre_1([z_t, extras_t]))          # [B, T, H]: ReLU dense layers, LayerNorm optional

The Q-network and the actor-critic network both hold one :class:`Encoder` as ``encoder``; the
acting side mirrors it with :class:`NumpyEncoder`, so the two cannot drift apart. The dense
building block, :class:`DenseReLU` (TF ops, or one native op each way with LayerNorm), and its numpy
version live here too: the layers after the core use them as well.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from agents import kernels
from agents import native as native_ops

if TYPE_CHECKING:
    from agents.networks import NetworkConfig


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


class Encoder(keras.layers.Layer):
    """``[..., F]`` network inputs -> ``[..., H]`` features (``H`` the last pre-layer width, or ``F``).

    ``norm_dim``: the leading input features (the observation) that the running normalisation
    scales; 0 for none (``network.normalize_obs=false`` also turns it off). ``choice``: the
    network's kernel decision, which the dense layers follow.
    """

    def __init__(
        self,
        config: NetworkConfig,
        input_dim: int,
        norm_dim: int,
        choice: kernels.KernelChoice,
        name: str = "encoder",
    ) -> None:
        super().__init__(name=name)
        self.config = config
        self.input_dim = int(input_dim)
        self.norm_dim = int(norm_dim) if config.normalize_obs else 0
        self.pre = dense_stack(config.pre_layers, "pre", config.layer_norm, choice)
        self.output_dim = self.pre[-1].units if self.pre else self.input_dim

    def build(self, input_shape: tuple[int | None, ...] | None = None) -> None:
        # Keras runs build under this layer's name scope: paths read "<network>/encoder/<var>".
        if self.norm_dim:  # set by agents.normalizer, never trained
            kw = {"shape": (self.norm_dim,), "trainable": False}
            self.input_mean = self.add_weight(initializer="zeros", name="input_mean", **kw)
            self.input_std = self.add_weight(initializer="ones", name="input_std", **kw)
        width = self.input_dim
        for layer in self.pre:
            layer.build((None, width))
            width = layer.units
        self.built = True

    def normalize(self, inputs: tf.Tensor) -> tf.Tensor:
        """The running normalisation of the first ``norm_dim`` features: ``[..., F] -> [..., F]``."""
        if not self.norm_dim:
            return inputs
        clip = self.config.obs_clip
        obs = tf.clip_by_value((inputs[..., : self.norm_dim] - self.input_mean) / self.input_std, -clip, clip)
        return tf.concat([obs, inputs[..., self.norm_dim :]], axis=-1)

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        """``[..., F] -> [..., H]``."""
        x = self.normalize(inputs)
        for layer in self.pre:
            x = layer(x)
        return x


class NumpyEncoder:
    """:class:`Encoder` in numpy, one step for a batch of envs: ``[B, F] -> [B, H]``.

    Call :meth:`sync` after the learner changes the weights or the statistics.
    """

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.sync()

    def sync(self) -> None:
        """Copy the current weights and statistics out of the Keras encoder."""
        enc = self.encoder
        self.norm_dim = enc.norm_dim
        if self.norm_dim:
            self.mean, self.std = np.asarray(enc.input_mean), np.asarray(enc.input_std)
            self.clip = enc.config.obs_clip
        self.pre = [numpy_dense_relu(layer) for layer in enc.pre]

    def step(self, x: np.ndarray) -> np.ndarray:
        """``x`` ``[B, F]`` -> ``[B, H]`` float32."""
        x = np.asarray(x, np.float32)
        if self.norm_dim:
            obs = np.clip((x[:, : self.norm_dim] - self.mean) / self.std, -self.clip, self.clip)
            x = np.concatenate([obs, x[:, self.norm_dim :]], axis=1)
        for weights in self.pre:
            x = numpy_dense_relu_step(weights, x)
        return x
