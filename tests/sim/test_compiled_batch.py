"""The compiled bookkeeping (`sim.compiled_batch`) does exactly what the numpy code it replaces does: the queue
rotation of every array kind a JobBatch moves, the label check and padding of `core.relabel`, and the job check of
`core.validate_jobs` (which must still find every bad entry, wherever it is)."""

import numpy as np
import pytest

from sim import compiled_batch, compiled_planes, core
from sim.config import SimConfig
from sim.jobs import COPY_BUFFERS, CopyBuffers, JobBatch, rotation_index


def _ranges(rng, n_rows, n_jobs, n):
    rows = np.sort(rng.choice(n_rows, size=n, replace=False))
    lo = rng.integers(0, n_jobs - 1, size=n)
    hi = np.minimum(lo + rng.integers(0, 5, size=n), n_jobs - 1)
    return rows, lo, hi


@pytest.mark.parametrize(
    "shape,dtype",
    [((6, 9), np.int64), ((6, 9, 5, 2), np.int16), ((6, 9, 4), np.float64), ((6, 9, 3, 2), np.float32),
     ((6, 9), np.bool_)],
)  # fmt: skip
def test_rotation_moves_every_array_kind_as_numpy_does(shape, dtype) -> None:
    rng = np.random.default_rng(3)
    values = rng.random(shape) > 0.5 if dtype is np.bool_ else (rng.random(shape) * 100).astype(dtype)
    rows, lo, hi = _ranges(rng, shape[0], shape[1], 4)
    expected = values.copy()
    r, to, frm = rotation_index(rows, lo, hi)
    expected[r, to] = expected[r, frm]
    assert compiled_batch.rotate_rows(values, rows, lo, hi)
    np.testing.assert_array_equal(values, expected)


def test_rotation_leaves_a_strided_or_object_array_to_numpy() -> None:
    rng = np.random.default_rng(4)
    base = rng.integers(0, 9, size=(6, 18))
    strided = base[:, ::2]
    before = strided.copy()
    assert not compiled_batch.rotate_rows(strided, np.array([1]), np.array([0]), np.array([3]))
    np.testing.assert_array_equal(strided, before)
    assert not compiled_batch.rotate_rows(
        np.empty((2, 3), dtype=object), np.array([0]), np.array([0]), np.array([1])
    )


def test_a_batch_rotated_in_place_equals_the_rotated_copy() -> None:
    rng = np.random.default_rng(5)

    def job(b, j):
        usage = rng.integers(0, 4, size=(rng.integers(1, 6), 2))
        return dict(
            arrival_step=0, usage=usage, ec_label=int(rng.integers(0, 3)), workload_id=f"w{b}{j}",
            meta=rng.random(4).tolist(), usage_exact=(usage * 0.9).tolist(),
        )  # fmt: skip

    jobs = JobBatch.from_jobs([[job(b, j) for j in range(7)] for b in range(4)])
    assert jobs.meta is not None and jobs.usage_exact is not None
    rows, lo, hi = np.array([0, 2, 3]), np.array([1, 0, 4]), np.array([4, 6, 5])
    copied = jobs.rotated(rows, lo, hi)
    owned = jobs.owned_copy()
    owned.rotate_in_place(rows, lo, hi)
    for name in JobBatch._JOB_ARRAYS:
        if getattr(jobs, name) is not None:
            np.testing.assert_array_equal(getattr(owned, name), getattr(copied, name), err_msg=name)
    assert owned.workload_ids == copied.workload_ids
    assert owned.workload_ids[0][1:5] == ("w04", "w01", "w02", "w03")


def test_clean_labels_pads_with_zero_and_rejects_a_label_out_of_range() -> None:
    labels = np.array([[1, 2, 7, 9], [0, 3, 3, -4]])
    n_jobs = np.array([2, 3])
    np.testing.assert_array_equal(
        compiled_batch.clean_labels(labels, n_jobs, 4), [[1, 2, 0, 0], [0, 3, 3, 0]]
    )
    assert compiled_batch.clean_labels(labels, n_jobs, 3) is None  # job 1 of row 1 is label 3
    assert compiled_batch.clean_labels(np.array([[0, -1]]), np.array([2]), 3) is None


@pytest.mark.parametrize("where", ["label", "negative_label", "request", "usage_last_step", "none"])
def test_the_job_check_finds_a_bad_entry_anywhere_in_a_real_job(where) -> None:
    rng = np.random.default_rng(6)
    cap = np.array([8, 4])
    usage = rng.integers(0, 5, size=(3, 5, 6, 2)).astype(np.int16)
    request = rng.integers(0, 5, size=(3, 5, 2)).astype(np.int16)
    labels = rng.integers(0, 3, size=(3, 5))
    n_jobs = np.array([5, 4, 2])
    usage[2, 3, :, :] = 99  # padding: never checked
    labels[1, 4] = 99
    if where == "label":
        labels[1, 3] = 3
    elif where == "negative_label":
        labels[0, 0] = -1
    elif where == "request":
        request[2, 1, 1] = 5
    elif where == "usage_last_step":
        usage[1, 2, 5, 0] = 9
    assert compiled_batch.jobs_fit(usage, request, labels, n_jobs, cap, 3) == (where == "none")


def test_validate_and_relabel_give_the_numpy_paths_answers() -> None:
    cfg = SimConfig(n_machines=2, capacity_units=(4, 4), n_labels=3, oversize="clip", max_steps=20)
    jobs = JobBatch.from_jobs(
        [
            [
                dict(arrival_step=0, usage=[[1, 1], [5, 2]], ec_label=1),
                dict(arrival_step=1, usage=[[2, 2]], ec_label=0),
            ]
        ]
    )
    clipped, n_clipped = core.validate_jobs(cfg, jobs)  # the compiled check finds the oversized step
    assert n_clipped.tolist() == [2] and clipped.usage.max() == 4  # the step and the request (its peak)
    fine, none = core.validate_jobs(cfg, clipped)
    assert fine is clipped and none.tolist() == [0]
    state = core.reset(cfg, clipped, 0)
    seen = core.relabel(cfg, state, np.full_like(state.jobs.ec_label, 2))
    assert seen.obs_label.dtype == np.int64 and seen.obs_label.tolist() == [[2, 2]]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int16])
def test_wide_sums_by_cell_equal_sorted_segments_to_the_bit(dtype) -> None:
    rng = np.random.default_rng(7)
    values = (rng.normal(size=(40, 3, 5, 2)) * 1e3).astype(dtype)
    values[3] = -0.0  # a cell whose first row is -0.0 keeps it, as reduceat does
    cell = rng.integers(0, 12, size=40)
    cell[3] = 11
    cell[cell == 11] = [11] + [10] * (int((cell == 11).sum()) - 1)
    order = np.argsort(cell, kind="stable")
    sorted_cell = cell[order]
    starts = np.flatnonzero(np.r_[True, sorted_cell[1:] != sorted_cell[:-1]])
    expected = np.zeros((13, 3, 5, 2))
    expected[sorted_cell[starts]] = np.add.reduceat(values[order], starts, axis=0)
    got = core.sum_by_cell(values, cell, 13)
    assert got.dtype == np.float64 and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()  # the same bits, the sign of zero included
    assert compiled_planes.sum_rows(values, np.r_[cell[:-1], 13], 13) is None  # a cell out of range
    with pytest.raises(IndexError):
        core.sum_by_cell(values, np.r_[cell[:-1], 13], 13)


@pytest.mark.parametrize("threads", ["caller", "numba"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_every_segment_length_sums_as_reduceat_does(dtype, threads, on_threads) -> None:
    """numpy sums a segment as its first row plus a pairwise sum of the rest (8 partial sums from 8 terms on,
    halves past 128): lengths on both sides of each branch, and past the block, where the numpy path takes over."""
    calls = on_threads(threads, compiled_planes, "_sum_rows_parallel")
    rng = np.random.default_rng(8)
    lengths = [1, 2, 7, 8, 9, 15, 16, 17, 64, 129, 130, 200]
    cell = rng.permutation(np.repeat(np.arange(len(lengths)), lengths))
    scale = 10.0 ** rng.integers(-3, 6, size=(cell.size, 1, 1))
    values = (rng.normal(size=(cell.size, 3, 2)) * scale).astype(dtype)  # 3-D: sum_by_cell's wide path
    order = np.argsort(cell, kind="stable")
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    expected = np.add.reduceat(values[order], starts, axis=0).astype(np.float64)
    assert core.sum_by_cell(values, cell, len(lengths)).tobytes() == expected.tobytes()
    short = cell < 10  # no segment past 129 rows: the compiled pass itself
    got = compiled_planes.sum_rows(values[short], cell[short], len(lengths))
    assert got is not None
    assert got[:10].tobytes() == expected[:10].tobytes()
    assert compiled_planes.sum_rows(values, cell, len(lengths)) is None  # 130 rows: numpy's halves
    assert calls["_sum_rows_parallel"] == (1 if threads == "numba" else 0)


def test_no_rows_sum_to_zeros() -> None:
    got = core.sum_by_cell(np.zeros((0, 3, 2)), np.zeros(0, dtype=np.int64), 4)
    assert got.shape == (4, 3, 2) and not got.any()


@pytest.mark.parametrize("threads", ["caller", "numba"])
def test_the_compiled_running_requests_are_numpys_at_every_step(threads, on_threads) -> None:
    """`sim.core.placed_requests` and `jobs_per_machine` (one compiled pass over each env's jobs) equal the numpy
    masks and bincount at every step of random episodes, on the caller's thread and on numba's, with a job cut at
    each end of its life."""
    from sim.policies import make_policy

    calls = on_threads(threads, compiled_planes, "_running_requests_parallel")
    cfg = SimConfig(n_machines=3, capacity_units=(8, 8), oversize="clip", max_steps=60)
    rng = np.random.default_rng(3)
    sequences = [
        [
            dict(
                arrival_step=int(rng.integers(0, 12)),
                usage=rng.integers(1, 5, size=(int(rng.integers(1, 6)), 2)).tolist(),
                ec_label=0,
            )
            for _ in range(int(rng.integers(6, 15)))
        ]
        for _ in range(5)
    ]
    state = core.reset(cfg, JobBatch.from_jobs(sequences), 0)
    policy = make_policy("random_valid")
    n_compared = n_running = 0
    while not state.is_done.all():
        want = core._placed_requests_numpy(state)
        got, got_counts = core._running_per_machine(state)
        assert got.dtype == np.int64 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        counts = np.bincount(  # the running jobs per machine, from the same pass
            (np.arange(state.batch_size)[:, None] * cfg.n_machines + state.job_machine)[
                core.jobs_running(state)
            ],
            minlength=state.batch_size * cfg.n_machines,
        ).reshape(state.batch_size, cfg.n_machines)
        np.testing.assert_array_equal(got_counts, counts)
        n_compared += 1
        n_running += int(core.jobs_running(state).sum())
        state, *_ = core.step(cfg, state, policy.act(cfg, state, rng))
    assert n_compared > 10 and n_running > 40  # the episodes placed and ran jobs
    assert calls["_running_requests_parallel"] == (n_compared if threads == "numba" else 0)


def test_copy_buffers_reuse_a_buffer_only_once_nothing_holds_it() -> None:
    pool = CopyBuffers(min_bytes=64, max_bytes=4096)
    a = np.arange(40, dtype=np.int64).reshape(5, 8)  # 320 bytes: pooled
    first = pool.copy(a)
    np.testing.assert_array_equal(first, a)
    assert first is not a and first.flags.c_contiguous
    second = pool.copy(a + 1)  # the first still held: a new buffer, the first untouched
    assert second is not first
    np.testing.assert_array_equal(first, a)
    view = first[1:]
    first_id = id(first)
    del first
    third = pool.copy(a + 2)  # a view holds the first buffer: not handed out again
    assert id(third) != first_id and third is not second
    np.testing.assert_array_equal(view, a[1:])
    del view, second
    fourth = pool.copy(a + 3)  # now free: reused, with the new contents
    assert id(fourth) == first_id
    np.testing.assert_array_equal(fourth, a + 3)
    small = np.arange(4)
    assert pool.copy(small) is not small and len(pool._buffers) == 3  # below min_bytes: a plain copy
    strided = np.arange(80, dtype=np.int64).reshape(5, 16)[:, ::2]
    np.testing.assert_array_equal(pool.copy(strided), strided)


def test_copy_buffers_stay_within_their_size_dropping_free_buffers_first() -> None:
    pool = CopyBuffers(min_bytes=64, max_bytes=1000)
    a = np.zeros(50, dtype=np.int64)  # 400 bytes
    kept = [pool.copy(a), pool.copy(a)]  # 800 bytes, both held
    extra = pool.copy(a)  # over the size with nothing free: a plain copy, not kept
    assert len(pool._buffers) == 2 and all(extra is not b for b in pool._buffers)
    del kept[0]
    b = np.ones(60, dtype=np.int64)  # 480 bytes: the free buffer is dropped to make room
    got = pool.copy(b)
    assert len(pool._buffers) == 2 and any(got is x for x in pool._buffers)
    assert sum(x.nbytes for x in pool._buffers) <= 1000


def test_owned_copies_never_share_arrays_with_a_batch_still_held() -> None:
    rng = np.random.default_rng(8)
    jobs = JobBatch.from_jobs(
        [
            [dict(arrival_step=0, usage=rng.integers(0, 4, size=(5, 2)), ec_label=0) for _ in range(6)]
            for _ in range(3)
        ]
    )
    pool_min = COPY_BUFFERS.min_bytes
    COPY_BUFFERS.min_bytes = 0  # pool every array of this small batch
    try:
        one = jobs.owned_copy()
        two = jobs.owned_copy()
        assert not np.shares_memory(one.usage, two.usage)
        one.rotate_in_place(np.array([0]), np.array([0]), np.array([3]))
        np.testing.assert_array_equal(two.usage, jobs.usage)
        usage_id = id(one.usage)
        del one
        three = jobs.owned_copy()  # the first copy's buffers are free again: reused, with the source's values
        assert id(three.usage) == usage_id
        np.testing.assert_array_equal(three.usage, jobs.usage)
    finally:
        COPY_BUFFERS.min_bytes = pool_min
        COPY_BUFFERS.clear()
