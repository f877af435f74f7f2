"""Sequence networks: dense layers -> recurrent core -> dense layers -> head.

One :class:`RecurrentNetwork` serves as Q-network (head ``[A]`` Q-values), actor (tanh head) and
critic (input ``[obs, action]``, head ``[1]``). Training unrolls it over ``[B, T, F]``;
:class:`NumpyNetwork` mirrors its weights for acting one step at a time without TF dispatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import keras
import numpy as np
import tensorflow as tf

from agents import kernels, sequence_kernels
from agents.core import CELLS, RecurrentCore, State, core_weights, numpy_core_step
from agents.encoder import Encoder, Inputs, NumpyEncoder, dense_stack, numpy_dense_relu, numpy_dense_relu_step
from agents.torso import CNN_PRESETS
from envs.config import check
from envs.spaces import Observation

ENCODERS = ("auto", "flat")


@dataclass
class NetworkConfig:
    """Architecture shared by every network of an agent."""

    # Core: lstm | gru | lstm_peephole | mlp (mlp has no memory: the baseline).
    cell: str = "lstm"
    # Width of the core (hidden state size).
    units: int = 64
    # Widths of ReLU dense layers before the core.
    pre_layers: list[int] = field(default_factory=lambda: [64])
    # Widths of ReLU dense layers after the core.
    post_layers: list[int] = field(default_factory=list)
    # GRU only: apply the reset gate after the recurrent matmul (Keras and cuDNN default).
    reset_after: bool = True
    # Extra per-step inputs: any of prev_action, prev_reward (zeros at an episode's first step;
    # a discrete previous action is one-hot, a continuous one scaled to [-1, 1]).
    inputs: list[str] = field(default_factory=list)
    # Scale observations by running mean/std before the first layer (agents/normalizer.py).
    normalize_obs: bool = True
    # Q-networks only: separate value and advantage streams after the post layers (dueling head).
    dueling: bool = False
    # Normalised observations are clipped to [-obs_clip, obs_clip].
    obs_clip: float = 5.0
    # How observation leaves become features: auto (image leaves through the conv torso, discrete
    # one-hot, vectors as they are) | flat (image leaves flattened into a vector, no torso).
    encoder: str = "auto"
    # Conv torso for image leaves (agents/torso.py): minigrid (small, 7x7 views) | nature (DQN, 84x84).
    cnn: str = "minigrid"
    # Replace the preset's conv channels, square kernel sizes and strides (one entry per layer).
    cnn_channels: list[int] = field(default_factory=list)
    cnn_kernels: list[int] = field(default_factory=list)
    cnn_strides: list[int] = field(default_factory=list)
    # LayerNorm between each dense layer (pre, post) and its ReLU, as in PQN (Gallici et al. 2024).
    layer_norm: bool = False
    # Implementation of the learner's recurrence and LayerNorm dense layers (agents/kernels.py):
    # auto | native (C++ ops, lstm only, CPU) | graph | scan. auto takes native where the ops load
    # and TF sees no GPU, else graph where the cell has one, else scan.
    backend: str = "auto"

    def validate(self) -> None:
        """Range checks of these fields; one-line :class:`envs.config.ConfigError` naming the key."""
        check(self.cell in CELLS, "network.cell", self.cell, "one of " + "|".join(CELLS))
        extras = ("prev_action", "prev_reward")
        inputs = list(self.inputs)
        check(all(i in extras for i in inputs), "network.inputs", inputs, "any of " + "|".join(extras))
        check(self.units >= 1, "network.units", self.units, "integers >= 1")
        for key in ("pre_layers", "post_layers"):
            widths = list(getattr(self, key))
            check(all(w >= 1 for w in widths), f"network.{key}", widths, "widths >= 1")
        check(self.backend in kernels.BACKENDS, "network.backend", self.backend, "|".join(kernels.BACKENDS))
        check(self.encoder in ENCODERS, "network.encoder", self.encoder, "|".join(ENCODERS))
        check(self.cnn in CNN_PRESETS, "network.cnn", self.cnn, "|".join(CNN_PRESETS))
        self._validate_cnn_lists()
        allowed = f"auto|graph|scan for cell={self.cell}"
        check(self.backend != "native" or self.cell == "lstm", "network.backend", self.backend, allowed)

    def _validate_cnn_lists(self) -> None:
        """One entry per conv layer: the lists given agree, and the preset's fill in the others."""
        keys = ("cnn_channels", "cnn_kernels", "cnn_strides")
        given = [k for k in keys if getattr(self, k)]
        preset = dict(zip(keys, CNN_PRESETS[self.cnn][:3], strict=True))
        layers = len(getattr(self, given[0])) if given else len(preset["cnn_channels"])
        for key in keys:
            values = list(getattr(self, key))
            source = f"network.{given[0]} gives {layers}" if given else f"the {self.cnn} preset"
            allowed = f"{layers} integers >= 1, one per conv layer ({source})"
            if values:
                ok = len(values) == layers and all(v >= 1 for v in values)
                check(ok, f"network.{key}", values, allowed)
            else:  # the preset's list stands in; it must have as many layers
                allowed += f"; the {self.cnn} preset has {len(preset[key])}"
                check(len(preset[key]) == layers, f"network.{key}", values, allowed)


class RecurrentNetwork(keras.Model):
    """Observation leaves ``[B, T, ...]`` (and extras ``[B, T, X]``) -> ``[B, T, O]`` outputs, with a
    recurrent state carried between calls."""

    def __init__(
        self,
        config: NetworkConfig,
        observation: Observation | int,
        output_dim: int,
        output_activation: str | None = None,
        name: str = "network",
        extras_dim: int = 0,
        normalize: bool = False,
        heads: int = 1,
    ) -> None:
        """``observation``: the env's leaves (an int ``F``: one flat vector input ``[B, T, F]``);
        ``extras_dim``: width of the ``extras`` input (network.inputs); ``normalize``: scale vector
        and image leaves by running statistics (agents/normalizer.py); ``heads``: output heads on
        the shared torso, 1 to 4 (rdqn's clipped double Q twin, reward-prediction and
        short-discount heads). The network's output (``call``, ``unroll``) is the first head's;
        ``unroll_segments(all_heads=True)`` gives them all (acting and export pick one by rdqn's
        ``agent.acting_head``)."""
        super().__init__(name=name)
        if config.cell not in CELLS:
            raise ValueError(f"unknown cell {config.cell!r}")
        self.config = config
        self.output_dim = int(output_dim)
        self.kernels = kernels.for_network(config)  # decided once; the layers follow it
        self.encoder = Encoder(config, observation, extras_dim, self.kernels, normalize)
        self.core = RecurrentCore(
            config.cell, config.units, config.reset_after, self.kernels.recurrence, name="core"
        )
        self.post = dense_stack(config.post_layers, "post", config.layer_norm, self.kernels)
        self.head = keras.layers.Dense(output_dim, activation=output_activation, name="head")
        # Dueling (Wang et al. 2016): ``head`` is the advantage stream, ``value_head`` the value.
        self.value_head = keras.layers.Dense(1, name="value_head") if config.dueling else None
        # More heads (each with its value stream): same torso, own weights. rdqn's clipped double Q
        # twin, its reward predictor (agent.reward_head) and its short-discount Q head
        # (agent.short_gamma), those present in that order; the slots are named by position
        # ("twin_*", "third_*", "fourth_*") whatever they learn.
        if heads not in (1, 2, 3, 4):
            raise ValueError(f"heads must be 1 to 4, got {heads}")

        def extra(slot: int, prefix: str) -> tuple[keras.layers.Dense | None, keras.layers.Dense | None]:
            if heads <= slot:
                return None, None
            head = keras.layers.Dense(output_dim, activation=output_activation, name=f"{prefix}_head")
            return head, keras.layers.Dense(1, name=f"{prefix}_value_head") if config.dueling else None

        self.twin_head, self.twin_value_head = extra(1, "twin")
        self.third_head, self.third_value_head = extra(2, "third")
        self.fourth_head, self.fourth_value_head = extra(3, "fourth")
        # Build every layer under this model's name so variable paths read "<name>/<layer>/<var>"
        # and online/target twins pair by path.
        with keras.name_scope(self.name):
            self.encoder.build()
            self.core.build((None, None, self.encoder.output_dim))
            width = config.units
            for layer in self.post:
                layer.build((None, width))
                width = layer.units
            for pair in self.head_pairs:
                for layer in pair:
                    if layer is not None:
                        layer.build((None, width))
        self.built = True

    @property
    def heads(self) -> int:
        """Number of output heads (1 to 4: the Q head, then rdqn's twin, reward and short-discount heads)."""
        return len(self.head_pairs)

    @property
    def head_pairs(self) -> list[tuple[keras.layers.Dense, keras.layers.Dense | None]]:
        """Each output head and its value stream (``None`` without dueling), in slot order."""
        pairs = [(self.head, self.value_head), (self.twin_head, self.twin_value_head)]
        pairs += [(self.third_head, self.third_value_head), (self.fourth_head, self.fourth_value_head)]
        return [pair for pair in pairs if pair[0] is not None]

    @property
    def state_sizes(self) -> tuple[int, ...]:
        """Sizes of the recurrent state tuple (``()`` for mlp)."""
        return self.core.state_sizes

    def initial_state(self, batch_size: int) -> State:
        """Zero state: tuple of ``[B, U]``."""
        return self.core.initial_state(batch_size)

    def unroll(self, inputs: Inputs | tf.Tensor, state: State, first: tf.Tensor) -> tuple[tf.Tensor, State]:
        """``inputs`` leaves ``[B, T, ...]`` (a tensor ``[B, T, F]`` for one flat leaf), ``state``
        tuple of ``[B, U]``, ``first`` ``[B, T]`` -> ``[B, T, O]`` and the final state."""
        outputs, final_state = self.unroll_segments(inputs, state, first, ())
        return outputs[0], final_state

    def unroll_segments(
        self,
        inputs: Inputs | tf.Tensor,
        state: State,
        first: tf.Tensor,
        bounds: Sequence[int],
        all_heads: bool = False,
    ) -> tuple[list[tf.Tensor | None], State]:
        """One sequence ``[B, L, ...]`` cut at ``bounds`` into segments ``[0, b_1), [b_1, b_2), ...,
        [b_k, L)``, unrolled in order; each segment starts from the one before's final state with
        the gradient stopped there (R2D2: burn-in | trace | n-step tail, where only the trace is
        trained). Each segment is encoded on its own, so a segment with no gradient adds no
        backward work. Returns each segment's outputs ``[B, T_i, O]`` (with ``all_heads``:
        ``[B, T_i, H, O]``, every head stacked; ``None`` for an empty segment) and the final state."""
        edges = [0, *bounds, tf.nest.flatten(inputs)[0].shape[1]]  # L may be None without bounds
        spans = list(zip(edges[:-1], edges[1:], strict=True))
        live = [i for i, (a, b) in enumerate(spans) if b is None or b > a]
        if bounds:
            firsts = [first[:, spans[i][0] : spans[i][1]] for i in live]
            xs = self.encoder.encode_spans(inputs, [spans[i] for i in live])
        else:
            firsts, xs = [first], [self.encoder(inputs)]
        hs, final_state = sequence_kernels.unroll_segments(self.core, xs, state, firsts)
        outputs: list[tf.Tensor | None] = [None] * len(spans)
        for i, x in zip(live, hs, strict=True):
            for layer in self.post:
                x = layer(x)
            # Each head in turn (the others only with ``all_heads``). Dueling: advantage mean
            # removed, so value and advantage are identifiable. Inline, not through head_pairs:
            # the update's call path stays one pass through this file.
            heads = []
            for head, value_head in (
                (self.head, self.value_head),
                (self.twin_head, self.twin_value_head),
                (self.third_head, self.third_value_head),
                (self.fourth_head, self.fourth_value_head),
            ):
                if head is None or (heads and not all_heads):
                    break
                out = head(x)  # [B, T, O]
                if value_head is not None:
                    out = value_head(x) + out - tf.reduce_mean(out, axis=-1, keepdims=True)
                heads.append(out)
            outputs[i] = tf.stack(heads, axis=2) if all_heads else heads[0]  # [B, T, H, O] | [B, T, O]
        return outputs, final_state

    def call(self, inputs: Inputs | tf.Tensor) -> tf.Tensor:
        """Keras entry point: unroll from a zero state with no resets; ``[B, T, ...] -> [B, T, O]``."""
        shape = tf.shape(tf.nest.flatten(inputs)[0])
        out, _ = self.unroll(inputs, self.initial_state(shape[0]), tf.zeros(shape[:2], tf.float32))
        return out


def input_spec(
    observation: Observation, extras_dim: int, batch: int, length: int
) -> dict[str, tf.TensorSpec]:
    """A compiled step's network inputs: each leaf ``[B, L, *shape]`` in its stored dtype, and
    ``extras`` ``[B, L, X]`` when ``extras_dim`` > 0."""
    spec = {leaf.name: tf.TensorSpec([batch, length, *leaf.shape], leaf.dtype) for leaf in observation}
    if extras_dim:
        spec["extras"] = tf.TensorSpec([batch, length, extras_dim], tf.float32)
    return spec


def obs_fields(observation: Observation) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Replay fields of the observation leaves: their raw shape and dtype."""
    return {leaf.name: (leaf.shape, np.dtype(leaf.dtype)) for leaf in observation}


def time_slice(inputs: Inputs, start: int, stop: int | None = None) -> Inputs:
    """Steps ``[start, stop)`` of every input ``[B, L, ...]``."""
    return {k: v[:, start:stop] for k, v in inputs.items()}


def flat_state(state: tuple[np.ndarray, ...], batch_size: int) -> np.ndarray:
    """Concatenate a state tuple into ``[B, S]`` (``S = 0`` for mlp) for storage in replay."""
    if not state:
        return np.zeros((batch_size, 0), np.float32)
    return np.concatenate(state, axis=1)


def split_state(flat: np.ndarray | tf.Tensor, sizes: tuple[int, ...]) -> tuple:
    """Inverse of :func:`flat_state`: ``[B, S]`` -> tuple of ``[B, U]``."""
    out, start = [], 0
    for s in sizes:
        out.append(flat[:, start : start + s])
        start += s
    return tuple(out)


class NumpyNetwork:
    """A numpy mirror of a :class:`RecurrentNetwork` for stepping many envs one step at a time.

    Call :meth:`sync` after the learner changes the weights (or the observation statistics); the
    copy happens at the next :meth:`step`, so several updates between two acting steps cost one
    copy. ``step`` takes ``[B, F]`` inputs and the state tuple, returns ``[B, O]`` outputs (head
    activation applied) and the next state.
    """

    def __init__(self, network: RecurrentNetwork) -> None:
        self.network = network
        self.cell = network.config.cell
        self.reset_after = network.config.reset_after
        self.state_sizes = network.state_sizes
        self.activation = network.head.activation.__name__ if network.head.activation else "linear"
        self._pull()

    def sync(self) -> None:
        """The Keras network's weights changed: copy them before the next step."""
        self._stale = True

    def _pull(self) -> None:
        self._stale = False
        dense = lambda layer: (np.asarray(layer.kernel), np.asarray(layer.bias))  # noqa: E731
        self.encoder = NumpyEncoder(self.network.encoder)
        self.core = core_weights(self.network.core)
        self.post = [numpy_dense_relu(layer) for layer in self.network.post]
        self.head = dense(self.network.head)
        value_head = getattr(self.network, "value_head", None)
        self.value_head = dense(value_head) if value_head is not None else None
        # Every head after the first (none on an actor), each with its value stream or None.
        self.extra_heads = [
            (dense(head), dense(value) if value is not None else None)
            for head, value in getattr(self.network, "head_pairs", [])[1:]
        ]

    def initial_state(self, batch_size: int) -> tuple[np.ndarray, ...]:
        """Zero state: tuple of ``[B, U]`` float32 arrays."""
        return tuple(np.zeros((batch_size, s), np.float32) for s in self.state_sizes)

    def step(
        self,
        x: dict[str, np.ndarray] | np.ndarray,
        state: tuple[np.ndarray, ...],
        head: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """Leaves ``[B, ...]`` (an array ``[B, F]`` for one flat leaf) and ``extras`` ``[B, X]`` ->
        outputs ``[B, O]`` and the next state. ``head`` ``[B]`` (a slot index, 0 to heads - 1) picks
        each row's output head on a network with more than one; ``None``: the first head for every row."""
        if self._stale:
            self._pull()
        x, state = numpy_core_step(self.cell, self.core, self.encoder.step(x), state, self.reset_after)
        for weights in self.post:
            x = numpy_dense_relu_step(weights, x)
        out = self._head(x, self.head, self.value_head)
        if head is not None and np.any(head):
            head = np.asarray(head)
            for slot in np.unique(head[head > 0]):
                other = self._head(x, *self.extra_heads[slot - 1])
                out = np.where(head[:, None] == slot, other, out)
        if self.activation == "tanh":
            out = np.tanh(out)
        elif self.activation != "linear":
            raise ValueError(f"unsupported head activation {self.activation}")
        return out.astype(np.float32, copy=False), state

    @staticmethod
    def _head(x: np.ndarray, head: tuple, value_head: tuple | None) -> np.ndarray:
        """``[B, U]`` torso output -> ``[B, O]`` of one head (dueling: value + advantage - mean)."""
        out = x @ head[0] + head[1]
        if value_head is not None:
            out = (x @ value_head[0] + value_head[1]) + (out - out.mean(axis=-1, keepdims=True))
        return out
