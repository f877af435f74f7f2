"""The shared encoder: normalisation of the observation part, the dense stack, and its numpy mirror."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from agents import kernels
from agents.encoder import Encoder, NumpyEncoder
from agents.networks import NetworkConfig


@pytest.mark.parametrize("layer_norm", [False, True])
@pytest.mark.parametrize("pre_layers", [[], [8, 5]])
def test_encoder_and_numpy_mirror_agree(layer_norm: bool, pre_layers: list[int]) -> None:
    config = NetworkConfig(pre_layers=pre_layers, layer_norm=layer_norm, obs_clip=2.0, backend="graph")
    encoder = Encoder(config, input_dim=5, norm_dim=3, choice=kernels.for_network(config))
    encoder.build()
    encoder.input_mean.assign([1.0, -1.0, 0.5])
    encoder.input_std.assign([2.0, 0.5, 1.0])
    x = np.random.default_rng(0).normal(scale=3.0, size=(4, 5)).astype(np.float32)  # [B, F]
    ours = encoder(tf.constant(x[:, None]))[:, 0].numpy()  # [B, 1, F] -> [B, H]
    assert ours.shape == (4, encoder.output_dim) and encoder.output_dim == (pre_layers or [5])[-1]
    np.testing.assert_allclose(NumpyEncoder(encoder).step(x), ours, atol=1e-5)
    # The normalisation alone: the observation part scaled and clipped, the extras untouched.
    z = encoder.normalize(tf.constant(x)).numpy()
    expected = np.clip((x[:, :3] - [1.0, -1.0, 0.5]) / [2.0, 0.5, 1.0], -2.0, 2.0)
    np.testing.assert_allclose(z[:, :3], expected, atol=1e-6)
    np.testing.assert_array_equal(z[:, 3:], x[:, 3:])


def test_normalize_obs_false_has_no_statistics() -> None:
    config = NetworkConfig(normalize_obs=False, backend="graph")
    encoder = Encoder(config, input_dim=3, norm_dim=3, choice=kernels.for_network(config))
    encoder.build()
    assert encoder.norm_dim == 0 and not any("input_mean" in v.path for v in encoder.variables)
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(NumpyEncoder(encoder).step(x), encoder(tf.constant(x)).numpy(), atol=1e-6)
