"""Prioritized sequence replay: the sum tree's sampling proportions, priority updates, importance
weights, which starts may be sampled, and the checkpoint round trip."""

from __future__ import annotations

import numpy as np
import pytest

from agents.replay import ReplayConfig, SequenceReplay
from agents.sum_tree import SequencePriorities, SumTree


def test_sampling_follows_the_priorities_chi_square() -> None:
    tree = SumTree(6)  # not a power of two: two padding leaves stay empty
    priorities = np.array([1.0, 2.0, 0.0, 4.0, 0.5, 2.5])
    tree.set(np.arange(6), priorities)
    assert tree.total == pytest.approx(priorities.sum())
    draws = tree.sample(np.random.default_rng(0).random(100_000))
    counts = np.bincount(draws, minlength=8)
    assert counts[2] == 0 and counts[6:].sum() == 0  # priority 0 and padding: never
    expected = priorities / priorities.sum() * len(draws)
    keep = expected > 0
    chi2 = (((counts[:6] - expected) ** 2)[keep] / expected[keep]).sum()
    assert chi2 < 20.5  # 99.9 % quantile of chi-square with 4 degrees of freedom: 18.5


def test_set_updates_inner_sums_and_state_round_trip() -> None:
    tree = SumTree(5)
    tree.set(np.array([0, 4, 4]), np.array([1.0, 2.0, 3.0]))  # a repeated index keeps its last value
    assert tree.total == pytest.approx(4.0) and tree.get(np.array([4]))[0] == 3.0
    copy = SumTree(5)
    copy.load_state_dict(tree.state_dict())
    np.testing.assert_array_equal(copy.nodes, tree.nodes)
    with pytest.raises(ValueError, match="saved 5 leaves, this tree holds 4"):
        SumTree(4).load_state_dict(tree.state_dict())


def _replay(exponent: float = 1.0, seq_len: int = 4) -> SequenceReplay:
    config = ReplayConfig(priority_exponent=exponent, priority_eta=0.5, importance_exponent=0.5)
    fields = {"obs": ((1,), np.float32), "action": ((), np.int32)}
    return SequenceReplay(20, 2, seq_len, fields, state_dim=1, seed=0, priority=config)


def _add(replay: SequenceReplay, t: int) -> None:
    e = replay.num_envs
    zeros = np.zeros(e, np.float32)
    obs = np.full((e, 1), t, np.float32) + 1000 * np.arange(e)[:, None]  # env i's rows: t + 1000 i
    replay.add(obs=obs, action=np.zeros(e, np.int32), reward=zeros, terminated=zeros, truncated=zeros,
               first=zeros, valid=np.ones(e, np.float32), state=np.zeros((e, 1), np.float32))  # fmt: skip


def test_only_complete_sequences_before_the_head_are_sampled() -> None:
    replay = _replay()
    for t in range(13):  # 10 rows per env: wrapped, the head sits at row 3
        _add(replay, t)
    batch = replay.sample(256)
    obs = batch["obs"][..., 0] % 1000  # [B, L]: consecutive, oldest row 3 (t = 3) to newest t = 12
    np.testing.assert_array_equal(np.diff(obs, axis=1), 1.0)
    assert obs.min() >= 3 and obs.max() <= 12 and set(np.unique(obs[:, 0])) == set(range(3, 10))
    assert batch["weight"].shape == (256,) and batch["weight"].max() == pytest.approx(1.0)


def test_priorities_follow_td_errors_and_weights_correct_for_them() -> None:
    replay = _replay(exponent=1.0)
    for t in range(10):
        _add(replay, t)
    batch = replay.sample(8)
    td = np.zeros((8, 3), np.float32)
    td[0] = [4.0, 0.0, 2.0]  # eta 0.5: 0.5 * 4 + 0.5 * mean(4, 0, 2) = 3
    mask = np.ones((8, 3), np.float32)
    mask[0, 1] = 0.0  # masked: the mean runs over 4 and 2 only -> 0.5 * 4 + 0.5 * 3 = 3.5
    leaves = replay.priorities.last.copy()
    replay.update_priorities(td, mask)
    assert replay.priorities.tree.get(leaves[:1])[0] == pytest.approx(3.5, abs=1e-5)
    assert replay.priorities.max_priority == pytest.approx(3.5, abs=1e-5)
    # The high-priority start is drawn far more often, and carries the smallest weight.
    batch = replay.sample(512)
    first_obs = batch["obs"][:, 0, 0]
    start_row, start_env = leaves[0] // 2, leaves[0] % 2  # rows hold t = row on this first lap
    hot = first_obs == start_row + 1000 * start_env
    assert hot.mean() > 0.2
    assert batch["weight"][hot].max() < batch["weight"][~hot].min()
    # Exactly (N P(i)) ** -beta over the batch maximum; beta anneals from 0.5 (updates=0) to 1.
    prio = replay.priorities
    for updates, beta in ((0, 0.5), (prio.anneal_steps // 2, 0.75), (10 * prio.anneal_steps, 1.0)):
        batch = replay.sample(64, updates)
        prob = prio.tree.get(prio.last) / prio.tree.total
        n = np.count_nonzero(prio.tree.get(np.arange(replay.rows * 2)))
        want = (n * prob) ** -beta
        np.testing.assert_allclose(batch["weight"], want / want.max(), rtol=1e-5)


def test_priorities_survive_a_checkpoint_and_uniform_checkpoints_get_them() -> None:
    replay = _replay()
    for t in range(12):
        _add(replay, t)
    replay.sample(4)
    replay.update_priorities(np.full((4, 3), 7.0, np.float32), np.ones((4, 3), np.float32))
    restored = _replay()
    restored.load_state_dict(replay.state_dict())
    np.testing.assert_array_equal(restored.priorities.tree.nodes, replay.priorities.tree.nodes)
    assert restored.priorities.max_priority == replay.priorities.max_priority
    uniform = SequenceReplay(20, 2, 4, {"obs": ((1,), np.float32), "action": ((), np.int32)}, 1, seed=0)
    for t in range(12):
        _add(uniform, t)
    upgraded = _replay()
    upgraded.load_state_dict(uniform.state_dict())  # a run resumed with priorities switched on
    fresh = _replay()  # the tree a prioritized replay builds from the same adds: every start at 1
    for t in range(12):
        _add(fresh, t)
    assert isinstance(fresh.priorities, SequencePriorities)
    np.testing.assert_array_equal(upgraded.priorities.tree.nodes, fresh.priorities.tree.nodes)


@pytest.mark.parametrize("adds", [7, 13])  # part-filled (head at row 7), wrapped (head at row 3)
def test_a_restore_with_another_sequence_length_samples_only_sequences_that_fit(adds: int) -> None:
    # trace_length, burn_in and n_step may change on resume; the saved leaves mark starts for the
    # old length. A longer sequence from one of them must not run past the head into older rows.
    replay = _replay()
    for t in range(adds):
        _add(replay, t)
    replay.sample(4)
    hot = replay.priorities.last.copy()  # these starts get priority 7
    replay.update_priorities(np.full((4, 3), 7.0, np.float32), np.ones((4, 3), np.float32))
    for seq_len, starts in ((6, range(max(adds - 10, 0), adds - 5)), (2, range(max(adds - 10, 0), adds - 1))):
        restored = _replay(seq_len=seq_len)
        restored.load_state_dict(replay.state_dict())
        obs = restored.sample(512)["obs"][..., 0] % 1000  # [B, L] the write order t
        np.testing.assert_array_equal(np.diff(obs, axis=1), 1.0)  # consecutive: never across the head
        assert set(np.unique(obs[:, 0])) == set(starts)  # every start that fits, none that does not
        tree = restored.priorities.tree
        fits = restored.priorities.tree.get(hot) > 0
        np.testing.assert_allclose(tree.get(hot[fits]), 7.0, rtol=1e-5)  # kept where it still fits
        # Starts the longer saved length had left out enter at the running maximum.
        leaves = np.arange(restored.rows * 2)
        fresh = (tree.get(leaves) > 0) & (replay.priorities.tree.get(leaves) == 0)
        np.testing.assert_allclose(tree.get(leaves[fresh]), restored.priorities.max_priority)
        assert fresh.any() == (seq_len < 4)
