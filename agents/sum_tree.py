"""A sum tree over ``n`` leaf priorities, vectorised in numpy: batched updates and proportional
sampling in ``O(B log n)`` array operations (no Python loop over the batch)."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Leaves ``[n]`` of non-negative priorities; :meth:`sample` draws leaf ``i`` with probability
    ``p_i / sum(p)``. The tree is a heap in one array (node ``k`` has children ``2k`` and ``2k + 1``;
    the leaves start at ``size``, the smallest power of two ``>= n``)."""

    def __init__(self, n: int) -> None:
        self.n = int(n)
        self.size = 1 << max(self.n - 1, 0).bit_length()
        self.nodes = np.zeros(2 * self.size, np.float64)

    @property
    def total(self) -> float:
        """Sum of all priorities."""
        return float(self.nodes[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        """Priorities of leaves ``index`` ``[B]``."""
        return self.nodes[self.size + np.asarray(index)]

    def set(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Set leaves ``index`` ``[B]`` to ``priority`` ``[B]`` (a repeated index keeps its last value)."""
        index = np.asarray(index, np.int64).reshape(-1)
        priority = np.broadcast_to(np.asarray(priority, np.float64), index.shape)
        node = self.size + index
        self.nodes[node] = priority
        # Parents are recomputed from their children, so a parent listed twice gets the same value.
        node = node // 2
        while node.size and node[0] >= 1:
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]
            node = node // 2

    def sample(self, uniform: np.ndarray) -> np.ndarray:
        """Leaves for ``uniform`` ``[B]`` values in ``[0, 1)``: the leaf whose prefix-sum interval
        holds ``u * total``. Leaves of priority 0 are never returned while the total is positive."""
        target = np.asarray(uniform, np.float64) * self.total
        node = np.ones(target.shape, np.int64)
        while node[0] < self.size:
            left = 2 * node
            go_right = target >= self.nodes[left]
            # Rounding can leave a target just past the left sum where the right child is empty.
            go_right &= self.nodes[left + 1] > 0
            target = np.where(go_right, target - self.nodes[left], target)
            node = np.where(go_right, left + 1, left)
        return node - self.size

    def state_dict(self) -> dict[str, np.ndarray]:
        """The leaf priorities (the inner nodes are rebuilt on load)."""
        return {"leaves": self.nodes[self.size : self.size + self.n].copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`; the leaf count must match."""
        leaves = np.asarray(state["leaves"], np.float64)
        if leaves.shape != (self.n,):
            raise ValueError(f"sum tree: saved {leaves.shape[0]} leaves, this tree holds {self.n}")
        self.nodes[:] = 0.0
        self.nodes[self.size : self.size + self.n] = leaves
        for level_start in _levels(self.size):
            k = np.arange(level_start, 2 * level_start)
            self.nodes[k] = self.nodes[2 * k] + self.nodes[2 * k + 1]


def _levels(size: int) -> list[int]:
    """First node index of each inner level, bottom up: ``size // 2, size // 4, ..., 1``."""
    out, start = [], size // 2
    while start >= 1:
        out.append(start)
        start //= 2
    return out


class SequencePriorities:
    """Priorities of sequence starts for prioritized sequence replay (R2D2).

    A start is a (row, env) pair of the replay ring (leaf ``row * E + env``); it is sampleable once
    its ``seq_len`` rows are written and until the write head reaches it again. New starts enter at
    the running maximum priority; after a learner step each sampled start gets
    ``eta * max|delta| + (1 - eta) * mean|delta|`` over its trace. The tree holds ``p ** alpha``.
    """

    def __init__(
        self,
        rows: int,
        num_envs: int,
        seq_len: int,
        exponent: float,
        eta: float,
        importance_exponent: float,
        anneal_steps: int,
    ) -> None:
        self.rows, self.num_envs, self.seq_len = int(rows), int(num_envs), int(seq_len)
        self.alpha, self.eta = float(exponent), float(eta)
        self.beta0, self.anneal_steps = float(importance_exponent), int(anneal_steps)
        self.tree = SumTree(self.rows * self.num_envs)
        self.max_priority = 1.0
        self.written = 0  # rows written so far (saturates at rows)
        self.last: np.ndarray | None = None  # leaves of the latest sample, for update()
        self._envs = np.arange(self.num_envs)

    def _leaves(self, row: int) -> np.ndarray:
        return (row % self.rows) * self.num_envs + self._envs

    def on_add(self, pos: int) -> None:
        """Row ``pos`` was just written for every env: starts there now run into the head (invalid);
        the start ``seq_len - 1`` rows back has its sequence complete (valid, at the max priority)."""
        self.written = min(self.written + 1, self.rows)
        if self.written >= self.seq_len:
            leaves = np.concatenate([self._leaves(pos), self._leaves(pos - self.seq_len + 1)])
            priority = np.repeat([0.0, self.max_priority**self.alpha], self.num_envs)
            self.tree.set(leaves, priority)
        else:
            self.tree.set(self._leaves(pos), 0.0)

    def sample(self, rng: np.random.Generator, batch_size: int, updates: int) -> tuple[np.ndarray, ...]:
        """``(row [B], env [B], weight [B])``: stratified proportional draws and their importance
        weights ``(N P(i)) ** -beta``, normalised by the batch maximum; ``beta`` anneals to 1."""
        uniform = (np.arange(batch_size) + rng.random(batch_size)) / batch_size
        leaves = self.tree.sample(uniform)
        self.last = leaves
        prob = self.tree.get(leaves) / self.tree.total
        valid = np.count_nonzero(self.tree.nodes[self.tree.size : self.tree.size + self.tree.n])
        beta = self.beta0 + (1.0 - self.beta0) * min(updates / self.anneal_steps, 1.0)
        weight = (valid * prob) ** -beta
        return leaves // self.num_envs, leaves % self.num_envs, (weight / weight.max()).astype(np.float32)

    def update(self, td_error: np.ndarray, mask: np.ndarray) -> None:
        """New priorities of the latest sample from its TD errors and mask ``[B, T]``."""
        if self.last is None:
            return
        d = np.abs(td_error) * mask
        count = np.maximum(mask.sum(axis=1), 1.0)
        priority = self.eta * d.max(axis=1) + (1.0 - self.eta) * d.sum(axis=1) / count + 1e-6
        self.max_priority = max(self.max_priority, float(priority.max()))
        self.tree.set(self.last, priority**self.alpha)
        self.last = None

    def state_dict(self) -> dict[str, np.ndarray]:
        """Leaves, running maximum and rows written."""
        meta = np.array([self.max_priority, self.written], np.float64)
        return {"leaves": self.tree.state_dict()["leaves"], "meta": meta}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Inverse of :meth:`state_dict`. Call :meth:`revalidate` after it: which starts are
        sampleable depends on ``seq_len``, which a resumed run may change."""
        self.tree.load_state_dict({"leaves": state["leaves"]})
        self.max_priority, self.written = float(state["meta"][0]), int(state["meta"][1])

    def revalidate(self, pos: int, full: bool) -> None:
        """Make the sampleable starts exactly those whose ``seq_len`` rows are written and do not
        reach the write head ``pos``: starts that no longer fit get priority 0, starts that fit and
        had none enter at the running maximum; the others keep their priority.

        Needed after a restore with another ``seq_len`` (``replay.trace_length``, ``replay.burn_in``
        or ``agent.n_step`` changed on resume): the saved leaves mark starts for the old length, and
        a longer sequence from one of them would run past the head into the oldest rows.
        """
        live = self.rows if full else pos
        oldest = pos if full else 0
        age = (np.arange(self.rows) - oldest) % self.rows  # [rows] 0 = oldest stored row
        fits = np.repeat(age + self.seq_len <= live, self.num_envs)  # [rows * E] by leaf
        leaves = np.arange(self.rows * self.num_envs)
        current = self.tree.get(leaves)
        new = np.where(fits, np.where(current > 0, current, self.max_priority**self.alpha), 0.0)
        changed = new != current
        if changed.any():
            self.tree.set(leaves[changed], new[changed])
        self.written = live
