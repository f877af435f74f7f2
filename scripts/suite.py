"""The learning suite: ``python -m scripts.suite [tasks=[...]] [seeds=[...]] [parallel=2] [out=DIR]``.

Runs every task (``conf/suite.yaml``) for every seed and every variant, each run a separate
``python -m scripts.train`` process. The variants are the shipped preset and the memoryless
baseline (``network.cell=mlp``) beside it; an ablation (``--config-name ablation``) lists one
variant per setting it changes. Writes one table (``DIR/suite.md``, ``DIR/suite.json``) and the
curves (``DIR/curves.csv``, and ``DIR/curves.png`` with matplotlib). Per task, variant and seed:

* whether the greedy evaluation reaches the task's threshold within its budget, and the env steps
  and wall seconds of the first evaluation that does;
* the best evaluation and the evaluation at the end of the budget (stability: does it still meet
  the threshold there?);
* with ``floor``: the lowest evaluation after the first one at or above the threshold, over the
  whole run (``run_steps`` may go past the budget to test that the policy stays learned);
* the final policy (the run's last checkpoint) over ``final_episodes`` greedy episodes
  (``scripts.evaluate``, the same episode seeds for every run), a tenth of a 10-episode
  evaluation's variance: whether the policy the run ends with meets the threshold, where the last
  in-training evaluation says so only to within a few hundredths.

The suite takes hours; it can be stopped at any time (SIGTERM or Ctrl-C: every running run
finishes its step and checkpoints, no new one starts, the table so far is written, exit 128 + the
signal) and started again with the same ``out``: a finished run is read back, an interrupted one
resumes from its newest checkpoint, and ``report_only=true`` writes the table from whatever has
finished. Before any run starts, each task and variant's command line is checked as
``scripts.train`` checks it (a bad key or value is one line, exit 2, nothing written); runs that
exit non-zero anyway are left out of the table and the suite exits 1.
"""

from __future__ import annotations

import csv
import json
import math
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from agents.guards import StopSignals
from scripts.summarize import median_or_none


@dataclass
class SuiteTask:
    """One task of the suite."""

    # Overrides that select the env (and, for continuous tasks, the agent): e.g. [env=cartpole_p].
    overrides: list[str] = field(default_factory=list)
    # What the threshold applies to: return (eval_return_mean) | success (eval_success_rate).
    metric: str = "return"
    # Evaluation value to reach; null = report only (no threshold).
    threshold: float | None = None
    # Env steps within which the threshold must be reached (and at whose end it must still hold).
    budget: int = 50_000
    # Env steps each run lasts (>= budget): past the budget only the floor is checked.
    run_steps: int | None = None
    # Lowest evaluation allowed after the first one at or above the threshold; null = not checked.
    floor: float | None = None
    # Env steps between greedy evaluations.
    eval_every: int = 5_000
    # Greedy episodes of the final policy (the last checkpoint, scripts.evaluate) once a run has
    # finished; 0 = none.
    final_episodes: int = 100

    @property
    def length(self) -> int:
        """Env steps each run lasts: ``run_steps``, or the budget."""
        return self.run_steps or self.budget

    # Seeds for this task; null = the suite's seeds.
    seeds: list[int] | None = None
    # The suite's variants this task runs (names from variant_defs); null = all of them.
    variants: list[str] | None = None


@dataclass
class SuiteConfig:
    """The suite's settings."""

    # Where runs, logs and the table go.
    out: str = "bench/suite"
    # Tasks to run, by name (keys of task_defs), in this order.
    tasks: list[str] = field(default_factory=list)
    task_defs: dict[str, SuiteTask] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 4])
    # The agent preset (conf/agent/<name>.yaml, one built on rdqn) of every task whose overrides
    # name none: the one preset the discrete tasks share. The continuous tasks name theirs (rtd3).
    discrete_agent: str = "rdqn_lambda"
    # Overrides applied to every run of every variant.
    overrides: list[str] = field(default_factory=list)
    # Variants to run on each task, by name (keys of variant_defs), in this order.
    variants: list[str] = field(default_factory=lambda: ["preset", "baseline"])
    # Each variant's overrides on top of the task's (preset: none; the memoryless baseline:
    # network.cell=mlp). An ablation defines one variant per setting it changes.
    variant_defs: dict[str, list[str]] = field(
        default_factory=lambda: {"preset": [], "baseline": ["network.cell=mlp"]}
    )
    # Runs at a time (separate processes); each uses up to 2 TF threads.
    parallel: int = 1
    # Only read finished runs and write the table; start nothing.
    report_only: bool = False


METRICS = {"return": "eval_return_mean", "success": "eval_success_rate"}
# Keys of the final evaluation's record (FINAL_RECORD) per metric.
FINAL_METRICS = {"return": "return_mean", "success": "success_rate"}
# Episode i of every final evaluation starts from this seed + i: every run and variant of a task
# meets the same episodes, none of them one its training or its evaluations saw.
FINAL_EVAL_SEED = 2_000_003
# The final evaluation's record in each run directory (the user's own eval-<step>.json stay as they are).
FINAL_RECORD = "suite-final-eval.json"


AGENT_PRESETS = Path(__file__).resolve().parent.parent / "conf" / "agent"


def discrete_presets() -> list[str]:
    """Names of the shipped agent presets for discrete actions: conf/agent/*.yaml whose defaults
    lead to the rdqn schema (rdqn itself, or a preset built on it such as r2d2)."""

    def discrete(name: str) -> bool:
        entries = OmegaConf.load(AGENT_PRESETS / f"{name}.yaml").get("defaults", [])
        return any(
            isinstance(e, str)
            and (
                e.startswith("/agent/rdqn_schema")
                or ((AGENT_PRESETS / f"{e}.yaml").is_file() and discrete(e))
            )
            for e in entries
        )

    return sorted(p.stem for p in AGENT_PRESETS.glob("*.yaml") if discrete(p.stem))


def names_agent(overrides: list[str]) -> bool:
    """True if one of ``overrides`` picks the agent preset (``agent=...``)."""
    return any(o.lstrip("+~").startswith("agent=") for o in overrides)


def invalid(cfg: SuiteConfig) -> str | None:
    """One line naming the first bad key and what it allows, or None."""
    presets = discrete_presets()
    if cfg.discrete_agent not in presets:
        allowed = "|".join(presets)
        return (
            f"discrete_agent={cfg.discrete_agent!r} is not a discrete-action agent preset: allowed {allowed}"
        )
    known = sorted(cfg.task_defs)
    for name in cfg.tasks:
        if name not in cfg.task_defs:
            return f"tasks: {name!r} is unknown: allowed {'|'.join(known)}"
    for name, task in cfg.task_defs.items():
        if task.metric not in METRICS:
            return f"task_defs.{name}.metric={task.metric!r} is invalid: allowed {'|'.join(METRICS)}"
        if task.budget < 1 or task.eval_every < 1:
            return f"task_defs.{name}: budget and eval_every must be integers >= 1"
        if task.final_episodes < 0:
            return f"task_defs.{name}.final_episodes={task.final_episodes} is invalid: allowed integers >= 0"
        if task.run_steps is not None and task.run_steps < task.budget:
            return (
                f"task_defs.{name}.run_steps={task.run_steps} is invalid: allowed >= budget ({task.budget})"
            )
    allowed = "|".join(sorted(cfg.variant_defs))
    if not cfg.variants:
        return f"variants=[] is invalid: allowed a non-empty list of {allowed}"
    for v in cfg.variants:
        if v not in cfg.variant_defs:
            return f"variants: {v!r} is unknown: allowed {allowed}"
    for name in cfg.tasks:
        for v in cfg.task_defs[name].variants or []:
            if v not in cfg.variant_defs:
                return f"task_defs.{name}.variants: {v!r} is unknown: allowed {allowed}"
    if cfg.parallel < 1:
        return f"parallel={cfg.parallel} is invalid: allowed integers >= 1"
    if not cfg.seeds:
        return "seeds=[] is invalid: allowed a non-empty list of integers"
    return None


@dataclass
class Job:
    """One run of the suite: a task, a variant and a seed."""

    task: str
    variant: str
    seed: int
    run_dir: Path
    argv: list[str]
    # Greedy episodes of the final policy once the run has finished (0: none).
    final_episodes: int = 0


def jobs(cfg: SuiteConfig) -> list[Job]:
    """Every run: task by task, variant by variant in their order, seed by seed."""
    out = []
    for name in cfg.tasks:
        task = cfg.task_defs[name]
        chosen = [v for v in cfg.variants if task.variants is None or v in task.variants]
        for variant in chosen:
            extra = cfg.variant_defs[variant]
            # the suite's agent preset, unless the task, the suite or the variant picks one
            named = names_agent([*task.overrides, *cfg.overrides, *extra])
            agent = [] if named else [f"agent={cfg.discrete_agent}"]
            for seed in task.seeds if task.seeds is not None else cfg.seeds:
                run_dir = Path(cfg.out) / name / variant / f"s{seed}"
                argv = [
                    *agent,
                    *task.overrides,
                    *cfg.overrides,
                    *extra,
                    f"train.total_env_steps={task.length}",
                    f"eval.every_env_steps={task.eval_every}",
                    f"seed={seed}",
                    "train.progress_bar=false",
                    f"hydra.run.dir={run_dir}",
                ]
                out.append(Job(name, variant, seed, run_dir, argv, task.final_episodes))
    return out


def run_summary(run_dir: Path) -> dict:
    """The run's summary.json ({} before it has written one)."""
    path = run_dir / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def finished(run_dir: Path) -> bool:
    """True when the run wrote its summary with status finished."""
    return run_summary(run_dir).get("status") == "finished"


def final_record(run_dir: Path, episodes: int) -> dict | None:
    """The suite's final evaluation of a finished run (``FINAL_RECORD``: its last checkpoint over
    ``episodes`` episodes from :data:`FINAL_EVAL_SEED`), or None if it has not been made for the
    run's last step with those settings."""
    path, summary = run_dir / FINAL_RECORD, run_summary(run_dir)
    if episodes < 1 or summary.get("status") != "finished" or not path.is_file():
        return None
    step = summary.get("env_steps")
    record = json.loads(path.read_text())
    same = record.get("episodes") == episodes and record.get("seed") == FINAL_EVAL_SEED
    return record if same and record.get("step") == step else None


def invalid_runs(cfg: SuiteConfig) -> str | None:
    """One line for the first task and variant whose runs ``scripts.train`` would refuse (a bad key
    or value among the overrides, an env the agent cannot act in), checked once per task and
    variant before any run starts; None if every one would start."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    import scripts.train  # noqa: F401  (registers the run schemas the presets extend)
    from scripts.overrides import check

    seen: set[tuple[str, str]] = set()
    backup = get_gh_backup()  # the suite's own Hydra app; each check composes the run's config
    GlobalHydra.instance().clear()
    try:
        for job in jobs(cfg):
            if (job.task, job.variant) in seen:
                continue
            seen.add((job.task, job.variant))
            problem = check(job.argv)
            if problem:
                return f"task {job.task}, variant {job.variant}: {problem}"
    finally:
        restore_gh_from_backup(backup)
    return None


class SuiteFailed(Exception):
    """Some runs exited non-zero (the table was written from the others)."""

    def __init__(self, failed: int) -> None:
        super().__init__(f"{failed} run(s) exited non-zero")
        self.failed = failed


class SuiteStopped(Exception):
    """A signal stopped the suite before every run finished (the table so far is written)."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(f"stopped by {signal_name}")
        self.signal = signal_name


class Children:
    """The suite's running ``scripts.train`` processes. Each starts in its own session, so a signal
    reaches it only through :meth:`stop`: once per stop, whether it came from a terminal's Ctrl-C
    or a ``kill`` of the suite (a second one tells the runs to abort, as it tells scripts.train).
    After the first stop no new run starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self.stopping = False

    def start(self, argv: list[str], log_path: Path) -> subprocess.Popen | None:
        """Start one run, its output appended to ``log_path``; None once the suite is stopping."""
        with self._lock:
            if self.stopping:
                return None
            with open(log_path, "a") as log:  # the child keeps its own copy of the descriptor
                proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
            self._running.add(proc)
            return proc

    def wait(self, proc: subprocess.Popen) -> int:
        """Wait for a run started here; returns its exit code."""
        code = proc.wait()
        with self._lock:
            self._running.discard(proc)
        return code

    def stop(self) -> None:
        """SIGTERM every running run (each finishes its step and checkpoints); start no more."""
        with self._lock:
            self.stopping = True
            for proc in self._running:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)


def run_job(job: Job, children: Children | None = None) -> int | None:
    """Train one run in its own process (resuming an interrupted one), then evaluate its final
    policy (:func:`final_record`) in another; returns the last exit code, or None when the suite was
    stopping and the process was not started."""
    children = children or Children()
    if not finished(job.run_dir):
        argv = [sys.executable, "-m", "scripts.train", *job.argv]
        if (job.run_dir / "config.json").is_file():
            argv.append(f"resume={job.run_dir}")
        job.run_dir.parent.mkdir(parents=True, exist_ok=True)
        proc = children.start(argv, job.run_dir.parent / f"s{job.seed}.log")
        if proc is None:
            return None
        code = children.wait(proc)
        status = "finished" if finished(job.run_dir) else "not finished"
        print(f"{job.task} {job.variant} seed {job.seed}: exit {code}, {status}", flush=True)
        if not finished(job.run_dir):
            return code
    if job.final_episodes < 1 or final_record(job.run_dir, job.final_episodes) is not None:
        return 0
    step = run_summary(job.run_dir)["env_steps"]
    argv = [
        sys.executable,
        "-m",
        "scripts.evaluate",
        f"run={job.run_dir}",
        f"step={step}",
        f"episodes={job.final_episodes}",
        f"seed={FINAL_EVAL_SEED}",
        f"record={job.run_dir / FINAL_RECORD}",
    ]
    proc = children.start(argv, job.run_dir.parent / f"s{job.seed}.log")
    if proc is None:
        return None
    code = children.wait(proc)
    print(f"{job.task} {job.variant} seed {job.seed}: final evaluation over {job.final_episodes} episodes,"
          f" exit {code}", flush=True)  # fmt: skip
    return code


def run_jobs(todo: list[Job], parallel: int) -> tuple[list[int | None], str | None]:
    """Run the jobs, ``parallel`` at a time. SIGTERM or SIGINT to the suite stops every running
    run at its next step with a checkpoint and starts no more; a second one aborts them. Returns
    each job's exit code (None: not started) and the name of the signal that stopped the suite."""
    children = Children()
    with StopSignals() as stop, ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = [pool.submit(run_job, job, children) for job in todo]
        try:
            while wait(futures, timeout=0.5).not_done:
                if stop.requested and not children.stopping:
                    children.stop()
        except KeyboardInterrupt:  # the second signal
            children.stop()
            raise
    return [f.result() for f in futures], stop.requested


def read_run(run_dir: Path, task: SuiteTask) -> dict | None:
    """A run's figures from its progress.csv, or None if it has no evaluation yet."""
    path = run_dir / "progress.csv"
    if not path.is_file():
        return None
    column = METRICS[task.metric]
    with path.open() as f:
        rows = list(csv.DictReader(f))
    curve = [(int(r["env_steps"]), float(r["wall_time_s"]), float(r.get(column) or "nan")) for r in rows]
    if not curve:
        return None
    final = final_record(run_dir, task.final_episodes)
    value = final.get(FINAL_METRICS[task.metric]) if final else None
    return summarize_curve(curve, task) | {
        "finished": finished(run_dir),
        "curve": [[s, v] for s, _, v in curve],
        "final": value,
        "final_step": final["step"] if final else None,
    }


def summarize_curve(curve: list[tuple[int, float, float]], task: SuiteTask) -> dict:
    """Threshold, stability and floor figures of one run's ``(env_steps, wall_s, value)`` curve."""
    within = [p for p in curve if p[0] <= task.budget]
    hit = None
    if task.threshold is not None:
        hit = next((p for p in within if p[2] >= task.threshold), None)
    at_budget = within[-1] if within else None
    after = [p[2] for p in curve if hit is not None and p[0] > hit[0]]
    return {
        "steps_to_threshold": hit[0] if hit else None,
        "wall_to_threshold_s": hit[1] if hit else None,
        "best": max((p[2] for p in within), default=math.nan),
        "at_budget": at_budget[2] if at_budget and at_budget[0] == task.budget else None,
        "holds_at_budget": (
            None
            if task.threshold is None or not at_budget or at_budget[0] != task.budget
            else at_budget[2] >= task.threshold
        ),
        "lowest_after_threshold": min(after) if after else None,
        "last_step": curve[-1][0],
    }


def collect(cfg: SuiteConfig) -> dict:
    """Per task and variant: every seed's figures and the counts the table shows."""
    result: dict = {}
    for job in jobs(cfg):
        task = cfg.task_defs[job.task]
        entry = result.setdefault(job.task, {}).setdefault(job.variant, {"runs": []})
        run = read_run(job.run_dir, task)
        entry["runs"].append({"seed": job.seed, **(run or {"finished": False})})
    for name, variants in result.items():
        task = cfg.task_defs[name]
        for entry in variants.values():
            runs = [r for r in entry["runs"] if r.get("last_step") is not None]
            entry["seeds"] = len(entry["runs"])
            entry["complete"] = sum(r.get("last_step", 0) >= task.length for r in runs)
            entry["reached"] = sum(r["steps_to_threshold"] is not None for r in runs)
            entry["held_at_budget"] = sum(bool(r["holds_at_budget"]) for r in runs)
            finals = [r["final"] for r in runs if r.get("final") is not None]
            entry["final_evaluated"] = len(finals)
            entry["final_held"] = None if task.threshold is None else sum(v >= task.threshold for v in finals)
            entry["median_steps_to_threshold"] = median_or_none([r["steps_to_threshold"] for r in runs])
            entry["median_wall_to_threshold_s"] = median_or_none([r["wall_to_threshold_s"] for r in runs])
            if task.floor is not None:
                entry["stayed_above_floor"] = sum(
                    r["steps_to_threshold"] is not None
                    and r["last_step"] >= task.length
                    and (r["lowest_after_threshold"] is None or r["lowest_after_threshold"] >= task.floor)
                    for r in runs
                )
    return result


def _num(x: float | None, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def _steps(x: float | None) -> str:
    # evaluations land on the first multiple of num_envs at or past the schedule: 42504 -> 42.5k
    return "-" if x is None else f"{round(x / 100) / 10:g}k"


def _final_cell(task: SuiteTask, entry: dict, spec: str) -> str:
    """The final evaluations of a task's runs: per seed (with the step where it is not the end of
    the task's runs), then how many meet the threshold (or their median) and over how many episodes."""
    if task.final_episodes < 1:
        return "-"
    # a third decimal for values within [-1, 1]: a mean of 100 episodes at 0.946 must not read as 0.95
    spec = ".3f" if spec == ".2f" else spec
    values = []
    for r in entry["runs"]:
        value = _num(r.get("final"), spec)
        step = r.get("final_step")
        values.append(value if step in (None, task.length) else f"{value} at {_steps(step)}")
    if task.threshold is None:
        finals = [r["final"] for r in entry["runs"] if r.get("final") is not None]
        held = f"median {_num(median_or_none(finals), spec)}"
    else:
        held = f"{entry['final_held']}/{entry['seeds']}"
    return f"{', '.join(values)} ({held}; {task.final_episodes})"


def format_table(cfg: SuiteConfig, result: dict) -> str:
    """The suite table in Markdown: one row per task and variant, under a line naming the preset."""
    extra = f" with `{' '.join(cfg.overrides)}`" if cfg.overrides else ""
    lines = [
        f"Tasks that name no agent run `agent={cfg.discrete_agent}`{extra}.",
        "",
        "| task | metric >= threshold | budget | variant | seeds reaching it | env steps to it per seed "
        "(median) | median wall s to it | best per seed | at the budget per seed (holding) | "
        "lowest after reaching it (floor, run length) | final policy per seed (holding; episodes) |",
        "|---|---|--:|---|--:|---|--:|---|---|---|---|",
    ]
    for name, variants in result.items():
        task = cfg.task_defs[name]
        for variant, e in variants.items():
            runs = e["runs"]
            thr = "report" if task.threshold is None else f"{task.metric} >= {task.threshold:g}"
            per_seed = ", ".join(_steps(r.get("steps_to_threshold")) for r in runs)
            # whole numbers for returns in the hundreds, two decimals for popgym returns and rates
            scale = (
                abs(task.threshold)
                if task.threshold is not None
                else max((abs(r["best"]) for r in runs if r.get("best") is not None), default=0.0)
            )
            spec = ".0f" if scale >= 100 else ".2f"
            best = ", ".join(_num(r.get("best"), spec) for r in runs)
            budget = ", ".join(_num(r.get("at_budget"), spec) for r in runs)
            floor = "-"
            if task.floor is not None:
                lows = ", ".join(_num(r.get("lowest_after_threshold"), spec) for r in runs)
                stay = f"{e['stayed_above_floor']}/{e['seeds']} stay >= {task.floor:g}"
                floor = f"{lows} ({stay} to {_steps(task.run_steps)})"
            final = _final_cell(task, e, spec)
            incomplete = e["seeds"] - e["complete"]
            note = f" ({incomplete} unfinished)" if incomplete else ""
            if task.threshold is None:  # a reported task: the end-of-budget median to set beside the baseline
                reached, steps, wall = "-", "-", "-"
                ends = [r["at_budget"] for r in runs if r.get("at_budget") is not None]
                held = f"median {_num(median_or_none(ends), spec)}"
            else:
                reached = f"{e['reached']} / {e['seeds']}"
                steps = f"{per_seed} ({_steps(e['median_steps_to_threshold'])})"
                wall = _num(e["median_wall_to_threshold_s"], ".0f")
                held = f"{e['held_at_budget']}/{e['seeds']}"
            lines.append(
                f"| {name} | {thr} | {_steps(task.budget)} | {variant}{note} | {reached} | {steps} | "
                f"{wall} | {best} | {budget} ({held}) | {floor} | {final} |"
            )
    return "\n".join(lines) + "\n"


def write_curves(result: dict, cfg: SuiteConfig, out: Path) -> Path | None:
    """Curves to ``curves.csv`` and, if matplotlib imports, one panel per task in ``curves.png``."""
    with (out / "curves.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["task", "variant", "seed", "env_steps", "value"])
        for name, variants in result.items():
            for variant, e in variants.items():
                for r in e["runs"]:
                    for step, value in r.get("curve", []):
                        writer.writerow([name, variant, r["seed"], step, value])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cols = min(len(result), 3) or 1
    rows = math.ceil(len(result) / cols) or 1
    fig, axes = plt.subplots(rows, cols, figsize=(5.5 * cols, 3.8 * rows), squeeze=False)
    for i, (name, variants) in enumerate(result.items()):
        ax, task = axes[i // cols, i % cols], cfg.task_defs[name]
        for j, (variant, e) in enumerate(variants.items()):
            for k, r in enumerate(e["runs"]):
                curve = r.get("curve", [])
                ax.plot([p[0] for p in curve], [p[1] for p in curve], color=f"C{j}", alpha=0.6, lw=1,
                        label=variant if k == 0 else None)  # fmt: skip
        if task.threshold is not None:
            ax.axhline(task.threshold, color="k", ls=":", lw=1)
        ax.axvline(task.budget, color="grey", ls="--", lw=0.8)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("env steps")
        ax.set_ylabel(f"greedy eval {task.metric}")
        ax.legend(loc="best", fontsize=8)
    for i in range(len(result), rows * cols):
        axes[i // cols, i % cols].axis("off")
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=110)
    plt.close(fig)
    return out / "curves.png"


def run_suite(cfg: SuiteConfig) -> dict:
    """Run (or resume) every job, then write the table, JSON and curves; returns the result.
    Raises :class:`SuiteStopped` after writing them when a signal stopped the runs."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    stopped, failed = None, 0
    if not cfg.report_only:
        codes, stopped = run_jobs(jobs(cfg), cfg.parallel)
        failed = sum(c not in (0, None) for c in codes)
        if failed:
            print(f"{failed} run(s) exited non-zero: see the s<seed>.log files under {out}", flush=True)
        if stopped:
            waiting = sum(c is None for c in codes)
            print(f"stopped by {stopped}: {waiting} run(s) not started; the same command continues"
                  " where it stopped", flush=True)  # fmt: skip
    result = collect(cfg)
    variants = {v: cfg.variant_defs[v] for v in cfg.variants}
    record = {
        "discrete_agent": cfg.discrete_agent,
        "overrides": cfg.overrides,
        "variants": variants,
        "tasks": result,
    }
    (out / "suite.json").write_text(json.dumps(record, indent=2))
    table = format_table(cfg, result)
    (out / "suite.md").write_text(table)
    write_curves(result, cfg, out)
    print(table)
    print(f"wrote {out / 'suite.md'}, {out / 'suite.json'} and the curves beside them")
    if stopped:
        raise SuiteStopped(stopped)
    if not cfg.report_only and failed:
        raise SuiteFailed(failed)
    return result


ConfigStore.instance().store(name="suite_schema", node=SuiteConfig)


@hydra.main(version_base="1.3", config_path="../conf", config_name="suite")
def main(cfg: DictConfig) -> None:
    """Hydra entry point."""
    config = OmegaConf.to_object(cfg)
    assert isinstance(config, SuiteConfig)
    problem = invalid(config) or (None if config.report_only else invalid_runs(config))
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        run_suite(config)
    except SuiteStopped as stop:
        sys.exit(128 + signal.Signals[stop.signal].value)
    except SuiteFailed as failed:
        print(f"error: {failed}; the table holds the others", file=sys.stderr)
        sys.exit(1)


def cli(argv: list[str] | None = None) -> None:
    """``python -m scripts.suite``: the command line checked in one go (one line for a bad key or
    value, nothing written), then Hydra's ``main``."""
    from scripts.tf_logs import quiet_tensorflow

    quiet_tensorflow()  # the checks import TF: its start-up lines off the console
    from scripts.overrides import check_composes, config_name

    argv = sys.argv[1:] if argv is None else list(argv)
    problem = check_composes(argv, config_name(argv, "suite"), SuiteConfig)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.argv = [sys.argv[0], *argv]
    main()


if __name__ == "__main__":
    cli()
