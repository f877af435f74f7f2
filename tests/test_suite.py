"""scripts.suite: the per-run figures from a curve, job resumption, the table, a tiny real suite."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.checkpoint import Checkpointer
from scripts import suite
from scripts.suite import SuiteConfig, SuiteTask, summarize_curve
from tests.helpers import ROOT


def test_summarize_curve_threshold_budget_and_floor():
    task = SuiteTask(threshold=475.0, budget=30, run_steps=60, floor=400.0)
    curve = [(10, 1.0, 200.0), (20, 2.0, 480.0), (30, 3.0, 450.0), (40, 4.0, 390.0), (60, 6.0, 500.0)]
    r = summarize_curve(curve, task)
    assert r["steps_to_threshold"] == 20 and r["wall_to_threshold_s"] == 2.0
    assert r["best"] == 480.0  # within the budget only
    assert r["at_budget"] == 450.0 and r["holds_at_budget"] is False
    assert r["lowest_after_threshold"] == 390.0  # over the whole run, past the budget
    assert r["last_step"] == 60


def test_summarize_curve_threshold_only_counts_within_budget():
    task = SuiteTask(threshold=0.9, budget=20)
    r = summarize_curve([(10, 1.0, 0.5), (20, 2.0, 0.8), (30, 3.0, 0.95)], task)
    assert r["steps_to_threshold"] is None and r["lowest_after_threshold"] is None
    assert r["at_budget"] == 0.8 and r["holds_at_budget"] is False
    # no evaluation exactly at the budget: nothing to say about holding there
    r = summarize_curve([(10, 1.0, 0.95), (15, 2.0, 0.97)], task)
    assert r["steps_to_threshold"] == 10 and r["at_budget"] is None and r["holds_at_budget"] is None


def test_invalid_names_the_key():
    cfg = SuiteConfig(tasks=["nope"], task_defs={"a": SuiteTask()})
    assert suite.invalid(cfg) == "tasks: 'nope' is unknown: allowed a"
    cfg = SuiteConfig(tasks=["a"], task_defs={"a": SuiteTask(budget=10, run_steps=5)})
    assert "task_defs.a.run_steps=5" in suite.invalid(cfg)
    cfg = SuiteConfig(tasks=["a"], task_defs={"a": SuiteTask(metric="median")})
    assert "allowed return|success" in suite.invalid(cfg)
    cfg = SuiteConfig(tasks=["a"], task_defs={"a": SuiteTask(final_episodes=-1)})
    assert suite.invalid(cfg) == "task_defs.a.final_episodes=-1 is invalid: allowed integers >= 0"


def test_jobs_run_each_variant_with_its_overrides_after_the_task_and_suite_overrides():
    tasks = {"a": SuiteTask(overrides=["env=cue_memory"]), "b": SuiteTask(variants=["zero"])}
    defs = {"preset": [], "zero": ["replay.initial_state=zero"], "unused": ["y=2"]}
    cfg = SuiteConfig(tasks=["a", "b"], task_defs=tasks, seeds=[3], overrides=["x=1"], discrete_agent="rdqn")
    cfg.variants, cfg.variant_defs = ["preset", "zero"], defs
    got = [(j.task, j.variant, j.argv[:4]) for j in suite.jobs(cfg)]
    assert got == [
        ("a", "preset", ["agent=rdqn", "env=cue_memory", "x=1", "train.total_env_steps=50000"]),
        ("a", "zero", ["agent=rdqn", "env=cue_memory", "x=1", "replay.initial_state=zero"]),
        ("b", "zero", ["agent=rdqn", "x=1", "replay.initial_state=zero", "train.total_env_steps=50000"]),
    ]
    assert suite.invalid(cfg) is None
    cfg.task_defs["b"].variants = ["nope"]
    assert suite.invalid(cfg) == "task_defs.b.variants: 'nope' is unknown: allowed preset|unused|zero"
    cfg.task_defs["b"].variants, cfg.variants = None, ["preset", "nope"]
    assert suite.invalid(cfg) == "variants: 'nope' is unknown: allowed preset|unused|zero"


def test_the_suite_agent_goes_to_tasks_that_name_none():
    """``discrete_agent`` picks the discrete tasks' preset; a task, the suite or a variant naming one wins."""
    tasks = {"d": SuiteTask(overrides=["env=cartpole_p"]), "c": SuiteTask(overrides=["agent=rtd3"])}
    cfg = SuiteConfig(tasks=["d", "c"], task_defs=tasks, seeds=[0], discrete_agent="r2d2")
    cfg.variants, cfg.variant_defs = ["preset", "other"], {"preset": [], "other": ["agent=rdqn"]}
    agents = [(j.task, j.variant, [a for a in j.argv if a.startswith("agent=")]) for j in suite.jobs(cfg)]
    assert agents == [
        ("d", "preset", ["agent=r2d2"]),
        ("d", "other", ["agent=rdqn"]),
        ("c", "preset", ["agent=rtd3"]),
        ("c", "other", ["agent=rtd3", "agent=rdqn"]),  # the later one, the variant's, wins
    ]
    assert suite.invalid(cfg) is None
    assert suite.discrete_presets() == ["r2d2", "r2d2_bandit", "rdqn", "rdqn_lambda"]
    for bad in ("dqn", "rtd3"):  # unknown, or a preset for continuous actions
        cfg.discrete_agent = bad
        allowed = "r2d2|r2d2_bandit|rdqn|rdqn_lambda"
        assert (
            suite.invalid(cfg)
            == f"discrete_agent={bad!r} is not a discrete-action agent preset: allowed {allowed}"
        )
    cfg.discrete_agent = "dqn"
    assert "Tasks that name no agent run `agent=dqn`." in suite.format_table(cfg, {})


def test_a_reported_task_shows_its_end_of_budget_median_and_no_threshold_counts(tmp_path):
    """A task without a threshold reports best and end-of-budget evaluations (and their median),
    not seeds "reaching" a threshold it does not have."""
    cfg = SuiteConfig(out=str(tmp_path), tasks=["r"], task_defs={"r": SuiteTask(budget=200)}, seeds=[0, 1])
    cfg.variants = ["preset"]
    for job, end in zip(suite.jobs(cfg), (0.4, 0.6), strict=True):
        job.run_dir.mkdir(parents=True)
        rows = ["env_steps,wall_time_s,eval_return_mean", "100,1.0,0.1", f"200,2.0,{end}"]
        (job.run_dir / "progress.csv").write_text("\n".join(rows) + "\n")
    row = suite.format_table(cfg, suite.collect(cfg)).splitlines()[-1]
    assert row == (
        "| r | report | 0.2k | preset | - | - | - | 0.40, 0.60 | 0.40, 0.60 (median 0.50) | - "
        "| -, - (median -; 100) |"
    )


def _finished_run(run_dir: Path, step: int, rows: list[str]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / "summary.json").write_text(json.dumps({"status": "finished", "env_steps": step}))
    (run_dir / "progress.csv").write_text("\n".join(rows) + "\n")


def _final_eval(run_dir: Path, step: int, episodes: int, seed: int = suite.FINAL_EVAL_SEED, **values) -> None:
    record = {"step": step, "episodes": episodes, "seed": seed, **values}
    (run_dir / suite.FINAL_RECORD).write_text(json.dumps(record))


def test_the_final_evaluation_counts_only_when_made_by_the_suite_and_uses_the_task_metric(tmp_path):
    """The final policy's figure comes from the suite's record of the last checkpoint over the task's
    episodes from the suite's seed; a record made with other settings, or of an earlier step, is
    not mistaken for it, nor is the user's own eval-<step>.json."""
    task = SuiteTask(metric="success", threshold=0.9, budget=200, final_episodes=50)
    cfg = SuiteConfig(out=str(tmp_path), tasks=["m"], task_defs={"m": task}, seeds=[0, 1, 2])
    cfg.variants = ["preset"]
    rows = ["env_steps,wall_time_s,eval_return_mean,eval_success_rate", "100,1.0,0.1,0.2", "200,2.0,0.5,0.9"]
    for job in suite.jobs(cfg):
        _finished_run(job.run_dir, 200, rows)
    runs = [job.run_dir for job in suite.jobs(cfg)]
    _final_eval(runs[0], 200, 50, return_mean=0.7, success_rate=0.96)
    _final_eval(runs[1], 200, 50, return_mean=0.6, success_rate=0.82)
    _final_eval(runs[2], 200, 10, seed=0, return_mean=0.9, success_rate=1.0)  # other settings
    assert suite.final_record(runs[2], 50) is None and suite.final_record(runs[0], 50)["step"] == 200
    _final_eval(runs[2], 100, 50, return_mean=0.9, success_rate=1.0)  # an earlier step
    (runs[2] / "eval-200.json").write_text(json.dumps({"step": 200, "episodes": 50, "success_rate": 1.0}))
    assert suite.final_record(runs[2], 50) is None
    result = suite.collect(cfg)
    entry = result["m"]["preset"]
    assert [r["final"] for r in entry["runs"]] == [0.96, 0.82, None]
    assert entry["final_evaluated"] == 2 and entry["final_held"] == 1
    assert suite.format_table(cfg, result).rstrip().endswith("| 0.960, 0.820, - (1/3; 50) |")


def test_cli_runs_only_the_variants_asked_for(tmp_path):
    """``variants=[preset]`` on the command line leaves the baseline out (report only: no runs)."""
    out = tmp_path / "s"
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.suite", f"out={out}", "tasks=[pendulum_p]", "variants=[preset]",
         "report_only=true"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "| pendulum_p |" in proc.stdout and "| baseline" not in proc.stdout
    assert list(json.loads((out / "suite.json").read_text())["variants"]) == ["preset"]


def test_cli_rejects_an_unknown_task_in_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.suite", f"out={tmp_path}/s", "tasks=[cartpole_p,nope]"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: tasks: 'nope' is unknown: allowed ")
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config-name", "ablation", "tasks=[pendulum_p]", "variants=[value_rescaling]", "seeds=[0]"],
         "error: task pendulum_p, variant value_rescaling: agent.value_rescaling is not a key: allowed "),
        (["tasks=[cartpole_p]", 'overrides=["agent.tau=1.5"]'],
         "error: task cartpole_p, variant preset: agent.tau=1.5 is invalid: allowed (0, 1]"),
        (["parallel=abc"], "error: parallel=abc is invalid: "),
        (["paralel=2"], "error: paralel is not a key: allowed discrete_agent|out|overrides|parallel|"),
    ],
)  # fmt: skip
def test_cli_refuses_what_it_or_its_runs_would_refuse_in_one_line_before_any_run(tmp_path, args, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.suite", *args, f"out={tmp_path}/s"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.strip().startswith(needle)
    assert not (tmp_path / "s").exists()


def test_a_suite_whose_runs_fail_writes_the_table_and_says_so(tmp_path, monkeypatch):
    cfg = SuiteConfig(
        out=str(tmp_path / "s"), tasks=["cue"], task_defs={"cue": SuiteTask(budget=100)}, seeds=[0]
    )
    monkeypatch.setattr(suite, "run_jobs", lambda todo, parallel: ([2] * len(todo), None))
    with pytest.raises(suite.SuiteFailed, match="^2 run"):
        suite.run_suite(cfg)
    assert (tmp_path / "s" / "suite.md").is_file()
    cfg.report_only = True  # a report of what has finished is not a failure
    suite.run_suite(cfg)


@pytest.mark.parametrize("config", ["suite", "ablation"])
def test_every_run_of_the_shipped_suites_would_start(config):
    """Every task and variant of the shipped suite and ablation passes scripts.train's checks."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name=config))
    assert suite.invalid(cfg) is None and suite.invalid_runs(cfg) is None


class _FakeRun:
    """Stands in for a scripts.train process in run_job: exits 0 at once."""

    def __init__(self, argv: list[str], **kwargs: object) -> None:
        self.argv = argv

    def wait(self) -> int:
        return 0

    def poll(self) -> int:
        return 0


def test_jobs_resume_an_interrupted_run_and_skip_a_finished_one(tmp_path, monkeypatch):
    task = SuiteTask(overrides=["env=cue_memory"], budget=100)
    cfg = SuiteConfig(out=str(tmp_path), tasks=["t"], task_defs={"t": task}, seeds=[0, 1])
    cfg.variants = ["preset"]
    calls = []
    monkeypatch.setattr(suite.subprocess, "Popen", lambda argv, **kw: calls.append(argv) or _FakeRun(argv))
    done, stopped = suite.jobs(cfg)
    for job, status in ((done, "finished"), (stopped, "stopped by SIGTERM")):
        job.run_dir.mkdir(parents=True)
        (job.run_dir / "config.json").write_text("{}")
        (job.run_dir / "summary.json").write_text(json.dumps({"status": status, "env_steps": 100}))
    # a finished run is not trained again; only its final policy is evaluated, once
    assert suite.run_job(done) == 0
    assert calls == [[sys.executable, "-m", "scripts.evaluate", f"run={done.run_dir}", "step=100",
                      "episodes=100", f"seed={suite.FINAL_EVAL_SEED}",
                      f"record={done.run_dir / suite.FINAL_RECORD}"]]  # fmt: skip
    _final_eval(done.run_dir, 100, 100)
    calls.clear()
    assert suite.run_job(done) == 0 and calls == []
    assert suite.run_job(stopped) == 0
    assert calls[0][-1] == f"resume={stopped.run_dir}" and "seed=1" in calls[0]
    assert "train.total_env_steps=100" in calls[0]
    assert len(calls) == 1  # still not finished: no final evaluation


def test_a_stopping_suite_starts_no_more_runs(tmp_path, monkeypatch):
    task = SuiteTask(overrides=["env=cue_memory"], budget=100)
    cfg = SuiteConfig(out=str(tmp_path), tasks=["t"], task_defs={"t": task}, seeds=[0])
    monkeypatch.setattr(suite.subprocess, "Popen", lambda argv, **kw: pytest.fail("a run started"))
    children = suite.Children()
    children.stop()
    assert suite.run_job(suite.jobs(cfg)[0], children) is None
    assert not (tmp_path / "t" / "preset" / "s0.log").exists()


@pytest.mark.train  # scripts.suite starts scripts.train processes
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_suite_stops_its_runs_with_a_checkpoint_and_starts_no_more(tmp_path, sig):
    """kill (or Ctrl-C) of the suite alone: the running run checkpoints and stops, no orphan goes on
    training, the next seed never starts, the table so far is written, exit 128 + the signal."""
    out = tmp_path / "s"
    tiny = ["env.num_envs=4", "network.units=16", "network.pre_layers=[16]", "replay.capacity=4000",
            "replay.burn_in=2", "replay.trace_length=4", "agent.batch_size=8", "train.learning_starts=100",
            "train.checkpoint_every_env_steps=200"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "scripts.suite", f"out={out}", "tasks=[cartpole_p]", "variants=[preset]",
         "seeds=[0,1]", "overrides=[" + ",".join(f"'{o}'" for o in tiny) + "]"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    run = out / "cartpole_p" / "preset" / "s0"
    end = time.monotonic() + 240
    while not (run.is_dir() and Checkpointer(run).latest() is not None):
        assert proc.poll() is None, proc.communicate()[0][-2000:]
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)
    proc.send_signal(sig)
    text = proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + sig.value, text[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "stopped by SIGTERM" and summary["env_steps"] < 200_000
    assert Checkpointer(run).latest() == summary["env_steps"]
    assert not (run / "run.lock").exists()  # the run's process has ended
    assert f"stopped by {sig.name}: 1 run(s) not started" in text
    assert not (out / "cartpole_p" / "preset" / "s1").exists()
    assert "| cartpole_p |" in (out / "suite.md").read_text()


@pytest.mark.train  # scripts.suite starts scripts.train processes
def test_tiny_suite_writes_the_table_and_reads_runs_back(tmp_path):
    task = SuiteTask(
        overrides=["env=cue_memory", "env.kwargs.delay=2", "env.num_envs=4", "network.units=16",
                   "network.pre_layers=[16]", "replay.capacity=4000", "replay.burn_in=2",
                   "replay.trace_length=4", "agent.batch_size=8", "train.learning_starts=100"],
        threshold=0.9, budget=400, run_steps=600, floor=0.5, eval_every=200, final_episodes=3,
    )  # fmt: skip
    cfg = SuiteConfig(out=str(tmp_path / "s"), tasks=["cue"], task_defs={"cue": task}, seeds=[0])
    result = suite.run_suite(cfg)
    preset, baseline = result["cue"]["preset"], result["cue"]["baseline"]
    assert preset["complete"] == 1 and baseline["complete"] == 1
    run = preset["runs"][0]
    assert [p[0] for p in run["curve"]] == [200, 400, 600] and run["finished"]
    final = json.loads((tmp_path / "s/cue/preset/s0" / suite.FINAL_RECORD).read_text())
    assert final["episodes"] == 3 and final["seed"] == suite.FINAL_EVAL_SEED
    assert run["final"] == final["return_mean"] and run["final_step"] == 600
    config = json.loads((tmp_path / "s/cue/baseline/s0/config.json").read_text())
    assert config["network"]["cell"] == "mlp" and config["train"]["total_env_steps"] == 600
    table = (tmp_path / "s/suite.md").read_text()
    assert "| cue | return >= 0.9 | 0.4k | preset |" in table and "| baseline |" in table
    progress = tmp_path / "s/cue/preset/s0/progress.csv"
    evaluated = tmp_path / "s/cue/preset/s0" / suite.FINAL_RECORD
    before = progress.stat().st_mtime_ns, evaluated.stat().st_mtime_ns
    again = suite.run_suite(cfg)  # finished runs are read back, neither rerun nor evaluated again
    assert (progress.stat().st_mtime_ns, evaluated.stat().st_mtime_ns) == before
    assert again["cue"]["preset"]["runs"][0]["curve"] == run["curve"]
    assert (tmp_path / "s/curves.csv").read_text().startswith("task,variant,seed,env_steps,value")


@pytest.mark.parametrize(
    ("config", "task", "args", "agent"),
    [
        ("suite", "minigrid_memory", [], "rdqn_lambda"),
        ("suite", "cartpole_p", ["discrete_agent=r2d2"], "r2d2"),
        ("suite", "count_recall", ["discrete_agent=rdqn"], "rdqn"),
        ("ablation", "cartpole_p", [], "rdqn"),  # the ablation's variants change the rdqn preset
    ],
)
def test_shipped_suite_configs_compose_and_their_runs_validate(config, task, args, agent):
    """Every variant's overrides of one task compose into a run config that passes validation."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from agents.config import validate

    with initialize_config_module("conf", version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name=config, overrides=args))
        assert suite.invalid(cfg) is None
        assert task in cfg.tasks and Path(cfg.out).parts[0] == "bench"
        import scripts.train  # noqa: F401  (registers the run-config schemas)

        for job in suite.jobs(cfg):
            if job.task == task and job.seed == cfg.seeds[0]:
                overrides = [a for a in job.argv if not a.startswith("hydra.")]
                run = OmegaConf.to_object(compose(config_name="config", overrides=overrides))
                validate(run)
                assert run.agent.name == agent
