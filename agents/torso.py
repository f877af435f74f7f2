"""Convolutional torso for image observation leaves, and its numpy mirror for acting.

::

    x  [N, H, W, C] float (normalised per channel by the encoder)
    x <- relu(conv_i(x))          i = 0..k-1, "valid" padding; minigrid max-pools 2x2 after conv_0
    out = flatten(x)              [N, F]

Presets (``network.cnn``): ``minigrid`` is the small torso used for MiniGrid's 7x7x3 egocentric view
(16, 32, 64 channels of 2x2 kernels, stride 1, one 2x2 max-pool): 64 features; ``nature`` is the DQN
torso (Mnih et al. 2015: 32 8x8/4, 64 4x4/2, 64 3x3/1): 3136 features on 84x84 frames, its 512-unit
dense layer being the encoder's first ``network.pre_layers`` width. ``network.cnn_channels``,
``cnn_kernels`` and ``cnn_strides`` replace the preset's lists.
"""

from __future__ import annotations

from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

CNN_PRESETS = {
    "minigrid": ((16, 32, 64), (2, 2, 2), (1, 1, 1), True),
    "nature": ((32, 64, 64), (8, 4, 3), (4, 2, 1), False),
}


@dataclass(frozen=True)
class TorsoSpec:
    """Channels, square kernel sizes and strides per conv layer; ``pool``: 2x2 max-pool after the first."""

    channels: tuple[int, ...]
    kernels: tuple[int, ...]
    strides: tuple[int, ...]
    pool: bool

    def output_hw(self, height: int, width: int) -> tuple[int, int]:
        """Spatial size after the torso (``(0, 0)`` or less if the image is too small)."""
        for i, (k, s) in enumerate(zip(self.kernels, self.strides, strict=True)):
            height, width = (height - k) // s + 1, (width - k) // s + 1
            if i == 0 and self.pool:
                height, width = height // 2, width // 2
        return height, width


def torso_spec(preset: str, channels: list[int], kernels: list[int], strides: list[int]) -> TorsoSpec:
    """The preset's torso with any of its lists replaced (lists must then have one entry per layer)."""
    base_c, base_k, base_s, pool = CNN_PRESETS[preset]
    c = tuple(channels) or base_c
    k = tuple(kernels) or base_k
    s = tuple(strides) or base_s
    return TorsoSpec(tuple(map(int, c)), tuple(map(int, k)), tuple(map(int, s)), pool)


class ConvTorso(keras.layers.Layer):
    """``[N, H, W, C]`` -> ``[N, F]``: ReLU conv layers named ``<name>/conv_<i>``."""

    def __init__(self, spec: TorsoSpec, name: str) -> None:
        super().__init__(name=name)
        self.spec = spec
        self.convs = [
            keras.layers.Conv2D(c, k, strides=s, activation="relu", name=f"conv_{i}")
            for i, (c, k, s) in enumerate(zip(spec.channels, spec.kernels, spec.strides, strict=True))
        ]
        self.output_dim = 0
        self.flops = 0  # multiply-adds x 2 of one image through the convs

    def build(self, input_shape: tuple[int | None, ...]) -> None:
        _, h, w, c = input_shape
        height, width = self.spec.output_hw(int(h), int(w))
        if height < 1 or width < 1:
            raise ValueError(f"image {h}x{w} is too small for the conv torso {self.spec}")
        shape = (None, int(h), int(w), int(c))
        for i, conv in enumerate(self.convs):
            conv.build(shape)
            cin = shape[3]
            shape = conv.compute_output_shape(shape)
            self.flops += 2 * shape[1] * shape[2] * conv.kernel_size[0] * conv.kernel_size[1] * cin * shape[3]
            if i == 0 and self.spec.pool:
                shape = (None, shape[1] // 2, shape[2] // 2, shape[3])
        self.output_dim = int(height * width * self.spec.channels[-1])
        self.built = True

    def call(self, x: tf.Tensor) -> tf.Tensor:
        """``[N, H, W, C]`` float32 -> ``[N, F]``."""
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if i == 0 and self.spec.pool:
                x = tf.nn.max_pool2d(x, 2, 2, "VALID")
        return tf.reshape(x, [tf.shape(x)[0], self.output_dim])


def numpy_torso(torso: ConvTorso) -> list[tuple[np.ndarray, np.ndarray, int]]:
    """A :class:`ConvTorso`'s weights for :func:`numpy_torso_step`: (kernel, bias, stride) per layer."""
    return [
        (np.asarray(c.kernel), np.asarray(c.bias), s)
        for c, s in zip(torso.convs, torso.spec.strides, strict=True)
    ]


def numpy_torso_step(
    layers: list[tuple[np.ndarray, np.ndarray, int]], pool: bool, x: np.ndarray
) -> np.ndarray:
    """numpy :class:`ConvTorso`: ``[N, H, W, C] -> [N, F]`` (im2col and one matmul per layer)."""
    for i, (kernel, bias, stride) in enumerate(layers):
        x = np.maximum(_conv2d(x, kernel, stride) + bias, 0.0)
        if i == 0 and pool:
            n, h, w, c = x.shape
            x = x[:, : h // 2 * 2, : w // 2 * 2].reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))
    return x.reshape(len(x), -1)


def _conv2d(x: np.ndarray, kernel: np.ndarray, stride: int) -> np.ndarray:
    """'valid' convolution: ``x`` ``[N, H, W, C]``, ``kernel`` ``[k, k, C, F]`` -> ``[N, Ho, Wo, F]``."""
    kh, kw, c, f = kernel.shape
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))  # [N, H', W', C, kh, kw]
    windows = windows[:, ::stride, ::stride]
    n, ho, wo = windows.shape[:3]
    cols = windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * ho * wo, kh * kw * c)
    return (cols @ kernel.reshape(kh * kw * c, f)).reshape(n, ho, wo, f)
