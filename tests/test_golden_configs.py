"""Golden configurations: what our SB3 constructors resolve equals the reference's resolved config.

The expected values in ``tests/fixtures/golden/`` were recorded by running the reference's own
config code at its pinned commit (TD-MPC2: hydra ``config.yaml`` -> ``parse_cfg`` -> ``make_env`` ->
``TDMPC2.__init__`` @b67b21c; DreamerV3: ``configs.yaml`` through ``embodied.Config``/``Flags`` as
``dreamerv3/main.py:30-34`` @2411f7d); ``tests/fixtures/golden/README.md`` says exactly how.

Every key of a recorded config is accounted for exactly once, in one of:

* a MAP (reference name -> our attribute, with the unit conversion where the conventions differ),
* FIXED (the reference's setting is a behaviour our code hardwires; the value is asserted, and
  checked against our model's parameters where that is visible),
* DOCUMENTED (a known difference, with its ``docs/deviations.md`` id and our expected value),
* REF_ONLY (no counterpart here, with the reason).

Our config fields that the reference lacks are listed in OURS_ONLY with the reason. A recorded key
that none of these lists names fails the test, so a new fixture cannot pass by silence.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from pathlib import Path

import jax
import numpy as np
import pytest

from sb3_worldmodels import TDMPC2, DreamerV3
from sb3_worldmodels.blocks.episodes import discount_from_episode_length
from sb3_worldmodels.dreamerv3.config import DreamerV3Config
from sb3_worldmodels.dreamerv3.config import preset as dv3_preset
from sb3_worldmodels.tdmpc2 import agent as tdmpc2_core
from sb3_worldmodels.tdmpc2.config import TDMPC2Config

GOLDEN = Path(__file__).parent / "fixtures" / "golden"


def _load(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())


def _get(obj, path: str):
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _same(ours, ref) -> bool:
    """Equal values; numbers compare as numbers (the reference's YAML writes 20 for 20.0, 5e6 as float)."""
    if isinstance(ref, bool) or isinstance(ours, bool):
        return type(ours) is type(ref) and ours == ref
    if isinstance(ref, (int, float)) and isinstance(ours, (int, float, np.integer, np.floating)):
        return float(ours) == float(ref)
    return ours == ref


def _classify(keys, mapped, fixed, documented, ref_only_patterns) -> dict[str, str]:
    """Which list accounts for each reference key; fails on a key in none or in several."""
    where: dict[str, list[str]] = {k: [] for k in keys}
    for k in keys:
        for name, group in (("map", mapped), ("fixed", fixed), ("documented", documented)):
            if k in group:
                where[k].append(name)
        for reason, patterns in ref_only_patterns.items():
            if any(re.fullmatch(p, k) for p in patterns):
                where[k].append(f"ref_only: {reason}")
    unaccounted = sorted(k for k, w in where.items() if not w)
    twice = {k: w for k, w in where.items() if len(w) > 1}
    assert not unaccounted, f"recorded reference keys with no mapping or reason: {unaccounted}"
    assert not twice, f"reference keys listed more than once: {twice}"
    stale = [k for group in (mapped, fixed, documented) for k in group if k not in where]
    assert not stale, f"listed keys that the recorded config does not have: {stale}"
    return {k: w[0] for k, w in where.items()}


# ================================================================================================
# TD-MPC2 (nicklashansen/tdmpc2 @b67b21c)
# ================================================================================================

TDMPC2_TASKS = ("cartpole-balance", "walker-walk", "humanoid-walk")
TDMPC2_SIZES = (1, 5, 19, 48, 317)

# reference cfg key -> attribute path on our model. Unit conventions are the same on both sides:
# the reference's ``episode_length``, ``seed_steps``, ``buffer_size`` and ``steps`` count agent steps
# (its dmc env repeats every action twice and reports max_episode_steps = 500, envs/dmcontrol.py),
# and so do ours (num_timesteps counts agent steps, T9); our ``episode_length`` argument counts
# simulator steps, so the comparison uses ``agent_episode_length`` (= 1000 // action_repeat).
TDMPC2_MAP = {
    "task_dim": "_config.task_dim",  # 0 for a single task (parser.py:57); the embedding width otherwise
    # config.yaml:13-28 (training)
    "batch_size": "_config.batch_size",
    "reward_coef": "_config.reward_coef",
    "value_coef": "_config.value_coef",
    "consistency_coef": "_config.consistency_coef",
    "rho": "_config.rho",
    "lr": "learning_rate",  # our _config.learning_rate stays at its default (the rate is in the state)
    "enc_lr_scale": "_config.enc_lr_scale",
    "grad_clip_norm": "_config.grad_clip_norm",
    "tau": "_config.tau",
    "buffer_size": "buffer_size",
    # config.yaml:31-39 (planning); ``iterations`` as TDMPC2.__init__ leaves it (+2 if action_dim >= 20)
    "iterations": "_config.iterations",
    "num_samples": "_config.num_samples",
    "num_elites": "_config.num_elites",
    "num_pi_trajs": "_config.num_pi_trajs",
    "horizon": "_config.horizon",
    "min_std": "_config.min_std",
    "max_std": "_config.max_std",
    "temperature": "_config.temperature",
    # config.yaml:42-49 (actor, critic) and parse_cfg's bin_size
    "log_std_min": "_config.log_std_min",
    "log_std_max": "_config.log_std_max",
    "entropy_coef": "_config.entropy_coef",
    "num_bins": "_config.num_bins",
    "vmin": "_config.vmin",
    "vmax": "_config.vmax",
    "bin_size": "_config.bin_size",
    # config.yaml:52-60 (architecture) after the MODEL_SIZE preset (parse_cfg)
    "model_size": "model_size",
    "num_enc_layers": "_config.num_enc_layers",
    "enc_dim": "_config.enc_dim",
    "mlp_dim": "_config.mlp_dim",
    "latent_dim": "_config.latent_dim",
    "num_q": "_config.num_q",
    "dropout": "_config.dropout",
    "simnorm_dim": "_config.simnorm_dim",
    # set by envs/__init__.py:56-61 from the env
    "action_dim": "_config.action_dim",
    "episode_length": "agent_episode_length",
    "seed_steps": "seed_steps",
}
# Keys compared by hand below: ``obs_shape`` ({'state': (obs_dim,)}) and the discount heuristic's
# parameters (``discount_denom``/``discount_min``/``discount_max``: the defaults of
# :func:`discount_from_episode_length`, which our class calls).
TDMPC2_SPECIAL = {"obs_shape", "discount_denom", "discount_min", "discount_max"}

# Reference settings that are behaviours our code hardwires (value asserted from the fixture).
TDMPC2_FIXED = {
    "mpc": True,  # act() plans with MPPI after the seed phase; there is no policy-only mode
    "multitask": False,  # single-task agent only
}

TDMPC2_DOCUMENTED: dict = {}  # no known difference in the resolved configuration

TDMPC2_REF_ONLY = {
    "trainer bookkeeping (evaluation, logging, checkpoints): SB3 callbacks and save/load here": (
        "checkpoint",
        "eval_episodes",
        "eval_freq",
        "exp_name",
        "data_dir",
        "wandb_project",
        "wandb_entity",
        "wandb_silent",
        "disable_wandb",
        "save_csv",
        "save_video",
        "save_agent",
        "work_dir",
        "task_title",
    ),
    "the training budget: our learn(total_timesteps), in agent steps as the reference's steps": ("steps",),
    "the run seed (reference default 1); ours is SB3's seed argument (random streams differ, T1)": ("seed",),
    "the task name: the test builds the same dm_control task from our env id": ("task",),
    "multi-task only (mt30/mt80): this library trains single-task agents": (
        "tasks",
        "obs_shapes",
        "action_dims",
        "episode_lengths",
    ),
}

TDMPC2_OURS_ONLY = {
    "obs_dim": "compared with the reference's obs_shape['state'][0]",
    "image_shape": (
        "later upstream code (obs: rgb, obs_shape['rgb'], config.yaml:6@eece801, channel-last here); "
        "empty for the state observations recorded here, as b67b21c has no pixel path"
    ),
    "num_channels": "later upstream code (config.yaml:58@eece801), used only with images; b67b21c lacks it",
    "discount": "compared with the discount TDMPC2.__init__ computes (agent.discount, tdmpc2.py:31-48)",
    "learning_rate": "left at its default on purpose; the SB3 learning_rate is compared with lr",
    "q_dropout": (
        "'always' is b67b21c's behaviour (layers.py:7-27, world_model.py:70-72@b67b21c); "
        "other modes are later upstream code"
    ),
    "dropout_masks": "how masks are drawn (docs/deviations.md T13)",
    "episodic": "later upstream code (7ec6bc8); off = b67b21c",
    "termination_coef": "later upstream code (7ec6bc8), used only with episodic=True",
    "stale_pi_grad_in_clip": (
        "b67b21c's clipping behaviour (tdmpc2.py:180,232,267@b67b21c), not a config key there"
    ),
    "matmul_precision": "numerics switch; 'float32' is how the reference ran (float32 GEMMs)",
    "compute_dtype": "numerics switch; 'auto' is float32 on every backend, as the reference ran (T21)",
    **dict.fromkeys(
        ("beta1", "beta2", "eps", "pi_eps"),
        "Adam's constants, not config keys there (torch.optim.Adam's defaults and eps=1e-5, tdmpc2.py:20-27)",
    ),
    "action_dims": "multi-task only (the reference's action_dims, '???' for a single task)",
    "episode_lengths": "multi-task only (the reference's episode_lengths, '???' for a single task)",
}


def _tdmpc2_record(task: str, size: int) -> dict:
    return _load(f"tdmpc2_{task}.json")["sizes"][str(size)]


@pytest.fixture
def tdmpc2_shape_only_init(monkeypatch):
    """Build TD-MPC2 models without initialising parameters (shapes only): the configuration is
    resolved by the unchanged constructor path; only ``init_state`` runs under ``jax.eval_shape``."""
    real = tdmpc2_core.init_state
    monkeypatch.setattr(
        tdmpc2_core, "init_state", lambda config, key: jax.eval_shape(functools.partial(real, config), key)
    )


def _learnable_params(model) -> int:
    params = model.policy.state["agent"].params  # target Qs live outside params: not learnable
    return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def _build_tdmpc2(task: str, size: int, ctor: str):
    if ctor == "id":
        return TDMPC2(f"dm_control/{task}-v0", action_repeat=2, model_size=size)
    from sb3_worldmodels.envs.dmc import make_dmc_env

    return TDMPC2(make_dmc_env(task), model_size=size)


def _check_tdmpc2(model, rec: dict) -> None:
    cfg = rec["cfg"]
    kinds = _classify(
        set(cfg), {**TDMPC2_MAP, **dict.fromkeys(TDMPC2_SPECIAL)}, TDMPC2_FIXED, TDMPC2_DOCUMENTED,
        TDMPC2_REF_ONLY,
    )  # fmt: skip
    assert set(TDMPC2Config.__dataclass_fields__) <= set(TDMPC2_OURS_ONLY) | {
        p.split(".", 1)[1] for p in TDMPC2_MAP.values() if p.startswith("_config.")
    }, "a TDMPC2Config field is neither mapped nor listed in TDMPC2_OURS_ONLY"
    wrong = {}
    for key, kind in kinds.items():
        if kind == "map" and key in TDMPC2_MAP:
            ours = _get(model, TDMPC2_MAP[key])
            if not _same(ours, cfg[key]):
                wrong[key] = (f"reference {cfg[key]!r}", f"ours {TDMPC2_MAP[key]} = {ours!r}")
        elif kind == "fixed" and cfg[key] != TDMPC2_FIXED[key]:
            wrong[key] = (f"reference {cfg[key]!r}", f"hardwired here {TDMPC2_FIXED[key]!r}")
    assert not wrong, f"TD-MPC2 config differs from the reference: {wrong}"
    # the special ones
    assert cfg["obs_shape"] == {"state": [model._config.obs_dim]}
    defaults = inspect.signature(discount_from_episode_length).parameters
    assert _same(defaults["denom"].default, cfg["discount_denom"])
    assert _same(defaults["lo"].default, cfg["discount_min"])
    assert _same(defaults["hi"].default, cfg["discount_max"])
    # what TDMPC2.__init__ computes (tdmpc2.py:30-33) and the model's size
    assert _same(model._config.discount, rec["agent.discount"])
    assert _same(model.discount, rec["agent.discount"]) and _same(model.gamma, rec["agent.discount"])
    assert _learnable_params(model) == rec["model.total_params"]
    # the reference's agent acts in [-1, 1] (action_scale.Wrapper, envs/dmcontrol.py); ours acts in
    # [-1, 1] too, mapped onto the env's bounds at the boundary
    assert (rec["env.action_space.low"], rec["env.action_space.high"]) == (-1.0, 1.0)
    ends = np.repeat(np.array([[-1.0], [1.0]], np.float32), model._config.action_dim, axis=1)
    space = model.action_space
    np.testing.assert_allclose(model.action_adapter.to_env(ends), np.stack([space.low, space.high]))


@pytest.mark.parametrize("size", [1, 5])
def test_tdmpc2_golden_walker_walk_full_construction(size):
    """The untouched constructor, parameters initialised (sizes 1 and 5, from the env id)."""
    pytest.importorskip("dm_control")
    _check_tdmpc2(_build_tdmpc2("walker-walk", size, "id"), _tdmpc2_record("walker-walk", size))


@pytest.mark.parametrize("ctor", ["id", "make_dmc_env"])
@pytest.mark.parametrize("size", TDMPC2_SIZES)
@pytest.mark.parametrize("task", TDMPC2_TASKS)
def test_tdmpc2_golden(task, size, ctor, tdmpc2_shape_only_init):
    """Every task x size x constructor, parameters as shapes only (317M parameters cost nothing)."""
    pytest.importorskip("dm_control")
    rec = _tdmpc2_record(task, size)
    model = _build_tdmpc2(task, size, ctor)
    _check_tdmpc2(model, rec)
    # the large-action heuristic: humanoid's 21-dim action plans with 6 + 2 iterations
    assert model._config.iterations == (8 if task == "humanoid-walk" else 6) == rec["cfg"]["iterations"]
    assert model.iterations == 6  # the configured count stays as given (saved with the model)


# ================================================================================================
# DreamerV3 (danijar/dreamerv3 @2411f7d)
# ================================================================================================

# reference key -> (attribute path on our model, conversion of our value into the reference's unit)
_ID = None
DV3_MAP = {
    "dyn.rssm.deter": ("_config.deter", _ID),
    "dyn.rssm.hidden": ("_config.hidden", _ID),
    "dyn.rssm.classes": ("_config.classes", _ID),
    "dyn.rssm.stoch": ("_config.stoch", _ID),
    "dyn.rssm.blocks": ("_config.blocks", _ID),
    "dyn.rssm.imglayers": ("_config.img_layers", _ID),
    "dyn.rssm.obslayers": ("_config.obs_layers", _ID),
    "dyn.rssm.unimix": ("_config.unimix", _ID),
    "enc.simple.layers": ("_config.enc_layers", _ID),
    "enc.simple.units": ("_config.units", _ID),
    "dec.simple.layers": ("_config.dec_layers", _ID),
    "dec.simple.units": ("_config.units", _ID),
    "rewhead.layers": ("_config.rew_layers", _ID),
    "rewhead.units": ("_config.units", _ID),
    "rewhead.bins": ("_config.bins", _ID),
    "conhead.layers": ("_config.con_layers", _ID),
    "conhead.units": ("_config.units", _ID),
    "actor.layers": ("_config.actor_layers", _ID),
    "actor.units": ("_config.units", _ID),
    "actor.minstd": ("_config.minstd", _ID),
    "actor.maxstd": ("_config.maxstd", _ID),
    "actor.unimix": ("_config.actor_unimix", _ID),
    "critic.layers": ("_config.critic_layers", _ID),
    "critic.units": ("_config.units", _ID),
    "critic.bins": ("_config.bins", _ID),
    "rssm_loss.free": ("_config.free_nats", _ID),
    "loss_scales.dyn": ("_config.dyn_scale", _ID),
    "loss_scales.rep": ("_config.rep_scale", _ID),
    "loss_scales.dec_mlp": ("_config.rec_scale", _ID),
    "loss_scales.dec_cnn": ("_config.rec_image_scale", _ID),
    "enc.simple.depth": ("_config.cnn_depth", _ID),
    "dec.simple.depth": ("_config.cnn_depth", _ID),
    "enc.simple.mults": ("_config.cnn_mults", list),
    "dec.simple.mults": ("_config.cnn_mults", list),
    "enc.simple.kernel": ("_config.cnn_kernel", _ID),
    "dec.simple.kernel": ("_config.cnn_kernel", _ID),
    "loss_scales.reward": ("_config.rew_scale", _ID),
    "loss_scales.cont": ("_config.con_scale", _ID),
    "loss_scales.actor": ("_config.actor_scale", _ID),
    "loss_scales.critic": ("_config.critic_scale", _ID),
    "loss_scales.replay_critic": ("_config.repval_scale", _ID),
    "run.train_ratio": ("_config.train_ratio", _ID),
    "run.num_envs": ("n_envs", _ID),
    "run.train_fill": ("_config.train_fill", _ID),  # rows collected before training may start (both 0)
    "batch_size": ("_config.batch_size", _ID),
    # The reference's batch_length counts the sampled rows, context included (replay_context 1):
    # 65 = our batch_length (trained rows, T) + 1 (agent.py:188-199@2411f7d; our window has T + 1 rows).
    "batch_length": ("_config.batch_length", lambda t: t + 1),
    "imag_length": ("_config.imag_horizon", _ID),
    "horizon": ("_config.return_horizon", _ID),  # 1 / (1 - gamma)
    "return_lambda": ("_config.lam", _ID),
    "return_lambda_replay": ("_config.repval_lam", _ID),
    "actent": ("_config.actent", _ID),
    "slowreg": ("_config.slowreg", _ID),
    "slow_critic_fraction": ("_config.slow_rate", _ID),
    "retnorm.rate": ("_config.retnorm_rate", _ID),
    "retnorm.limit": ("_config.retnorm_limit", _ID),
    "opt.lr": ("learning_rate", _ID),  # our _config.learning_rate stays at its default by design
    "opt.agc": ("_config.agc", _ID),
    "opt.pmin": ("_config.agc_pmin", _ID),
    "opt.beta1": ("_config.beta1", _ID),
    "opt.beta2": ("_config.beta2", _ID),
    "opt.eps": ("_config.eps", _ID),
    "opt.warmup": ("_config.warmup", _ID),
    "opt.wd": ("_config.weight_decay", _ID),
    "replay.size": ("buffer_size", _ID),  # rows in both (per-env rings here, D7)
}
DV3_ENV_MAP = {"env.dmc.repeat": ("action_repeat", _ID)}  # dmc settings only

# Reference settings that our code hardwires (where cited, the reference code that specifies the behaviour).
DV3_FIXED = {
    "replay_context": 1,  # one context row per window (agent.py:188-199@2411f7d, agent.py:172-183@29eb964)
    # continue target (1 - terminal)(1 - 1/horizon), discount 1 (agent.py:258-261,316@2411f7d)
    "contdisc": True,
    "dyn.typ": "rssm",
    "dyn.rssm.cell": "blockgru",
    "dyn.rssm.act": "silu",
    "dyn.rssm.norm": "rms",
    "dyn.rssm.dynlayers": 1,  # one input layer each for h, z, a (dynin0-2)
    "dyn.rssm.absolute": False,  # posterior sees [h, embed]
    "dyn.rssm.outscale": 1.0,
    "dyn.rssm.winit": "normal",
    "dyn.rssm.block_fans": False,
    "dyn.rssm.block_norm": False,
    "enc.typ": "simple",
    "enc.spaces": ".*",  # every observation key is encoded
    "enc.simple.act": "silu",
    "enc.simple.norm": "rms",
    "enc.simple.winit": "normal",
    "enc.simple.symlog": True,
    "dec.typ": "simple",
    "dec.spaces": ".*",  # every observation key is decoded (one output layer per key)
    "dec.simple.act": "silu",
    "dec.simple.norm": "rms",
    "dec.simple.winit": "normal",
    "dec.simple.inputs": ["deter", "stoch"],
    "dec.simple.vecdist": "symlog_mse",
    "enc.simple.debug_outer": True,  # first encoder conv stride 1 (nets.py:263@2411f7d)
    "dec.simple.debug_outer": True,  # decoder output conv stride 1 (nets.py:354-356@2411f7d)
    "dec.simple.block_space": 8,  # networks.DECODER_SPACE_BLOCKS
    "dec.simple.hidden_stoch": True,  # space1hid
    "dec.simple.space_hidden": 0,
    "dec.simple.block_fans": False,
    "dec.simple.block_norm": False,
    "dec.simple.outscale": 1.0,  # the image output conv (vector outputs use the Dist default 0.1)
    "rewhead.act": "silu",
    "rewhead.norm": "rms",
    "rewhead.dist": "symexp_twohot",
    "rewhead.outscale": 0.0,  # zero output kernel: checked on the parameters below
    "rewhead.inputs": ["deter", "stoch"],
    "rewhead.winit": "normal",
    "rewhead.block_fans": False,
    "rewhead.block_norm": False,
    "conhead.act": "silu",
    "conhead.norm": "rms",
    "conhead.dist": "binary",
    "conhead.outscale": 1.0,
    "conhead.inputs": ["deter", "stoch"],
    "conhead.winit": "normal",
    "conhead.block_fans": False,
    "conhead.block_norm": False,
    "actor.act": "silu",
    "actor.norm": "rms",
    "actor.outscale": 0.01,
    "actor.inputs": ["deter", "stoch"],
    "actor.winit": "normal",
    "actor.block_fans": False,
    "actor.block_norm": False,
    "actor_dist_disc": "onehot",
    "actor_dist_cont": "normal",
    "critic.act": "silu",
    "critic.norm": "rms",
    "critic.dist": "symexp_twohot",
    "critic.outscale": 0.0,  # zero output kernel: checked on the parameters below
    "critic.inputs": ["deter", "stoch"],
    "critic.winit": "normal",
    "critic.block_fans": False,
    "critic.block_norm": False,
    "imag_start": "all",  # every posterior state starts an imagination (N = B * T)
    "imag_repeat": 1,
    "slow_critic_update": 1,  # the slow critic moves every update
    "slowtar": False,  # returns bootstrap from the online critic
    "retnorm.impl": "perc",
    "retnorm.perclo": 5.0,
    "retnorm.perchi": 95.0,
    "valnorm.impl": "off",
    "advnorm.impl": "off",
    "opt.scaler": "rms",  # LaProp
    "opt.momentum": True,
    "opt.globclip": 0.0,
    "opt.schedule": "constant",  # times the 1,000-update warmup
    "opt.anneal": 0,
    "separate_lrs": False,  # one learning rate for all modules
    "ac_grads": "none",  # actor-critic inputs stop-gradiented
    "reset_context": 0.0,
    "replay_critic_loss": True,
    "replay_critic_grad": True,
    "replay_critic_bootstrap": "imag",
    "reward_grad": True,
    "random_agent": False,
    "run.expl_until": 0,  # no separate exploration phase
    "replay.online": True,  # every fresh item reaches training batches (D22)
    "replay.fracs.uniform": 1.0,  # uniform replay sampling
    "replay.fracs.priority": 0.0,
    "replay.fracs.recency": 0.0,
    "wrapper.discretize": 0,  # continuous actions are not discretised
}
DV3_ENV_FIXED = {"env.dmc.image": False}  # the proprio protocol: vector observations

DV3_REF_ONLY = {
    "the CNN's final resolution: derived from the image size here (H / 16), asserted there": (
        r"(enc|dec)\.simple\.minres",
    ),
    "options whose only value makes them unused (fracs uniform 1.0, separate_lrs False, norms off)": (
        r"replay\.prio\..*",
        r"replay\.priosignal",
        r"replay\.recexp",
        r"lrs\..*",
        r"(valnorm|advnorm)\.(rate|limit)",
    ),
    "dead options removed upstream in 1a532a7 (configs.yaml:98-99,108,147@2411f7d)": (
        r"compute_lr",
        r"compute_lr_params\..*",
        r"scale_by_actent",
        r"winit_scale",
    ),
    "reports, logging, evaluation and run scripts: SB3 callbacks and logger here (D22)": (
        r"report",
        r"report_gradnorms",
        r"batch_length_eval",
        r"filter",
        r"logdir",
        r"eval_dir",
        r"method",
        r"tensorboard_videos",
        r"opt\.details",
        r"run\.(script|duration|log_.*|save_every|eval_every|eval_initial|eval_eps|eval_fill)",
        r"run\.(num_envs_eval|from_checkpoint)",
    ),
    "distributed runtime, devices and jax flags (jax.compute_dtype is D1, below)": (
        r"run\.(actor_addr|replay_addr|logger_addr|actor_batch|actor_threads|env_replica|ipv6)",
        r"run\.(usage\..*|timer|driver_parallel|agent_process|remote_replay)",
        r"jax\.(?!compute_dtype$).*",
        r"replay\.(chunksize|debug_save_wait)",
        r"imag_unroll",
    ),
    "the training budget: our learn(total_timesteps)": (r"run\.steps",),
    "the run seed: SB3's seed argument here (replay sampler seeded from it, D9)": (r"seed",),
    "the task name: the test builds the same task from our env id": (r"task",),
    "embodied env wrappers (time limit, reset, space checks): the Gymnasium env is used as given": (
        r"wrapper\.(length|reset|checks)",
    ),
    "settings of other env suites, and the dmc image rendering size/camera": (
        r"env\.(atari|crafter|atari100k|dmlab|minecraft|procgen|loconav)\..*",
        r"env\.dmc\.(size|camera)",
    ),
}
DV3_REF_ONLY_GYM = {
    "dmc settings in a gym task's config (unused by gym_CartPole-v1)": (r"env\.dmc\.(image|repeat)",),
}

DV3_OURS_ONLY = {
    "obs_dim": "from the env (the reference's enc_space widths: compared below)",
    "action_dim": "from the env (the reference's act_space: compared below)",
    "discrete": "from the env (compared below)",
    "obs_keys": "from the env: the decoder's per-key outputs (compared with enc_space below)",
    "image_shape": "from the env: the image keys stacked along the channels (none in these settings)",
    "image_keys": "from the env: the decoder's per-key image outputs (none in these settings)",
    "learning_rate": "left at its default on purpose; the SB3 learning_rate is compared with opt.lr",
    "matmul_precision": "the precision of float32 matmuls (the reference's float32 GEMMs)",
    "compute_dtype": "the reference's jax.compute_dtype, compared below as a documented difference (D1)",
}

# Known differences: reference key -> (our expected value in the reference's unit, deviations.md id).
DV3_DOCUMENTED_DMC = {
    "jax.compute_dtype": ("float32", "D1"),
}
_200M_TO_1M = {"dyn.rssm.deter": 512, "dyn.rssm.hidden": 64, "dyn.rssm.classes": 4}
_UNITS = (
    "enc.simple.units", "dec.simple.units", "rewhead.units", "conhead.units", "actor.units", "critic.units",
)  # fmt: skip
# The reference resolves a gym task with its `defaults` block (200m sizes, train_ratio 32); our
# CartPole setting is the "1m" preset (ours, D3) at our default train ratio 512 (D23).
DV3_DOCUMENTED_GYM = {
    "jax.compute_dtype": ("float32", "D1"),
    "run.train_ratio": (512, "D23"),
    **{k: (v, "D3") for k, v in _200M_TO_1M.items()},
    **{k: (64, "D3") for k in _UNITS},
    **{k: (4, "D3") for k in ("enc.simple.depth", "dec.simple.depth")},
}


def _our_value(model, spec):
    path, conv = spec
    value = _get(model, path)
    return value if conv is None else conv(value)


def _check_dv3(model, rec, *, env_map, env_fixed, documented, extra_ref_only) -> None:
    cfg = rec["config"]
    mapped = {k: v for k, v in {**DV3_MAP, **env_map}.items() if k not in documented}
    fixed = {**DV3_FIXED, **env_fixed}
    kinds = _classify(set(cfg), mapped, fixed, documented, {**DV3_REF_ONLY, **extra_ref_only})
    fields = set(DreamerV3Config.__dataclass_fields__)
    covered = {p.split(".", 1)[1] for p, _ in DV3_MAP.values() if p.startswith("_config.")}
    assert fields <= covered | set(DV3_OURS_ONLY), (
        f"DreamerV3Config fields neither mapped nor listed: {sorted(fields - covered - set(DV3_OURS_ONLY))}"
    )
    wrong = {}
    for key, kind in kinds.items():
        if kind == "map":
            ours = _our_value(model, mapped[key])
            if not _same(ours, cfg[key]):
                wrong[key] = (f"reference {cfg[key]!r}", f"ours {mapped[key][0]} -> {ours!r}")
        elif kind == "fixed" and cfg[key] != fixed[key]:
            wrong[key] = (f"reference {cfg[key]!r}", f"hardwired here {fixed[key]!r}")
        elif kind == "documented":
            expected, dev_id = documented[key]
            assert not _same(expected, cfg[key]), f"{key}: {dev_id} lists a difference that is gone"
    assert not wrong, f"DreamerV3 config differs from the reference: {wrong}"
    # documented differences: our side has the documented value
    ours_documented = {
        "jax.compute_dtype": model._config.compute_dtype,  # "auto" on a CPU (D1)
        "run.train_ratio": model._config.train_ratio,
        "dyn.rssm.deter": model._config.deter,
        "dyn.rssm.hidden": model._config.hidden,
        "dyn.rssm.classes": model._config.classes,
        **{k: model._config.units for k in _UNITS},
        **{k: model._config.cnn_depth for k in ("enc.simple.depth", "dec.simple.depth")},
    }
    for key, (expected, dev_id) in documented.items():
        assert _same(ours_documented[key], expected), f"{key} ({dev_id}): ours {ours_documented[key]!r}"
    # the env as the reference builds it (main.py make_env + the encoder's key filter, agent.py:36-39)
    (act,) = rec["env"]["act_space"].values()
    enc = rec["env"]["enc_space"]
    assert model._config.discrete == act["discrete"]
    if act["discrete"]:  # classes = high - low
        assert model._config.action_dim == int(act["high"] - act["low"])
    else:
        assert [model._config.action_dim] == act["shape"] and (act["low"], act["high"]) == (-1.0, 1.0)
    assert model._config.obs_dim == sum(int(np.prod(s)) for s in enc.values())
    if len(enc) > 1:  # a Dict observation: one decoder output per key, same widths
        assert dict(model._config.obs_keys) == {k: int(np.prod(s)) for k, s in enc.items()}
    # FIXED values visible in the parameters: layer counts, widths, zero-initialised output heads
    params = model.policy.state["agent"].params
    cfg_ = model._config
    assert sum(k.startswith("mlp") for k in params["enc"]) == cfg["enc.simple.layers"]
    assert sum(k.startswith("mlp") for k in params["dec"]) == cfg["dec.simple.layers"]
    for module, key in (("rew", "rewhead"), ("con", "conhead"), ("actor", "actor"), ("critic", "critic")):
        hidden = [k for k in params[module] if re.fullmatch(r"h\d+", k)]
        assert len(hidden) == cfg[f"{key}.layers"], module
        # the width is our units (compared with the reference's *.units above, or documented)
        assert all(params[module][h]["kernel"].shape[-1] == cfg_.units for h in hidden), module
    assert sum(re.fullmatch(r"img\d+", k) is not None for k in params["dyn"]) == cfg["dyn.rssm.imglayers"]
    assert sum(re.fullmatch(r"obs\d+", k) is not None for k in params["dyn"]) == cfg["dyn.rssm.obslayers"]
    assert params["dyn"]["dyn0"]["kernel"].shape[0] == cfg["dyn.rssm.blocks"]
    assert params["dyn"]["dyn0"]["bias"].shape == (cfg_.deter,)
    for module in ("rew", "critic"):  # outscale 0.0
        assert not np.any(np.asarray(params[module]["out"]["kernel"])), module
    for module, key in (("rew", "rewhead"), ("critic", "critic")):  # 255 bins (256 padded there: D15)
        assert params[module]["out"]["kernel"].shape[-1] == cfg[f"{key}.bins"], module


def test_dreamerv3_golden_dmc_proprio():
    """The paper's proprio setting: --configs dmc_proprio (walker-walk) = our defaults at repeat 2."""
    pytest.importorskip("dm_control")
    rec = _load("dreamerv3_dmc_proprio.json")
    assert rec["argv"] == ["--configs", "dmc_proprio"] and rec["config"]["task"] == "dmc_walker_walk"
    model = DreamerV3("dm_control/walker-walk-v0", action_repeat=2)
    _check_dv3(
        model, rec, env_map=DV3_ENV_MAP, env_fixed=DV3_ENV_FIXED, documented=DV3_DOCUMENTED_DMC,
        extra_ref_only={},
    )  # fmt: skip
    assert _same(model.gamma, 1 - 1 / rec["config"]["horizon"])


def test_dreamerv3_golden_gym_cartpole():
    """A gym task as the reference resolves it (the `defaults` block, --task gym_CartPole-v1) against
    our CartPole setting ("1m", our preset); only the documented differences remain."""
    rec = _load("dreamerv3_gym_cartpole.json")
    assert rec["argv"] == ["--task", "gym_CartPole-v1"]
    model = DreamerV3("CartPole-v1", model_size="1m")
    _check_dv3(
        model, rec, env_map={}, env_fixed={}, documented=DV3_DOCUMENTED_GYM, extra_ref_only=DV3_REF_ONLY_GYM
    )
    # The reference names a flat gym observation "image" (a 1-D key, so its MLP encoder takes it);
    # ours is the single key "vector". Same width.
    assert rec["env"]["enc_space"] == {"image": [4]} and model._config.decoder_outputs == (("vector", 4),)


@pytest.mark.parametrize("name", ["size12m", "size25m", "size50m", "size100m", "size200m", "size400m"])
def test_dreamerv3_golden_presets(name):
    """Every 2411f7d size preset (--configs sizeXm) against our preset() (no model is built)."""
    cfg = _load("dreamerv3_presets.json")["presets"][name]["config"]
    ours = dv3_preset(name[len("size") :])
    assert (cfg["dyn.rssm.deter"], cfg["dyn.rssm.hidden"], cfg["dyn.rssm.classes"]) == (
        ours.deter, ours.hidden, ours.classes,
    )  # fmt: skip
    assert (cfg["dyn.rssm.stoch"], cfg["dyn.rssm.blocks"]) == (ours.stoch, ours.blocks)
    for key in _UNITS:
        assert cfg[key] == ours.units, key
    # the CNN depth keys (D18) follow depth = units / 16: the rule our "1m" extrapolates (D3)
    assert cfg["enc.simple.depth"] == cfg["dec.simple.depth"] == ours.units // 16
