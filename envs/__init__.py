"""Environments: gymnasium construction, POMDP wrappers and tiny memory tasks."""

from envs.config import EnvConfig
from envs.make import EnvSpec, describe_env, make_env, make_vec_env

__all__ = ["EnvConfig", "EnvSpec", "describe_env", "make_env", "make_vec_env"]
