"""Helpers shared by the parity tests (comparison with recorded reference numbers)."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_close(name: str, ours: Any, ref: Any, rtol: float = 1e-5, scale_tol: float = 1e-5) -> None:
    """|ours − ref| ≤ scale_tol·max|ref| + rtol·|ref|, elementwise, with matching shapes."""
    ours = np.asarray(ours, np.float64)
    ref = np.asarray(ref, np.float64)
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} != {ref.shape}"
    err = np.abs(ours - ref)
    bound = scale_tol * np.max(np.abs(ref), initial=0.0) + rtol * np.abs(ref)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert np.all(err <= bound), (
        f"{name}: max abs err {err.max():.3e} (bound {bound[worst]:.3e} at {worst}), "
        f"ref max {np.abs(ref).max():.3e}"
    )


def tdmpc2_start_state(config: Any, params: dict, target: dict, scale: float = 1.0) -> Any:
    """A TD-MPC2 state with given parameters, fresh Adam states for both optimisers (world model eps
    1e-8, policy 1e-5, as the reference) and RunningScale ``scale``."""
    import jax
    import jax.numpy as jnp

    from sb3_worldmodels.tdmpc2 import agent as core

    state = core.init_state(config, jax.random.PRNGKey(0))
    return state._replace(
        params=params,
        target_qs=target,
        wm_opt=core._adam(1e-8).init(core._wm_params(params)),
        pi_opt=core._adam(1e-5).init(params["pi"]),
        scale=state.scale._replace(value=jnp.asarray(scale, jnp.float32)),
    )


DREAMERV3_TERMS = {  # our loss term -> (reference loss name, loss scale), agent.py:403-406@2411f7d
    "rec": ("vector", 1.0),
    "rew": ("reward", 1.0),
    "con": ("cont", 1.0),
    "dyn": ("dyn", 1.0),
    "rep": ("rep", 0.1),
    "actor": ("actor", 1.0),
    "critic": ("critic", 1.0),
    "repval": ("replay_critic", 0.3),
}
DREAMERV3_METRICS = {  # our metric -> reference metric (agent.py:362-390@2411f7d, jaxutils.py:526-548)
    "loss": "opt_loss",
    "grad_norm": "opt_grad_norm",
    "param_norm": "opt_param_norm",
    "update_norm": "opt_update_norm",
    "actor_entropy": "ent/action/mean",
    "post_entropy": "post_ent/mean",
    "prior_entropy": "prior_ent/mean",
    "return_mean": "ret/mean",
    "return_std": "ret/std",
    "return_min": "ret/min",
    "return_max": "ret/max",
    "value_mean": "val/mean",
    "value_std": "val/std",
    "weight_mean": "weight/mean",
    "adv_mean": "adv/mean",
    "replay_return_mean": "replay_ret/mean",
    "imag_reward_mean": "rew/mean",
    "imag_reward_std": "rew/std",
}


def dreamerv3_update_record(before: Any, after: Any, metrics: Any, latents: Any, aux: dict) -> dict:
    """What the DreamerV3 parity tests keep of one ``update_with_noise`` call, as numpy."""
    import jax

    from sb3_worldmodels.dreamerv3.reference_weights import flatten_tree

    def as_numpy(tree: Any) -> Any:
        return jax.tree_util.tree_map(np.asarray, tree)

    return {
        "before": before,
        "state": after,
        "metrics": as_numpy(metrics),
        "latents": as_numpy(latents),
        "grads": flatten_tree(aux["grads"]),
        "updates": flatten_tree(aux["updates"]),
        "internals": as_numpy(aux["internals"]),
    }
