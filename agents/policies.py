"""Acting policies over the numpy network mirror: epsilon-greedy (rdqn) and the deterministic actor
with exploration noise (rddpg/rtd3), plus the noise processes and action scaling they use.

Actions live in ``[-1, 1]`` inside the agent and are rescaled to the env's bounds at the edge::

    env_action = low + (u + 1) / 2 * (high - low)        # u in [-1, 1]

so a noise scale ``sigma`` means ``sigma`` times the half-range of every action dimension,
whatever the env's units (Pendulum's torque in [-2, 2] and a task in [-1, 1] share one setting).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from agents.networks import NumpyNetwork

NpState = tuple[np.ndarray, ...]


class ActionScaler:
    """Maps ``[-1, 1]`` to the env's action box ``[low, high]`` (both ``[A]``) and back."""

    def __init__(self, low: np.ndarray, high: np.ndarray) -> None:
        self.center = ((np.asarray(high) + np.asarray(low)) / 2).astype(np.float32)
        self.half = ((np.asarray(high) - np.asarray(low)) / 2).astype(np.float32)

    def to_env(self, u: np.ndarray) -> np.ndarray:
        """``[..., A]`` in ``[-1, 1]`` -> env units."""
        return (self.center + self.half * u).astype(np.float32)

    def from_env(self, a: np.ndarray) -> np.ndarray:
        """``[..., A]`` env units -> ``[-1, 1]`` (clipped: envs may report out-of-box actions)."""
        return np.clip((np.asarray(a, np.float32) - self.center) / self.half, -1.0, 1.0)


class GaussianNoise:
    """Independent ``N(0, sigma^2)`` per step, env and action dimension."""

    def __init__(self, sigma: float, rng: np.random.Generator) -> None:
        self.sigma, self.rng = float(sigma), rng

    def __call__(self, shape: tuple[int, ...]) -> np.ndarray:
        return self.sigma * self.rng.standard_normal(shape).astype(np.float32)

    def reset(self, envs: np.ndarray) -> None:
        """Nothing to forget: the noise has no memory."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Nothing to restore."""


class OUNoise:
    """Ornstein-Uhlenbeck noise, ``x <- x - theta * x + sigma * N(0, 1)`` per env (DDPG).

    Stationary std is ``sigma / sqrt(theta * (2 - theta))``. ``x`` ``[E, A]`` restarts at 0 at
    each env's episode start (:meth:`reset`) and is saved with checkpoints (:meth:`state_dict`).
    """

    def __init__(self, sigma: float, theta: float, rng: np.random.Generator) -> None:
        self.sigma, self.theta, self.rng = float(sigma), float(theta), rng
        self.x = np.zeros((0, 0), np.float32)

    def __call__(self, shape: tuple[int, ...]) -> np.ndarray:
        if self.x.shape != shape:  # first call (or a different number of envs): start at 0
            self.x = np.zeros(shape, np.float32)
        self.x += -self.theta * self.x + self.sigma * self.rng.standard_normal(shape).astype(np.float32)
        return self.x.copy()

    def reset(self, envs: np.ndarray) -> None:
        """Restart the process at 0 for the envs where ``envs`` ``[E]`` (bool) is true."""
        if len(self.x) == len(envs):
            self.x[envs] = 0.0

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"ou_x": self.x.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.x = np.asarray(state["ou_x"], np.float32).copy()


class Noise(Protocol):
    """Exploration noise in half-range units: ``noise(shape)`` -> ``[E, A]``."""

    def __call__(self, shape: tuple[int, ...]) -> np.ndarray: ...

    def reset(self, envs: np.ndarray) -> None: ...

    def state_dict(self) -> dict[str, np.ndarray]: ...

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None: ...


class EpsilonGreedy:
    """Batched epsilon-greedy over a numpy Q-network: observation leaves ``[E, ...]`` -> ``[E]``
    int actions.

    ``inputs`` (``network.inputs``) adds the one-hot previous action ``[E, A]`` and/or the
    previous reward ``[E]`` as extra inputs, as the learner does from replay.
    """

    def __init__(
        self,
        net: NumpyNetwork,
        num_actions: int,
        epsilon: Callable[[], float],
        seed: int,
        inputs: Sequence[str] = (),
    ) -> None:
        self.net = net
        self.num_actions = num_actions
        self.epsilon = epsilon
        self.inputs = list(inputs)
        self.rng = np.random.default_rng(seed)

    def act(
        self,
        obs: np.ndarray,
        prev_action: np.ndarray,
        prev_reward: np.ndarray,
        state: NpState,
        explore: bool,
    ) -> tuple[np.ndarray, NpState]:
        q, state = self.net.step(network_inputs(obs, prev_action, prev_reward, self.inputs, None), state)
        action = q.argmax(axis=1).astype(np.int32)
        if explore:
            eps = self.epsilon()
            random = self.rng.random(len(action)) < eps
            action = np.where(random, self.rng.integers(0, self.num_actions, len(action)), action)
        return action.astype(np.int32), state

    def episode_start(self, envs: np.ndarray) -> None:
        """Epsilon-greedy keeps no per-episode exploration state."""

    def state_dict(self) -> dict[str, np.ndarray]:
        return {}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Nothing besides ``rng`` to restore."""


class DeterministicPolicy:
    """Batched recurrent actor with exploration noise: observation leaves ``[E, ...]`` -> actions ``[E, A]``.

    Before ``learning_starts`` env steps the actions are uniform in the bounds (the actor's state
    still advances, so replay records the state it really had).
    """

    def __init__(
        self,
        net: NumpyNetwork,
        scaler: ActionScaler,
        inputs: list[str],
        noise: Noise,
        random_actions: Callable[[], bool],
        rng: np.random.Generator,
    ) -> None:
        self.net, self.scaler, self.inputs = net, scaler, list(inputs)
        self.noise, self.random_actions, self.rng = noise, random_actions, rng

    def features(
        self, obs: dict[str, np.ndarray], prev_action: np.ndarray, prev_reward: np.ndarray
    ) -> dict[str, np.ndarray]:
        """Per-step network inputs: observation leaves ``[E, ...]``, and the extras ``[E, X]``
        named in ``network.inputs``."""
        return network_inputs(obs, prev_action, prev_reward, self.inputs, self.scaler)

    def episode_start(self, envs: np.ndarray) -> None:
        """Envs (``[E]`` bool) whose next step starts an episode: restart their noise process."""
        self.noise.reset(envs)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Exploration state a checkpoint must hold besides the rng (the OU process)."""
        return self.noise.state_dict()

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.noise.load_state_dict(state)

    def act(
        self,
        obs: np.ndarray,
        prev_action: np.ndarray,
        prev_reward: np.ndarray,
        state: NpState,
        explore: bool,
    ) -> tuple[np.ndarray, NpState]:
        u, state = self.net.step(self.features(obs, prev_action, prev_reward), state)  # [E, A]
        if explore:
            if self.random_actions():
                u = self.rng.uniform(-1.0, 1.0, u.shape).astype(np.float32)
            else:
                u = np.clip(u + self.noise(u.shape), -1.0, 1.0)
        return self.scaler.to_env(u), state


def extras_width(action_width: int, inputs: list[str]) -> int:
    """``X`` of :func:`extra_features`: ``action_width`` (one-hot or box) and 1 for the reward."""
    return action_width * ("prev_action" in inputs) + ("prev_reward" in inputs)


def extra_features(
    prev_action: np.ndarray,
    prev_reward: np.ndarray,
    inputs: list[str],
    scaler: ActionScaler | None,
) -> np.ndarray:
    """``[..., A]`` previous action and ``[...]`` previous reward -> the ``[..., X]`` extra inputs
    named in ``network.inputs`` (in the order action, reward).

    Continuous actions are mapped to ``[-1, 1]`` by ``scaler``; with ``scaler=None`` (discrete
    actions) ``prev_action`` is used as given: the Actor's one-hot, all zero at an episode start.
    """
    parts = []
    if "prev_action" in inputs:
        parts.append(np.asarray(prev_action, np.float32) if scaler is None else scaler.from_env(prev_action))
    if "prev_reward" in inputs:
        parts.append(np.asarray(prev_reward, np.float32)[..., None])
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=-1)


def network_inputs(
    obs: dict[str, np.ndarray] | np.ndarray,
    prev_action: np.ndarray,
    prev_reward: np.ndarray,
    inputs: list[str],
    scaler: ActionScaler | None,
) -> dict[str, np.ndarray]:
    """Observation leaves (a plain array: the single flat leaf ``obs``) plus, when
    ``network.inputs`` asks for them, ``extras`` ``[..., X]``."""
    if not isinstance(obs, dict):
        obs = {"obs": obs}
    if not inputs:
        return obs
    return {**obs, "extras": extra_features(prev_action, prev_reward, inputs, scaler)}


def with_weights_of(policy, learner, which: str):
    """A copy of ``policy`` acting with the numpy mirror of ``learner.eval_network(which)``
    (``online`` or ``target``, the EMA weights); the original keeps its own network."""
    acting = copy.copy(policy)
    acting.net = NumpyNetwork(learner.eval_network(which))
    return acting
