"""The per-step encoder every network starts with, and its numpy mirror for acting.

::

    x_t = [obs_t, extras_t]                          # [B, T, F]: network.inputs adds the extras
    z_t = clip((obs_t - mean) / std, -clip, clip)    # running statistics (agents/normalizer.py)
    e_t = pre_k(... pre_1([z_t, extras_t]))          # [B, T, H]: ReLU dense layers, LayerNorm optional

The Q-network and the actor-critic network both hold one :class:`Encoder` as ``encoder``; the
acting side mirrors it with :class:`NumpyEncoder`, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from agents import kernels
from agents.layers import dense_stack, numpy_dense_relu, numpy_dense_relu_step

if TYPE_CHECKING:
    from agents.networks import NetworkConfig


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
