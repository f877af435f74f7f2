"""After training: evaluate a checkpoint and export the policy, loaded by plain TensorFlow."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from agents.actor import Actor
from agents.config import Config, validate
from agents.export import PolicyModule, export_saved_model
from agents.loop import train
from agents.rdqn import RDQNLearner
from agents.saved_run import evaluate_run, load_run
from envs import make_vec_env
from envs.config import ConfigError

LOADER = textwrap.dedent(
    """
    import sys
    for name in ("agents", "envs", "scripts", "conf"):
        sys.modules[name] = None  # recurrl must not be needed
    import numpy as np
    import tensorflow as tf
    model = tf.saved_model.load(sys.argv[1])
    data = np.load(sys.argv[2])
    state = model.initial_state(tf.constant(1, tf.int32))["state"]
    actions, values = [], []
    for obs in data["obs"]:
        out = model.step(tf.constant(obs[None]), state)
        state = out["state"]
        actions.append(out["action"].numpy()[0])
        values.append(out["q_values" if "q_values" in out else "action_mean"].numpy()[0])
    sig = model.signatures["step"](observation=tf.constant(data["obs"][:1]), state=model.initial_state(
        tf.constant(1, tf.int32))["state"])
    np.savez(sys.argv[3], action=np.array(actions), value=np.array(values), sig_action=sig["action"].numpy())
    """
)


def _as_rddpg(config: Config) -> None:
    """Turn the tiny rdqn config into an rddpg one on the continuous cue task."""
    from agents.rddpg import RDDPGConfig

    config.agent = RDDPGConfig(batch_size=8, n_step=2)
    config.env.id = "recurrl/CueMemoryContinuous-v0"
    config.network.post_layers = [16]


def _load_without_recurrl(loader: str, out: Path, episode: dict, tmp_path: Path) -> dict[str, np.ndarray]:
    """Run ``loader`` on the export ``out`` and the episode's observations in a subprocess whose
    ``agents``/``envs``/``scripts`` imports are blocked; returns the arrays it saved."""
    np.savez(tmp_path / "episode.npz", obs=episode["obs"])
    script = tmp_path / "load.py"
    script.write_text(loader)
    proc = subprocess.run(
        [sys.executable, str(script), str(out), str(tmp_path / "episode.npz"), str(tmp_path / "got.npz")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(np.load(tmp_path / "got.npz"))


def _episode(saved) -> dict[str, np.ndarray]:
    """One greedy episode of the numpy acting policy: observations, actions and outputs per step."""
    env = make_vec_env(saved.config.env, seed=123, num_envs=1)
    policy = saved.greedy_policy("online")
    actor = Actor(env, policy, replay=None, seed=123)
    obs, actions, values = [], [], []
    while True:
        features = actor.obs
        out, _ = policy.net.step(features, actor.state)
        obs.append(features["obs"][0].copy())
        values.append(out[0])
        stats = actor.step(explore=False)
        actions.append(actor.prev_action[0])
        if stats.returns:
            break
    env.close()
    return {"obs": np.array(obs, np.float32), "action": np.array(actions), "value": np.array(values)}


@pytest.mark.parametrize(("agent", "cell"), [("rdqn", "lstm"), ("rdqn", "gru"), ("rddpg", "lstm")])
def test_exported_policy_acts_like_the_numpy_policy_without_recurrl(
    tiny_config: Config, tmp_path: Path, agent: str, cell: str
) -> None:
    config = copy.deepcopy(tiny_config)
    config.network.cell = cell
    if agent == "rddpg":
        _as_rddpg(config)
    train(config)
    saved = load_run(config.run_dir, backend="graph")
    episode = _episode(saved)
    out = export_saved_model(saved, tmp_path / "export")
    got = _load_without_recurrl(LOADER, out, episode, tmp_path)
    assert len(got["action"]) == len(episode["obs"]) >= 3
    if agent == "rdqn":  # the actor's previous action is one-hot
        np.testing.assert_array_equal(got["action"], episode["action"].argmax(axis=-1))
    else:
        np.testing.assert_allclose(got["action"], episode["action"], atol=1e-5)
    np.testing.assert_allclose(got["value"], episode["value"], atol=1e-5)
    assert got["sig_action"].shape[0] == 1


def test_exported_action_is_in_the_envs_multidiscrete_space(tiny_config: Config, tmp_path: Path) -> None:
    """The agent picks one of prod(nvec) joint actions; the export returns the env's own action."""
    import gymnasium as gym

    config = copy.deepcopy(tiny_config)
    config.env.kwargs = {**config.env.kwargs, "action_type": "multi_discrete"}
    train(config)
    saved = load_run(config.run_dir, backend="graph")
    episode = _episode(saved)
    got = _load_without_recurrl(LOADER, export_saved_model(saved, tmp_path / "export"), episode, tmp_path)
    raw = gym.make(config.env.id, **config.env.kwargs).action_space  # MultiDiscrete([2, 3])
    joint = episode["action"].argmax(axis=-1)  # the actor's indices, one-hot as its previous action
    assert got["action"].shape == (len(joint), 2) and all(
        raw.contains(a.astype(raw.dtype)) for a in got["action"]
    )
    np.testing.assert_array_equal(
        got["action"], np.stack(np.unravel_index(joint, raw.nvec), axis=-1) + raw.start
    )
    np.testing.assert_allclose(got["value"], episode["value"], atol=1e-5)  # over the joint indices


def test_a_loaded_run_has_the_weights_it_was_saved_with(tiny_config: Config, monkeypatch) -> None:
    """Every weight of every network, the observation statistics included, as the run had it when
    it wrote its last checkpoint; the statistics are the running ones, not their initial values."""
    import keras

    from agents.checkpoint import Checkpointer

    tiny_config.network.layer_norm = True
    tiny_config.network.post_layers = [8]
    seen: dict[int, dict[str, np.ndarray]] = {}
    save = Checkpointer.save

    networks: list = []
    real_init = Checkpointer.__init__

    def tracking_init(self, run_dir, max_to_keep=2, **objects):
        real_init(self, run_dir, max_to_keep, **objects)
        networks[:] = [v for v in objects.values() if isinstance(v, keras.Model)]

    def saving(self, step, extra, info):
        seen[step] = {w.path: np.asarray(w) for net in networks for w in net.weights}
        save(self, step, extra, info)

    monkeypatch.setattr(Checkpointer, "__init__", tracking_init)
    monkeypatch.setattr(Checkpointer, "save", saving)
    train(copy.deepcopy(tiny_config))
    monkeypatch.undo()
    saved = load_run(tiny_config.run_dir)
    loaded = {w.path: np.asarray(w) for net in saved.learner.networks() for w in net.weights}
    assert saved.step == 400 and loaded.keys() == seen[400].keys()
    for path, value in seen[400].items():
        np.testing.assert_array_equal(loaded[path], value, err_msg=path)
    assert not np.allclose(loaded["online_q/encoder/input_std"], 1.0)


def test_evaluate_run_writes_returns_and_refuses_a_missing_step(tiny_config: Config) -> None:
    train(copy.deepcopy(tiny_config))
    saved = load_run(tiny_config.run_dir)
    assert saved.step == 400
    record = evaluate_run(saved, episodes=6, network="target", seed=5)
    assert record["episodes"] == 6 and len(record["returns"]) == 6 and record["network"] == "target"
    assert np.isclose(record["return_mean"], np.mean(record["returns"]))
    assert "success_rate" not in record  # the env sets no success_return
    saved.config.env.success_return = 0.5
    counted = evaluate_run(saved, episodes=6, network="target", seed=5)
    assert counted["success_rate"] == np.mean(np.array(counted["returns"]) >= 0.5)
    with pytest.raises(ConfigError, match=r"^step=300 is invalid: allowed 200\|400$"):
        load_run(tiny_config.run_dir, step=300)
    allowed = r"^network='ema' is invalid: allowed run\|online\|target\|average$"
    with pytest.raises(ConfigError, match=allowed):
        evaluate_run(saved, episodes=2, network="ema", seed=5)
    assert load_run(tiny_config.run_dir, step=200).step == 200
    kept_none = r"^network='average' is invalid for this run: it was trained without agent\.average_tau"
    with pytest.raises(ConfigError, match=kept_none):
        evaluate_run(saved, episodes=2, network="average", seed=5)
    state = Path(tiny_config.run_dir) / "ckpt" / "state-200.npz"
    state.write_bytes(state.read_bytes()[:100])  # truncated
    damaged = r"^step=200 is invalid: its checkpoint is damaged \(BadZipFile: .*\); allowed 400 "
    with pytest.raises(ConfigError, match=damaged):
        load_run(tiny_config.run_dir, step=200)


def test_evaluation_reads_the_weights_and_not_the_replay(tiny_config: Config) -> None:
    """A checkpoint whose replay arrays are damaged still has sound weights: evaluate and export
    load it (they never read the replay), where resuming the run would skip it."""
    import zipfile

    from agents.checkpoint import Checkpointer

    train(copy.deepcopy(tiny_config))
    state = Path(tiny_config.run_dir) / "ckpt" / "state-400.npz"
    with zipfile.ZipFile(state) as z:
        member = z.getinfo("replay/data/obs.npy")
    data = bytearray(state.read_bytes())
    middle = member.header_offset + 30 + len(member.filename) + member.compress_size // 2
    data[middle : middle + 8] = bytes(8 * [0xFF])  # the member's CRC no longer matches
    state.write_bytes(bytes(data))
    with pytest.raises(zipfile.BadZipFile):
        Checkpointer(tiny_config.run_dir).load(400)
    saved = load_run(tiny_config.run_dir)
    assert saved.step == 400
    assert evaluate_run(saved, episodes=2, network="target", seed=0)["episodes"] == 2


def test_a_run_trained_with_an_average_network_evaluates_and_exports_it(
    tiny_config: Config, monkeypatch
) -> None:
    asked = []
    eval_network = RDQNLearner.eval_network
    monkeypatch.setattr(
        RDQNLearner, "eval_network", lambda self, which: asked.append(which) or eval_network(self, which)
    )
    tiny_config.agent.average_tau = 0.05
    tiny_config.eval.network = "average"
    validate(tiny_config)
    summary = train(copy.deepcopy(tiny_config))
    assert [e["env_steps"] for e in summary["evaluations"]] == [200, 400] and asked == ["average"] * 2
    monkeypatch.undo()
    saved = load_run(tiny_config.run_dir)
    average = saved.learner.eval_network("average")
    assert saved.network_name() == "average" and PolicyModule(saved).net is average
    online = saved.learner.eval_network("online")
    pairs = zip(average.get_weights(), online.get_weights(), strict=True)
    assert any(not np.allclose(a, o) for a, o in pairs)
    record = evaluate_run(saved, episodes=3, network="run", seed=1)
    assert record["network"] == "average" and len(record["returns"]) == 3


def test_network_run_acts_with_the_weights_the_runs_evaluations_used(tiny_config: Config) -> None:
    train(copy.deepcopy(tiny_config))
    saved = load_run(tiny_config.run_dir)
    assert saved.config.eval.network == "online" and saved.network_name() == "online"
    saved.config.eval.network = "target"  # as a run trained with eval.network=target reads back
    by_run = evaluate_run(saved, episodes=4, network="run", seed=3)
    by_name = evaluate_run(saved, episodes=4, network="target", seed=3)
    assert by_run["network"] == "target" and by_run["returns"] == by_name["returns"]
    assert PolicyModule(saved).net is saved.learner.eval_network("target")
    assert PolicyModule(saved, "online").net is saved.learner.eval_network("online")


def test_commands_refuse_a_bad_network_before_loading_the_run(tmp_path: Path) -> None:
    from scripts.evaluate import EvaluateConfig, run_evaluation
    from scripts.export import ExportConfig, run_export

    missing = str(tmp_path / "no-run")  # loading it would fail with a different line
    allowed = r"^network='ema' is invalid: allowed run\|online\|target\|average$"
    with pytest.raises(ConfigError, match=allowed):
        run_evaluation(EvaluateConfig(run=missing, network="ema"))
    with pytest.raises(ConfigError, match=allowed):
        run_export(ExportConfig(run=missing, network="ema"))
    assert not (tmp_path / "no-run").exists()


def test_evaluate_command_writes_eval_json_and_refuses_a_non_run(tiny_config: Config, tmp_path: Path) -> None:
    train(copy.deepcopy(tiny_config))
    root = Path(__file__).resolve().parents[1]
    run = tiny_config.run_dir
    cmd = [sys.executable, "-m", "scripts.evaluate", f"run={run}", "episodes=3"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((Path(run) / "eval-400.json").read_text())
    assert record["episodes"] == 3 and record["step"] == 400
    elsewhere = tmp_path / "final.json"  # record= leaves eval-<step>.json as it was
    again = [*cmd, "episodes=2", "step=200", f"record={elsewhere}"]
    proc = subprocess.run(again, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(elsewhere.read_text())["step"] == 200 and not (Path(run) / "eval-200.json").exists()
    assert json.loads((Path(run) / "eval-400.json").read_text()) == record
    from scripts.evaluate import EvaluateConfig, run_evaluation

    target = run_evaluation(EvaluateConfig(run=str(run), episodes=2, network="target"))
    assert json.loads((Path(run) / "eval-400-target.json").read_text()) == target
    assert target["network"] == "target" and json.loads((Path(run) / "eval-400.json").read_text()) == record

    with pytest.raises(
        ConfigError, match=r"^record='.*/nowhere/x\.json' is invalid: allowed a file in an existing"
    ):
        run_evaluation(EvaluateConfig(run=str(run), record=str(tmp_path / "nowhere" / "x.json")))
    bad = tmp_path / "empty"
    proc = subprocess.run([*cmd[:3], f"run={bad}"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines()[-1].startswith("error: run=")
    assert not bad.exists()


def test_video_of_a_rendering_env_and_one_line_for_another(tiny_config: Config, tmp_path: Path) -> None:
    pytest.importorskip("moviepy", reason="video needs the video extra (moviepy)")
    pytest.importorskip("pygame", reason="CartPole renders with pygame (video extra)")
    from agents.saved_run import record_video
    from scripts.evaluate import EvaluateConfig, run_evaluation

    cue = copy.deepcopy(tiny_config)
    train(cue)
    with pytest.raises(ConfigError, match=r"^env.id='recurrl/CueMemory-v0' cannot render rgb_array"):
        record_video(load_run(cue.run_dir), "online", 0, 1, tmp_path / "none")
    with pytest.raises(ConfigError, match="cannot render rgb_array"):  # refused before any record
        run_evaluation(EvaluateConfig(run=cue.run_dir, video=True))
    assert not list(Path(cue.run_dir).glob("eval-*.json"))
    cart = copy.deepcopy(tiny_config)
    cart.run_dir = str(tmp_path / "cart")
    cart.env.id, cart.env.kwargs, cart.env.mask_obs = "CartPole-v1", {}, [1, 3]
    train(cart)
    files = record_video(load_run(cart.run_dir), "online", 0, 2, tmp_path / "videos")
    assert len(files) == 2 and all(Path(f).stat().st_size > 1000 for f in files)
    record = run_evaluation(EvaluateConfig(run=cart.run_dir, episodes=2, video=True, video_episodes=1))
    written = json.loads((Path(cart.run_dir) / "eval-400.json").read_text())
    assert written == record and len(written["videos"]) == 1  # the record names its videos


KERAS_LOADER = textwrap.dedent(
    """
    import sys
    for name in ("agents", "envs", "scripts", "conf"):
        sys.modules[name] = None
    import keras
    import numpy as np
    model = keras.saving.load_model(sys.argv[1])
    data = np.load(sys.argv[2])
    state = [np.zeros((1, int(s.shape[-1])), np.float32) for s in model.inputs[1:]]
    values = []
    for obs in data["obs"]:
        out, *state = model([obs[None, None], *state])
        state = [np.asarray(s) for s in state]
        values.append(np.asarray(out)[0, 0])
    np.savez(sys.argv[3], value=np.array(values))
    """
)


@pytest.mark.parametrize(("agent", "cell"), [("rdqn", "lstm"), ("rdqn", "gru"), ("rddpg", "lstm")])
def test_keras_export_of_stock_layers_matches_the_numpy_policy(
    tiny_config: Config, tmp_path: Path, agent: str, cell: str
) -> None:
    from agents.export import export_keras

    tiny_config.network.cell = cell
    tiny_config.network.layer_norm = True
    if agent == "rddpg":  # post layers too: the actor's head sits after them
        _as_rddpg(tiny_config)
    train(tiny_config)
    saved = load_run(tiny_config.run_dir)
    episode = _episode(saved)
    out = export_keras(saved, tmp_path / "policy")
    got = _load_without_recurrl(KERAS_LOADER, out, episode, tmp_path)
    np.testing.assert_allclose(got["value"], episode["value"], atol=1e-4)


def test_dict_observation_exports_one_input_per_leaf(tiny_config: Config) -> None:
    """A Dict observation (a discrete leaf and a Box leaf; here the cue task's dict view) exports
    with one named input per leaf, and the SavedModel acts as the numpy policy does; the stock
    Keras export, which reads one flat vector, refuses it with one line."""
    import tensorflow as tf

    from agents.export import keras_model

    config = copy.deepcopy(tiny_config)
    config.env.kwargs = {**config.env.kwargs, "obs_type": "dict"}
    train(config)
    saved = load_run(config.run_dir, backend="graph")
    out = export_saved_model(saved, Path(config.run_dir) / "export")
    model = tf.saved_model.load(str(out))
    sig = model.signatures["step"].structured_input_signature[1]
    assert set(sig) == {"obs_cue", "obs_query", "state"}
    env = make_vec_env(config.env, seed=5, num_envs=1)
    policy = saved.greedy_policy("online")
    actor = Actor(env, policy, replay=None, seed=5)
    state = model.initial_state(tf.constant(1, tf.int32))["state"]
    for _ in range(8):  # two episodes: the state is zeroed where one starts, as the actor does
        keep = 1.0 - actor.first[:, None]
        expected, _ = policy.net.step(actor.obs, tuple(s * keep for s in actor.state))
        got = model.step({k: tf.constant(v) for k, v in actor.obs.items()}, state * keep)
        np.testing.assert_allclose(got["q_values"].numpy(), expected, rtol=1e-4, atol=1e-5)
        state = got["state"]
        actor.step(explore=False)
    env.close()
    with pytest.raises(ConfigError, match="format=keras exports a flat vector observation"):
        keras_model(saved)


def test_an_export_never_overwrites_and_appears_whole(tiny_config: Config, monkeypatch) -> None:
    from scripts.export import ExportConfig, run_export

    train(copy.deepcopy(tiny_config))
    run = Path(tiny_config.run_dir)
    first = run_export(ExportConfig(run=str(run)))
    assert first == run / "export" / "saved_model-400"
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=r"^out='.*saved_model-400' already exists: choose another out="):
        run_export(ExportConfig(run=str(run)))  # the same export again
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    target = run_export(ExportConfig(run=str(run), network="target"))
    assert target == run / "export" / "saved_model-400-target" and target.is_dir()
    with pytest.raises(ConfigError, match="already exists"):
        run_export(ExportConfig(run=str(run), out=str(first)))

    def dies_halfway(module, path, signatures=None) -> None:
        (Path(path) / "half").mkdir(parents=True)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tf.saved_model, "save", dies_halfway)
    with pytest.raises(OSError):
        run_export(ExportConfig(run=str(run), network="online"))
    assert sorted(p.name for p in (run / "export").iterdir()) == ["saved_model-400", "saved_model-400-target"]
    keras_file = run_export(ExportConfig(run=str(run), format="keras", out=str(run / "k.keras")))
    with pytest.raises(ConfigError, match="already exists"):
        run_export(ExportConfig(run=str(run), format="keras", out=str(keras_file)))
    assert sorted(p.name for p in run.glob("*keras*")) == ["k.keras"]
