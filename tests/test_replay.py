"""Sequence replay: wrap-around order, no crossing the write head, masks at episode ends."""

from __future__ import annotations

import numpy as np

from agents.replay import SequenceReplay


def _replay(capacity: int = 20, envs: int = 2, seq_len: int = 4, zero: bool = False) -> SequenceReplay:
    fields = {"obs": ((1,), np.float32), "action": ((), np.int32)}
    return SequenceReplay(capacity, envs, seq_len, fields, state_dim=2, zero_initial_state=zero, seed=0)


def _add(replay: SequenceReplay, t: int) -> None:
    e = replay.num_envs
    replay.add(
        obs=np.full((e, 1), t, np.float32) + np.arange(e)[:, None] * 1000,
        action=np.zeros(e, np.int32),
        reward=np.full(e, t, np.float32),
        terminated=np.zeros(e, np.float32),
        truncated=np.zeros(e, np.float32),
        first=np.zeros(e, np.float32),
        valid=np.ones(e, np.float32),
        state=np.full((e, 2), t, np.float32),
    )


def test_sequences_are_consecutive_and_within_one_env_after_wraparound() -> None:
    replay = _replay()  # 10 rows per env
    assert not replay.can_sample()
    for t in range(3):
        _add(replay, t)
    assert not replay.can_sample()
    for t in range(3, 27):  # wraps around twice; rows now hold t = 17..26
        _add(replay, t)
    assert len(replay) == 20
    batch = replay.sample(500)
    obs = batch["obs"][..., 0]
    env = obs[:, 0] // 1000
    t = obs - env[:, None] * 1000
    np.testing.assert_array_equal(np.diff(t, axis=1), 1.0)  # consecutive in time, never crossing head
    assert t.min() == 17 and t.max() == 26  # only live rows, oldest to newest
    assert set(np.unique(env)) == {0, 1}
    np.testing.assert_array_equal(batch["state"][:, 0], t[:, 0])  # state stored at the start row


def test_zero_initial_state_option() -> None:
    replay = _replay(zero=True)
    for t in range(1, 8):
        _add(replay, t)
    assert (replay.sample(10)["state"] == 0).all()


def test_state_dict_round_trip_keeps_sampling_stream() -> None:
    a = _replay()
    for t in range(13):
        _add(a, t)
    b = _replay()
    b.load_state_dict(a.state_dict())
    got_a, got_b = a.sample(16), b.sample(16)
    for k, v in got_a.items():
        np.testing.assert_array_equal(v, got_b[k])


def test_end_episodes_closes_open_episodes_so_no_target_crosses_a_resume() -> None:
    from agents.returns import n_step_targets

    replay = _replay(capacity=20, envs=2)
    for t in range(12):  # wraps: the write head sits at row 2
        _add(replay, t)
    replay.data["valid"][(replay.pos - 1) % replay.rows, 1] = 0.0  # env 1 already ended its episode
    replay.end_episodes()
    last, prev = (replay.pos - 1) % replay.rows, (replay.pos - 2) % replay.rows
    assert replay.data["valid"][last].tolist() == [0.0, 0.0]
    assert replay.data["reward"][last, 0] == 0.0 and replay.data["truncated"][prev].tolist() == [1.0, 0.0]
    # Stopped right after a terminal step, before its final-observation row: the terminal
    # transition is kept (its target needs no next row); a time-limit cut is closed instead.
    ended = _replay(capacity=20, envs=2)
    for t in range(5):
        _add(ended, t)
    last, prev = ended.pos - 1, ended.pos - 2
    ended.data["terminated"][last, 0] = 1.0
    ended.data["truncated"][last, 1] = 1.0
    ended.end_episodes()
    assert ended.data["valid"][last].tolist() == [1.0, 0.0]
    assert ended.data["terminated"][last].tolist() == [1.0, 0.0] and ended.data["reward"][last, 0] == 4.0
    assert ended.data["truncated"][prev].tolist() == [0.0, 1.0]
    # After the resume the next row starts a fresh episode with reward 100 for env 0.
    _add(replay, 100)
    replay.data["first"][(replay.pos - 1) % replay.rows] = 1.0
    rows = (np.arange(replay.pos - 6, replay.pos)) % replay.rows
    d = {k: replay.data[k][rows, 0][None] for k in ("reward", "terminated", "truncated")}
    value = np.full((1, 6), 1000.0, np.float32)  # bootstrap value of every row's observation
    y = n_step_targets(d["reward"], d["terminated"], d["truncated"], value, gamma=1.0, n_step=3).numpy()[0]
    # Rows 0-2 (t = 7, 8, 9): rewards up to the truncated row t = 10, then the value of the final
    # observation at t = 11; never the new episode's reward of 100.
    assert y.tolist() == [7 + 8 + 9 + 1000, 8 + 9 + 10 + 1000, 9 + 10 + 1000]
