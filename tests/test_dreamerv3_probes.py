"""DreamerV3 on probe environments with known answers, trained for seconds at a tiny size.

The probes use a higher learning rate and a one-update warmup (the paper's 4e-5 with a 1,000-update
warmup needs far more updates); everything else is the agent as it trains on real tasks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from stable_baselines3.common.env_util import make_vec_env

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.blocks.math import symexp_bins, twohot_mean
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.networks import features, make_networks
from tests.probe_envs import BanditEnv, DelayedChoiceEnv, DiscountProbeEnv

PROBE = dict(
    model_size="1m",
    units=32,
    deter=64,
    hidden=32,
    classes=4,
    stoch=8,
    blocks=4,
    batch_size=8,
    batch_length=8,
    train_ratio=32,
    imag_horizon=5,
    learning_rate=1e-3,
    warmup=1,
    seed=0,
)


def probe(env_fn, n_envs=4, **kwargs):
    return DreamerV3(make_vec_env(env_fn, n_envs=n_envs, seed=0), **{**PROBE, **kwargs})


def critic_value(model: DreamerV3, obs: np.ndarray) -> float:
    """The critic's expected return at the posterior of a first observation."""
    cfg = model.config
    params = model.policy.state["agent"].params
    carry = core.init_carry(cfg, 1)
    _, carry, _, _ = core.policy_step_jit(
        cfg,
        core.policy_params(model.policy.state["agent"]),
        carry,
        jnp.asarray(obs[None]),
        jnp.ones(1, bool),
        jax.random.PRNGKey(0),
        deterministic=True,
    )
    logits = make_networks(cfg).critic.apply({"params": params["critic"]}, features(carry.deter, carry.stoch))
    return float(twohot_mean(logits, jnp.asarray(symexp_bins(cfg.bins)))[0])


def test_probe_discounting():
    """Reward 1 for 4 steps, gamma = 1 - 1/2: the first state's value is 1.875 (undiscounted: 4)."""
    model = probe(DiscountProbeEnv, return_horizon=2.0)
    model.learn(1_500)
    value = critic_value(model, DiscountProbeEnv().reset()[0])
    assert abs(value - 1.875) < 0.3, value


def test_probe_continuous_advantage():
    """One step, reward = action in [-1, 1]: the actor's mean moves to the upper bound."""
    model = probe(lambda: BanditEnv(discrete=False))
    model.learn(1_500)
    action, _ = model.predict(np.zeros(1, np.float32), deterministic=True)
    assert float(action[0]) > 0.5, action


def test_probe_delayed_choice_in_imagination():
    """The first action only changes the next step's reward (1 vs 0.3): learned through imagined rollouts."""
    model = probe(DelayedChoiceEnv)
    model.learn(2_000)
    obs = DelayedChoiceEnv().reset()[0]
    action, _ = model.predict(obs, deterministic=True)
    assert int(action) == 1
