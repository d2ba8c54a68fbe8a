"""EC profiles: exact per-label, per-age means of usage / request; fallbacks; period folding; lookups."""

from __future__ import annotations

import numpy as np
import pytest

from sim.jobs import JobBatch
from sim.profiles import EcProfiles, ProfileConfig, learn_profiles


def _job(label: int, cpu: list[int], mem: list[int], request=None) -> dict:
    job = {"arrival_step": 0, "usage": [[c, m] for c, m in zip(cpu, mem, strict=True)], "ec_label": label}
    return job if request is None else {**job, "request": request}


@pytest.fixture()
def batch() -> JobBatch:
    # A: cpu 2,4,4 / 4 and mem 1,1,2 / 2; C: cpu request 0 (left out), mem 3,3 / 3; B (2nd row): cpu 4,2 / 4,
    # mem 2,0 / 2. Row 1 has a padding job.
    return JobBatch.from_jobs(
        [
            [_job(1, [2, 4, 4], [1, 1, 2], (4, 2)), _job(2, [0, 0], [3, 3])],
            [_job(1, [4, 2], [2, 0], (4, 2))],
        ]
    )


def test_profiles_are_exact_means_over_living_jobs(batch) -> None:
    prof = learn_profiles(batch, n_labels=4, horizon=4)
    assert prof.fraction.shape == (4, 4, 2) and prof.period_steps is None
    assert prof.fraction[1].tolist() == [[0.75, 0.75], [0.75, 0.25], [1.0, 1.0], [0.0, 0.0]]
    assert prof.counts[1].tolist() == [[2, 2], [2, 2], [1, 1], [0, 0]]
    assert prof.fraction[2].tolist() == [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0]]
    assert prof.counts[2].tolist() == [[0, 1], [0, 1], [0, 0], [0, 0]]
    assert prof.n_jobs.tolist() == [0, 2, 1, 0]
    # labels 0 and 3 have no job: the all-jobs mean (C counts in mem only), counts stay 0
    expected = [[0.75, 2.5 / 3], [0.75, 0.5], [1.0, 1.0], [0.0, 0.0]]
    for label in (0, 3):
        assert prof.fraction[label] == pytest.approx(np.array(expected))
        assert prof.counts[label].sum() == 0


def test_horizon_cuts_ages_and_folding_shares_slots(batch) -> None:
    assert learn_profiles(batch, 4, horizon=2).fraction[1].tolist() == [[0.75, 0.75], [0.75, 0.25]]
    folded = learn_profiles(batch, 4, horizon=4, cfg=ProfileConfig(period_steps=2))
    assert folded.fraction.shape == (4, 2, 2) and folded.period_steps == 2
    # slot 0 = ages 0 and 2: cpu (0.5 + 1 + 1) / 3, mem (0.5 + 1 + 1) / 3; slot 1 = age 1
    assert folded.fraction[1] == pytest.approx(np.array([[5 / 6, 5 / 6], [0.75, 0.25]]))
    assert folded.counts[1].tolist() == [[3, 3], [2, 2]]


def test_predict_reads_label_and_age(batch) -> None:
    prof = learn_profiles(batch, 4, horizon=4)
    got = prof.predict(np.array([1, 1, 1, 2]), np.array([1, 5, -1, 0]))
    assert got.tolist() == [[0.75, 0.25], [0.0, 0.0], [0.0, 0.0], [0.0, 1.0]]  # beyond T and before start: 0
    folded = learn_profiles(batch, 4, horizon=4, cfg=ProfileConfig(period_steps=2))
    assert folded.predict(1, 5).tolist() == [0.75, 0.25]  # age 5 -> slot 1
    flat = EcProfiles.flat(3, 2)
    assert flat.predict(np.array([0, 2]), np.array([0, 1000])).tolist() == [[1.0, 1.0], [1.0, 1.0]]


def test_bad_input_is_named(batch) -> None:
    with pytest.raises(ValueError, match="ec_label 2 outside 0..1"):
        learn_profiles(batch, n_labels=2, horizon=4)
    with pytest.raises(ValueError, match="horizon"):
        learn_profiles(batch, 4, horizon=0)
    with pytest.raises(ValueError, match="no jobs"):
        learn_profiles(JobBatch.from_jobs([[]]), 4, horizon=4)
    with pytest.raises(ValueError, match="period_steps"):
        ProfileConfig(period_steps=0)


def test_served_labels_weigh_each_age_by_the_observation_ages_that_showed_the_label(batch) -> None:
    # the clustering labels served at every age give the same means (each job alive at age a weighs a + 1)
    constant = np.repeat(batch.ec_label[:, :, None], 5, axis=2)
    same = learn_profiles(batch, 4, horizon=4, labels_by_age=constant)
    assert same.fraction.tolist() == learn_profiles(batch, 4, horizon=4).fraction.tolist()
    assert same.counts[1].tolist() == [[2, 2], [4, 4], [3, 3], [0, 0]]  # A at ages 0-2, B at 0-1
    assert same.n_jobs.tolist() == [0, 2, 1, 0]
    # job A (row 0) is served label 1 at arrival and label 3 once it has been observed; the rest as clustered
    switch = constant.copy()
    switch[0, 0, 1:] = 3
    prof = learn_profiles(batch, 4, horizon=4, labels_by_age=switch)
    # label 1: A at age 0 only (its one case a0 = 0 <= a, at every age), B at ages 0-1
    assert prof.counts[1].tolist() == [[2, 2], [3, 3], [1, 1], [0, 0]]
    assert prof.fraction[1][2].tolist() == [1.0, 1.0]  # age 2: only A's case a0 = 0 (cpu 4/4, mem 2/2)
    assert prof.fraction[1][1] == pytest.approx([(1.0 + 2 * 0.5) / 3, (0.5 + 0.0 * 2) / 3])
    # label 3: A's cases a0 = 1 (ages 1, 2) and a0 = 2 (age 2)
    assert prof.counts[3].tolist() == [[0, 0], [1, 1], [2, 2], [0, 0]]
    assert prof.fraction[3][1].tolist() == [1.0, 0.5] and prof.fraction[3][2].tolist() == [1.0, 1.0]
    assert prof.n_jobs.tolist() == [0, 2, 1, 1]
    with pytest.raises(ValueError, match="labels_by_age has shape"):
        learn_profiles(batch, 4, horizon=4, labels_by_age=constant[:1])
    bad = constant.copy()
    bad[1, 0, 1] = 9
    with pytest.raises(ValueError, match="served label 9 outside 0..3"):
        learn_profiles(batch, 4, horizon=4, labels_by_age=bad)
