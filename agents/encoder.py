"""The per-step encoder every network starts with, and its numpy mirror for acting.

An observation is a set of leaves (envs/spaces.py); each is encoded on its own, then the features
are joined with the extra inputs and go through the dense layers::

    vector          clip((x - mean) / std, -clip, clip)      running statistics per feature
    image           torso(clip((x - mean) / std, ...))       statistics per channel; agents/torso.py
    discrete        one_hot(x - start, n)
    multi_discrete  [one_hot(x_k - start_k, n_k) for k]      concatenated
    multi_binary    float(x)
    e_t = pre_k(... pre_1([leaf features..., extras_t]))     # [B, T, H]; extras: network.inputs

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
from agents.torso import ConvTorso, numpy_torso, numpy_torso_step, torso_spec
from envs.spaces import Leaf, Observation, vector_observation

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


Inputs = dict[str, tf.Tensor]  # leaf name -> [..., *leaf shape], plus "extras" -> [..., X]


def stat_names(leaf: Leaf) -> tuple[str, str]:
    """Variable names of a leaf's running mean and std (``input_mean`` for a flat ``obs``)."""
    if leaf.name == "obs":
        return "input_mean", "input_std"
    short = leaf.name.replace(".", "_")
    return f"{short}_mean", f"{short}_std"


class Encoder(keras.layers.Layer):
    """Observation leaves plus ``extras`` ``[..., X]`` -> ``[..., H]`` (``H``: the last pre-layer
    width, or the width of the joined features without pre layers).

    ``observation``: the env's leaves (an int ``D`` means one flat vector leaf ``obs`` of ``D``).
    ``normalize``: vector and image leaves are scaled by running statistics (``stats``), unless
    ``network.normalize_obs=false``. ``choice``: the network's kernel decision for the dense layers.
    """

    def __init__(
        self,
        config: NetworkConfig,
        observation: Observation | int,
        extras_dim: int,
        choice: kernels.KernelChoice,
        normalize: bool = False,
        name: str = "encoder",
    ) -> None:
        super().__init__(name=name)
        self.config = config
        if isinstance(observation, int | np.integer):
            observation = vector_observation(int(observation))
        self.observation: Observation = tuple(observation)
        self.extras_dim = int(extras_dim)
        self.normalize_obs = bool(normalize) and config.normalize_obs
        spec = torso_spec(config.cnn, config.cnn_channels, config.cnn_kernels, config.cnn_strides)
        self.torsos: dict[str, ConvTorso] = {}
        if config.encoder == "auto":
            for leaf in self.observation:
                if leaf.kind == "image":
                    self.torsos[leaf.name] = ConvTorso(spec, leaf.name.replace(".", "_") + "_torso")
        self.pre = dense_stack(config.pre_layers, "pre", config.layer_norm, choice)
        self.stats: dict[str, tuple[tf.Variable, tf.Variable]] = {}
        self.feature_dim = 0
        self.output_dim = 0

    def build(self, input_shape: tuple[int | None, ...] | None = None) -> None:
        # Keras runs build under this layer's name scope: paths read "<network>/encoder/<var>".
        width = self.extras_dim
        for leaf in self.observation:
            if self.normalize_obs and leaf.normalized:  # set by agents.normalizer, never trained
                size = leaf.image_shape[-1] if leaf.kind == "image" else leaf.width
                kw = {"shape": (size,), "trainable": False}
                mean_name, std_name = stat_names(leaf)
                self.stats[leaf.name] = (
                    self.add_weight(initializer="zeros", name=mean_name, **kw),
                    self.add_weight(initializer="ones", name=std_name, **kw),
                )
            torso = self.torsos.get(leaf.name)
            if torso is not None:
                torso.build((None, *leaf.image_shape))
                width += torso.output_dim
            else:
                width += leaf.width
        self.feature_dim = width
        for layer in self.pre:
            layer.build((None, width))
            width = layer.units
        self.output_dim = width
        self.built = True

    def leaf_features(self, leaf: Leaf, x: tf.Tensor) -> tf.Tensor:
        """One leaf ``[..., *leaf.shape]`` (stored dtype) -> ``[..., W]`` float32."""
        if leaf.kind == "discrete":
            return tf.one_hot(tf.cast(x, tf.int32) - leaf.starts[0], leaf.sizes[0])
        if leaf.kind == "multi_discrete":
            offsets = np.concatenate([[0], np.cumsum(leaf.sizes)[:-1]]) - np.asarray(leaf.starts)
            index = tf.cast(x, tf.int32) + tf.constant(offsets, tf.int32)  # [..., K]
            return tf.reduce_sum(tf.one_hot(index, leaf.width), axis=-2)
        x = tf.cast(x, tf.float32)
        if leaf.kind == "multi_binary":
            return x
        if leaf.kind == "image":
            if len(leaf.shape) == 2:
                x = x[..., None]
            elif leaf.channels_first:
                x = tf.experimental.numpy.moveaxis(x, -3, -1)  # [..., C, H, W] -> [..., H, W, C]
        if leaf.name in self.stats:
            mean, std = self.stats[leaf.name]
            clip = self.config.obs_clip
            x = tf.clip_by_value((x - mean) / std, -clip, clip)
        if leaf.kind == "vector":
            return x
        lead = tf.shape(x)[:-3]
        torso = self.torsos.get(leaf.name)
        if torso is None:  # network.encoder=flat: the pixels as one vector
            return tf.reshape(x, tf.concat([lead, [leaf.width]], 0))
        y = torso(tf.reshape(x, [-1, *leaf.image_shape]))  # [N, F]
        return tf.reshape(y, tf.concat([lead, [torso.output_dim]], 0))

    def features(self, inputs: Inputs | tf.Tensor) -> tf.Tensor:
        """The joined leaf features and extras, before the dense layers: ``[..., feature_dim]``."""
        if not isinstance(inputs, dict):  # a plain tensor: the single flat leaf "obs"
            inputs = {"obs": inputs}
        parts = [self.leaf_features(leaf, inputs[leaf.name]) for leaf in self.observation]
        if self.extras_dim:
            parts.append(tf.cast(inputs["extras"], tf.float32))
        return parts[0] if len(parts) == 1 else tf.concat(parts, axis=-1)

    def call(self, inputs: Inputs | tf.Tensor) -> tf.Tensor:
        """Leaves ``[..., *shape]`` and extras ``[..., X]`` -> ``[..., H]``."""
        x = self.features(inputs)
        for layer in self.pre:
            x = layer(x)
        return x

    def encode_spans(self, inputs: Inputs | tf.Tensor, spans: list[tuple[int, int]]) -> list[tf.Tensor]:
        """Steps ``[a, b)`` of leaves ``[B, L, ...]`` for each span, each encoded on its own:
        ``[B, b - a, H]``. A span whose outputs take no gradient (R2D2's burn-in and n-step tail)
        then adds no work to the backward pass."""
        if not isinstance(inputs, dict):
            inputs = {"obs": inputs}
        return [self({k: v[:, a:b] for k, v in inputs.items()}) for a, b in spans]


class NumpyEncoder:
    """:class:`Encoder` in numpy, one step for a batch of envs: leaves ``[B, *shape]`` and extras
    ``[B, X]`` -> ``[B, H]``.

    Call :meth:`sync` after the learner changes the weights or the statistics.
    """

    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.observation = encoder.observation
        self.extras_dim = encoder.extras_dim
        self.clip = encoder.config.obs_clip
        self.pool = {name: torso.spec.pool for name, torso in encoder.torsos.items()}
        self.sync()

    def sync(self) -> None:
        """Copy the current weights and statistics out of the Keras encoder."""
        enc = self.encoder
        self.stats = {k: (np.asarray(m), np.asarray(s)) for k, (m, s) in enc.stats.items()}
        self.torsos = {name: numpy_torso(torso) for name, torso in enc.torsos.items()}
        self.pre = [numpy_dense_relu(layer) for layer in enc.pre]

    def leaf_features(self, leaf: Leaf, x: np.ndarray) -> np.ndarray:
        """One leaf ``[B, *leaf.shape]`` -> ``[B, W]`` float32."""
        x = np.asarray(x)
        if leaf.kind == "discrete":
            return np.eye(leaf.sizes[0], dtype=np.float32)[x.astype(np.int64) - leaf.starts[0]]
        if leaf.kind == "multi_discrete":
            out = np.zeros((len(x), leaf.width), np.float32)
            offsets = np.concatenate([[0], np.cumsum(leaf.sizes)[:-1]]) - np.asarray(leaf.starts)
            np.put_along_axis(out, x.astype(np.int64) + offsets, 1.0, axis=1)
            return out
        x = x.astype(np.float32)
        if leaf.kind == "multi_binary":
            return x
        if leaf.kind == "image":
            x = x[..., None] if len(leaf.shape) == 2 else np.moveaxis(x, 1, -1) if leaf.channels_first else x
        if leaf.name in self.stats:
            mean, std = self.stats[leaf.name]
            x = np.clip((x - mean) / std, -self.clip, self.clip)
        if leaf.kind == "vector":
            return x
        if leaf.name not in self.torsos:
            return x.reshape(len(x), -1)
        return numpy_torso_step(self.torsos[leaf.name], self.pool[leaf.name], x)

    def step(self, inputs: dict[str, np.ndarray] | np.ndarray) -> np.ndarray:
        """Leaves (a dict, or the single flat ``obs`` array) and ``extras`` -> ``[B, H]`` float32."""
        if not isinstance(inputs, dict):
            inputs = {"obs": inputs}
        parts = [self.leaf_features(leaf, inputs[leaf.name]) for leaf in self.observation]
        if self.extras_dim:
            parts.append(np.asarray(inputs["extras"], np.float32))
        x = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        for weights in self.pre:
            x = numpy_dense_relu_step(weights, x)
        return x
