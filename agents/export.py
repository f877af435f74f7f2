"""The acting policy as a TensorFlow SavedModel that needs neither recurrl nor its native ops.

The SavedModel has two signatures (and the same two functions as attributes of the loaded object)::

    initial_state(batch_size: int32 [])            -> {"state": [B, S]}
    step(observation: [B, O], state: [B, S])        -> {"action": [B] int32 (rdqn) or [B, A] (rddpg),
                                                        "q_values": [B, A] (rdqn) | "action_mean": [B, A],
                                                        "state": [B, S]}

``action`` is in the env's own action space: for rdqn the env's ``Discrete(n, start)`` value
(index + start), or for a ``MultiDiscrete(nvec, start)`` env ``[B, D]`` int32, the joint index
the agent picks unravelled over ``nvec`` plus ``start``; ``q_values`` are over the agent's indices
(``prod(nvec)`` joint actions).

``state`` is the recurrent state flattened as in replay (``(h, c)`` for an LSTM, ``h`` for a GRU),
followed by the previous action when the network reads it (``network.inputs=[prev_action]``).
Zero it (or call ``initial_state``) where an episode starts. rdqn acts greedily (argmax Q);
rddpg/rtd3 deterministically (the actor's mean, in the env's action units). An env whose
observation is not one flat vector (a Dict, Tuple, image or discrete space) takes one input per
observation leaf instead of ``observation``: the signature's inputs are named after the leaves
with dots as underscores (``obs_image``, ``obs_direction``), each ``[B, *shape]`` in its own dtype;
the function attribute takes them as a dict ``{"obs.image": ..., "obs.direction": ...}``.
Observations are those the run's env config gives, after its wrappers (``env.mask_obs``,
``env.preprocessing``: Atari frames, MiniGrid's one-hot view): apply the same outside recurrl.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import keras
import numpy as np
import tensorflow as tf

from agents.encoder import LN_EPSILON
from agents.rundir import fsync_dir
from agents.saved_run import SavedRun
from envs import make_env
from envs.config import ConfigError, EnvConfig
from envs.wrappers import JointDiscreteActions, ShiftDiscreteActions


class PolicyModule(tf.Module):
    """The greedy policy of a :class:`SavedRun` as a ``tf.Module`` with flat-tensor signatures."""

    def __init__(self, saved: SavedRun, network: str = "run") -> None:
        super().__init__(name="recurrl_policy")
        inputs = list(saved.config.network.inputs)
        if any(i != "prev_action" for i in inputs):
            raise ConfigError(
                f"network.inputs={inputs} cannot be exported: allowed [] or [prev_action] "
                "(the previous reward is not an input of step)"
            )
        self.net = saved.learner.eval_network(saved.network_name(network))
        # The output head greedy acting uses: 0 but for rdqn's agent.acting_head reward or bandit.
        self.head = int(getattr(saved.policy, "greedy_head", lambda: 0)())
        self.discrete = saved.spec.discrete
        self.num_actions = saved.spec.num_actions
        self.observation = saved.spec.observation
        self.flat = len(self.observation) == 1 and self.observation[0].kind == "vector"
        self.state_sizes = tuple(self.net.state_sizes)
        self.prev_action = "prev_action" in inputs
        self.state_dim = sum(self.state_sizes) + (self.num_actions if self.prev_action else 0)
        if self.discrete:
            self.nvec, self.start = discrete_action_layout(saved.config.env)
        else:
            low, high = saved.spec.action_low, saved.spec.action_high
            self.center = tf.constant((high + low) / 2, tf.float32)
            self.half = tf.constant((high - low) / 2, tf.float32)
        self.initial_state = tf.function(self._initial_state, input_signature=[tf.TensorSpec([], tf.int32)])
        state = tf.TensorSpec([None, self.state_dim], tf.float32)
        if self.flat:
            obs = tf.TensorSpec([None, self.observation[0].width], tf.float32)
            self.step = tf.function(lambda observation, state: self._step({"obs": observation}, state),
                                    input_signature=[obs, state])  # fmt: skip
        else:
            leaves = {
                leaf.name: tf.TensorSpec([None, *leaf.shape], leaf.dtype, name=leaf.name.replace(".", "_"))
                for leaf in self.observation
            }
            self.step = tf.function(self._step, input_signature=[leaves, state])

    def _initial_state(self, batch_size: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"state": tf.zeros(tf.stack([batch_size, self.state_dim]), tf.float32)}

    def _step(self, observation: dict[str, tf.Tensor], state: tf.Tensor) -> dict[str, tf.Tensor]:
        parts, start = [], 0
        for size in self.state_sizes:
            parts.append(state[:, start : start + size])
            start += size
        x = {k: v[:, None] for k, v in observation.items()}  # [B, 1, ...]
        if self.prev_action:
            x["extras"] = state[:, None, start:]
        first = tf.zeros(tf.stack([tf.shape(state)[0], 1]), tf.float32)
        if self.discrete:
            if self.head:
                (q,), new_state = self.net.unroll_segments(x, tuple(parts), first, (), all_heads=True)
                q = q[:, 0, self.head]
            else:
                q, new_state = self.net.unroll(x, tuple(parts), first)
                q = q[:, 0]
            action = tf.argmax(q, axis=-1, output_type=tf.int32)  # [B] the agent's index
            taken = tf.one_hot(action, self.num_actions)
            if self.nvec is not None:  # [B, D] the env's MultiDiscrete action
                env_action = tf.transpose(tf.unravel_index(action, self.nvec)) + self.start
            else:
                env_action = action + self.start
            out = {"action": env_action, "q_values": q}
        else:
            h, new_state = self.net.encode(x, tuple(parts), first)
            taken = self.net.policy(h)[:, 0]  # [-1, 1]
            mean = self.center + self.half * taken
            out = {"action": mean, "action_mean": mean}
        flat = list(new_state) + ([taken] if self.prev_action else [])
        out["state"] = tf.concat(flat, axis=-1) if flat else tf.zeros([tf.shape(state)[0], 0])
        return out


def discrete_action_layout(env_config: EnvConfig) -> tuple[tf.Tensor | None, tf.Tensor]:
    """How the agent's action index maps to the env's discrete action: ``(nvec [D], start [D])``
    int32 for a MultiDiscrete env (joint index unravelled over ``nvec``, plus ``start``), else
    ``(None, start [])`` for ``Discrete(n, start)``."""
    env = make_env(env_config, seed=0)
    try:
        layer = env
        while isinstance(layer, gym.Wrapper):
            if isinstance(layer, JointDiscreteActions):
                return tf.constant(layer.nvec, tf.int32), tf.constant(layer.start, tf.int32)
            if isinstance(layer, ShiftDiscreteActions):
                return None, tf.constant(layer.start, tf.int32)
            layer = layer.env
        return None, tf.constant(0, tf.int32)
    finally:
        env.close()


def refuse_existing(out: str | Path) -> None:
    """Raise :class:`ConfigError` (one line naming ``out=``) if ``out`` exists: exports never overwrite."""
    if Path(out).exists():
        raise ConfigError(f"out={str(out)!r} already exists: choose another out= or remove it")


def _write_whole(out: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write`` on a temporary sibling of ``out``, then rename it to ``out``: a failed or killed
    export leaves nothing at ``out``, and an existing ``out`` is never touched."""
    refuse_existing(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp{out.suffix}")
    try:
        write(tmp)
        refuse_existing(out)  # another export may have finished there meanwhile
        os.rename(tmp, out)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
    fsync_dir(out.parent)
    return out


def export_saved_model(saved: SavedRun, out: str | Path, network: str = "run") -> Path:
    """Write the policy of ``saved`` as a SavedModel directory ``out``; returns its path.

    Refuses (:class:`ConfigError`) an ``out`` that exists; the directory appears whole or not at all.
    """
    module = PolicyModule(saved, network)
    signatures = {
        "initial_state": module.initial_state.get_concrete_function(),
        "step": module.step.get_concrete_function(),
    }
    return _write_whole(Path(out), lambda tmp: tf.saved_model.save(module, str(tmp), signatures=signatures))


def keras_model(saved: SavedRun, network: str = "run") -> keras.Model:
    """The policy network rebuilt from stock Keras layers (no recurrl class in it), weights copied::

        inputs:  observation [B, T, O], then the recurrent state ([B, U] h and c for an LSTM, h for a GRU)
        outputs: Q-values [B, T, A] (rdqn) or the actor's action in [-1, 1] [B, T, A] (rddpg),
                 then the final state

    Normalisation is ``Normalization`` and a clip built from ``Rescaling`` and ``hard_tanh``; each
    dense layer is ``Dense`` (+ ``LayerNormalization``) + ReLU; the core is ``keras.layers.LSTM`` or
    ``GRU`` with the trained weights (the cores keep Keras' weight layouts).
    """
    config = saved.config.network
    if not (len(saved.spec.observation) == 1 and saved.spec.observation[0].kind == "vector"):
        leaves = [leaf.name for leaf in saved.spec.observation]
        raise ConfigError(
            f"format=keras exports a flat vector observation; this run's observation has leaves "
            f"{leaves}: use format=saved_model"
        )
    if config.cell not in ("lstm", "gru"):
        raise ConfigError(
            f"network.cell={config.cell!r} has no stock Keras layer: format=keras allows lstm|gru"
        )
    if config.inputs:
        raise ConfigError(
            f"network.inputs={list(config.inputs)} cannot be exported as format=keras: allowed []"
        )
    if config.dueling:
        raise ConfigError("network.dueling=true cannot be exported as format=keras: use format=saved_model")
    net = saved.learner.eval_network(saved.network_name(network))
    encoder = net.encoder
    obs = keras.Input((None, saved.spec.obs_dim), name="observation")
    state_in = [keras.Input((s,), name=n) for s, n in zip(net.state_sizes, ("h", "c"), strict=False)]
    x = obs
    if "obs" in encoder.stats:
        mean, std = (np.asarray(v) for v in encoder.stats["obs"])
        clip = float(config.obs_clip)
        x = keras.layers.Normalization(mean=mean, variance=np.square(std), name="normalize")(x)
        x = keras.layers.Rescaling(1.0 / clip)(x)
        x = keras.layers.Activation("hard_tanh")(x)
        x = keras.layers.Rescaling(clip, name="clip")(x)
    x = _dense_stack(x, encoder.pre, "pre")
    core = net.core
    rnn_cls = keras.layers.LSTM if config.cell == "lstm" else keras.layers.GRU
    kwargs = {} if config.cell == "lstm" else {"reset_after": config.reset_after}
    rnn = rnn_cls(core.units, return_sequences=True, return_state=True, name="core", **kwargs)
    x, *state_out = rnn(x, initial_state=state_in)
    rnn.set_weights([np.asarray(w) for w in (core.cell.kernel, core.cell.recurrent_kernel, core.cell.bias)])
    x = _dense_stack(x, net.post, "post")
    head = net.head
    activation = head.activation.__name__ if head.activation else None
    out_layer = keras.layers.Dense(head.units, activation=activation, name="head")
    out = out_layer(x)
    out_layer.set_weights([np.asarray(head.kernel), np.asarray(head.bias)])
    return keras.Model([obs, *state_in], [out, *state_out], name="recurrl_policy")


def _dense_stack(x: keras.KerasTensor, layers: list, prefix: str) -> keras.KerasTensor:
    for i, layer in enumerate(layers):
        dense = keras.layers.Dense(
            layer.units, activation=None if layer.layer_norm else "relu", name=f"{prefix}_{i}"
        )
        y = dense(x)
        dense.set_weights([np.asarray(layer.kernel), np.asarray(layer.bias)])
        if layer.layer_norm:
            norm = keras.layers.LayerNormalization(epsilon=LN_EPSILON, name=f"{prefix}_{i}_layer_norm")
            y = keras.layers.ReLU()(norm(y))
            norm.set_weights([np.asarray(layer.ln_gamma), np.asarray(layer.ln_beta)])
        x = y
    return x


def export_keras(saved: SavedRun, out: str | Path, network: str = "run") -> Path:
    """Write :func:`keras_model` as a ``.keras`` file (``keras.saving.load_model`` reads it with no
    custom objects); returns its path. Refuses an ``out`` that exists; the file appears whole."""
    out = Path(out)
    out = out if out.suffix == ".keras" else out.with_suffix(".keras")
    refuse_existing(out)
    model = keras_model(saved, network)
    return _write_whole(out, model.save)
