"""The fused kernels (native C++ ops, agents/sequence_kernels.py graph) equal the reference tf.scan path."""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from agents import kernels, native, sequence_kernels
from agents.networks import NetworkConfig, RecurrentNetwork
from agents.rdqn import RDQNConfig, RDQNLearner

B, T, F, A = 3, 7, 5, 4


@contextlib.contextmanager
def kernel(net, name: str):
    """Trace the enclosed unrolls of ``net`` with its recurrence set to ``name``."""
    old, net.core.recurrence = net.core.recurrence, name
    try:
        yield
    finally:
        net.core.recurrence = old


FUSED = [pytest.param("lstm", "native", marks=pytest.mark.native), ("lstm", "graph"), ("gru", "graph")]


def _case(cell: str, seed: int = 0):
    net = RecurrentNetwork(NetworkConfig(cell=cell, units=6, pre_layers=[8], post_layers=[5]), F, A, name="q")
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(B, T, F)).astype(np.float32))
    first = np.zeros((B, T), np.float32)
    first[0, 0] = first[1, 3] = first[2, 6] = 1.0
    state = tuple(tf.constant(rng.normal(size=(B, u)).astype(np.float32)) for u in net.state_sizes)
    weights = tf.constant(rng.normal(size=(B, T, A)).astype(np.float32))
    return net, x, tf.constant(first), state, weights


def _values_and_grads(net, x, first, state, weights, compiled: bool) -> list[np.ndarray]:
    def run(x, state):
        with tf.GradientTape() as tape:
            tape.watch([x, *state])
            out, final = net.unroll(x, state, first)
            # Loss through the outputs and the final state, so every incoming gradient is non-zero.
            loss = tf.reduce_sum(out * weights) + sum(tf.reduce_sum(s * s) for s in final)
        grads = tape.gradient(loss, [*net.trainable_variables, x, *state])
        return [out, *final, *grads]

    fn = tf.function(run) if compiled else run
    return [np.asarray(v) for v in fn(x, state)]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize(("cell", "name"), FUSED)
def test_fused_equals_reference_in_values_and_gradients(cell: str, name: str, compiled: bool) -> None:
    net, x, first, state, weights = _case(cell)
    with kernel(net, name):
        assert sequence_kernels.recurrence_for(net.core, x) == name
        fast = _values_and_grads(net, x, first, state, weights, compiled)
    with kernel(net, "scan"):
        ref = _values_and_grads(net, x, first, state, weights, compiled)
    assert len(fast) == len(ref) == 2 + 2 * len(state) + len(net.trainable_variables)
    for a, b in zip(fast, ref, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)


def test_backend_resolves_once_per_network(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """auto: native for lstm where the ops load and no GPU is visible, else graph (lstm, gru with
    reset_after), else scan; a missing library warns once however many networks are built."""

    def resolve(*args, **kwargs) -> tuple[str, str, str]:
        return dataclasses.astuple(kernels.resolve(*args, **kwargs))  # recurrence, dense, reason

    monkeypatch.setattr(kernels, "gpu_visible", lambda: False)
    monkeypatch.setattr(native, "available", lambda: (True, ""))
    assert resolve("lstm", "auto", layer_norm=True)[:2] == ("native", "native")
    assert resolve("gru", "auto", layer_norm=True)[:2] == ("graph", "native")
    assert resolve("gru", "auto", reset_after=False)[:2] == ("scan", "tf")
    assert resolve("lstm_peephole", "graph")[:2] == ("scan", "tf")
    assert resolve("mlp", "auto", layer_norm=True)[:2] == ("none", "native")
    assert resolve("lstm", "scan", layer_norm=True)[:2] == ("scan", "tf")
    monkeypatch.setattr(kernels, "gpu_visible", lambda: True)  # the native ops are CPU-only
    choice = resolve("lstm", "auto", layer_norm=True)
    assert choice[:2] == ("graph", "tf") and "GPU" in choice[2]
    monkeypatch.setattr(kernels, "gpu_visible", lambda: False)
    monkeypatch.setattr(native, "available", lambda: (False, "no C++ compiler"))
    kernels._warn_once.cache_clear()
    with caplog.at_level("WARNING", logger="agents.kernels"):
        nets = [
            RecurrentNetwork(NetworkConfig(units=4, layer_norm=True), F, A, name=f"q{i}") for i in range(2)
        ]
    assert [dataclasses.astuple(n.kernels)[:2] for n in nets] == [("graph", "tf")] * 2
    assert not any(layer.native for layer in nets[0].encoder.pre)
    assert [r.getMessage() for r in caplog.records].count(
        "network.backend=auto: native ops unavailable (no C++ compiler); using the graph kernel and TF ops"
    ) == 1
    with pytest.raises(ValueError, match="native"):
        RecurrentNetwork(NetworkConfig(cell="gru", units=4, backend="native"), F, A, name="q")


def test_graph_kernel_needs_a_static_length() -> None:
    """The graph kernel unrolls every step in the graph: unknown or long lengths run tf.scan."""
    net = RecurrentNetwork(
        NetworkConfig(cell="lstm", units=4, pre_layers=[], backend="graph"), F, A, name="q"
    )
    assert sequence_kernels.recurrence_for(net.core, tf.zeros([B, T, F])) == "graph"
    too_long = tf.zeros([B, sequence_kernels.MAX_STATIC_STEPS + 1, F])
    assert sequence_kernels.recurrence_for(net.core, too_long) == "scan"
    assert sequence_kernels.recurrence_for(net.core, tf.TensorSpec([B, None, F])) == "scan"

    @tf.function(input_signature=[tf.TensorSpec([B, None, F])])
    def dynamic(x):
        out, _ = net.unroll(x, net.initial_state(B), tf.zeros(tf.shape(x)[:2]))
        return out

    assert dynamic(tf.zeros([B, T, F])).shape == (B, T, A)


@pytest.mark.native
def test_auto_runs_the_native_ops_where_they_load() -> None:
    net = RecurrentNetwork(NetworkConfig(cell="lstm", units=4, pre_layers=[]), F, A, name="q")
    long = tf.zeros([B, sequence_kernels.MAX_STATIC_STEPS + 1, F])
    assert net.kernels.recurrence == sequence_kernels.recurrence_for(net.core, long) == "native"  # any length
    graph = tf.function(net.call).get_concrete_function(tf.TensorSpec([B, T, F])).graph
    assert "RecurrlLstmForward" in {op.type for op in graph.get_operations()}


def _learner_after_updates(updates: int, cell: str, name: str) -> tuple[list[np.ndarray], dict]:
    keras.utils.set_random_seed(3)
    network = NetworkConfig(cell=cell, units=8, pre_layers=[8], backend=name)
    learner = RDQNLearner(RDQNConfig(batch_size=4, n_step=2), network, 3, 2, 2, 5)
    rng = np.random.default_rng(0)
    b, length = 4, learner.seq_len
    first = np.zeros((b, length), np.float32)
    first[1, 4] = 1.0
    batch = {
        "obs": rng.normal(size=(b, length, 3)).astype(np.float32),
        "action": rng.integers(0, 2, (b, length)).astype(np.int32),
        "state": rng.normal(size=(b, learner.state_dim)).astype(np.float32) * 0.1,
        "reward": rng.normal(size=(b, length)).astype(np.float32),
        "terminated": np.zeros((b, length), np.float32),
        "truncated": np.zeros((b, length), np.float32),
        "first": first,
        "valid": np.ones((b, length), np.float32),
    }
    for _ in range(updates):
        metrics = learner.step(batch)
    variables = learner.online_q.trainable_variables + learner.target_q.trainable_variables
    return [np.asarray(v) for v in variables], metrics


@pytest.mark.parametrize(("cell", "name"), FUSED)
def test_learner_updates_match_reference_path(cell: str, name: str) -> None:
    """Three rdqn updates (burn-in, resets, double Q, n_step tail, target EMA) land on the same weights."""
    fast_weights, fast_metrics = _learner_after_updates(3, cell, name)
    ref_weights, ref_metrics = _learner_after_updates(3, cell, "scan")
    for a, b in zip(fast_weights, ref_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    for key in ("loss", "q_mean", "grad_norm", "td_error"):
        np.testing.assert_allclose(fast_metrics[key], ref_metrics[key], rtol=1e-4, atol=1e-5)


def test_backward_transpose_is_materialised_and_exact() -> None:
    """The backward loop's ``U^T`` is exact and built by a 3-D transpose, which Grappler does not
    fold into the following matmul's ``transpose_b`` (a 2-D transpose it would)."""
    from agents.sequence_kernels import _transpose

    rk = tf.constant(np.random.default_rng(0).normal(size=(6, 24)).astype(np.float32))
    np.testing.assert_array_equal(_transpose(rk), tf.transpose(rk))
    graph = tf.function(_transpose).get_concrete_function(tf.TensorSpec([6, 24])).graph
    (transpose,) = [op for op in graph.get_operations() if op.type == "Transpose"]
    assert transpose.inputs[0].shape.rank == 3 and transpose.inputs[1].shape == (3,)


@pytest.mark.parametrize("name", [pytest.param("native", marks=pytest.mark.native), "graph", "scan"])
def test_segments_give_the_values_and_gradients_of_one_unroll(name: str) -> None:
    """rdqn's unroll in segments (burn-in | trace | n-step tail): the same values as one unroll over
    the whole sequence, and the gradients of a loss on the trace equal those of one unroll of trace
    and tail from the burn-in's stopped final state. The tail only feeds an argmax, so stopping the
    state before it changes nothing either."""
    net, x, first, state, weights = _case("lstm")
    burn, trace = 2, 3  # of T = 7 steps; first[2, 6] = 1 falls in the tail

    def segments_and_whole():
        with tf.GradientTape(persistent=True) as tape:
            (_, q_trace, q_tail), _ = net.unroll_segments(x, state, first, (burn, burn + trace))
            q_split = tf.concat([q_trace, q_tail], axis=1)
            _, warm = net.unroll(x[:, :burn], state, first[:, :burn])
            warm = tuple(tf.stop_gradient(s) for s in warm)
            q_whole, _ = net.unroll(x[:, burn:], warm, first[:, burn:])
            # A loss on the trace rows plus an argmax over trace and tail (no gradient), as in rdqn.
            greedy = tf.cast(tf.argmax(q_split, axis=-1), tf.float32)
            w = weights[:, burn : burn + trace]
            loss_split = tf.reduce_sum(q_trace * w) + tf.reduce_sum(greedy)
            loss_whole = tf.reduce_sum(q_whole[:, :trace] * w)
        split = tape.gradient(loss_split, net.trainable_variables)
        whole = tape.gradient(loss_whole, net.trainable_variables)
        return q_split, q_whole, split, whole

    with kernel(net, name):
        q_split, q_whole, split, whole = tf.function(segments_and_whole)()
        full, _ = net.unroll(x, state, first)
    np.testing.assert_allclose(q_split, q_whole, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(q_split, full[:, burn:], rtol=1e-5, atol=2e-6)
    for a, b in zip(split, whole, strict=True):
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6)


def test_empty_segments_are_none() -> None:
    """No burn-in: the first segment is empty and comes back as None; the others keep their rows."""
    net, x, first, state, _ = _case("lstm")
    (none, q_trace, q_tail), final = net.unroll_segments(x, state, first, (0, 4))
    whole, whole_final = net.unroll(x, state, first)
    assert none is None and q_trace.shape[1] == 4 and q_tail.shape[1] == x.shape[1] - 4
    np.testing.assert_allclose(tf.concat([q_trace, q_tail], axis=1), whole, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(final[0], whole_final[0], rtol=1e-5, atol=2e-6)
