"""Optuna samplers for ``rl_zoo3 train -optimize`` (the zoo's ``(trial, n_actions, n_envs,
additional_args)`` signature) and their converters for ``--trial-id`` reloads.

They search only hyperparameters that leave the cost of a step unchanged (rates, coefficients,
horizons of the return): model size, batch shape and planner width come from the YAML entry or
``-params``, so a trial costs what a plain run costs. Ranges bracket the reference defaults.
"""

from __future__ import annotations

from typing import Any


def sample_tdmpc2_params(trial: Any, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """Around the b67b21c defaults: lr 3e-4, rho 0.5, entropy 1e-4, tau 0.01, temperature 0.5."""
    return convert_tdmpc2_params(
        {
            "learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-3, log=True),
            "rho": trial.suggest_float("rho", 0.3, 0.8),
            "entropy_coef": trial.suggest_float("entropy_coef", 1e-5, 1e-3, log=True),
            "tau": trial.suggest_float("tau", 0.003, 0.05, log=True),
            "temperature": trial.suggest_float("temperature", 0.1, 2.0, log=True),
        }
    )


def convert_tdmpc2_params(sampled: dict[str, Any]) -> dict[str, Any]:
    return dict(sampled)


def sample_dreamerv3_params(trial: Any, n_actions: int, n_envs: int, additional_args: dict) -> dict[str, Any]:
    """Around the 2411f7d defaults: lr 4e-5, actor entropy 3e-4, return horizon 333, slow rate 0.02."""
    return convert_dreamerv3_params(
        {
            "learning_rate": trial.suggest_float("learning_rate", 1e-5, 3e-4, log=True),
            "actent": trial.suggest_float("actent", 1e-4, 3e-3, log=True),
            "return_horizon": trial.suggest_categorical("return_horizon", [100, 333, 1000]),
            "slow_rate": trial.suggest_float("slow_rate", 0.005, 0.05, log=True),
        }
    )


def convert_dreamerv3_params(sampled: dict[str, Any]) -> dict[str, Any]:
    params = dict(sampled)
    if "return_horizon" in params:
        params["return_horizon"] = float(params["return_horizon"])
    return params


SAMPLERS = {"tdmpc2": sample_tdmpc2_params, "dreamerv3": sample_dreamerv3_params}
CONVERTERS = {"tdmpc2": convert_tdmpc2_params, "dreamerv3": convert_dreamerv3_params}
