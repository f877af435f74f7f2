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


class HeadBandit:
    """Which output head each env acts with, one choice per episode: Agent57's meta-controller
    (Badia et al. 2020), a sliding-window UCB over the undiscounted returns of the last ``window``
    training episodes, each credited to the head that acted in it.

    At each episode start an env takes a uniformly random head with probability ``explore``, else
    the head of highest ``mean_k + beta * spread * sqrt(1 / n_k)`` over the window (a head absent
    from the window first). ``spread`` is the window's return range, so one ``beta`` serves a task
    whose returns span 500 and one whose returns span 2. Greedy evaluation and export act with
    :meth:`best`, the head of highest windowed mean return.
    """

    def __init__(self, heads: int, window: int, beta: float, explore: float) -> None:
        self.heads, self.window, self.beta, self.explore = heads, window, beta, explore
        self.arm_history = np.zeros(0, np.int64)  # [N <= window] head of each finished episode
        self.return_history = np.zeros(0, np.float64)  # [N] its return

    def record(self, arms: np.ndarray, returns: np.ndarray) -> None:
        """Finished episodes: the head ``[K]`` each acted with and its return ``[K]``."""
        self.arm_history = np.concatenate([self.arm_history, np.asarray(arms, np.int64)])[-self.window :]
        self.return_history = np.concatenate([self.return_history, np.asarray(returns, np.float64)])[
            -self.window :
        ]

    def means(self) -> tuple[np.ndarray, np.ndarray]:
        """Windowed mean return ``[H]`` (NaN for a head absent from the window) and count ``[H]``."""
        counts = np.bincount(self.arm_history, minlength=self.heads).astype(np.float64)
        sums = np.bincount(self.arm_history, weights=self.return_history, minlength=self.heads)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, sums / counts, np.nan), counts

    def choose(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Heads ``[n]`` for ``n`` episodes starting now (the acting policy's ``rng``)."""
        means, counts = self.means()
        if (counts == 0).any():
            greedy = int(np.flatnonzero(counts == 0)[0])
        else:
            spread = float(np.ptp(self.return_history)) or 1.0
            greedy = int(np.argmax(means + self.beta * spread * np.sqrt(1.0 / counts)))
        random = rng.random(n) < self.explore
        return np.where(random, rng.integers(0, self.heads, n), greedy).astype(np.int64)

    def best(self) -> int:
        """The head of highest windowed mean return (the first head while the window is empty)."""
        means, counts = self.means()
        return int(np.nanargmax(means)) if counts.any() else 0

    def scalars(self) -> dict[str, float]:
        """Per-head windowed mean return and share of the window's episodes, and the best head."""
        means, counts = self.means()
        out = {"charts/bandit_best_head": float(self.best())}
        for k in range(self.heads):
            out[f"charts/bandit_head{k}_return"] = float(means[k])
            out[f"charts/bandit_head{k}_share"] = float(counts[k] / max(counts.sum(), 1.0))
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"bandit_arms": self.arm_history.copy(), "bandit_returns": self.return_history.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.arm_history = np.asarray(state["bandit_arms"], np.int64).copy()
        self.return_history = np.asarray(state["bandit_returns"], np.float64).copy()


class EpsilonGreedy:
    """Batched epsilon-greedy over a numpy Q-network: observation leaves ``[E, ...]`` -> ``[E]``
    int actions.

    ``inputs`` (``network.inputs``) adds the one-hot previous action ``[E, A]`` and/or the
    previous reward ``[E]`` as extra inputs, as the learner does from replay.

    On a network with more than one head ``head`` picks the slot that acts (0: the Q head), or
    ``"bandit"``: a :class:`HeadBandit` picks one arm per env per training episode and greedy acting
    uses its best arm; ``slots`` ``[arms]`` maps each arm to the network's head slot.
    """

    def __init__(
        self,
        net: NumpyNetwork,
        num_actions: int,
        epsilon: Callable[[], float],
        seed: int,
        inputs: Sequence[str] = (),
        head: int | str = 0,
        bandit: HeadBandit | None = None,
        slots: Sequence[int] = (0, 1),
    ) -> None:
        self.net = net
        self.num_actions = num_actions
        self.epsilon = epsilon
        self.inputs = list(inputs)
        self.rng = np.random.default_rng(seed)
        self.head, self.bandit = head, bandit
        self.slots = np.asarray(slots, np.int64)
        self.arms = np.zeros(0, np.int64)  # [E] the head each env's current training episode acts with

    def greedy_head(self) -> int:
        """The head slot greedy acting (evaluation, export) uses."""
        return int(self.slots[self.bandit.best()]) if self.bandit is not None else int(self.head)

    def _heads(self, n: int, explore: bool) -> np.ndarray | None:
        """``[n]`` head slot per env, or ``None`` for the first head everywhere."""
        if self.bandit is None or not explore:  # one head for every env
            head = self.greedy_head()
            return None if head == 0 else np.full(n, head, np.int64)
        if len(self.arms) != n:  # first call: every env starts an episode
            self.arms = self.bandit.choose(n, self.rng)
        return self.slots[self.arms]

    def act(
        self,
        obs: np.ndarray,
        prev_action: np.ndarray,
        prev_reward: np.ndarray,
        state: NpState,
        explore: bool,
    ) -> tuple[np.ndarray, NpState]:
        x = network_inputs(obs, prev_action, prev_reward, self.inputs, None)
        heads = self._heads(len(prev_reward), explore)
        q, state = self.net.step(x, state) if heads is None else self.net.step(x, state, heads)
        action = q.argmax(axis=1).astype(np.int32)
        if explore:
            eps = self.epsilon()
            random = self.rng.random(len(action)) < eps
            action = np.where(random, self.rng.integers(0, self.num_actions, len(action)), action)
        return action.astype(np.int32), state

    def episode_start(self, envs: np.ndarray) -> None:
        """Envs (``[E]`` bool) starting a training episode: with the bandit, each picks its head."""
        if self.bandit is not None and len(self.arms) == len(envs) and envs.any():
            self.arms[envs] = self.bandit.choose(int(envs.sum()), self.rng)

    def episode_end(self, envs: np.ndarray, returns: np.ndarray) -> None:
        """Training episodes that ended: env indices ``[K]`` and returns ``[K]``, credited to the
        head each acted with."""
        if self.bandit is not None and len(self.arms) and len(envs):
            self.bandit.record(self.arms[np.asarray(envs)], returns)

    def state_dict(self) -> dict[str, np.ndarray]:
        if self.bandit is None:
            return {}
        return {**self.bandit.state_dict(), "bandit_env_heads": self.arms.copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """The bandit's window and each env's current head (``rng`` is restored by the caller)."""
        if self.bandit is not None and "bandit_arms" in state:
            self.bandit.load_state_dict(state)
            self.arms = np.asarray(state["bandit_env_heads"], np.int64).copy()


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

    def episode_end(self, envs: np.ndarray, returns: np.ndarray) -> None:
        """Nothing is credited to finished episodes."""

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
