"""The shared encoder: one encoder per observation leaf kind, the dense stack, and the numpy mirror
that acting uses (same values as the TF encoder to float32 round-off)."""

from __future__ import annotations

import gymnasium as gym
import keras
import numpy as np
import pytest
import tensorflow as tf

from agents import kernels
from agents.encoder import Encoder, NumpyEncoder
from agents.networks import NetworkConfig
from agents.normalizer import ObsNormalizer
from agents.torso import ConvTorso, numpy_torso, numpy_torso_step, torso_spec
from envs.spaces import observation_leaves

SPACES = {
    "vector": gym.spaces.Box(-1, 1, (5,), np.float32),
    "discrete": gym.spaces.Discrete(4, start=2),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 3, 4], start=[0, 1, -1]),
    "multi_binary": gym.spaces.MultiBinary(3),
    "multi_binary_2d": gym.spaces.MultiBinary([2, 3]),  # stored and encoded as 6 flat bits
    "image_hwc": gym.spaces.Box(0, 255, (7, 7, 3), np.uint8),
    "image_chw": gym.spaces.Box(0, 255, (2, 9, 9), np.uint8),
    "image_gray": gym.spaces.Box(0, 255, (8, 8), np.uint8),
    "dict": gym.spaces.Dict(
        {"image": gym.spaces.Box(0, 10, (7, 7, 3), np.uint8), "direction": gym.spaces.Discrete(4)}
    ),
    "tuple": gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-2, 2, (2,), np.float32))),
}


def _encoder(space: gym.spaces.Space, **network) -> Encoder:
    config = NetworkConfig(obs_clip=2.0, backend="graph", **network)
    encoder = Encoder(config, observation_leaves(space), 2, kernels.for_network(config), normalize=True)
    with keras.name_scope("net"):
        encoder.build()
    return encoder


def _batch(space: gym.spaces.Space, n: int, seed: int) -> dict[str, np.ndarray]:
    """``n`` samples of ``space`` as leaves ``{name: [n, ...]}``, plus extras ``[n, 2]``."""
    from envs.spaces import split_obs

    space.seed(seed)
    samples = [space.sample() for _ in range(n)]
    leaves = observation_leaves(space)
    stacked = gym.vector.utils.concatenate(space, samples, gym.vector.utils.create_empty_array(space, n=n))
    batch = split_obs(stacked, leaves)
    batch["extras"] = np.random.default_rng(seed).normal(size=(n, 2)).astype(np.float32)
    return batch


@pytest.mark.parametrize("kind", sorted(SPACES))
@pytest.mark.parametrize("layer_norm", [False, True])
def test_every_leaf_encoder_and_its_numpy_mirror_agree(kind: str, layer_norm: bool) -> None:
    """Statistics that differ from the identity, then the TF encoder on ``[B, T, ...]`` and the numpy
    mirror on ``[B, ...]`` give the same features for every observation kind."""
    space = SPACES[kind]
    encoder = _encoder(space, pre_layers=[8], layer_norm=layer_norm)
    norm = ObsNormalizer(encoder.observation)
    for seed in range(3):
        norm.update(_batch(space, 16, seed))
    norm.push([type("Net", (), {"encoder": encoder})()])
    batch = _batch(space, 6, seed=7)
    ours = encoder({k: tf.constant(v[:, None]) for k, v in batch.items()})[:, 0].numpy()  # [B, H]
    assert ours.shape == (6, 8) and encoder.output_dim == 8
    np.testing.assert_allclose(NumpyEncoder(encoder).step(batch), ours, rtol=1e-5, atol=1e-5)


def test_feature_widths_and_values_of_the_discrete_encoders() -> None:
    """One-hot (with the space's start removed), concatenated one-hots, and bits as floats; the
    extras come last."""
    space = gym.spaces.Tuple((SPACES["discrete"], SPACES["multi_discrete"], SPACES["multi_binary"]))
    encoder = _encoder(space, pre_layers=[])
    batch = {
        "obs.0": np.array([2, 5]),
        "obs.1": np.array([[0, 1, -1], [1, 3, 2]]),
        "obs.2": np.array([[1, 0, 1], [0, 0, 0]], np.int8),
        "extras": np.array([[0.5, -0.5], [1.0, 2.0]], np.float32),
    }
    expected = np.array(
        [
            [1, 0, 0, 0] + [1, 0] + [1, 0, 0] + [1, 0, 0, 0] + [1, 0, 1] + [0.5, -0.5],
            [0, 0, 0, 1] + [0, 1] + [0, 0, 1] + [0, 0, 0, 1] + [0, 0, 0] + [1.0, 2.0],
        ],
        np.float32,
    )
    assert encoder.feature_dim == expected.shape[1]
    tf_out = encoder({k: tf.constant(v) for k, v in batch.items()}).numpy()
    np.testing.assert_array_equal(tf_out, expected)
    np.testing.assert_array_equal(NumpyEncoder(encoder).step(batch), expected)


def test_image_statistics_are_per_channel_and_the_torso_reads_hwc() -> None:
    """A CHW image is normalised per channel over all pixels and moved to HWC before the torso:
    the same pixels given as HWC to an HWC encoder with the same weights give the same features."""
    chw = SPACES["image_chw"]
    hwc = gym.spaces.Box(0, 255, (9, 9, 2), np.uint8)
    enc_chw, enc_hwc = _encoder(chw, pre_layers=[6]), _encoder(hwc, pre_layers=[6])
    leaf = enc_chw.observation[0]
    assert leaf.channels_first and leaf.image_shape == (9, 9, 2)
    assert enc_chw.stats[leaf.name][0].shape == (2,)
    for a, b in zip(enc_chw.weights, enc_hwc.weights, strict=True):
        b.assign(a)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (5, 2, 9, 9)).astype(np.uint8)
    x[:, 1] //= 8  # channel 1 much darker: different statistics per channel
    norm = ObsNormalizer(enc_chw.observation)
    norm.update({"obs": x})
    moments = norm.moments["obs"]
    np.testing.assert_allclose(moments.mean, x.astype(np.float64).mean(axis=(0, 2, 3)))
    norm.push([type("Net", (), {"encoder": enc_chw})(), type("Net", (), {"encoder": enc_hwc})()])
    a = enc_chw({"obs": tf.constant(x), "extras": tf.zeros([5, 2])}).numpy()
    b = enc_hwc({"obs": tf.constant(x.transpose(0, 2, 3, 1)), "extras": tf.zeros([5, 2])}).numpy()
    np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "first"),
    [
        ((7, 7, 3), False),
        ((7, 7, 20), False),  # MiniGrid's one-hot view: more channels than rows
        ((20, 7, 7), True),
        ((84, 84, 1), False),
        ((4, 84, 84), True),
        ((210, 160, 3), False),
        ((3, 210, 160), True),
    ],
)
def test_image_channels_beside_a_square_pair_else_the_smaller_end(shape: tuple, first: bool) -> None:
    (leaf,) = observation_leaves(gym.spaces.Box(0, 255, shape, np.uint8))
    assert leaf.channels_first is first
    assert leaf.image_shape == ((*shape[1:], shape[0]) if first else shape)


@pytest.mark.parametrize(
    ("preset", "shape", "features"),
    [("minigrid", (7, 7, 3), 64), ("nature", (84, 84, 1), 3136), ("minigrid", (12, 10, 3), 3 * 2 * 64)],
)
def test_conv_torso_sizes_and_numpy_mirror(preset: str, shape: tuple, features: int) -> None:
    torso = ConvTorso(torso_spec(preset, [], [], []), "torso")
    torso.build((None, *shape))
    assert torso.output_dim == features
    x = np.random.default_rng(1).normal(size=(3, *shape)).astype(np.float32)
    ours = torso(tf.constant(x)).numpy()
    assert ours.shape == (3, features)
    mirror = numpy_torso_step(numpy_torso(torso), torso.spec.pool, x)
    np.testing.assert_allclose(mirror, ours, rtol=1e-4, atol=1e-4)


def test_custom_torso_lists_and_flat_encoder() -> None:
    """network.cnn_* replace the preset's lists; network.encoder=flat feeds the pixels as a vector."""
    encoder = _encoder(SPACES["image_hwc"], cnn_channels=[4, 5], cnn_kernels=[2, 3], cnn_strides=[1, 1])
    torso = encoder.torsos["obs"]
    assert [c.filters for c in torso.convs] == [4, 5]
    assert torso.output_dim == 5  # 7x7 -> conv 2: 6x6 -> pool: 3x3 -> conv 3: 1x1
    flat = _encoder(SPACES["image_hwc"], encoder="flat", pre_layers=[])
    assert not flat.torsos and flat.feature_dim == 7 * 7 * 3 + 2
    with pytest.raises(ValueError, match="too small"):
        _encoder(gym.spaces.Box(0, 255, (4, 4, 3), np.uint8), cnn="nature")


def test_normalize_obs_false_has_no_statistics() -> None:
    encoder = _encoder(SPACES["dict"], normalize_obs=False)
    assert not encoder.stats and not any("_mean" in v.path for v in encoder.variables)
    batch = _batch(SPACES["dict"], 3, seed=0)
    tf_out = encoder({k: tf.constant(v) for k, v in batch.items()}).numpy()
    np.testing.assert_allclose(NumpyEncoder(encoder).step(batch), tf_out, rtol=1e-5, atol=1e-5)


def test_flat_vector_keeps_its_variable_names() -> None:
    """A flat Box observation keeps ``input_mean``/``input_std`` (runs written before other leaf
    kinds existed load unchanged); other leaves are named after their path."""
    flat = _encoder(SPACES["vector"])
    paths = {v.path for v in flat.non_trainable_variables}
    assert paths == {"net/encoder/input_mean", "net/encoder/input_std"}
    tree = _encoder(SPACES["dict"])
    names = {v.path for v in tree.non_trainable_variables}
    assert names == {"net/encoder/obs_image_mean", "net/encoder/obs_image_std"}
