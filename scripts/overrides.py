"""The command line checked before Hydra runs: a mistake is one line that names the key and what it
allows (Hydra's own report spans several lines), and nothing is created on disk (Hydra makes the
run directory and its log file before the task starts).

The check composes ``conf/config.yaml`` with the overrides, converts it to the typed config (a resumed
run's own, with the overrides applied) and runs the same validation as training, including the
checks that need one instance of the env.
"""

from __future__ import annotations

from hydra import compose, initialize_config_module
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agents.config import config_from_dict, load_run_config, validate, validate_for_env
from envs import describe_env
from envs.config import ConfigError

# Hydra's own flags that take a value (``--config-name NAME``): neither they nor it are overrides.
_FLAGS_WITH_VALUE = {
    "--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd", "--info", "-i", "--cfg", "-c",
    "--package", "-p", "--experimental-rerun",
}  # fmt: skip


def task_overrides(argv: list[str]) -> list[str]:
    """The ``key=value`` / ``group=option`` arguments of a command line, Hydra's flags left out."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def config_overrides(argv: list[str]) -> list[str]:
    """The overrides of ``argv`` that set the config (Hydra's own ``hydra.*`` left out)."""
    return [o for o in task_overrides(argv) if not o.lstrip("+~").startswith("hydra.")]


def _allowed_keys(overrides: list[str], full_key: str, config_name: str = "config") -> str:
    """The keys beside ``full_key`` in the config composed without the offending override."""
    parent, _, _ = full_key.rpartition(".")
    rest = [o for o in overrides if not f"{o.lstrip('+~').split('=', 1)[0]}.".startswith(f"{full_key}.")]
    try:
        cfg = compose(config_name, overrides=rest)
    except (HydraException, OmegaConfBaseException):
        return ""
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return "|".join(sorted(node.keys())) if isinstance(node, DictConfig) else ""


def _message(exc: Exception, overrides: list[str], config_name: str = "config") -> str:
    if isinstance(exc, MissingConfigException) and exc.options is not None:
        group = exc.missing_cfg_file.split("/")[0] if exc.missing_cfg_file else "group"
        chosen = next((o for o in overrides if o.split("=", 1)[0] == group), group)
        allowed = "|".join(o for o in exc.options if not o.endswith("_schema"))
        return f"{chosen} is invalid: allowed {allowed}"
    cause = exc if isinstance(exc, OmegaConfBaseException) else exc.__cause__
    cause = cause if isinstance(cause, OmegaConfBaseException) else exc
    full_key = getattr(cause, "full_key", None)
    first = str(getattr(cause, "msg", None) or cause).strip().splitlines()[0]
    if not full_key:
        return first
    if "not in" in first:  # an unknown key: say which exist there
        allowed = _allowed_keys(overrides, full_key, config_name)
        return f"{full_key} is not a key" + (f": allowed {allowed}" if allowed else "")
    value = next((o.split("=", 1)[1] for o in overrides if o.lstrip("+").split("=", 1)[0] == full_key), None)
    return f"{full_key}={value} is invalid: {first}" if value is not None else f"{full_key}: {first}"


def config_name(argv: list[str], default: str) -> str:
    """The ``--config-name``/``-cn`` of a command line, or ``default``."""
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag in ("--config-name", "-cn"):
            return value
    return default


def check_composes(argv: list[str], name: str, schema: type) -> str | None:
    """Compose ``conf/<name>.yaml`` with the overrides of ``argv`` into ``schema``: one line naming
    the first unknown key or bad value, or None. For commands whose own config is all there is to
    check (the suite); ``scripts.train`` uses :func:`check`."""
    overrides = config_overrides(argv)
    try:
        with initialize_config_module("conf", version_base="1.3"):
            try:
                cfg = compose(name, overrides=overrides)
                OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), _without_hydra(cfg)))
            except (HydraException, OmegaConfBaseException) as exc:
                return _message(exc, overrides, name)
    except (HydraException, OmegaConfBaseException) as exc:
        return str(exc).strip().splitlines()[0]
    return None


def _without_hydra(cfg: DictConfig) -> dict:
    data = OmegaConf.to_container(cfg, resolve=False)
    data.pop("hydra", None)
    return data


def check(argv: list[str]) -> str | None:
    """Compose ``conf/config.yaml`` with the overrides of ``argv``; one line describing the first
    problem, or None. Sweeps (``-m``) are left to Hydra, which expands them first."""
    if "-m" in argv or "--multirun" in argv:
        return None
    overrides = config_overrides(argv)
    try:
        with initialize_config_module("conf", version_base="1.3"):
            try:
                cfg = compose("config", overrides=overrides)
            except (HydraException, OmegaConfBaseException) as exc:
                return _message(exc, overrides)
            # ``+key=value`` appends even to dataclass nodes: merging into the typed schema finds
            # keys that no field reads.
            try:
                config = config_from_dict(_without_hydra(cfg))
            except OmegaConfBaseException as exc:
                return _message(exc, overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        return str(exc).strip().splitlines()[0]
    try:
        if config.resume:
            config = load_run_config(config.resume, [o for o in overrides if not o.startswith("resume=")])
        validate(config)
        validate_for_env(config, describe_env(config.env))
    except ConfigError as exc:
        return str(exc)
    return None
