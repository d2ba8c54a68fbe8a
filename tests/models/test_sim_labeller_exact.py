"""The EC labeller on UNQUANTISED observed usage: `JobBatch.usage_exact` from the table, `job_view`'s exact view
(observed steps only) and `SimViewLabeller` fitted and served on it."""

import dataclasses

import numpy as np
import pytest

from models.sim_labeller import SimLabellerConfig, fit_sim_labeller, state_at_ages
from pipelines.job_sequences import jobs_to_frame
from sim import core
from sim.config import SimConfig
from sim.forecast import job_view
from sim.jobs import JobBatch, pad_job_batch, stack_job_batches
from sim.labelling import label_accuracy_by_age

CFG = SimConfig(n_machines=4)
SMALL = SimLabellerConfig(n_ages_per_job=3, max_iter=300, seed=0)


def table_rows() -> list[dict]:
    """Two sequences; job (0, 1) has no unquantised usage (null lists)."""
    base = {"source": "s", "load_pct": 30, "split": "test", "workload_id": "w", "is_long_running": False}
    jobs = [
        (0, 0, 0, [1, 2, 1], [1, 1, 1], [0.2, 1.5, 0.9], [0.4, 0.5, 0.6]),
        (0, 1, 2, [3], [2], None, None),
        (1, 0, 1, [1, 1], [2, 2], [0.1, 0.3], [1.2, 1.7]),
    ]
    rows = []
    for seq, idx, arrival, cpu, mem, cpu_x, mem_x in jobs:
        row = {
            **base,
            "sequence_id": seq,
            "job_index": idx,
            "arrival_step": arrival,
            "ec_label": idx,
            "duration_steps": len(cpu),
            "cpu_units": cpu,
            "mem_units": mem,
            "cpu_request_units": max(cpu),
            "mem_request_units": max(mem),
        }
        if cpu_x is not None:
            row |= {"cpu_units_exact": cpu_x, "mem_units_exact": mem_x}
        rows.append(row)
    return rows


def test_exact_usage_round_trips_through_from_frame_and_select() -> None:
    jobs = JobBatch.from_frame(jobs_to_frame(table_rows()))
    x = jobs.usage_exact
    assert x.shape == jobs.usage.shape and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 0], [[0.2, 0.4], [1.5, 0.5], [0.9, 0.6]], rtol=1e-6)
    assert np.isnan(x[0, 1]).all()  # null lists
    np.testing.assert_allclose(x[1, 0, :2], [[0.1, 1.2], [0.3, 1.7]], rtol=1e-6)
    assert np.isnan(x[1, 0, 2:]).all() and np.isnan(x[1, 1]).all()  # beyond duration, padding job
    picked = jobs.select([1, 0, 1])
    np.testing.assert_array_equal(picked.usage_exact[0], x[1])
    np.testing.assert_array_equal(picked.usage_exact[1], x[0])
    first = jobs.first_jobs(1)
    assert first.usage_exact.shape == first.usage.shape
    np.testing.assert_array_equal(first.usage_exact[:, 0], x[:, 0, : first.max_duration])
    padded = pad_job_batch(jobs, 4, 5)
    assert padded.usage_exact.shape == (2, 4, 5, 2) and np.isnan(padded.usage_exact[:, 2:]).all()
    np.testing.assert_array_equal(padded.usage_exact[:, :2, :3], x)
    without = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]] * 4, ec_label=0)]])
    assert without.usage_exact is None
    stacked = stack_job_batches([jobs, without])
    assert stacked.usage_exact.shape == stacked.usage.shape
    np.testing.assert_array_equal(stacked.usage_exact[:2, :2, :3], x)
    assert np.isnan(stacked.usage_exact[2]).all()  # a batch without unquantised usage stacks as NaN
    assert stack_job_batches([without, without]).usage_exact is None


def test_from_jobs_takes_usage_exact_and_checks_its_shape() -> None:
    job = dict(arrival_step=0, usage=[[1, 1], [2, 1]], ec_label=0, usage_exact=[[0.5, 0.25], [1.5, 0.5]])
    jobs = JobBatch.from_jobs([[job, dict(arrival_step=1, usage=[[1, 1]], ec_label=1)]])
    np.testing.assert_array_equal(jobs.usage_exact[0, 0], [[0.5, 0.25], [1.5, 0.5]])
    assert np.isnan(jobs.usage_exact[0, 1]).all()
    with pytest.raises(ValueError, match="usage_exact"):
        JobBatch.from_jobs([[{**job, "usage_exact": [[0.5, 0.25]]}]])


def test_the_simulator_never_reads_exact_usage() -> None:
    """Rollouts with any unquantised usage (or none) are identical: the step logic stays on the integer units."""
    jobs = JobBatch.from_frame(jobs_to_frame(table_rows()))
    rng = np.random.default_rng(0)
    other = dataclasses.replace(jobs, usage_exact=rng.random(jobs.usage.shape).astype(np.float32) * 8)
    finals = []
    for batch in (jobs, other, dataclasses.replace(jobs, usage_exact=None)):
        state = core.reset(CFG, batch, seed=0)
        for _ in range(12):
            mask = core.action_mask(CFG, state)
            state, *_ = core.step(CFG, state, mask.argmax(axis=1))
        finals.append(state)
    for st in finals[1:]:
        np.testing.assert_array_equal(st.timeline, finals[0].timeline)
        np.testing.assert_array_equal(st.job_machine, finals[0].job_machine)
        np.testing.assert_array_equal(st.penalty_totals, finals[0].penalty_totals)


def test_job_view_exact_shows_only_observed_steps() -> None:
    rng = np.random.default_rng(1)
    n, t_max = 6, 10
    usage = rng.integers(1, 5, size=(n, t_max, 2))
    exact = rng.random((n, t_max, 2)) * 4
    seqs = [
        [dict(arrival_step=0, usage=usage[i].tolist(), ec_label=0, usage_exact=exact[i].tolist())]
        for i in range(n)
    ]
    jobs = JobBatch.from_jobs(seqs)
    rows, job_index = np.arange(n), np.zeros(n, dtype=np.int64)
    for k in range(t_max + 1):
        ages = np.full(n, k)
        state = state_at_ages(jobs, rows, job_index, ages)
        env = np.arange(n)
        view = job_view(CFG, state, env, np.zeros_like(env), 4)
        # perturb every step from age k on (the future): the exact view must not change
        future = jobs.usage_exact.copy()
        future[:, :, k:] = rng.random(future[:, :, k:].shape) * 8
        moved = dataclasses.replace(jobs, usage_exact=future)
        view2 = job_view(CFG, state_at_ages(moved, rows, job_index, ages), env, np.zeros_like(env), 4)
        for name in ("recent_exact", "life_max_exact", "life_mean_exact"):
            np.testing.assert_array_equal(getattr(view, name), getattr(view2, name))
        # the same mask as the quantised view, over the unquantised values
        np.testing.assert_array_equal(np.isnan(view.recent_exact), np.isnan(view.recent))
        if k:
            np.testing.assert_allclose(view.life_mean_exact, exact[:, :k].mean(axis=1), rtol=1e-6)
            np.testing.assert_allclose(view.recent_exact[:, -1], exact[:, k - 1], rtol=1e-6)
        else:
            assert np.isnan(view.life_mean_exact).all() and np.isnan(view.recent_exact).all()
    no_exact = state_at_ages(dataclasses.replace(jobs, usage_exact=None), rows, job_index, np.full(n, 3))
    view = job_view(CFG, no_exact, np.arange(n), np.zeros(n, dtype=np.int64), 4)
    assert view.recent_exact is None and view.life_mean_exact is None and view.life_max_exact is None


def sub_unit_jobs(seed: int, n_seqs: int = 10, n_jobs: int = 20) -> JobBatch:
    """Two ECs that differ only below one unit: cpu 0.2 vs 0.6 of a unit (+- 0.05 noise), memory 0.3 for both;
    every step quantises to 1 unit (ceil) and the meta is the same for every job."""
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(n_seqs):
        jobs = []
        for _ in range(n_jobs):
            label = int(rng.integers(0, 2))
            dur = int(rng.integers(2, 20))
            cpu = (0.2 if label == 0 else 0.6) + rng.uniform(-0.05, 0.05, dur)
            exact = np.column_stack([cpu, np.full(dur, 0.3)])
            units = np.ceil(exact).astype(int)  # all ones
            jobs.append(
                dict(
                    arrival_step=int(rng.integers(0, 30)),
                    usage=units.tolist(),
                    usage_exact=exact.tolist(),
                    ec_label=label,
                    meta=[0.25, 0.25, 0, 1],
                )
            )
        seqs.append(jobs)
    return JobBatch.from_jobs(seqs)


@pytest.fixture(scope="module")
def sub_unit():
    train, test = sub_unit_jobs(0), sub_unit_jobs(1)
    assert (train.usage[train.duration > 0][..., :] <= 1).all()
    exact = fit_sim_labeller(CFG, train, dataclasses.replace(SMALL, usage_view="exact"))
    units = fit_sim_labeller(CFG, train, dataclasses.replace(SMALL, usage_view="units"))
    return train, test, exact, units


def test_exact_view_separates_classes_that_differ_below_one_unit(sub_unit) -> None:
    _, test, exact, units = sub_unit
    assert exact.view == "exact" and units.view == "units"
    acc_exact = label_accuracy_by_age(exact, CFG, test, (1, 2, 4))
    acc_units = label_accuracy_by_age(units, CFG, test, (1, 2, 4))
    assert (acc_exact["accuracy"] >= 0.98).all()
    # the quantised view shows every job at an age alike (1 unit everywhere, the same meta): one label per age, so
    # at best the share of that age's more frequent class among the jobs still running
    for age, acc in zip(acc_units["age_steps"], acc_units["accuracy"], strict=True):
        alive = test.duration > age
        majority = max(np.mean(test.ec_label[alive] == c) for c in (0, 1))
        assert acc <= majority + 1e-9 and majority < 0.7


def test_auto_view_follows_the_training_batch(sub_unit) -> None:
    train, *_ = sub_unit
    assert fit_sim_labeller(CFG, train, SMALL).view == "exact"  # usage_view="auto" by default
    no_exact = dataclasses.replace(train, usage_exact=None)
    assert fit_sim_labeller(CFG, no_exact, SMALL).view == "units"
    with pytest.raises(ValueError, match="usage_view='exact'"):
        fit_sim_labeller(CFG, no_exact, dataclasses.replace(SMALL, usage_view="exact"))


def test_a_labeller_trained_on_the_exact_view_refuses_a_batch_without_it(sub_unit) -> None:
    _, test, exact, units = sub_unit
    no_exact = dataclasses.replace(test, usage_exact=None)
    with pytest.raises(ValueError, match="'exact' usage view"):
        exact.predict_jobs(CFG, no_exact, np.array([0]), np.array([0]), np.array([2]))
    state = core.reset(CFG, no_exact, seed=0)
    with pytest.raises(ValueError, match="'exact' usage view"):
        exact.labels(CFG, state)
    # the quantised-view labeller serves either batch, and ignores the unquantised usage
    np.testing.assert_array_equal(units.labels(CFG, state), units.labels(CFG, core.reset(CFG, test, seed=0)))
