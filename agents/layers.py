"""Dense building blocks shared by every network: ``relu(dense(x))`` or ``relu(LayerNorm(dense(x)))``
as a Keras layer (TF ops or one native op each way) and in numpy for acting."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from agents import kernels
from agents import native as native_ops

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
