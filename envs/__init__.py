"""Environments: gymnasium construction, POMDP wrappers, tiny memory tasks and fault checks."""

from envs.config import EnvConfig
from envs.faults import describe_non_finite
from envs.make import EnvSpec, describe_env, has_time_limit, make_env, make_vec_env

__all__ = [
    "EnvConfig",
    "EnvSpec",
    "describe_env",
    "describe_non_finite",
    "has_time_limit",
    "make_env",
    "make_vec_env",
]
