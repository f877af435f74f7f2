"""Sequence replay: a preallocated numpy ring per env, sampled as overlapping sequences.

Rows are written in lock-step for all vectorised envs, one row per env step::

    obs_t, state_t (recurrent state before obs_t), first_t (episode starts at t),
    action_t, reward_t, terminated_t, truncated_t (outcome of action_t),
    valid_t (row holds a real transition; 0 for the final-observation row of an episode)

A sample is ``burn_in + trace_length + n_step`` consecutive rows of one env, never crossing the
write head (so never mixing old and new data). Episode boundaries inside a sequence are marked by
``first``: the learner zeroes the recurrent state there and masks rows with ``valid = 0``, so two
episodes never share memory or a return.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from agents.sum_tree import SequencePriorities
from envs.config import check, finite


@dataclass
class ReplayConfig:
    """Sequence replay settings."""

    # Total rows kept across all envs (each env gets capacity // num_envs).
    capacity: int = 100_000
    # Steps that only warm up the recurrent state before the loss (R2D2 burn-in).
    burn_in: int = 8
    # Steps per sequence that carry loss.
    trace_length: int = 16
    # Start state of a sampled sequence: the one recorded while acting (stored) or zeros (zero).
    initial_state: str = "stored"
    # Prioritized sequence replay (rdqn): sampling probability ~ priority ** exponent; 0 = uniform
    # (R2D2 uses 0.9).
    priority_exponent: float = 0.0
    # A sequence's priority: eta * max|TD error| + (1 - eta) * mean|TD error| over its trace.
    priority_eta: float = 0.9
    # Importance-sampling exponent at the start; annealed linearly to 1 over anneal_steps updates.
    importance_exponent: float = 0.6
    importance_anneal_steps: int = 100_000

    def validate(self) -> None:
        """Range checks of these fields (``capacity`` against the sequence length: agents.config)."""
        check(self.burn_in >= 0, "replay.burn_in", self.burn_in, "integers >= 0")
        check(self.trace_length >= 1, "replay.trace_length", self.trace_length, "integers >= 1")
        states = ("stored", "zero")
        check(self.initial_state in states, "replay.initial_state", self.initial_state, "|".join(states))
        check(finite(self.priority_exponent) and self.priority_exponent >= 0, "replay.priority_exponent",
              self.priority_exponent, ">= 0 (0 = uniform)")  # fmt: skip
        for key in ("priority_eta", "importance_exponent"):
            value = getattr(self, key)
            check(finite(value) and 0 <= value <= 1, f"replay.{key}", value, "[0, 1]")
        steps = self.importance_anneal_steps
        check(steps >= 1, "replay.importance_anneal_steps", steps, "integers >= 1")


class SequenceReplay:
    """Numpy ring buffer of ``[N, E, ...]`` rows (``N = capacity // E``), sampled as sequences."""

    def __init__(
        self,
        capacity: int,
        num_envs: int,
        seq_len: int,
        fields: dict[str, tuple[tuple[int, ...], Any]],
        state_dim: int,
        zero_initial_state: bool = False,
        seed: int = 0,
        priority: ReplayConfig | None = None,
    ) -> None:
        """``priority``: a config with ``priority_exponent > 0`` makes sampling prioritized."""
        self.num_envs = int(num_envs)
        self.rows = int(capacity) // self.num_envs
        self.seq_len = int(seq_len)
        if self.rows < self.seq_len:
            raise ValueError(f"capacity per env {self.rows} < sequence length {self.seq_len}")
        self.zero_initial_state = zero_initial_state
        base = {
            "first": ((), np.float32),
            "valid": ((), np.float32),
            "reward": ((), np.float32),
            "terminated": ((), np.float32),
            "truncated": ((), np.float32),
        }
        specs = {**base, **fields, "state": ((state_dim,), np.float32)}
        self.data = {
            k: np.zeros((self.rows, self.num_envs, *shape), dtype) for k, (shape, dtype) in specs.items()
        }
        self.pos = 0
        self.full = False
        self.rng = np.random.default_rng(seed)
        self.priorities: SequencePriorities | None = None
        if priority is not None and priority.priority_exponent > 0:
            self.priorities = SequencePriorities(
                self.rows,
                self.num_envs,
                self.seq_len,
                priority.priority_exponent,
                priority.priority_eta,
                priority.importance_exponent,
                priority.importance_anneal_steps,
            )

    @property
    def nbytes(self) -> int:
        """Bytes of the preallocated rows (pages are committed as rows are written)."""
        return int(sum(v.nbytes for v in self.data.values()))

    def __len__(self) -> int:
        """Rows stored, summed over envs."""
        return (self.rows if self.full else self.pos) * self.num_envs

    def can_sample(self) -> bool:
        """True once at least one full sequence is stored."""
        return self.full or self.pos >= self.seq_len

    def add(self, **row: np.ndarray) -> None:
        """Write one row for every env; each value is ``[E, ...]``. Every field must be given."""
        if row.keys() != self.data.keys():
            raise KeyError(f"replay row needs {sorted(self.data)}, got {sorted(row)}")
        for key, value in row.items():
            self.data[key][self.pos] = value
        if self.priorities is not None:
            self.priorities.on_add(self.pos)
        self.pos += 1
        if self.pos == self.rows:
            self.pos, self.full = 0, True

    def sample(self, batch_size: int, updates: int = 0) -> dict[str, np.ndarray]:
        """``batch_size`` sequences: each field ``[B, L, ...]``, plus ``state`` ``[B, S]`` at step 0;
        with priorities also ``weight`` ``[B]``, the importance weights (``updates`` anneals them)."""
        if not self.can_sample():
            raise RuntimeError("not enough rows in replay to sample one sequence")
        weight = None
        if self.priorities is not None:
            start, env, weight = self.priorities.sample(self.rng, batch_size, updates)
        else:
            span = (self.rows if self.full else self.pos) - self.seq_len + 1  # valid start offsets
            oldest = self.pos if self.full else 0
            start = oldest + self.rng.integers(0, span, size=batch_size)
            env = self.rng.integers(0, self.num_envs, size=batch_size)
        idx = (start[:, None] + np.arange(self.seq_len)) % self.rows  # [B, L]
        out = {k: v[idx, env[:, None]] for k, v in self.data.items() if k != "state"}
        if weight is not None:
            out["weight"] = weight
        state = self.data["state"][idx[:, 0], env]
        out["state"] = np.zeros_like(state) if self.zero_initial_state else state
        return out

    def end_episodes(self, envs: np.ndarray | slice | None = None) -> None:
        """Close the open episodes of ``envs`` (env columns; default all) at the write head, as a
        time limit would.

        Called when acting restarts with fresh episodes (a resumed run, a restarted acting worker):
        the newest row of each env becomes a final-observation row (``valid = 0``) and the row
        before it is marked truncated, so its n-step target bootstraps from that observation and no
        target reaches into the next episode. A final-observation row, and a transition that ended
        its episode by termination (its target needs no next observation), are left as they are; a
        transition cut by a time limit is closed like an open one, as the final observation it
        bootstraps from was never written.
        """
        stored = self.rows if self.full else self.pos
        if stored < 2:
            return
        cols = slice(None) if envs is None else envs
        last, prev = (self.pos - 1) % self.rows, (self.pos - 2) % self.rows
        d = self.data
        # [E] the newest row is a real transition whose target needs the row after it
        open_ = (d["valid"][last, cols] > 0) & (d["terminated"][last, cols] == 0)
        for key in ("valid", "reward", "terminated", "truncated"):
            d[key][last, cols] = np.where(open_, 0.0, d[key][last, cols])
        goes_on = open_ & (d["valid"][prev, cols] > 0) & (d["terminated"][prev, cols] == 0)
        d["truncated"][prev, cols] = np.where(goes_on, 1.0, d["truncated"][prev, cols])

    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to restore the buffer exactly (arrays, cursor, sampling RNG)."""
        meta = np.array([self.pos, int(self.full)], np.int64)
        rng_state = np.frombuffer(json.dumps(self.rng.bit_generator.state).encode(), np.uint8)
        live = self.rows if self.full else self.pos  # unwritten rows are not saved
        state = {**{f"data/{k}": v[:live] for k, v in self.data.items()}, "meta": meta, "rng": rng_state}
        if self.priorities is not None:
            state.update({f"priority/{k}": v for k, v in self.priorities.state_dict().items()})
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`; shapes must match this buffer's."""
        pos, full = int(state["meta"][0]), bool(state["meta"][1])
        live = self.rows if full else pos
        for k, v in self.data.items():
            saved = state[f"data/{k}"]
            if saved.shape != (live, *v.shape[1:]):
                raise ValueError(f"replay field {k}: saved {saved.shape} does not fit buffer {v.shape}")
            v[:live] = saved
            v[live:] = 0
        self.pos, self.full = pos, full
        self.rng.bit_generator.state = json.loads(bytes(state["rng"]).decode())
        if self.priorities is not None:
            if "priority/leaves" in state:
                self.priorities.load_state_dict({k: state[f"priority/{k}"] for k in ("leaves", "meta")})
            # Saved with uniform replay, every stored start enters at priority 1; either way the
            # sampleable starts follow this run's sequence length.
            self.priorities.revalidate(self.pos, self.full)

    def update_priorities(self, td_error: np.ndarray, mask: np.ndarray) -> None:
        """After a learner step on the latest sample: its TD errors and mask ``[B, T]`` set the
        sampled sequences' priorities (no-op for uniform replay)."""
        if self.priorities is not None:
            self.priorities.update(td_error, mask)
