"""`sim.jobs.superpose`: k sequences merged into one sequence of a k-times larger cluster."""

from __future__ import annotations

import numpy as np
import pytest

from sim.jobs import JobBatch, superpose


def _sequences(n_rows: int, seed: int) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(n_rows):
        seq = []
        for j in range(int(rng.integers(2, 7))):
            dur = int(rng.integers(1, 6))
            usage = rng.integers(0, 5, size=(dur, 2)).tolist()
            seq.append(
                {
                    "arrival_step": int(rng.integers(0, 6)),  # ties within and across rows
                    "usage": usage,
                    "ec_label": int(rng.integers(0, 3)),
                    "workload_id": f"r{b}j{j}",
                    "meta": [float(rng.random()), None, 1.0, 2.0],
                    "usage_exact": (np.asarray(usage) / 8.0).tolist() if j % 2 else None,
                }
            )
        rows.append(seq)
    return rows


def _arrays(jobs: JobBatch) -> list[np.ndarray]:
    return [jobs.arrival_step, jobs.duration, jobs.usage, jobs.request, jobs.ec_label, jobs.n_jobs, jobs.meta]


def test_superposed_sequences_are_the_merged_sequences_in_arrival_order() -> None:
    seqs = _sequences(5, seed=4)
    jobs = JobBatch.from_jobs(seqs)
    got = superpose(jobs, 2)
    # from_jobs orders one list's jobs by (arrival, position): the earlier row first on a tie, as superpose
    want = JobBatch.from_jobs([seqs[0] + seqs[1], seqs[2] + seqs[3]])  # the fifth is left out
    assert got.batch_size == 2
    for a, b in zip(_arrays(got), _arrays(want), strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.usage_exact, want.usage_exact)  # NaN where a job has none
    assert got.workload_ids == want.workload_ids
    assert got.n_jobs.tolist() == [len(seqs[0]) + len(seqs[1]), len(seqs[2]) + len(seqs[3])]
    assert (np.diff(got.arrival_step[0, : got.n_jobs[0]]) >= 0).all()
    assert got.sequence_keys[1] == ("python", 0, "", "2+3")
    # rows in = rows out + rows left out, jobs likewise
    assert int(got.n_jobs.sum()) + len(seqs[4]) == int(jobs.n_jobs.sum())


def test_one_at_a_time_is_the_same_batch_and_bad_k_is_refused() -> None:
    jobs = JobBatch.from_jobs(_sequences(3, seed=5))
    same = superpose(jobs, 1)
    for a, b in zip(_arrays(same), _arrays(jobs), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="3 sequences cannot be merged 4 at a time"):
        superpose(jobs, 4)
    with pytest.raises(ValueError, match="merged 0 at a time"):
        superpose(jobs, 0)
