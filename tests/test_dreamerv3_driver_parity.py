"""Collection and replay against the reference (driver.py:34-81, replay.py:130-317, train.py:26-91@2411f7d).

The fixtures ``tests/fixtures/dreamerv3/driver_*`` were recorded by running danijar/dreamerv3
@2411f7d (+ 29eb964) itself: ``embodied/run/train.py`` with ``embodied.Driver`` (in-process envs),
``embodied.replay.Replay`` (uniform, ``online=True``, chunk size 4 so that windows cross chunks),
``when.Ratio`` and the ``train_fill`` gate, and the real ``JAXAgent`` at tiny sizes, on the scripted
:class:`~tests.probe_envs.DriverScriptEnv` (2 envs, exactly two episodes each, one ending by
termination and one by truncation). The action sent to the env is a scripted function of the
observation (the reference's policy still ran and its latents were stored). See the README there.

Here the same env runs through ``DreamerV3.learn`` (``_collect_act``, ``_collect_observe``,
``_advance_schedule``, ``SequenceReplay``, ``RatioSchedule``) with the reference's initial policy
parameters, the scripted actions and the reference's posterior samples injected through the
policy's noise (so that the stored latents can be compared value for value). The replay sampler's
draws differ by design (docs/deviations.md D9), so the windows are compared as the set that can be
sampled, their annotation and the online queue, not draw by draw.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from stable_baselines3.common.vec_env import DummyVecEnv

from sb3_worldmodels import DreamerV3
from sb3_worldmodels.common.replay import SequenceReplay, annotate_batch
from sb3_worldmodels.common.schedule import RatioSchedule
from sb3_worldmodels.dreamerv3 import agent as core
from sb3_worldmodels.dreamerv3.config import SMOKE_SETTINGS
from sb3_worldmodels.dreamerv3.reference_weights import ref_to_path, unflatten
from tests.parity_helpers import load_fixture
from tests.probe_envs import DriverScriptEnv

FIXTURES = Path(__file__).parent / "fixtures" / "dreamerv3"
WINDOW = 9  # reference batch_length 9 = our batch_length 8 + the context row (configs.yaml:92-94@2411f7d)
N_ENVS = 2
ROWS = 40  # 2 envs x (6 + 14 | 11 + 9) rows: exactly two episodes per env, reset rows included
FIELDS = ("vector", "action", "reward", "is_first", "is_last", "is_terminal")


def load(name: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays = load_fixture(FIXTURES / f"driver_{name}.npz")
    return arrays, json.loads((FIXTURES / f"driver_{name}.json").read_text())


class Recorder:
    """What our side did, observed through wrappers around the replay and the schedule."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int]] = []  # (env, stream position, row counter) per row
        self.items: list[int] = []  # replay items after each row
        self.policy_latent: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self.ratio_calls: list[tuple[int, int]] = []  # (row counter, updates)
        self.samples: list[dict[str, Any]] = []
        self.writebacks: list[dict[str, Any]] = []


class EagerFromStream:
    """An acting function as the collector calls it (``AgentFunction.from_stream().call_from_host``),
    run eagerly: its key split from the stream's as the compiled call splits it, the function given the
    concrete arrays it reads."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def from_stream(self) -> EagerFromStream:
        return self

    def call_from_host(self, config: Any, *args: Any, **kwargs: Any) -> tuple[Any, jax.Array]:
        *arguments, stream_key = args
        next_key, step_key = jax.random.split(stream_key)
        return self.fn(config, *arguments, step_key, **kwargs), next_key


def run_ours(
    monkeypatch: pytest.MonkeyPatch, ref: dict[str, np.ndarray], train_ratio: float, train_fill: int
) -> tuple[DreamerV3, Recorder]:
    rec = Recorder()
    # The reference's posterior sample (stoch indices) per observed row, by (env, t, k).
    ref_stoch = {
        tuple(int(x) for x in vec): stoch
        for vecs, stochs in zip(ref["policy_vector"], ref["policy_stoch"], strict=True)
        for vec, stoch in zip(vecs, stochs, strict=True)
    }
    injected: dict[str, np.ndarray] = {}
    original_draw_noise = core._draw_noise

    def draw_noise(config, key, shapes):  # the policy's Gumbel noise, replaced by the recorded samples
        if set(shapes) != {"stoch", "action"}:  # training's noise is left alone
            return original_draw_noise(config, key, shapes)
        return {name: jnp.asarray(injected[name], jnp.float32) for name in shapes}

    def policy_step(config, params, carry, obs, is_first, key, deterministic=False):
        obs_np = np.asarray(obs)
        cells = [tuple(int(x) for x in row) for row in obs_np]
        stoch = np.stack([ref_stoch[c] for c in cells])
        action = np.array([DriverScriptEnv.action_for(*c) for c in cells])
        injected["stoch"] = 1e4 * np.eye(config.classes, dtype=np.float32)[stoch]
        injected["action"] = 1e4 * np.eye(config.action_dim, dtype=np.float32)[action]
        return core.policy_step(config, params, carry, obs, is_first, key, deterministic)

    monkeypatch.setattr(core, "_draw_noise", draw_noise)
    monkeypatch.setattr(core, "policy_step_jit", EagerFromStream(policy_step))  # the patched noise is used

    add_rows, sample, write_back = SequenceReplay.add_rows, SequenceReplay.sample, SequenceReplay.write_back
    ratio_call = RatioSchedule.__call__

    def rec_add_rows(self, env_ids, rows):
        before = self.rows_added_per_env.copy()
        items = add_rows(self, env_ids, rows)
        for i, env in enumerate(np.asarray(env_ids)):
            pos = int(before[env])
            rec.rows.append((int(env), pos, len(rec.rows) + 1))
            rec.policy_latent[(int(env), pos)] = (np.array(rows["deter"][i]), np.array(rows["stoch"][i]))
        rec.items.extend(int(x) for x in items)
        return items

    def rec_sample(self, batch_size, count=1):
        queue = self.online_queue.copy()
        batch, envs, starts = sample(self, batch_size, count)
        rec.samples.append(
            {"rows": len(rec.rows), "queue": queue, "popped": len(queue) - self.queue_size,
             "envs": envs.copy(), "starts": starts.copy(), "batch": {k: v.copy() for k, v in batch.items()}}
        )  # fmt: skip
        return batch, envs, starts

    def rec_write_back(self, envs, starts, values):
        rec.writebacks.append(
            {
                "envs": np.array(envs),
                "starts": np.array(starts),
                "values": {k: np.array(v) for k, v in values.items()},
            }
        )
        return write_back(self, envs, starts, values)

    def rec_ratio(self, step):
        n = ratio_call(self, step)
        rec.ratio_calls.append((int(step), n))
        return n

    monkeypatch.setattr(SequenceReplay, "add_rows", rec_add_rows)
    monkeypatch.setattr(SequenceReplay, "sample", rec_sample)
    monkeypatch.setattr(SequenceReplay, "write_back", rec_write_back)
    monkeypatch.setattr(RatioSchedule, "__call__", rec_ratio)

    vec = DummyVecEnv([lambda i=i: DriverScriptEnv(i) for i in range(N_ENVS)])
    settings = {**SMOKE_SETTINGS, "train_ratio": train_ratio}
    model = DreamerV3("MlpPolicy", vec, seed=0, train_fill=train_fill, **settings)
    assert model._config.batch_length + 1 == WINDOW and model._config.batch_size == 2
    # The reference's initial policy parameters (enc, dyn, actor); the rest keeps our init.
    flat = {ref_to_path(k)[1]: v for k, v in load_fixture(FIXTURES / "driver_params_init.npz").items()}
    policy_tree = unflatten(flat)
    agent = model.policy.state["agent"]
    params = dict(agent.params)
    for module in ("enc", "dyn", "actor"):
        ours_shapes = jax.tree_util.tree_map(jnp.shape, params[module])
        assert jax.tree_util.tree_map(jnp.shape, policy_tree[module]) == ours_shapes
        params[module] = policy_tree[module]
    model.policy.state = {**model.policy.state, "agent": agent._replace(params=params)}
    model.learn(ROWS)
    assert model.num_timesteps == ROWS
    return model, rec


def run_record(name: str) -> tuple[dict, dict, DreamerV3, Recorder]:
    """The reference's record ``name`` and our run with its settings."""
    ref, meta = load(name)
    with pytest.MonkeyPatch.context() as mp:
        model, rec = run_ours(mp, ref, train_ratio=meta["train_ratio"], train_fill=meta["train_fill"])
    return ref, meta, model, rec


@pytest.fixture(scope="module")
def ratio8() -> tuple[dict, dict, DreamerV3, Recorder]:
    return run_record("ratio8")


def ours_rows(model: DreamerV3, env: int) -> dict[str, np.ndarray]:
    buf = model.replay_buffer
    return buf.read_rows(env, np.arange(buf.rows_added_per_env[env]))


def ref_rows(ref: dict, env: int) -> dict[str, np.ndarray]:
    return {k: ref[f"final{env}_{k}"] for k in (*FIELDS, "deter", "stoch")}


# ------------------------------------------------------------------------------------------ rows


def test_stored_rows_match_the_reference_per_env_stream(ratio8):
    """Row t of each env stream: obs_t, the action taken after it (zeroed on the last row,
    driver.py:70-73@2411f7d), the reward that led to it (0 on the reset row), is_first on the reset
    row, is_last on the episode's last row, is_terminal only where the episode terminated."""
    ref, meta, model, _ = ratio8
    for env in range(N_ENVS):
        theirs, ours = ref_rows(ref, env), ours_rows(model, env)
        assert len(ours["obs"]) == len(theirs["vector"]) == ROWS // N_ENVS
        np.testing.assert_array_equal(ours["obs"], theirs["vector"])
        np.testing.assert_array_equal(ours["reward"], theirs["reward"])
        for flag in ("is_first", "is_last", "is_terminal"):
            np.testing.assert_array_equal(ours[flag], theirs[flag], err_msg=f"env {env} {flag}")
        # Our Discrete action is stored one-hot; the reference stores the index (0 on is_last rows).
        last = theirs["is_last"]
        assert not theirs["action"][last].any()
        np.testing.assert_array_equal(ours["action"][last], 0.0)
        np.testing.assert_array_equal(
            ours["action"][~last], np.eye(2, dtype=np.float32)[theirs["action"][~last]]
        )
    # The scripted episodes themselves: two per env, one terminal and one truncated end each.
    for env in range(N_ENVS):
        theirs = ref_rows(ref, env)
        assert (
            theirs["is_first"].sum() == 2
            and theirs["is_last"].sum() == 2
            and theirs["is_terminal"].sum() == 1
        )


def test_rows_reach_the_replay_in_the_reference_order_except_terminal_rows(ratio8):
    """Per env the stream order is identical (above). Across envs the reference interleaves one row
    per env per driver step (driver.py:76-78@2411f7d), the terminal row one driver step after the
    row before it; ours adds an episode's terminal row in the same vector step as the row before it
    (docs/deviations.md D11), so an env whose episode ended is one row ahead from then on."""
    ref, _, _, rec = ratio8
    theirs = list(zip(ref["row_env"].tolist(), ref["row_pos"].tolist(), strict=True))
    ours = [(env, pos) for env, pos, _ in rec.rows]
    assert sorted(ours) == sorted(theirs)
    # Identical up to env 0's first terminal row (its stream row 5, the 11th row of the run) ...
    assert ours[:11] == theirs[:11]
    assert theirs[10:13] == [(0, 5), (1, 5), (0, 6)]
    # ... which ours adds with env 0's row before it, so env 0's reset row comes before env 1's row.
    assert ours[8:13] == [(0, 4), (1, 4), (0, 5), (0, 6), (1, 5)]
    np.testing.assert_array_equal(ref["row_step"], np.arange(1, ROWS + 1))  # step counts every row


# ---------------------------------------------------------------------------------- update counts


def updates_per_step(pairs: list[tuple[int, int]]) -> np.ndarray:
    out = np.zeros(ROWS + 1, np.int64)
    for step, n in pairs:
        out[step] += n
    return out


def ref_updates_per_step(ref: dict) -> np.ndarray:
    return updates_per_step(list(zip(ref["row_step"].tolist(), ref["row_updates"].tolist(), strict=True)))


def test_update_counts_per_step_match_the_reference(ratio8):
    """when.Ratio(train_ratio / (B * (L - 1))) is consulted at every row counter value once the
    replay holds B items (train.py:26-28,80-90@2411f7d, when.py:26-42): same count at every step."""
    ref, _, model, rec = ratio8
    ours = updates_per_step(rec.ratio_calls)
    np.testing.assert_array_equal(ours, ref_updates_per_step(ref))
    assert model._n_updates == int(ref["row_updates"].sum()) == len(ref["train_after_row"]) == 12
    # The gate opens at the same step counter value (18): the first ratio call answers 1 there.
    assert rec.ratio_calls[0] == (18, 1)
    assert int(ref["row_step"][np.flatnonzero(ref["row_items"] >= 2)[0]]) == 18


def test_replay_item_count_after_each_row(ratio8):
    """len(replay) after each row (the gate's input): per env stream an item per row from row 8
    on (replay.py:130-141@2411f7d), so the totals agree wherever both envs have delivered the
    same rows; after env 0's first terminal row ours is one row ahead on env 0 (D11)."""
    ref, _, _, rec = ratio8
    theirs = ref["row_items"]
    ours = np.asarray(rec.items)
    assert theirs[-1] == ours[-1] == 2 * (ROWS // N_ENVS - WINDOW + 1)
    # From the item counts per stream: both equal sum_e max(rows_e - 8, 0) after every row.
    for rows, items in ((list(zip(ref["row_env"], ref["row_pos"], strict=True)), theirs), (
        [(e, p) for e, p, _ in rec.rows], ours)):  # fmt: skip
        held = np.zeros(N_ENVS, int)
        for (env, _), n in zip(rows, items, strict=True):
            held[env] += 1
            assert n == np.maximum(held - WINDOW + 1, 0).sum()


# --------------------------------------------------------------------------- sampleable windows


def test_sampleable_windows_and_their_annotation_match(ratio8):
    """Every window of 9 consecutive rows of one env stream is an item, across episode boundaries
    (replay.py:130-141@2411f7d); annotated, row 0 is first and a row before a first row is last
    (replay.py:303-317@2411f7d)."""
    ref, _, model, _ = ratio8
    buf = model.replay_buffer
    ours_items = sorted(
        (env, start)
        for env in range(N_ENVS)
        for start in range(int(buf.rows_added_per_env[env] - buf.rows_per_env[env]),
                           int(buf.rows_added_per_env[env]) - WINDOW + 1)
    )  # fmt: skip
    theirs = sorted(map(tuple, ref["items_final"].tolist()))
    assert ours_items == theirs and buf.num_items == len(theirs) == 24
    for (env, start), first, last in zip(
        map(tuple, ref["annot_window"].tolist()), ref["annot_is_first"], ref["annot_is_last"], strict=True
    ):
        rows = buf.read_rows(env, np.arange(start, start + WINDOW))
        batch = {
            "is_first": rows["is_first"][None, None].copy(),
            "is_last": rows["is_last"][None, None].copy(),
        }
        annotate_batch(batch)
        np.testing.assert_array_equal(batch["is_first"][0, 0], first, err_msg=f"{env, start}")
        np.testing.assert_array_equal(batch["is_last"][0, 0], last, err_msg=f"{env, start}")


def test_every_sampled_window_is_a_valid_item_when_sampled(ratio8):
    """Both sides only ever sample windows whose 9 rows were stored at that time, from one env, and
    the batch holds exactly those rows (annotated)."""
    ref, _, _, rec = ratio8
    row_index = {(e, p): i for i, (e, p) in enumerate(zip(ref["row_env"], ref["row_pos"], strict=True))}
    for env, start, after in zip(
        ref["sample_env"], ref["sample_start"], ref["sample_after_row"], strict=True
    ):
        assert row_index[(env, start + WINDOW - 1)] <= after
    held = {}
    for s in rec.samples:
        held = {}
        for env, pos, _ in rec.rows[: s["rows"]]:
            held[env] = pos + 1
        for env, start, obs in zip(s["envs"].ravel(), s["starts"].ravel(),
                                   s["batch"]["obs"].reshape(-1, WINDOW, 3), strict=True):  # fmt: skip
            assert start + WINDOW <= held[env]
            np.testing.assert_array_equal(obs[:, 0], env)
    # The reference's batches hold the rows of their windows (checked on the stored streams).
    for u, windows in enumerate(ref["train_window"]):
        for b, (env, start) in enumerate(windows):
            np.testing.assert_array_equal(
                ref["train_batch_vector"][u, b], ref[f"final{env}_vector"][start : start + WINDOW]
            )


# ---------------------------------------------------------------------------------- online queue


def test_online_queue_holds_the_same_fresh_windows(ratio8):
    """Queued when the stream held a multiple of 9 rows before the new row (replay.py:140-144
    @2411f7d): per env the windows starting at rows 1 and 10."""
    ref, meta, _, rec = ratio8
    theirs = []
    for q in meta["queue_after_row"]:
        theirs.extend(tuple(x) for x in q if tuple(x) not in theirs)
    ours = []
    for s in rec.samples:
        ours.extend(tuple(x) for x in s["queue"].tolist() if tuple(x) not in ours)
    assert sorted(theirs) == sorted(ours) == [(0, 1), (0, 10), (1, 1), (1, 10)]
    # Per env in the same order.
    for env in range(N_ENVS):
        assert [w for w in ours if w[0] == env] == [w for w in theirs if w[0] == env]


def test_online_items_are_sampled_first_by_the_next_batch(ratio8):
    """_sample pops the queue before any uniform draw (replay.py:178-191@2411f7d): every queued
    window is in the first training batch drawn after it was queued, ahead of the uniform ones."""
    ref, meta, _, rec = ratio8
    online = ref["sample_online"]
    # Reference: batches of 2 samples; online samples come first in their batch.
    per_batch = online.reshape(-1, 2)
    assert not np.any(~per_batch[:, 0] & per_batch[:, 1])
    for s in rec.samples:
        k = s["popped"]
        np.testing.assert_array_equal(
            np.stack([s["envs"].ravel()[:k], s["starts"].ravel()[:k]], -1), s["queue"][:k]
        )
    assert sum(s["popped"] for s in rec.samples) == int(online.sum()) == 4  # all consumed, none lost


def consumption(ref: dict, rec: Recorder) -> tuple[dict, dict]:
    """(env, start) of each online window -> (1-based update index, rows stored when sampled)."""
    theirs = {}
    updates = np.repeat(np.arange(1, len(ref["train_after_row"]) + 1), 2)
    for env, start, on, u in zip(
        ref["sample_env"], ref["sample_start"], ref["sample_online"], updates, strict=True
    ):
        if on:
            theirs[(int(env), int(start))] = (int(u), int(ref["train_after_row"][u - 1]) + 1)
    ours, done = {}, 0
    for s in rec.samples:
        count = s["envs"].shape[0]
        for i in range(s["popped"]):
            ours[(int(s["envs"].ravel()[i]), int(s["starts"].ravel()[i]))] = (done + 1 + i // 2, s["rows"])
        done += count
    return theirs, ours


def test_online_window_consumption_timing(ratio8):
    """When each fresh window reaches training: (update index, rows stored when it was sampled).
    The reference pops the queue per sample inside the per-row train callback
    (embodied/run/train.py:80-90@2411f7d); ours samples after the whole vector step (D6), and env 0,
    one row ahead after its first terminal row (D11), queues its window at row 1 one update earlier.
    Measured: every fresh window is consumed at the same update or earlier, never later."""
    ref, _, _, rec = ratio8
    theirs, ours = consumption(ref, rec)
    assert set(theirs) == set(ours)
    assert theirs == {(0, 1): (2, 20), (1, 1): (2, 20), (0, 10): (11, 38), (1, 10): (11, 38)}
    assert ours == {(0, 1): (1, 19), (1, 1): (2, 22), (0, 10): (11, 40), (1, 10): (11, 40)}
    for w in theirs:
        assert ours[w][0] <= theirs[w][0]


# ------------------------------------------------------------------------------ context latents


def test_policy_latents_stored_with_their_rows(ratio8):
    """The policy's posterior (deter, argmax stoch) at obs_t is stored with row t (agent.py:157-160,
    driver.py:75@2411f7d). With the reference's initial parameters and its posterior samples
    injected, the deter values agree exactly up to the second update (the first one is a no-op:
    warmup factor 0, jaxutils.py:510-513@2411f7d); after it ours acts with the newest parameters and
    the reference with ones a few updates old (D4): parameter differences of ~1e-6, amplified by the
    RMSNorm of near-zero biases on reset rows, move deter by up to 2e-4 (values up to 0.45). The
    terminal row holds zeros in ours (D10), the reference's policy output in theirs."""
    ref, _, _, rec = ratio8
    second_update_rows = rec.samples[1]["rows"]  # rows stored when ours ran its second update
    early = {(e, p) for e, p, _ in rec.rows[:second_update_rows]}
    for i in range(ROWS):
        env, pos = int(ref["row_env"][i]), int(ref["row_pos"][i])
        deter, stoch = rec.policy_latent[(env, pos)]
        if ref["row_is_last"][i]:
            assert not deter.any() and not stoch.any()
            continue
        np.testing.assert_array_equal(stoch, ref["row_policy_stoch"][i])
        if (env, pos) in early:
            np.testing.assert_allclose(
                deter, ref["row_policy_deter"][i], rtol=1e-6, atol=1e-7, err_msg=f"{env, pos}"
            )
        else:
            np.testing.assert_allclose(
                deter, ref["row_policy_deter"][i], rtol=0, atol=5e-4, err_msg=f"{env, pos}"
            )
    # The reset row's deter is the GRU step from a zero carry: exactly zero at these parameters.
    assert not ref["row_policy_deter"][ref["row_is_first"]].any()


def final_latent_rule(
    policy: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
    writes: list[tuple[int, int, np.ndarray, np.ndarray]],
) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
    """Final (deter, stoch) of every row: the last write-back to it, else the policy's latent."""
    out = {(e, p): policy(e, p) for e in range(N_ENVS) for p in range(ROWS // N_ENVS)}
    for env, pos, deter, stoch in writes:
        out[(env, pos)] = (deter, stoch)
    return out


def test_reference_write_back_lags_one_call_and_covers_rows_1_to_8(ratio8):
    """The reference's train outputs come back one call late (jaxagent.py:188-191@2411f7d): the
    write-back of call u covers rows start+1..start+8 of the windows of call u-1 (agent.py:213-218,
    replay.py:147-167@2411f7d); the last call's latents are never written."""
    ref, _, _, _ = ratio8
    calls = ref["writeback_call"]
    np.testing.assert_array_equal(calls, np.arange(1, len(ref["train_after_row"])))
    for j, u in enumerate(calls):
        for b, (env, start) in enumerate(ref["train_window"][u - 1]):
            expected = np.stack([np.full(WINDOW - 1, env), np.arange(start + 1, start + WINDOW)], -1)
            np.testing.assert_array_equal(ref["writeback_rows"][j, b], expected)
    wb = (ref["writeback_rows"], ref["writeback_deter"], ref["writeback_stoch"])
    writes = [
        (int(e), int(p), d, s)
        for rows, deter, stoch in zip(*wb, strict=True)
        for r, dd, ss in zip(rows, deter, stoch, strict=True)
        for (e, p), d, s in zip(r, dd, ss, strict=True)
    ]  # fmt: skip
    index = {(int(e), int(p)): i for i, (e, p) in enumerate(zip(ref["row_env"], ref["row_pos"], strict=True))}
    expected = final_latent_rule(lambda e, p: (ref["row_policy_deter"][index[(e, p)]],
                                               ref["row_policy_stoch"][index[(e, p)]]), writes)  # fmt: skip
    for (env, pos), (deter, stoch) in expected.items():
        np.testing.assert_array_equal(ref[f"final{env}_deter"][pos], deter)
        np.testing.assert_array_equal(ref[f"final{env}_stoch"][pos], stoch)


def test_our_write_back_covers_rows_1_to_8_of_the_same_call(ratio8):
    """Ours writes a call's latents right after it (D5), to rows start+1..start+8 of that call's
    windows: every row ends with the latent of the last call that trained on it, else the policy's
    (zeros on terminal rows, D10), as the reference's rule above with no lag."""
    _, _, model, rec = ratio8
    assert len(rec.writebacks) == len(rec.samples) == 12
    writes = []
    for s, w in zip(rec.samples, rec.writebacks, strict=True):
        np.testing.assert_array_equal(w["envs"], s["envs"])
        np.testing.assert_array_equal(w["starts"], s["starts"])
        for c in range(w["envs"].shape[0]):
            for b in range(w["envs"].shape[1]):
                env, start = int(w["envs"][c, b]), int(w["starts"][c, b])
                for i in range(WINDOW - 1):
                    writes.append(
                        (env, start + 1 + i, w["values"]["deter"][c, b, i], w["values"]["stoch"][c, b, i])
                    )
    expected = final_latent_rule(lambda e, p: rec.policy_latent[(e, p)], writes)
    for env in range(N_ENVS):
        rows = ours_rows(model, env)
        for pos in range(ROWS // N_ENVS):
            np.testing.assert_array_equal(rows["deter"][pos], expected[(env, pos)][0])
            np.testing.assert_array_equal(rows["stoch"][pos], expected[(env, pos)][1])
    # Row 0 of a stream is never inside rows 1..8 of a window: it keeps the policy's latent.
    for env in range(N_ENVS):
        np.testing.assert_array_equal(ours_rows(model, env)["deter"][0], rec.policy_latent[(env, 0)][0])


def test_context_row_of_a_batch_is_the_stored_row(ratio8):
    """The context (row 0 of a window) passed to training carries the row's stored latent and its
    stored action: the 29eb964 fix reads the context row's action (agent.py:196-197 after 29eb964)."""
    ref, _, model, rec = ratio8
    for s in rec.samples:
        for c in range(s["envs"].shape[0]):
            for b in range(s["envs"].shape[1]):
                env, start = int(s["envs"][c, b]), int(s["starts"][c, b])
                stored = ours_rows(model, env)
                for key in ("obs", "action", "reward", "is_terminal"):
                    np.testing.assert_array_equal(s["batch"][key][c, b], stored[key][start : start + WINDOW])
    # In the reference's batches the context action is the stored row's action (zero on is_last).
    for u, windows in enumerate(ref["train_window"]):
        for b, (env, start) in enumerate(windows):
            np.testing.assert_array_equal(
                ref["train_batch_action"][u, b], ref[f"final{env}_action"][start : start + WINDOW]
            )


# ------------------------------------------------------------------------ train_fill gate + ratio


@pytest.fixture(scope="module")
def ratio12_fill25() -> tuple[dict, dict, DreamerV3, Recorder]:
    return run_record("ratio12_fill25")


def test_train_fill_gate_reference_record(ratio12_fill25):
    """The reference's gate `step < train_fill` skips rows 1..24 (train.py:81@2411f7d): the ratio's
    first call, answering 1, is at step 25; then when.Ratio(0.75)."""
    ref, meta, _, _ = ratio12_fill25
    assert meta["train_fill"] == 25
    per_step = ref_updates_per_step(ref)
    assert per_step[:25].sum() == 0 and per_step[25] == 1
    assert int(per_step.sum()) == len(ref["train_after_row"])


def test_train_fill_update_counts_per_step_match(ratio12_fill25):
    ref, _, _, rec = ratio12_fill25
    np.testing.assert_array_equal(updates_per_step(rec.ratio_calls), ref_updates_per_step(ref))


def test_train_fill_does_not_change_the_actions(ratio12_fill25):
    ref, _, model, _ = ratio12_fill25
    for env in range(N_ENVS):
        np.testing.assert_array_equal(ours_rows(model, env)["action"].argmax(-1)[~ref[f"final{env}_is_last"]],
                                      ref[f"final{env}_action"][~ref[f"final{env}_is_last"]])  # fmt: skip


def test_train_fill_rows_and_later_counts(ratio12_fill25):
    """Everything but the gate's first row agrees: the stored flags and rewards, and the ratio's
    counts once both sides have started (shifted by the one-row-late start above)."""
    ref, _, model, rec = ratio12_fill25
    for env in range(N_ENVS):
        ours, theirs = ours_rows(model, env), ref_rows(ref, env)
        np.testing.assert_array_equal(ours["obs"], theirs["vector"])
        np.testing.assert_array_equal(ours["reward"], theirs["reward"])
        for flag in ("is_first", "is_last", "is_terminal"):
            np.testing.assert_array_equal(ours[flag], theirs[flag])
    ours = updates_per_step(rec.ratio_calls)
    assert ours[:25].sum() == 0 and ours[25] == 1  # the reference's first call at step 25
