"""The native ops (agents/native): LSTM equal to the TF-graph kernel at any length, dense + LayerNorm
+ ReLU equal to the TF layer; built once, optional."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from agents import native, sequence_kernels
from agents.encoder import DenseReLU

ROOT = Path(__file__).resolve().parents[1]


def _inputs(steps: int, batch: int, units: int, features: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    normal = lambda *shape: tf.constant(rng.normal(size=shape).astype(np.float32))  # noqa: E731
    x, kernel, bias = normal(batch, steps, features), normal(features, 4 * units), normal(4 * units)
    keep = tf.constant((rng.random((batch, steps)) > 0.2).astype(np.float32))
    h0, c0 = normal(batch, units), normal(batch, units)
    rk = 0.3 * normal(units, 4 * units)
    w = normal(batch, steps, units)
    return x, kernel, bias, keep, h0, c0, rk, w


def _run(inputs, use_native: bool) -> list[np.ndarray]:
    x, kernel, bias, keep, h0, c0, rk, w = inputs
    with tf.GradientTape() as tape:
        tape.watch([x, kernel, bias, h0, c0, rk])
        hs, h, c = sequence_kernels.lstm_sequence(x, kernel, bias, keep, h0, c0, rk, native=use_native)
        loss = tf.reduce_sum(hs * w) + tf.reduce_sum(h * h) + tf.reduce_sum(tf.sin(c))
    return [np.asarray(v) for v in (hs, h, c, *tape.gradient(loss, [x, kernel, bias, h0, c0, rk]))]


@pytest.mark.parametrize(("steps", "batch", "units"), [(1, 1, 3), (7, 3, 5), (19, 4, 16), (300, 2, 8)])
@pytest.mark.native
def test_native_equals_graph_kernel(steps: int, batch: int, units: int) -> None:
    """Values and all gradients (inputs, input kernel and bias, h0, c0, recurrent kernel), including
    lengths that are not a multiple of the op's kernel-gradient block and one longer than the graph
    kernel's limit."""
    inputs = _inputs(steps, batch, units)
    got = _run(inputs, use_native=True)
    want = _run(inputs, use_native=False)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


@pytest.mark.native
def test_native_runs_with_an_unknown_length() -> None:
    x, kernel, bias, keep, h0, c0, rk, _ = _inputs(6, 2, 4)

    @tf.function(input_signature=[tf.TensorSpec([2, None, 3]), tf.TensorSpec([2, None])])
    def unroll(x, keep):
        return sequence_kernels.lstm_sequence(x, kernel, bias, keep, h0, c0, rk, native=True)[0]

    np.testing.assert_allclose(unroll(x, keep), _run(_inputs(6, 2, 4), False)[0], rtol=2e-5, atol=2e-5)
    assert unroll(x[:, :3], keep[:, :3]).shape == (2, 3, 4)


@pytest.mark.native
def test_the_backward_op_is_deterministic() -> None:
    """Two threads share the backward op's block work; the gradient sums must not depend on which
    thread was free (training is deterministic per seed)."""
    ops = native.load()
    inputs, kernel, bias, keep, h0, c0, rk, dhs = _inputs(43, 8, 16, features=5)
    x = sequence_kernels.project(inputs, kernel, bias)
    _, _, _, cs, act, hm, cm = ops.recurrl_lstm_forward(x, keep, h0, c0, rk)
    saved = (cs, act, cm, hm, inputs, kernel)
    runs = [ops.recurrl_lstm_backward(dhs, h0, c0, keep, rk, *saved) for _ in range(30)]
    for run in runs[1:]:
        for a, b in zip(runs[0], run, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.native
def test_the_op_rejects_inconsistent_shapes() -> None:
    ops = native.load()
    inputs, kernel, bias, keep, h0, c0, rk, _ = _inputs(3, 2, 4)
    x = sequence_kernels.project(inputs, kernel, bias)
    with pytest.raises(tf.errors.InvalidArgumentError, match="4 \\* units"):
        ops.recurrl_lstm_forward(x[:, :, :-1], keep, h0, c0, rk)
    with pytest.raises(tf.errors.InvalidArgumentError, match="h0 and c0"):
        ops.recurrl_lstm_forward(x, keep, h0[:1], c0, rk)
    hs, _, _, cs, act, hm, cm = ops.recurrl_lstm_forward(x, keep, h0, c0, rk)
    with pytest.raises(tf.errors.InvalidArgumentError, match="inconsistent shapes"):
        ops.recurrl_lstm_backward(hs, h0, c0, keep, rk, cs, act, cm, hm, inputs, kernel[:-1])
    # A recurrent kernel with fewer than 4U columns: the op would read and write past its buffers.
    with pytest.raises(tf.errors.InvalidArgumentError, match="rk must be \\[U, 4U\\], got \\[4,15\\]"):
        ops.recurrl_lstm_backward(hs, h0, c0, keep, rk[:, :-1], cs, act, cm, hm, inputs, kernel)
    with pytest.raises(tf.errors.InvalidArgumentError, match="inconsistent shapes"):
        ops.recurrl_lstm_backward(hs, h0, c0, keep[:, :-1], rk, cs, act, cm, hm, inputs, kernel)


@pytest.mark.native
@pytest.mark.parametrize(
    ("lead", "features", "units"), [((5, 3), 2, 8), ((4, 7), 3, 64), ((13,), 16, 5), ((2, 3, 4), 6, 9)]
)
def test_dense_layer_norm_op_equals_the_tf_layer(lead: tuple[int, ...], features: int, units: int) -> None:
    """relu(LayerNorm(x W + b)): the fused op's output and its gradients (input, kernel, bias, scale,
    offset) equal the TF ops', for inputs of rank 2 to 4."""
    rng = np.random.default_rng(1)
    layer = DenseReLU(units, layer_norm=True)
    layer.build((None, features))
    layer.ln_gamma.assign(rng.uniform(0.5, 1.5, units).astype(np.float32))
    layer.ln_beta.assign(rng.normal(0.0, 0.3, units).astype(np.float32))
    layer.bias.assign(rng.normal(0.0, 0.5, units).astype(np.float32))
    x = tf.constant(rng.normal(size=(*lead, features)).astype(np.float32))
    w = tf.constant(rng.normal(size=(*lead, units)).astype(np.float32))
    results = []
    for native_op in (True, False):
        layer.native = native_op

        @tf.function
        def run(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x)
                loss = tf.reduce_sum(y * w)
            grads = tape.gradient(loss, [x, layer.kernel, layer.bias, layer.ln_gamma, layer.ln_beta])
            return [y, *grads]

        # The path that ran: the fused ops each way, or TF's LayerNorm ops and none of ours.
        ops = _op_types(run.get_concrete_function(x).graph)
        assert ("RecurrlDenseLnForward" in ops and "RecurrlDenseLnBackward" in ops) == native_op, ops
        assert ("Rsqrt" in ops) != native_op
        results.append(run(x))
    assert np.count_nonzero(results[0][0]) > 0
    for a, b in zip(*results, strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


@pytest.mark.native
def test_the_dense_op_rejects_inconsistent_shapes() -> None:
    ops = native.load()
    x, w, v = tf.zeros([4, 3]), tf.zeros([3, 5]), tf.zeros([5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="does not match w"):
        ops.recurrl_dense_ln_forward(x[:, :2], w, v, v, v, epsilon=1e-3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="b, gamma and beta"):
        ops.recurrl_dense_ln_forward(x, w, v[:4], v, v, epsilon=1e-3)
    out, yhat, rstd = ops.recurrl_dense_ln_forward(x, w, v, v, v, epsilon=1e-3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="rstd must have"):
        ops.recurrl_dense_ln_backward(out, x, w, v, yhat, rstd[:3], out)
    # No input features: rows are counted by dividing by I, so I = 0 must be refused first.
    empty_x, empty_w = tf.zeros([4, 0]), tf.zeros([0, 5])
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one input feature"):
        ops.recurrl_dense_ln_forward(empty_x, empty_w, v, v, v, epsilon=1e-3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="at least one input feature"):
        ops.recurrl_dense_ln_backward(out, empty_x, empty_w, v, yhat, rstd, out)


def _op_types(graph: tf.Graph) -> set[str]:
    """Op types in ``graph`` (a custom gradient traced in the same function adds its ops here)."""
    return {op.type for op in graph.get_operations()}


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.native
def test_build_is_cached_and_keyed(tmp_path: Path) -> None:
    """A fresh cache builds one library; the next process loads it without building."""
    env = {**os.environ, "RECURRL_CACHE_DIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "2"}
    code = "import logging; logging.basicConfig(level=logging.INFO); from agents import native; native.load()"
    first = _python(code, env)
    assert first.returncode == 0, first.stderr
    assert "building native ops, about 40 s, once per machine" in first.stderr
    assert "built lstm_op.cc dense_op.cc" in first.stderr
    (lib,) = tmp_path.glob("recurrl_ops-tf*.so")
    digest, size = lib.with_name(lib.name + ".sha256").read_text().split()
    assert int(size) == lib.stat().st_size and len(digest) == 64
    second = _python(code, env)
    assert second.returncode == 0 and "built" not in second.stderr
    assert list(tmp_path.glob("*.so")) == [lib]


def test_without_a_compiler_auto_falls_back_and_native_is_refused(tmp_path: Path) -> None:
    """No compiler and no cached library: auto warns once and uses the graph kernel and TF LayerNorm;
    an explicit ``network.backend=native`` fails with a one-line error before anything is written."""
    env = {
        **os.environ,
        "RECURRL_CACHE_DIR": str(tmp_path / "cache"),
        "TMPDIR": str(tmp_path / "tmp"),
        "CXX": "no-such-compiler",
        "PATH": str(tmp_path),  # no c++ or g++ either
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    env.pop("RECURRL_CXX", None)
    (tmp_path / "tmp").mkdir()
    code = (
        "import tensorflow as tf\n"
        "from agents import sequence_kernels\n"
        "from agents.networks import NetworkConfig, RecurrentNetwork\n"
        "cfg = NetworkConfig(units=4, layer_norm=True, post_layers=[4])\n"
        "net = RecurrentNetwork(cfg, 3, 2, name='q')\n"
        "RecurrentNetwork(cfg, 3, 2, name='target_q')\n"
        "k, path = net.kernels, sequence_kernels.recurrence_for(net.core, tf.zeros([2, 5, 3]))\n"
        "print('kernels', k.recurrence, k.dense, path)\n"
        "print('dense native', [layer.native for layer in net.encoder.pre + net.post])\n"
    )
    auto = _python(code, env)
    assert auto.returncode == 0, auto.stderr
    assert "kernels graph tf graph" in auto.stdout and "dense native [False, False]" in auto.stdout
    assert auto.stderr.count("native ops unavailable") == 1, auto.stderr
    assert "native ops unavailable (no C++ compiler: CXX=no-such-compiler not found)" in auto.stderr
    run_dir = tmp_path / "run"
    refused = subprocess.run(
        [sys.executable, "-m", "scripts.train", "network.backend=native", f"run_dir={run_dir}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode != 0
    assert "=native is unavailable here (no C++ compiler" in refused.stderr
    assert not run_dir.exists()


@pytest.mark.native
def test_native_drifts_from_the_reference_no_more_than_the_graph_kernel() -> None:
    """Over 150 rdqn updates round-off compounds; the native kernel must stay as close to the
    tf.scan reference as the graph kernel does (a wrong gradient term would drift much faster)."""
    from tests.test_sequence_kernels import _learner_after_updates

    weights = {name: _learner_after_updates(150, "lstm", name)[0] for name in ("native", "graph", "scan")}

    def drift(name: str) -> float:
        diffs = [np.abs(a - b).mean() for a, b in zip(weights[name], weights["scan"], strict=True)]
        return float(np.mean(diffs))

    assert drift("native") <= 3.0 * max(drift("graph"), 1e-9), (drift("native"), drift("graph"))
