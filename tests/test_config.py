"""Every config group composes; bad input fails before training with one clear line."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import scripts.train  # noqa: F401  (registers the config schemas the presets extend)
from agents.config import Config, validate
from envs.config import ConfigError
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _compose(overrides: list[str]) -> Config:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    return OmegaConf.to_object(cfg)


@pytest.mark.parametrize("agent", _options("agent"))
@pytest.mark.parametrize("env", _options("env"))
def test_every_config_group_composes(agent: str, env: str) -> None:
    config = _compose([f"agent={agent}", f"env={env}"])
    assert isinstance(config, Config)
    assert config.env.name == env
    validate(config)


def test_r2d2_preset_is_rdqn_with_r2d2_parts_and_env_presets_still_set_their_replay() -> None:
    rdqn, r2d2 = _compose(["agent=rdqn"]), _compose(["agent=r2d2"])
    # the rdqn preset with exactly these fields changed, and nothing else
    agent = replace(
        rdqn.agent, name="r2d2", gamma=0.999, n_step=5, lr=3e-4, value_rescaling=True, target_anchor=0.3
    )
    assert r2d2.agent == agent and r2d2.agent.kind == "rdqn"
    assert r2d2.network == replace(rdqn.network, dueling=True)
    assert r2d2.replay == replace(rdqn.replay, priority_exponent=0.9, capacity=400_000)
    assert r2d2.eval == replace(rdqn.eval, network="target")
    assert (r2d2.train, r2d2.env) == (rdqn.train, rdqn.env)
    # an env preset that sets the replay (84x84 frames) overrides the agent preset's 400k rows
    assert _compose(["agent=r2d2", "env=atari_pong"]).replay.capacity == 100_000


def test_rdqn_lambda_preset_is_rdqn_with_lambda_targets_dueling_and_prioritized_replay() -> None:
    rdqn, lam = _compose(["agent=rdqn"]), _compose(["agent=rdqn_lambda"])
    # the rdqn preset with exactly these fields changed, and nothing else (h(x) stays off)
    assert lam.agent == replace(rdqn.agent, name="rdqn_lambda", td_lambda=0.5)
    assert lam.agent.kind == "rdqn" and not lam.agent.value_rescaling
    assert lam.network == replace(rdqn.network, dueling=True)
    assert lam.replay == replace(rdqn.replay, trace_length=48, priority_exponent=0.6, capacity=400_000)
    assert lam.eval == replace(rdqn.eval, network="target")
    assert (lam.train, lam.env) == (rdqn.train, rdqn.env)


def test_r2d2_bandit_preset_is_r2d2_with_reward_and_short_heads_a_bandit_and_a_48_step_trace() -> None:
    r2d2, bandit = _compose(["agent=r2d2"]), _compose(["agent=r2d2_bandit"])
    want = replace(
        r2d2.agent, name="r2d2_bandit", lr=1e-3, reward_head=30.0, short_gamma=0.98, acting_head="bandit"
    )
    assert bandit.agent == want and bandit.agent.kind == "rdqn"
    assert bandit.replay == replace(r2d2.replay, trace_length=48)
    assert (bandit.network, bandit.eval, bandit.train, bandit.env) == (
        r2d2.network,
        r2d2.eval,
        r2d2.train,
        r2d2.env,
    )


def test_minigrid_preset_ends_episodes_cut_by_its_time_limit_as_terminal() -> None:
    env = _compose(["env=minigrid_memory"]).env
    assert env.time_limit_terminal and env.max_episode_steps == 245
    assert not _compose(["env=cartpole_p"]).env.time_limit_terminal  # CartPole's limit is not the task's


def test_documented_keys_exist() -> None:
    keys = (
        "env.id env.kwargs env.mask_obs env.flicker env.obs_noise env.num_envs network.cell "
        "network.units agent.gamma agent.tau agent.target_update_period agent.n_step agent.lr "
        "agent.batch_size replay.capacity replay.burn_in replay.trace_length replay.initial_state "
        "train.total_env_steps train.learning_starts train.updates_per_step eval.every_env_steps "
        "eval.episodes seed resume"
    ).split()
    node = OmegaConf.structured(_compose([]))
    for key in keys:
        assert OmegaConf.select(node, key, throw_on_missing=True, default="<absent>") != "<absent>", key


BAD = [
    (["agent.tau=0"], "agent.tau=0.0", "(0, 1]"),
    (["agent.tau=1.5"], "agent.tau=1.5", "(0, 1]"),
    (["agent.gamma=1.01"], "agent.gamma=1.01", "[0, 1]"),
    (["agent.gamma=-0.1"], "agent.gamma=-0.1", "[0, 1]"),
    (["replay.trace_length=0"], "replay.trace_length=0", "integers >= 1"),
    (["replay.capacity=100"], "replay.capacity=100", "sequence"),
    (["agent.n_step=0"], "agent.n_step=0", ">= 1"),
    (["agent.batch_size=0"], "agent.batch_size=0", ">= 1"),
    (["network.units=0"], "network.units=0", ">= 1"),
    (["network.cell=transformer"], "network.cell='transformer'", "lstm|gru|lstm_peephole|mlp"),
    (["env.mask_obs=[1,9]"], "env.mask_obs=[1, 9]", "outside [0, 3]"),
    (["env.id=NoSuchEnv-v0"], "env.id='NoSuchEnv-v0'", "cannot be made"),
    (["env.id=Pendulum-v1", "env.mask_obs=[]"], "agent=rdqn needs a discrete action space", "agent=rddpg"),
    (["replay.initial_state=random"], "replay.initial_state='random'", "stored|zero"),
    (["network.inputs=[velocity]"], "network.inputs=['velocity']", "prev_action|prev_reward"),
    (["train.tf_intra_op_threads=-1"], "train.tf_intra_op_threads=-1", ">= 0"),
    (["network.backend=cudnn"], "network.backend='cudnn'", "auto|native|graph|scan"),
    (
        ["network.cell=gru", "network.backend=native"],
        "network.backend='native'",
        "auto|graph|scan for cell=gru",
    ),
]


@pytest.mark.parametrize(("args", "key", "allowed"), BAD, ids=[b[0][0] for b in BAD])
def test_bad_input_is_one_line_and_nonzero(capsys, tmp_path: Path, args, key: str, allowed: str) -> None:
    code, err = run_cli(capsys, args, tmp_path / "run")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0
    assert len(lines) == 1, err
    assert key in lines[0] and allowed in lines[0], lines[0]
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "ckpt").exists()


def test_resume_of_a_directory_without_a_run(capsys, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, err = run_cli(capsys, [f"resume={tmp_path / 'empty'}"], tmp_path / "run")
    assert code != 0 and "holds no run" in err and len(err.strip().splitlines()) == 1


def test_typos_and_wrong_types_are_rejected_by_the_schema(capsys, tmp_path: Path) -> None:
    code, err = run_cli(capsys, ["agent.learnin_rate=0.1"], tmp_path / "a")
    assert code != 0 and "learnin_rate" in err
    code, err = run_cli(capsys, ["agent.lr=abc"], tmp_path / "b")
    assert code != 0 and "agent.lr" in err


def test_cli_subprocess_exit_code_and_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.train", "agent.tau=2", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == "error: agent.tau=2.0 is invalid: allowed (0, 1]"
    assert "Traceback" not in proc.stderr


def test_hydra_flags_with_a_value_are_not_taken_for_overrides() -> None:
    from scripts.overrides import task_overrides

    argv = ["--cfg", "job", "-p", "agent", "--config-name", "config", "agent=r2d2", "-c", "hydra", "seed=1"]
    assert task_overrides(argv) == ["agent=r2d2", "seed=1"]
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.train", "--cfg", "job", "agent=r2d2"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]  # prints the composed config, trains nothing
    assert "gamma: 0.999" in proc.stdout


def test_validate_accepts_defaults() -> None:
    validate(Config())
    with pytest.raises(ConfigError):
        bad = Config()
        bad.eval.episodes = 0
        validate(bad)


# (dotted key, bad value, a fragment of the allowed values, agent kind of the config)
INVALID = [
    ("agent.kind", "ppo", "rdqn", "rdqn"),
    ("agent.tau", 0.0, "(0, 1]", "rdqn"),
    ("agent.tau", float("nan"), "(0, 1]", "rddpg"),
    ("agent.gamma", 1.01, "[0, 1]", "rdqn"),
    ("agent.n_step", 0, "integers >= 1", "rddpg"),
    ("agent.td_lambda", 1.5, "[0, 1] or null", "rdqn"),
    ("agent.td_lambda", -0.1, "[0, 1] or null", "rddpg"),
    ("agent.td_lambda", float("nan"), "[0, 1] or null", "rddpg"),
    ("agent.batch_size", 0, "integers >= 1", "rdqn"),
    ("agent.lr", float("inf"), "> 0", "rdqn"),
    ("agent.target_update_period", 0, ">= 1", "rddpg"),
    ("agent.max_grad_norm", 0.0, "> 0", "rdqn"),
    ("agent.epsilon_start", 1.5, "[0, 1]", "rdqn"),
    ("agent.epsilon_end", -0.1, "[0, 1]", "rdqn"),
    ("agent.epsilon_decay_steps", 0, ">= 1", "rdqn"),
    ("agent.huber_delta", 0.0, "> 0", "rdqn"),
    ("agent.actor_lr", 0.0, "> 0 or null", "rddpg"),
    ("agent.critic_lr", -1.0, "> 0 or null", "rddpg"),
    ("agent.exploration", "uniform", "gaussian|ou", "rddpg"),
    ("agent.preactivation_penalty", -1.0, ">= 0", "rddpg"),
    ("agent.ou_theta", 1.5, "(0, 1]", "rddpg"),
    ("agent.policy_delay", 0, "integers >= 1", "rddpg"),
    ("network.cell", "transformer", "lstm|gru|lstm_peephole|mlp", "rdqn"),
    ("network.units", 0, "integers >= 1", "rdqn"),
    ("network.inputs", ["velocity"], "prev_action|prev_reward", "rdqn"),
    ("network.pre_layers", [0], "widths >= 1", "rdqn"),
    ("network.post_layers", [16, 0], "widths >= 1", "rddpg"),
    ("network.post_layers", [], "at least one layer for agent=rddpg/rtd3", "rddpg"),
    ("network.dueling", True, "false for agent=rddpg/rtd3", "rddpg"),
    ("network.backend", "cudnn", "auto|native|graph|scan", "rdqn"),
    ("replay.burn_in", -1, "integers >= 0", "rdqn"),
    ("replay.trace_length", 0, "integers >= 1", "rdqn"),
    ("replay.initial_state", "random", "stored|zero", "rddpg"),
    ("replay.capacity", 10, "burn_in + trace_length + n_step", "rdqn"),
    ("env.num_envs", 0, "integers >= 1", "rdqn"),
    ("env.flicker", 1.0, "[0, 1)", "rdqn"),
    ("env.obs_noise", -0.1, ">= 0", "rddpg"),
    ("train.total_env_steps", 0, "integers >= 1", "rdqn"),
    ("train.learning_starts", -1, "integers >= 0", "rdqn"),
    ("train.updates_per_step", 0.0, "> 0", "rddpg"),
    ("train.log_every_updates", 0, ">= 1", "rdqn"),
    ("train.checkpoint_every_env_steps", 0, ">= 1", "rdqn"),
    ("train.tf_inter_op_threads", -1, "integers >= 0", "rdqn"),
    ("eval.every_env_steps", 0, ">= 1", "rdqn"),
    ("eval.episodes", 0, "integers >= 1", "rddpg"),
    ("eval.network", "best", "online|target|average", "rddpg"),
    ("eval.network", "average", "average needs agent.average_tau", "rdqn"),
    ("agent.average_tau", 0.0, "(0, 1] or null", "rdqn"),
    ("agent.average_tau", 1.5, "(0, 1] or null", "rddpg"),
]


def _valid_config(kind: str) -> Config:
    from agents.networks import NetworkConfig
    from agents.rddpg import RDDPGConfig

    if kind == "rddpg":
        return Config(agent=RDDPGConfig(), network=NetworkConfig(post_layers=[16]))
    return Config()


@pytest.mark.parametrize(
    ("key", "value", "allowed", "kind"), INVALID, ids=[f"{c[0]}={c[1]}" for c in INVALID]
)
def test_each_bad_value_names_its_own_key(key: str, value, allowed: str, kind: str) -> None:
    config = _valid_config(kind)
    validate(config)  # the base config is sound: the error below comes from this one value
    section, name = key.split(".")
    setattr(getattr(config, section), name, value)
    with pytest.raises(ConfigError) as err:
        validate(config)
    message = str(err.value)
    assert message.startswith(f"{key}={value!r} is invalid: allowed "), message
    assert allowed in message.split(" is invalid: allowed ", 1)[1], message
    assert "\n" not in message


def test_native_backend_needs_an_lstm_cell() -> None:
    config = Config()
    config.network.cell, config.network.backend = "gru", "native"
    with pytest.raises(
        ConfigError, match=r"^network\.backend='native' is invalid: allowed auto\|graph\|scan for cell=gru$"
    ):
        validate(config)


def test_config_json_with_the_earlier_backend_key_still_loads() -> None:
    import dataclasses

    from agents.config import config_from_dict

    data = dataclasses.asdict(Config())
    data["network"]["kernel"] = data["network"].pop("backend")
    data["network"]["kernel"] = "graph"
    assert config_from_dict(data).network.backend == "graph"
