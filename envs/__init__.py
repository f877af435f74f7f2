"""Environments: gymnasium construction, POMDP wrappers, tiny memory tasks, fault checks and a slow
simulator for throughput figures."""

from envs import slow
from envs.config import EnvConfig
from envs.faults import describe_non_finite
from envs.make import EnvSpec, describe_env, has_time_limit, make_env, make_vec_env

slow.register()

__all__ = [
    "EnvConfig",
    "EnvSpec",
    "describe_env",
    "describe_non_finite",
    "has_time_limit",
    "make_env",
    "make_vec_env",
]
