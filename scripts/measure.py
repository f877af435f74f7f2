"""Timed measurements behind ``python -m scripts.benchmark`` (plain code: no Hydra in here).

Every speed figure is taken next to a reference measured in the same process, in interleaved
rounds, and reported as a median: on a shared or loaded machine absolute rates drift, ratios much
less. Learner rows are built from the real presets (``conf/``) through a ``compose`` callable that
the Hydra entry point passes in.

FLOPs of one learner update are counted from the weight shapes (matmuls only; elementwise ops,
the loss and the optimiser are not counted). A dense or recurrent layer with kernel ``[I, O]``
costs ``2 I O`` per sample and step forward, and twice that backward (input and weight grads)::

    net(step)     = sum over pre/post/head layers of 2 I O + core + torso, core = 2 (F + U) G
                    (G = 4U lstm, 3U gru, U mlp; F = core input width;
                     torso = sum over conv layers of 2 Ho Wo k k Cin Cout, per image leaf)
    rdqn update   = B net (L + L + 2 T)
                    # target over L, online over L (burn-in, trace, n_step tail), backward over the trace
    rddpg update  = B [L (enc_a + pol + enc_c + k qh)                # target actor and critic(s)
                       + burn_in (enc_a + enc_c)                      # online burn-in
                       + 3 T (enc_c + k qh) + 3 T (enc_a + pol) + 2 T qh]   # critic, actor losses

with ``L = burn_in + trace_length + n_step``, ``T = trace_length``, ``k`` critics, ``enc`` the
pre layers plus core, ``pol`` the actor's post layers and head, ``qh`` one critic's post layers and
head (a shared core is counted once). Efficiency is ``FLOPs x updates/s`` over the fp32 GEMM rate
of a large TF matmul measured between the rounds of the same row.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from agents import core, sequence_kernels
from agents.config import Config
from agents.loop import Counters, build_agent
from agents.replay import SequenceReplay
from envs import describe_env
from envs.make import EnvSpec
from scripts.bench_variants import VARIANTS

Compose = Callable[[list[str]], Config]


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def load_1min() -> float:
    return round(os.getloadavg()[0], 2)


class Gemm:
    """fp32 ``[n, n] x [n, n]`` matmuls through TF: the machine's large-matmul rate in GFLOP/s.

    One independent matmul per core in one ``tf.function``, so the rate is the whole machine's
    whatever TF's thread pools are (with one thread per op, as the learner runs, a single matmul
    would use one core; with TF's default pools each matmul is split over all cores).
    """

    def __init__(self, n: int, repeats: int, parallel: int | None = None) -> None:
        self.n, self.repeats = n, repeats
        self.parallel = parallel or len(os.sched_getaffinity(0))
        self.a = [tf.random.stateless_normal([n, n], seed=[1, i]) for i in range(self.parallel)]
        self.fn = tf.function(lambda xs: [tf.matmul(x, x) for x in xs])
        self._run()

    def _run(self) -> None:
        for out in self.fn(self.a):
            out.numpy()

    def sample(self) -> float:
        start = time.perf_counter()
        for _ in range(self.repeats):
            self._run()
        return 2 * self.n**3 * self.parallel * self.repeats / (time.perf_counter() - start) / 1e9


def _dense_flops(layers: list) -> int:
    return sum(2 * int(layer.kernel.shape[0]) * int(layer.kernel.shape[1]) for layer in layers)


def _encoder_flops(encoder) -> int:
    """The dense layers and, per image leaf, its conv torso."""
    return _dense_flops(encoder.pre) + sum(t.flops for t in encoder.torsos.values())


def _core_flops(core: core.RecurrentCore) -> int:
    rows = int(core.cell.kernel.shape[0]) + (0 if core.cell_kind == "mlp" else core.units)
    return 2 * rows * int(core.cell.kernel.shape[1])


def update_flops(learner, batch_size: int) -> int:
    """Matmul FLOPs of one update (formula in the module docstring)."""
    length, bi, tl = learner.seq_len, learner.burn_in, learner.trace_length
    if hasattr(learner, "online_q"):
        q = learner.online_q
        net = _encoder_flops(q.encoder) + _core_flops(q.core) + _dense_flops([*q.post, q.head])
        return batch_size * net * (2 * length + 2 * tl)
    actor, critic = learner.online_actor, learner.online_critic
    enc_a = _encoder_flops(actor.encoder) + _core_flops(actor.core)
    enc_c = 0 if critic is actor else _encoder_flops(critic.encoder) + _core_flops(critic.core)
    pol = _dense_flops([*actor.post, actor.head])
    heads = [_dense_flops([*post, head]) for post, head in zip(critic.q_posts, critic.q_heads, strict=True)]
    qh, k_qh = heads[0], sum(heads)
    per_sample = (
        length * (enc_a + pol + enc_c + k_qh)
        + bi * (enc_a + enc_c)
        + 3 * tl * (enc_c + k_qh)
        + 3 * tl * (enc_a + pol)
        + 2 * tl * qh
    )
    return batch_size * per_sample


def synthetic_batch(learner, spec: EnvSpec, batch_size: int, seed: int) -> dict[str, np.ndarray]:
    """A replay-shaped batch of random rows, with a few episode starts and ends inside."""
    rng = np.random.default_rng(seed)
    b, length = batch_size, learner.seq_len
    out: dict[str, np.ndarray] = {}
    for key, (shape, dtype) in learner.replay_fields().items():
        if key == "action" and spec.discrete:
            out[key] = rng.integers(0, spec.num_actions, (b, length)).astype(dtype)
        elif key == "prev_action" and spec.discrete:  # one-hot
            out[key] = np.eye(spec.num_actions, dtype=dtype)[rng.integers(0, spec.num_actions, (b, length))]
        elif key in ("action", "prev_action"):
            out[key] = rng.uniform(spec.action_low, spec.action_high, (b, length, *shape)).astype(dtype)
        elif np.issubdtype(dtype, np.integer):  # image pixels, discrete observation values
            out[key] = rng.integers(0, 4, (b, length, *shape)).astype(dtype)
        else:
            out[key] = rng.normal(size=(b, length, *shape)).astype(dtype)
    out["state"] = 0.1 * rng.normal(size=(b, learner.state_dim)).astype(np.float32)
    out["reward"] = rng.normal(size=(b, length)).astype(np.float32)
    out["first"] = (rng.random((b, length)) < 0.02).astype(np.float32)
    out["terminated"] = np.roll(out["first"], -1, axis=1) * (rng.random((b, length)) < 0.5)
    out["truncated"] = np.zeros((b, length), np.float32)
    out["valid"] = np.ones((b, length), np.float32)
    if getattr(learner, "importance_weights", False):  # prioritized replay's per-sequence weights
        out["weight"] = rng.uniform(0.2, 1.0, b).astype(np.float32)
    return out


class KerasStep:
    """Stock ``keras.layers.LSTM``/``GRU`` doing an rdqn update's recurrent work in one tf.function.

    Target forward over ``L``, online burn-in forward, online forward and backward over the rest,
    a squared TD loss against the target's max, Adam. Same layer sizes as the rdqn row (flat vector
    observations only: rows of other envs have no Keras column).
    """

    def __init__(self, config: Config, spec: EnvSpec, seq_len: int) -> None:
        n = config.network
        layer = keras.layers.LSTM if n.cell.startswith("lstm") else keras.layers.GRU
        self.nets = []
        for _ in range(2):
            pre = [keras.layers.Dense(w, activation="relu") for w in n.pre_layers]
            rnn = layer(n.units, return_sequences=True, return_state=True)
            head = keras.layers.Dense(spec.num_actions)
            self.nets.append((pre, rnn, head))
        self.bi, b = config.replay.burn_in, config.agent.batch_size
        self.obs = tf.random.stateless_normal([b, seq_len, spec.obs_dim], seed=[3, 4])
        self.optimizer = keras.optimizers.Adam(1e-3)
        self._run(self.nets[0], self.obs)
        self._run(self.nets[1], self.obs)
        self.step = tf.function(self._step)
        self.step(self.obs)

    @staticmethod
    def _run(net, x, state=None):
        pre, rnn, head = net
        for layer in pre:
            x = layer(x)
        out = rnn(x, initial_state=state)
        return head(out[0]), out[1:]

    def _step(self, obs: tf.Tensor) -> tf.Tensor:
        online, target = self.nets
        q_target, _ = self._run(target, obs)
        _, state = self._run(online, obs[:, : self.bi])
        state = [tf.stop_gradient(s) for s in state]
        variables = [v for layer in [*online[0], online[1], online[2]] for v in layer.trainable_variables]
        with tf.GradientTape() as tape:
            q, _ = self._run(online, obs[:, self.bi :], state)
            y = tf.stop_gradient(tf.reduce_max(q_target[:, self.bi :], axis=-1))
            loss = tf.reduce_mean(tf.square(y - tf.reduce_max(q, axis=-1)))
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        return loss


def timed(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """``calls`` calls of ``fn``: (calls per wall second, process CPU ms per call)."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return calls / wall, 1e3 * cpu / calls


def _build_learner(compose: Compose, overrides: list[str], kernel: str | None, seed: int):
    """The learner at ``overrides``, with ``network.backend=kernel`` unless None."""
    config = compose(overrides if kernel is None else [*overrides, f"network.backend={kernel}"])
    spec = describe_env(config.env)
    learner, _ = build_agent(config, spec, Counters())
    batch = synthetic_batch(learner, spec, config.agent.batch_size, seed)
    start = time.perf_counter()
    learner.step(batch)
    compile_s = time.perf_counter() - start
    return config, spec, learner, batch, compile_s


def filled_replay(config: Config, learner, spec: EnvSpec, seed: int) -> SequenceReplay:
    """The run's replay (prioritized as ``config.replay`` says), filled to capacity with random rows."""
    r = config.replay
    replay = SequenceReplay(
        r.capacity, config.env.num_envs, learner.seq_len, learner.replay_fields(), learner.state_dim,
        seed=seed, priority=r,
    )  # fmt: skip
    rows = synthetic_batch(learner, spec, config.env.num_envs, seed)  # [E, L, ...]: one row per step
    for t in range(replay.rows):
        replay.add(**{k: v[:, t % learner.seq_len] for k, v in rows.items() if k not in ("state", "weight")},
                   state=rows["state"])  # fmt: skip
    return replay


def replay_cases(compose: Compose, overrides: list[str], seed: int) -> dict[str, Callable[[], object]]:
    """rdqn updates fed from a full replay: uniform sampling, and prioritized sampling with the
    priority update after each step (``replay.priority_exponent=0.9``)."""
    cases = {}
    for key, extra in (("uniform_replay", []), ("prioritized", ["replay.priority_exponent=0.9"])):
        config, spec, learner, _, _ = _build_learner(compose, [*overrides, *extra], None, seed)
        replay = filled_replay(config, learner, spec, seed)
        counter = iter(range(1 << 30))

        def update(learner=learner, replay=replay, b=config.agent.batch_size, counter=counter) -> None:
            metrics = learner.step(replay.sample(b, next(counter)))
            replay.update_priorities(metrics["td_error"], metrics["mask"])

        cases[key] = update
    return cases


def learner_row(
    compose: Compose, overrides: list[str], gemm: Gemm, rounds: int, calls: int, compare: bool, seed: int
) -> dict:
    """Updates/s of one learner shape, with GEMM rate (and reference paths) in interleaved rounds."""
    config, spec, learner, batch, compile_s = _build_learner(compose, overrides, None, seed)
    kernel = sequence_kernels.recurrence_for(learner.networks()[0].core, tf.zeros([1, learner.seq_len, 1]))
    cases = {"fast": lambda: learner.step(batch)}
    if compare:
        ref = _build_learner(compose, overrides, "scan", seed)
        cases["reference"] = lambda: ref[2].step(ref[3])
        if kernel == "native":  # the TF-graph kernel it replaces
            graph = _build_learner(compose, overrides, "graph", seed)
            cases["graph"] = lambda: graph[2].step(graph[3])
        flat = len(spec.observation) == 1 and spec.observation[0].kind == "vector"
        if config.agent.kind == "rdqn" and config.network.cell in ("lstm", "gru") and flat:
            keras_step = KerasStep(config, spec, learner.seq_len)
            cases["keras"] = lambda: keras_step.step(keras_step.obs).numpy()
        if config.agent.kind == "rdqn":
            cases.update(replay_cases(compose, overrides, seed))
        for key, var in VARIANTS.items():  # the same batch, one option on
            if config.agent.kind in var.kinds:
                variant = _build_learner(compose, [*overrides, var.override], None, seed)[2]
                cases[key] = lambda variant=variant: variant.step(batch)
    rates: dict[str, list[float]] = {k: [] for k in cases}
    cpu: dict[str, list[float]] = {k: [] for k in cases}
    gflops = []
    for _ in range(rounds):
        gflops.append(gemm.sample())
        for key, fn in cases.items():
            rate, cpu_ms = timed(fn, calls)
            rates[key].append(rate)
            cpu[key].append(cpu_ms)
    row = _learner_row(config, learner, compile_s, median(gflops))
    row["kernel"] = kernel
    ups = median(rates["fast"])
    flops = row["flops_per_update"]
    row.update(
        updates_per_s=ups,
        cpu_ms_per_update=median(cpu["fast"]),
        achieved_gflops=flops * ups / 1e9,
        efficiency_pct=100 * flops * ups / 1e9 / row["gemm_gflops"],
    )
    if "prioritized" in rates:  # the cost of prioritized replay against uniform, same rounds
        row["uniform_replay_updates_per_s"] = median(rates["uniform_replay"])
        row["prioritized_updates_per_s"] = median(rates["prioritized"])
        row["prioritized_vs_uniform"] = median(rates["prioritized"]) / median(rates["uniform_replay"])
    for key, var in VARIANTS.items():
        if key in rates:
            row[f"{key}_updates_per_s"] = median(rates[key])
            row[var.ratio_key] = median(rates[key]) / ups
    for key in ("reference", "graph", "keras"):
        if key in rates:
            row[f"{key}_updates_per_s"] = median(rates[key])
            row[f"{key}_cpu_ms_per_update"] = median(cpu[key])
            row[f"speedup_vs_{key}"] = ups / median(rates[key])
    cases.clear()  # drop the learners (and their traced graphs) before the next row
    gc.collect()
    return row


def _learner_row(config: Config, learner, compile_s: float, gemm_gflops: float) -> dict:
    """A learner row's description; the rates are filled in by :func:`learner_row`."""
    return {
        "agent": config.agent.kind,
        "env": config.env.name,
        "cell": config.network.cell,
        "units": config.network.units,
        "batch_size": config.agent.batch_size,
        "burn_in": learner.burn_in,
        "trace_length": learner.trace_length,
        "seq_len": learner.seq_len,
        "flops_per_update": update_flops(learner, config.agent.batch_size),
        "updates_per_s": None,
        "cpu_ms_per_update": None,
        "gemm_gflops": gemm_gflops,
        "achieved_gflops": None,
        "efficiency_pct": None,
        "compile_s": compile_s,
        "kernel": None,
        "reference_updates_per_s": None,
        "reference_cpu_ms_per_update": None,
        "speedup_vs_reference": None,
        "graph_updates_per_s": None,
        "graph_cpu_ms_per_update": None,
        "speedup_vs_graph": None,
        "keras_updates_per_s": None,
        "keras_cpu_ms_per_update": None,
        "speedup_vs_keras": None,
        "uniform_replay_updates_per_s": None,
        "prioritized_updates_per_s": None,
        "prioritized_vs_uniform": None,
        **{k: None for name, var in VARIANTS.items() for k in (f"{name}_updates_per_s", var.ratio_key)},
        "load_1min": load_1min(),
    }


def target_update_times(compose: Compose, overrides: list[str], rounds: int, calls: int) -> dict:
    """Per-call time of the fused soft update against per-variable eager assigns (same run)."""
    config, _, learner, _, _ = _build_learner(compose, overrides, None, 0)
    updater = learner.targets
    tau = float(config.agent.tau)

    def eager() -> None:
        for online, target in updater.soft_pairs:
            target.assign((1.0 - tau) * target + tau * online)
        for online, target in updater.copy_pairs:
            target.assign(online)

    cases = {"fused": lambda: updater(tau), "eager": eager}
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():
        fn()
    for _ in range(rounds):
        for key, fn in cases.items():
            rate, _ = timed(fn, calls)
            times[key].append(1e3 / rate)
    fused, eager_ms = median(times["fused"]), median(times["eager"])
    return {
        "agent": config.agent.kind,
        "cell": config.network.cell,
        "units": config.network.units,
        "variables": len(updater.soft_pairs) + len(updater.copy_pairs),
        "fused_ms_per_call": fused,
        "eager_ms_per_call": eager_ms,
        "speedup": eager_ms / fused,
        "load_1min": load_1min(),
    }
