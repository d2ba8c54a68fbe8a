"""Gymnasium adapters: env checker, episodes end, vector env matches the core and autoresets."""

import numpy as np
from gymnasium.utils.env_checker import check_env

from sim import core
from sim.config import SimConfig
from sim.gym_env import TvwEnv, TvwVectorEnv
from sim.jobs import JobBatch


def jobs_of(rng, n_seqs, n_jobs=5):
    return JobBatch.from_jobs(
        [
            [
                dict(
                    arrival_step=int(a),
                    usage=rng.integers(1, 4, size=(int(rng.integers(1, 5)), 2)).tolist(),
                    ec_label=int(rng.integers(8)),
                )
                for a in rng.integers(0, 4, size=n_jobs)
            ]
            for _ in range(n_seqs)
        ]
    )


def test_check_env_passes():
    env = TvwEnv(jobs_of(np.random.default_rng(0), 3), SimConfig(n_machines=3, invalid_action="hold"))
    check_env(env, skip_render_check=True)


def test_single_env_episode_ends_with_masked_random_policy_and_sampler_source():
    rng = np.random.default_rng(1)
    env = TvwEnv(lambda gen, n: jobs_of(gen, n), SimConfig(n_machines=3))
    obs, _ = env.reset(seed=3)
    total, done = 0.0, False
    for _ in range(500):
        assert env.observation_space.contains(obs)
        obs, reward, term, trunc, info = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
        total += reward
        done = term or trunc
        if done:
            break
    assert done
    assert np.isclose(total, env.state.penalty_totals[0].sum())
    assert set(info) >= {"penalty_contention", "penalty_underutil", "penalty_overshoot", "penalty_wait"}


def test_vector_env_matches_core_and_autoresets_next_step():
    rng = np.random.default_rng(2)
    jobs = jobs_of(rng, 4)
    cfg = SimConfig(n_machines=2)
    venv = TvwVectorEnv(jobs, 3, cfg)
    obs, _ = venv.reset(seed=0, options={"rows": [0, 1, 2]})
    assert venv.observation_space.contains(obs)
    state = core.reset(cfg, jobs.select([0, 1, 2]), 0)  # noise-free config: the seed does not matter
    was_done = np.zeros(3, dtype=bool)
    is_comparing = True
    n_resets = 0
    for _ in range(200):
        mask = obs["action_mask"].astype(bool)
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        obs, reward, term, trunc, _ = venv.step(actions)
        is_comparing &= not was_done.any()
        if is_comparing:
            state, ref_reward, *_ = core.step(cfg, state, actions)
            np.testing.assert_array_equal(reward, ref_reward)
        # next-step autoreset: an env done last step is reset now, with reward 0 and a fresh episode
        assert (reward[was_done] == 0).all() and not (term | trunc)[was_done].any()
        n_resets += int(was_done.sum())
        was_done = term | trunc
    assert n_resets > 0
    assert venv.observation_space.contains(obs)


def test_registered_with_gymnasium_single_and_vector():
    import gymnasium

    from sim.gym_env import ENV_ID

    jobs = jobs_of(np.random.default_rng(0), 3)
    env = gymnasium.make(ENV_ID, jobs=jobs, cfg=SimConfig(n_machines=3))
    obs, _ = env.reset(seed=0)
    assert obs["machines"].shape[0] == 3
    vec = gymnasium.make_vec(
        ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", jobs=jobs, cfg=SimConfig(n_machines=3)
    )
    obs, _ = vec.reset(seed=0)
    assert obs["machines"].shape[:2] == (2, 3)


def test_readme_gymnasium_example_runs(tmp_path, monkeypatch):
    """The README's Gymnasium block, run as written against a warehouse holding `sim__job_sequences` (here the
    synthetic workloads' sequences, as the sample run writes them)."""
    import re
    from pathlib import Path

    import polars as pl

    from pipelines.synthetic import (
        DeepPlaceConfig,
        DeepRMConfig,
        build_deepplace_sequences,
        build_deeprm_sequences,
    )

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "tvw/Placement-v0" in b]
    assert len(blocks) == 1, "README: expected one python block using tvw/Placement-v0"
    assert len(blocks[0].strip().splitlines()) <= 20
    dp, _ = build_deepplace_sequences(
        DeepPlaceConfig(n_train_sequences=1, n_test_sequences=2, loads_pct=(50,))
    )
    drm = build_deeprm_sequences(DeepRMConfig(n_train_sequences=1, n_test_sequences=2, loads_pct=(50,)))
    table = tmp_path / "warehouse" / "tables" / "sim__job_sequences"
    table.mkdir(parents=True)
    pl.concat([dp, drm], how="vertical_relaxed").write_parquet(table / "all.parquet")
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), scope)
    assert scope["terminated"] or scope["truncated"]
    assert scope["vec"].num_envs == 8
    scope["vec"].close()
