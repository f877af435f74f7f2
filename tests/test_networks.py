"""Recurrent cores: shapes, step-by-step == full unroll, resets, Keras-compatible weights."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from agents import sequence_kernels
from agents.networks import NetworkConfig, NumpyNetwork, RecurrentNetwork, flat_state, split_state

CASES = [("lstm", True), ("gru", True), ("gru", False), ("lstm_peephole", True), ("mlp", True)]
B, T, F, A = 3, 7, 5, 4


def _net(cell: str, reset_after: bool, name: str = "online_q", units: int = 6) -> RecurrentNetwork:
    cfg = NetworkConfig(cell=cell, units=units, pre_layers=[8], post_layers=[8], reset_after=reset_after)
    net = RecurrentNetwork(cfg, F, A, name=name)
    # Non-zero peepholes so the test exercises them (they start at zero).
    for v in net.trainable_variables:
        if "peephole" in v.path:
            v.assign(np.linspace(-0.5, 0.5, v.shape[0]).astype(np.float32))
    return net


def _inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(B, T, F)).astype(np.float32)
    first = np.zeros((B, T), np.float32)
    first[1, 3] = 1.0
    return x, first


def _numpy_unroll(net: RecurrentNetwork, x: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The numpy acting mirror stepped over ``x`` ``[B, T, F]``: ``[B, T, A]``."""
    mirror = NumpyNetwork(net)
    state, outs = mirror.initial_state(B), []
    for t in range(T):
        state = tuple(s * (1.0 - first[:, t, None]) for s in state)
        o, state = mirror.step(x[:, t], state)
        outs.append(o)
    return np.stack(outs, 1)


@pytest.mark.parametrize(("cell", "reset_after"), CASES)
def test_shapes(cell: str, reset_after: bool) -> None:
    net = _net(cell, reset_after)
    x, first = _inputs()
    out, state = net.unroll(tf.constant(x), net.initial_state(B), tf.constant(first))
    assert out.shape == (B, T, A)
    assert tuple(s.shape for s in state) == tuple((B, u) for u in net.state_sizes)
    assert net.state_sizes == {"lstm": (6, 6), "lstm_peephole": (6, 6), "gru": (6,), "mlp": ()}[cell]


@pytest.mark.parametrize(("cell", "reset_after"), CASES)
def test_step_by_step_equals_full_unroll(cell: str, reset_after: bool) -> None:
    """TF one step at a time, and the numpy actor mirror, both match the full sequence unroll."""
    net = _net(cell, reset_after)
    x, first = _inputs()
    full, final = net.unroll(tf.constant(x), net.initial_state(B), tf.constant(first))
    state, outs = net.initial_state(B), []
    for t in range(T):
        o, state = net.unroll(tf.constant(x[:, t : t + 1]), state, tf.constant(first[:, t : t + 1]))
        outs.append(o[:, 0])
    np.testing.assert_allclose(np.stack(outs, 1), full, atol=1e-5)
    for a, b in zip(state, final, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    np.testing.assert_allclose(_numpy_unroll(net, x, first), full, atol=1e-5)


@pytest.mark.parametrize(("cell", "reset_after"), CASES[:4])
def test_reset_zeroes_state(cell: str, reset_after: bool) -> None:
    """After a first flag, outputs equal a fresh unroll from zeros of the remaining inputs."""
    net = _net(cell, reset_after)
    x, _ = _inputs()
    first = np.zeros((B, T), np.float32)
    first[:, 4] = 1.0
    warm = tuple(tf.ones([B, u]) for u in net.state_sizes)
    out, _ = net.unroll(tf.constant(x), warm, tf.constant(first))
    fresh, _ = net.unroll(tf.constant(x[:, 4:]), net.initial_state(B), tf.zeros([B, T - 4]))
    np.testing.assert_allclose(out[:, 4:], fresh, atol=1e-6)
    assert not np.allclose(
        out[:, :4], net.unroll(tf.constant(x[:, :4]), net.initial_state(B), tf.zeros([B, 4]))[0]
    )


@pytest.mark.parametrize(("cell", "reset_after"), [("lstm", True), ("gru", True), ("gru", False)])
def test_core_matches_keras_layer(cell: str, reset_after: bool) -> None:
    """Weights use Keras' own layouts: the core equals keras.layers.LSTM/GRU given its weights."""
    cfg = NetworkConfig(cell=cell, units=6, pre_layers=[], reset_after=reset_after)
    net = RecurrentNetwork(cfg, F, A, name="online_q")
    x, _ = _inputs()
    ours, _ = sequence_kernels.unroll(net.core, tf.constant(x), net.initial_state(B), tf.zeros([B, T]))
    if cell == "lstm":
        layer = keras.layers.LSTM(6, return_sequences=True)
    else:
        layer = keras.layers.GRU(6, return_sequences=True, reset_after=reset_after)
    layer.build((None, T, F))
    layer.set_weights(
        [np.asarray(w) for w in (net.core.cell.kernel, net.core.cell.recurrent_kernel, net.core.cell.bias)]
    )
    np.testing.assert_allclose(ours, layer(x), atol=1e-5)


@pytest.mark.parametrize(
    ("cell", "backend"),
    [
        pytest.param("lstm", "native", marks=pytest.mark.native),
        ("lstm", "graph"),
        ("gru", "graph"),
        ("gru", "scan"),
    ],
)
def test_trained_core_weights_load_into_keras(cell: str, backend: str) -> None:
    """After training steps through the chosen kernel, the core's weights (Keras layouts) load into
    keras.layers.LSTM / GRU unchanged and give the same outputs."""
    cfg = NetworkConfig(cell=cell, units=6, pre_layers=[], backend=backend)
    net = RecurrentNetwork(cfg, F, A, name="online_q")
    assert net.kernels.recurrence == backend
    x, first = _inputs()
    target = tf.constant(np.random.default_rng(1).normal(size=(B, T, 6)).astype(np.float32))
    weights = net.core.trainable_variables
    before = [np.asarray(w) for w in weights]
    optimizer = keras.optimizers.Adam(0.05)
    for _ in range(3):
        with tf.GradientTape() as tape:
            out, _ = sequence_kernels.unroll(
                net.core, tf.constant(x), net.initial_state(B), tf.constant(first)
            )
            loss = tf.reduce_mean((out - target) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, weights), weights, strict=True))
    assert all(not np.allclose(a, np.asarray(w)) for a, w in zip(before, weights, strict=True))
    layer_cls = keras.layers.LSTM if cell == "lstm" else keras.layers.GRU
    layer = layer_cls(6, return_sequences=True)
    layer.build((None, T, F))
    layer.set_weights([np.asarray(w) for w in weights])
    ours, _ = sequence_kernels.unroll(net.core, tf.constant(x), net.initial_state(B), tf.zeros([B, T]))
    np.testing.assert_allclose(ours, layer(x), atol=1e-5)


def test_flat_state_round_trip() -> None:
    h, c = np.ones((2, 3), np.float32), np.full((2, 3), 2.0, np.float32)
    flat = flat_state((h, c), 2)
    assert flat.shape == (2, 6)
    back = split_state(flat, (3, 3))
    np.testing.assert_array_equal(back[0], h)
    np.testing.assert_array_equal(back[1], c)
    assert flat_state((), 2).shape == (2, 0) and split_state(np.zeros((2, 0)), ()) == ()


def test_variable_paths_are_scoped_by_model_name() -> None:
    a, b = _net("lstm", True, "online_q"), _net("lstm", True, "target_q")
    rel = lambda net: [v.path.split("/", 1)[1] for v in net.trainable_variables]  # noqa: E731
    assert rel(a) == rel(b)
    assert all(v.path.startswith("online_q/") for v in a.trainable_variables)


def test_running_normalizer_matches_batch_statistics_and_both_paths_apply_it() -> None:
    from agents.normalizer import ObsNormalizer

    rng = np.random.default_rng(1)
    data = rng.normal(loc=[0.0, 3.0, -1.0, 0.0, 2.0], scale=[0.01, 2.0, 0.5, 1.0, 0.1], size=(300, F))
    norm = ObsNormalizer(F)
    for chunk in np.array_split(data, 7):
        norm.update(chunk)
    moments = norm.moments["obs"]
    np.testing.assert_allclose(moments.mean, data.mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(moments.std, np.maximum(data.std(0), 1e-2), rtol=1e-9)
    cfg = NetworkConfig(cell="lstm", units=6, pre_layers=[8])
    net = RecurrentNetwork(cfg, F, A, name="online_q", normalize=True)
    x, first = _inputs()
    before, _ = net.unroll(tf.constant(x), net.initial_state(B), tf.constant(first))
    norm.push([net])
    after, _ = net.unroll(tf.constant(x), net.initial_state(B), tf.constant(first))
    assert not np.allclose(before, after)
    scaled = np.clip((x - moments.mean) / moments.std, -5, 5).astype(np.float32)
    plain = RecurrentNetwork(
        NetworkConfig(cell="lstm", units=6, pre_layers=[8], normalize_obs=False), F, A, name="online_q2"
    )
    for v, w in zip(plain.trainable_variables, net.trainable_variables, strict=True):
        v.assign(w)
    np.testing.assert_allclose(
        after, plain.unroll(tf.constant(scaled), plain.initial_state(B), tf.constant(first))[0], atol=1e-5
    )
    mirror, state, outs = NumpyNetwork(net), None, []
    state = mirror.initial_state(B)
    for t in range(T):
        state = tuple(s * (1.0 - first[:, t, None]) for s in state)
        o, state = mirror.step(x[:, t], state)
        outs.append(o)
    np.testing.assert_allclose(np.stack(outs, 1), after, atol=1e-5)


def test_layer_norm_matches_keras_and_the_numpy_mirror() -> None:
    """network.layer_norm: relu(LayerNorm(dense(x))) in TF equals keras.layers.LayerNormalization
    and the numpy acting mirror; the LayerNorm weights are trainable and pair by path."""
    cfg = NetworkConfig(cell="lstm", units=6, pre_layers=[8], post_layers=[8], layer_norm=True)
    net = RecurrentNetwork(cfg, F, A, name="online_q")
    paths = [v.path for v in net.trainable_variables]
    assert "online_q/encoder/pre_0/ln_gamma" in paths and "online_q/post_0/ln_beta" in paths
    layer = net.encoder.pre[0]
    layer.ln_gamma.assign(np.linspace(0.5, 1.5, 8).astype(np.float32))
    layer.ln_beta.assign(np.linspace(-0.2, 0.2, 8).astype(np.float32))
    x, first = _inputs()
    ref = keras.layers.LayerNormalization(epsilon=1e-3)
    ref.build((None, 8))
    ref.set_weights([np.asarray(layer.ln_gamma), np.asarray(layer.ln_beta)])
    dense = tf.matmul(tf.constant(x), layer.kernel) + layer.bias
    np.testing.assert_allclose(layer(tf.constant(x)), tf.nn.relu(ref(dense)), atol=1e-5)
    full, _ = net.unroll(tf.constant(x), net.initial_state(B), tf.constant(first))
    np.testing.assert_allclose(_numpy_unroll(net, x, first), full, atol=1e-5)


def test_numpy_mirror_copies_the_weights_at_the_next_step_after_sync() -> None:
    net = _net("lstm", True)
    x, _ = _inputs()
    mirror = NumpyNetwork(net)
    state = mirror.initial_state(B)
    before, _ = mirror.step(x[:, 0], state)
    net.set_weights([w + 0.1 for w in net.get_weights()])
    unchanged, _ = mirror.step(x[:, 0], state)  # no sync: the old copy acts
    np.testing.assert_array_equal(unchanged, before)
    mirror.sync()
    after, _ = mirror.step(x[:, 0], state)
    fresh, _ = NumpyNetwork(net).step(x[:, 0], state)
    np.testing.assert_array_equal(after, fresh)
    assert not np.allclose(after, before)
