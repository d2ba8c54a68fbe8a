"""SimViewLabeller: EC labels learned from the simulator's own view of a job (observed, quantised usage + meta)."""

import dataclasses

import numpy as np
import pytest

from models.sim_labeller import (
    FEATURE_NAMES,
    SimLabellerConfig,
    SimViewLabeller,
    features_at_ages,
    fit_sim_labeller,
    job_features,
    sample_ages,
    state_at_ages,
)
from sim import core
from sim.config import SimConfig
from sim.forecast import job_view
from sim.gym_env import TvwEnv, TvwVectorEnv
from sim.jobs import JobBatch
from sim.labelling import Labeller, label_accuracy_by_age, most_frequent_label

CFG = SimConfig(n_machines=4)
SMALL = SimLabellerConfig(n_ages_per_job=3, max_iter=300, seed=0)
LOW, HIGH, WAVE = 0, 1, 2
"""Synthetic classes: flat 1 unit, flat 5 units, and a square wave 1 <-> 6 units of period 6 at a random phase."""


def synthetic_jobs(seed: int, n_seqs: int = 12, n_jobs: int = 20) -> JobBatch:
    """Jobs of three ECs that differ by usage level and phase pattern (class shares 1/2, 1/4, 1/4; meta carries
    no information: the same for every job). Windows start at a random offset into the pattern, as jobs cut from a
    workload's run do."""
    rng = np.random.default_rng(seed)
    seqs = []
    for _ in range(n_seqs):
        jobs = []
        for _ in range(n_jobs):
            label = int(rng.choice([LOW, HIGH, WAVE], p=[0.5, 0.25, 0.25]))
            dur = int(rng.integers(2, 25))
            age = np.arange(dur) + int(rng.integers(0, 6))
            level = {LOW: np.ones(dur), HIGH: np.full(dur, 5), WAVE: np.where(age % 6 < 3, 1, 6)}[label]
            noise = rng.integers(0, 2, size=dur) * (label != WAVE)
            cpu = np.clip(level + noise, 1, 8)
            mem = np.clip(level // 2 + 1, 1, 8)
            usage = np.column_stack([cpu, mem]).tolist()
            meta = [0.25, 0.25, 0, 1]
            jobs.append(dict(arrival_step=int(rng.integers(0, 30)), usage=usage, ec_label=label, meta=meta))
        seqs.append(jobs)
    return JobBatch.from_jobs(seqs)


def fresh(labeller: SimViewLabeller) -> SimViewLabeller:
    """The same model without kept labels."""
    return SimViewLabeller(labeller.model, labeller.classes, labeller.cfg)


@pytest.fixture(scope="module")
def labeller():
    return fit_sim_labeller(CFG, synthetic_jobs(seed=0), SMALL)


def test_features_have_their_declared_columns_and_nothing_observed_is_nan_usage():
    jobs = synthetic_jobs(seed=3, n_seqs=1, n_jobs=4)
    state = state_at_ages(jobs, np.zeros(4, dtype=np.int64), np.arange(4), np.array([0, 1, 2, 50]))
    view = job_view(CFG, state, np.arange(4), np.zeros(4, dtype=np.int64), 8)
    x = job_features(view)
    assert x.shape == (4, len(FEATURE_NAMES))
    assert view.n_observed.tolist() == [0, 1, 2, min(50, int(jobs.duration[0, 3]))]
    assert np.isnan(x[0, 5:]).all() and np.isfinite(x[1:, 4:11]).all()
    assert (view.label == 0).all()  # the state hides the clustering labels


def test_sampled_ages_are_zero_then_within_each_jobs_life():
    ages = sample_ages(np.array([1, 2, 30, 100]), 50, np.random.default_rng(0))
    assert ages.shape == (4, 51) and (ages[:, 0] == 0).all()
    assert (ages[:, 1:] >= 1).all() and (ages[:, 1:] <= np.array([1, 2, 30, 100])[:, None]).all()
    assert (ages[3, 1:] <= 10).mean() > 0.4  # log-uniform: young ages are not swamped by old ones


def test_labels_never_read_usage_not_yet_observed(labeller):
    """A rollout's labels, and labels at given ages, are unchanged when usage at unobserved ages changes."""
    assert isinstance(labeller, Labeller)
    jobs = synthetic_jobs(seed=5, n_seqs=3, n_jobs=12)
    rng = np.random.default_rng(1)
    state = core.reset(CFG, jobs, 0)
    for _ in range(8):  # a random valid policy, into the episodes: some jobs running, some waiting
        mask = core.action_mask(CFG, state)
        state, *_ = core.step(CFG, state, np.array([rng.choice(np.flatnonzero(m)) for m in mask]))
    is_placed = state.job_machine >= 0
    n_seen = np.where(is_placed, np.clip(state.t[:, None] - state.job_start + 1, 0, jobs.duration), 0)
    is_future = np.arange(jobs.max_duration)[None, None, :] >= n_seen[..., None]
    assert ((n_seen > 0) & (n_seen < jobs.duration)).any() and (~is_placed).any()
    noise = rng.integers(1, 9, size=jobs.usage.shape).astype(np.int16)
    perturbed = dataclasses.replace(jobs, usage=np.where(is_future[..., None], noise, jobs.usage))
    before = fresh(labeller).labels(CFG, state)
    after = fresh(labeller).labels(CFG, dataclasses.replace(state, jobs=perturbed))
    assert np.array_equal(before, after)
    # the check has teeth: the same noise on the observed steps changes some labels
    observed_noise = dataclasses.replace(jobs, usage=np.where(is_future[..., None], jobs.usage, noise))
    noisy_state = dataclasses.replace(state, jobs=observed_noise)
    assert not np.array_equal(before, fresh(labeller).labels(CFG, noisy_state))
    # a labeller that kept labels of other sequences at the same ages predicts the new ones anew
    assert np.array_equal(before, labeller.labels(CFG, state))
    assert np.array_equal(labeller.labels(CFG, noisy_state), fresh(labeller).labels(CFG, noisy_state))
    # predict_jobs at age a reads ages < a only
    rows, job_index = np.nonzero(jobs.is_real)
    for age in (0, 1, 3):
        later = dataclasses.replace(jobs, usage=jobs.usage.copy())
        later.usage[:, :, age:] = noise[:, :, age:]
        ages = np.full(rows.size, age)
        assert np.array_equal(
            labeller.predict_jobs(CFG, jobs, rows, job_index, ages),
            labeller.predict_jobs(CFG, later, rows, job_index, ages),
        )


def test_accuracy_after_a_few_steps_beats_the_best_constant_label(labeller):
    train, test = synthetic_jobs(seed=0), synthetic_jobs(seed=11)
    rows, job_index = np.nonzero(train.is_real)
    constant = most_frequent_label(train.ec_label[rows, job_index])
    assert constant == LOW
    table = label_accuracy_by_age(labeller, CFG, test, [0, 1, 4, 8], constant_label=constant)
    by_age = {r["age_steps"]: r for r in table.iter_rows(named=True)}
    # meta says nothing: on arrival the labeller can only guess the constant
    assert by_age[0]["accuracy"] == pytest.approx(by_age[0]["constant_accuracy"], abs=0.05)
    for age in (4, 8):  # a few steps show the level and whether the usage swings
        assert by_age[age]["accuracy"] > by_age[age]["constant_accuracy"] + 0.3
        assert by_age[age]["accuracy"] > 0.9


def test_the_gym_env_shows_its_labels(labeller):
    jobs = synthetic_jobs(seed=7, n_seqs=1, n_jobs=10)
    env = TvwEnv(jobs, CFG, labeller=labeller)
    obs, _ = env.reset(seed=0)
    for _ in range(12):
        obs, *_ = env.step(int(np.flatnonzero(obs["action_mask"])[0]))
    assert env.state.obs_label is not None
    assert np.array_equal(env.state.obs_label, labeller.labels(CFG, env.state))
    assert set(np.unique(env.state.obs_label).tolist()) <= {LOW, HIGH, WAVE}


def test_kept_labels_equal_fresh_predictions_through_a_rollout_with_autoresets(labeller):
    """labels() predicts again only jobs whose steps observed changed; that equals predicting every job anew."""
    jobs = synthetic_jobs(seed=8, n_seqs=4, n_jobs=6)
    env = TvwVectorEnv(jobs, 3, CFG, labeller=labeller)
    obs, _ = env.reset(seed=0)
    rng = np.random.default_rng(2)
    n_resets = 0
    for _ in range(120):
        assert np.array_equal(env.state.obs_label, fresh(labeller).labels(CFG, env.state))
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in obs["action_mask"]])
        obs, _, term, trunc, _ = env.step(actions)
        n_resets += int((term | trunc).sum())
    assert n_resets > 0


def test_served_labels_are_its_label_table_at_the_steps_before_now(labeller):
    """labels() serves, for every job the observation shows, predict_jobs at `observed_steps` (steps before the
    current one: a queued job and one placed at this step get their meta-only label); `labels_by_age` gives the
    fitted rules that same table."""
    from sim.labelling import labelled_jobs, labels_by_age, observed_steps

    jobs = synthetic_jobs(seed=6, n_seqs=3, n_jobs=12)
    rng = np.random.default_rng(3)
    state = core.reset(CFG, jobs, 0)
    n_checked = 0
    for _ in range(40):
        bi, ji = np.nonzero(labelled_jobs(CFG, state))
        served = labeller.labels(CFG, state)[bi, ji]
        expected = labeller.predict_jobs(CFG, jobs, bi, ji, observed_steps(state)[bi, ji])
        assert np.array_equal(served, expected)
        n_checked += int((observed_steps(state)[bi, ji] >= 2).sum())
        mask = core.action_mask(CFG, state)
        state, *_ = core.step(CFG, state, np.array([rng.choice(np.flatnonzero(m)) for m in mask]))
    assert n_checked > 20  # jobs with usage observed were among them
    table = labels_by_age(labeller, CFG, jobs)
    assert table.shape == (*jobs.ec_label.shape, jobs.max_duration + 1)
    b, j = np.nonzero(jobs.is_real)
    for age in (0, 1, 5):
        alive = jobs.duration[b, j] >= age
        got = table[b[alive], j[alive], age]
        assert np.array_equal(
            got, labeller.predict_jobs(CFG, jobs, b[alive], j[alive], np.full(alive.sum(), age))
        )


def test_fitting_needs_two_labels():
    one = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]] * 3, ec_label=4)]])
    with pytest.raises(ValueError, match="need at least 2"):
        fit_sim_labeller(CFG, one, SMALL)


def test_fit_if_labelled_reads_the_real_jobs_labels_not_the_padding():
    """Sequences of unequal length (the shorter padded): one real label is nothing to serve, whatever label the
    padding holds; two real labels fit the labeller."""
    from models.sim_labeller import fit_labeller_if_labelled

    def job(label: int, t: int) -> dict:
        return dict(
            arrival_step=t, usage=[[1 + (a + t) % 3, 1] for a in range(6)], ec_label=label, request=[3, 2]
        )

    one = JobBatch.from_jobs([[job(3, 0), job(3, 1), job(3, 2)], [job(3, 0)]])
    assert one.n_jobs.tolist() == [3, 1] and int(one.ec_label[1, 2]) != 3  # the padding holds another label
    assert fit_labeller_if_labelled(CFG, one, SMALL) is None
    two = JobBatch.from_jobs([[job(1, 0), job(3, 1), job(1, 2)], [job(3, 0)]])
    assert fit_labeller_if_labelled(CFG, two, SMALL) is not None


def test_labelling_accuracy_scores_every_labeller_per_load_and_age() -> None:
    import polars as pl

    from models.sim_labeller import LabellingSettings, labelling_accuracy
    from pipelines.synthetic import DEEPPLACE_SOURCE, SYNTHETIC_WORKLOADS

    jobs = SYNTHETIC_WORKLOADS[DEEPPLACE_SOURCE].build(3, 2, (30, 50), 0)
    scale = pl.DataFrame(
        {"source": [DEEPPLACE_SOURCE], "cpu_frac_scale": [2.0], "mem_frac_scale": [3.0], "step_bins": [12]}
    )
    asked = []
    settings = LabellingSettings(ages_steps=(0, 2), sim_view=SMALL)
    out = labelling_accuracy(jobs, scale, settings, lambda source: asked.append(source), warn=asked.append)
    assert asked == [DEEPPLACE_SOURCE, f"{DEEPPLACE_SOURCE}: no serving EC classifier; no classifier rows"]
    assert set(out["labeller"]) == {"sim_view"} and set(out["load_pct"]) == {30, 50}
    assert sorted(set(out["age_steps"])) == [0, 2] and out["accuracy"].is_between(0.0, 1.0).all()
    warned = []
    one_label = jobs.with_columns(ec_label=pl.lit(0, pl.Int32))
    empty = labelling_accuracy(one_label, scale, settings, warn=warned.append)
    assert empty.is_empty() and "fewer than 2 EC labels" in warned[0]


def test_saved_labeller_loads_back_and_serves_the_same_labels(labeller, tmp_path):
    from models.sim_labeller import load_sim_labeller

    path = tmp_path / "ec_sim_view__x.npz"
    labeller.save(path, card={"source": "x"})
    back = load_sim_labeller(path)
    jobs = synthetic_jobs(seed=3, n_seqs=2, n_jobs=10)
    assert back.view == labeller.view and back.cfg == labeller.cfg
    np.testing.assert_array_equal(back.label_table(CFG, jobs), labeller.label_table(CFG, jobs))
    (tmp_path / "junk.npz").write_bytes(b"not a labeller")
    with pytest.raises(ValueError, match="junk.npz: not a saved SimViewLabeller"):
        load_sim_labeller(tmp_path / "junk.npz")


def test_the_pipeline_serves_a_labeller_fitted_on_training_sequences_only(tmp_path):
    """`serving_sim_labellers` fits on the split "train" rows (a test row's usage never reaches it), saves it
    beside the classifier's path, and `served_labellers` loads it; with "classifier" the file is removed and the
    classifier serves."""
    import polars as pl

    from models.sim_labeller import served_labellers, serving_sim_labellers, sim_view_path

    def frame(jobs: JobBatch, split: str) -> pl.DataFrame:
        rows = []
        for b in range(jobs.batch_size):
            for j in range(int(jobs.n_jobs[b])):
                dur = int(jobs.duration[b, j])
                rows.append(
                    {
                        "source": "bitbrains",
                        "load_pct": 50,
                        "split": split,
                        "sequence_id": b,
                        "job_index": j,
                        "workload_id": f"{split}{b}_{j}",
                        "arrival_step": int(jobs.arrival_step[b, j]),
                        "cpu_units": jobs.usage[b, j, :dur, 0].tolist(),
                        "mem_units": jobs.usage[b, j, :dur, 1].tolist(),
                        "ec_label": int(jobs.ec_label[b, j]),
                        "duration_steps": dur,
                        "cpu_request_units": int(jobs.request[b, j, 0]),
                        "mem_request_units": int(jobs.request[b, j, 1]),
                        "is_long_running": True,
                    }
                )
        return pl.DataFrame(rows)

    train, test = (
        frame(synthetic_jobs(seed=0, n_seqs=6), "train"),
        frame(synthetic_jobs(seed=2, n_seqs=2), "test"),
    )
    saved = lambda source: tmp_path / f"ec_classifier__{source}.pt"  # noqa: E731
    table = serving_sim_labellers(pl.concat([train, test], how="diagonal_relaxed"), saved, log=lambda m: None)
    assert table.to_dicts() == [
        {
            "source": "bitbrains",
            "served_labeller": "sim_view",
            "sim_view_n_train_jobs": train.height,
            "sim_view_path": str(sim_view_path(saved("bitbrains"))),
        }
    ]
    scrambled = test.with_columns(pl.col("cpu_units").list.eval(pl.element() * 0 + 7))
    again = tmp_path / "again"
    again.mkdir()
    other = lambda source: again / f"ec_classifier__{source}.pt"  # noqa: E731
    serving_sim_labellers(pl.concat([train, scrambled], how="diagonal_relaxed"), other, log=lambda m: None)
    first, second = (np.load(sim_view_path(p("bitbrains")))["coef"] for p in (saved, other))
    np.testing.assert_array_equal(first, second)  # the test rows' usage did not reach the fit
    served = served_labellers(saved, classifier=lambda source: "the classifier")
    assert isinstance(served("bitbrains"), SimViewLabeller) and served("google") == "the classifier"
    serving_sim_labellers(train, saved, served="classifier", log=lambda m: None)
    assert not sim_view_path(saved("bitbrains")).exists()
    with pytest.raises(ValueError, match="served labeller must be one of"):
        serving_sim_labellers(train, saved, served="oracle")


def test_label_tables_are_kept_per_sequence_content_across_batches(labeller):
    """A rollout copies its batch per episode: the same sequences in another batch object (or alone, with other
    padding) are read from the labeller's cache, not predicted again, and give the same labels."""
    calls = []
    counting = fresh(labeller)
    predict = counting.predict_jobs
    counting.predict_jobs = lambda *a: calls.append(len(a[2])) or predict(*a)
    jobs = synthetic_jobs(seed=4, n_seqs=3, n_jobs=10)
    table = counting.label_table(CFG, jobs)
    assert sum(calls) > 0
    n_before = sum(calls)
    same = synthetic_jobs(seed=4, n_seqs=3, n_jobs=10)  # equal content, a new batch without riders
    np.testing.assert_array_equal(counting.label_table(CFG, same), table)
    alone = same.select(np.array([2]))
    got = counting.label_table(CFG, alone)
    np.testing.assert_array_equal(got[0, :, : table.shape[2]], table[2, : got.shape[1], : got.shape[2]])
    assert sum(calls) == n_before  # nothing predicted again
    np.testing.assert_array_equal(fresh(labeller).label_table(CFG, same), table)  # equals a cold prediction
    other = synthetic_jobs(seed=5, n_seqs=1, n_jobs=10)
    counting.label_table(CFG, other)
    assert sum(calls) > n_before  # new content is predicted


def test_the_label_store_starts_over_beyond_its_cap_and_keeps_serving_the_same_labels(labeller):
    small = fresh(labeller)
    small.max_jobs_kept = 15
    jobs = synthetic_jobs(seed=4, n_seqs=2, n_jobs=10)  # 20 jobs: over the cap after the first batch
    first = small.label_table(CFG, jobs)
    assert len(small._ids) == 20
    other = synthetic_jobs(seed=5, n_seqs=1, n_jobs=10)
    small.label_table(CFG, other)  # over the cap: the store starts over, once
    assert len(small._ids) == 10
    small.label_table(CFG, other)
    assert len(small._ids) == 10  # not again on every call
    np.testing.assert_array_equal(small.label_table(CFG, jobs), first)  # the old batch is served anew, equal


@pytest.mark.parametrize("threads", ["caller", "numba"])
def test_stored_labels_are_gathered_by_the_kernel_as_the_numpy_path_predicts_them(
    labeller, threads, on_threads
):
    """Once every shown (job, age) is stored, labels() gathers them in one kernel (`sim.compiled_labels`, its
    per-env bodies on the caller's thread or on numba's); those labels equal a new labeller's, which predicts them
    all (the numpy path), at every decision of a rollout."""
    from sim import compiled_labels
    from sim.compiled_labels import served_labels

    calls = on_threads(threads, compiled_labels, "_kernel_parallel")

    jobs = synthetic_jobs(seed=9, n_seqs=3, n_jobs=12)
    kept = fresh(labeller)
    rng = np.random.default_rng(4)
    state = core.reset(CFG, jobs, 0)
    n_gathered = 0
    for _ in range(40):
        # labels shown before this decision, unlike any prediction: a job left unlabelled shows as it was
        state = core.relabel(CFG, state, (state.jobs.ec_label + 1) % CFG.n_labels)
        kept.labels(CFG, state)  # stores whatever is new at this decision
        ids = kept._job_ids(CFG, state.jobs)
        gathered = served_labels(
            core.observed_labels(state), state.t, state.next_job, state.n_arrived, state.job_machine,
            state.job_start, jobs.duration, jobs.n_jobs, CFG.history_steps, ids, kept._store, kept.n_ages(jobs),
        )  # fmt: skip
        assert gathered is not None
        assert np.array_equal(kept.labels(CFG, state), fresh(labeller).labels(CFG, state))
        n_gathered += 1
        mask = core.action_mask(CFG, state)
        state, *_ = core.step(CFG, state, np.array([rng.choice(np.flatnonzero(m)) for m in mask]))
        if state.is_done.all():
            break
    assert n_gathered > 10
    assert (calls["_kernel_parallel"] > 0) == (threads == "numba")
    empty = fresh(labeller)
    ids = empty._job_ids(CFG, jobs)
    assert served_labels(
        core.observed_labels(state), state.t, state.next_job, state.n_arrived, state.job_machine,
        state.job_start, jobs.duration, jobs.n_jobs, CFG.history_steps, ids, empty._store, empty.n_ages(jobs),
    ) is None or not (state.n_arrived > state.next_job).any()  # fmt: skip


def test_a_selection_carries_the_job_rows_its_batch_was_prepared_with(labeller):
    """`prepare` assigns store rows once per batch; a selection of its rows (a rollout's B x N envs) carries them
    (`JobBatch.select` selects riders) and they are the rows the jobs' content gets afresh."""
    kept = fresh(labeller)
    jobs = synthetic_jobs(seed=12, n_seqs=3, n_jobs=8)
    kept.prepare(CFG, jobs)
    rows = np.array([2, 0, 2, 1])
    selected = jobs.select(rows)
    assert selected.__dict__.get("_riders")  # carried, not digested again
    np.testing.assert_array_equal(kept._job_ids(CFG, selected), kept._job_ids(CFG, jobs)[rows])
    again = synthetic_jobs(seed=12, n_seqs=3, n_jobs=8).select(rows)  # the same content, no riders
    np.testing.assert_array_equal(kept._job_ids(CFG, again), kept._job_ids(CFG, selected))


def test_features_at_ages_share_the_batchs_running_summaries_with_the_same_numbers() -> None:
    """A batch whose running summaries are computed (and then reordered, as a job pick does) lends them to the
    one-job states `features_at_ages` builds: the same features as a batch that computes them afresh."""
    jobs = synthetic_jobs(seed=3, n_seqs=4, n_jobs=10)
    rng = np.random.default_rng(0)
    rows = rng.integers(0, jobs.batch_size, 60)
    job_index = rng.integers(0, jobs.n_jobs[rows])
    ages = rng.integers(0, jobs.duration[rows, job_index] + 1)
    shared = jobs.owned_copy()
    want = features_at_ages(CFG, shared, rows, job_index, ages, 4)  # computes the batch's summaries
    assert "observed_prefix" in shared.__dict__
    shared.rotate_in_place(np.array([0, 2]), np.array([1, 0]), np.array([5, 3]))  # its jobs move, and `order`
    rotated = jobs.owned_copy()
    rotated.rotate_in_place(np.array([0, 2]), np.array([1, 0]), np.array([5, 3]))
    got = features_at_ages(CFG, shared, rows, job_index, ages, 4)
    assert not np.array_equal(got, want, equal_nan=True)  # the rotation moved jobs: a different selection
    # against the summaries of each selected job alone, computed afresh
    state = state_at_ages(rotated, rows, job_index, ages)
    # a copy without cached summaries
    alone = dataclasses.replace(state, jobs=dataclasses.replace(state.jobs))
    assert "observed_prefix" not in alone.jobs.__dict__
    env = np.arange(rows.size)
    assert np.array_equal(got, job_features(job_view(CFG, alone, env, 0 * env, 4)), equal_nan=True)


def test_a_selection_lends_its_summaries_and_a_batch_past_the_bound_keeps_its_own(monkeypatch) -> None:
    """A selected batch (`JobBatch.select`: summaries mapped by row) lends them with the same numbers; a batch
    larger than `SHARED_SUMMARIES_MAX_VALUES` is not summarised whole for a few jobs."""
    import models.sim_labeller as sim_labeller

    jobs = synthetic_jobs(seed=4, n_seqs=4, n_jobs=10)
    jobs.observed_prefix  # noqa: B018 - computed on the whole batch, then shared by the selection
    picked = jobs.select(np.array([3, 1, 1, 0]))
    assert picked.observed_prefix[0].rows is not None
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 4, 40)
    job_index = rng.integers(0, picked.n_jobs[rows])
    ages = rng.integers(0, picked.duration[rows, job_index] + 1)
    got = features_at_ages(CFG, picked, rows, job_index, ages, 4)
    state = state_at_ages(picked, rows, job_index, ages)
    alone = dataclasses.replace(state, jobs=dataclasses.replace(state.jobs))
    env = np.arange(rows.size)
    assert np.array_equal(got, job_features(job_view(CFG, alone, env, 0 * env, 4)), equal_nan=True)
    monkeypatch.setattr(sim_labeller, "SHARED_SUMMARIES_MAX_VALUES", jobs.usage.size - 1)
    fresh = jobs.owned_copy()
    fresh.__dict__.pop("observed_prefix", None)
    assert np.array_equal(
        features_at_ages(CFG, fresh, rows, job_index, ages, 4),
        features_at_ages(CFG, jobs, rows, job_index, ages, 4),
        equal_nan=True,
    )
    assert "observed_prefix" not in fresh.__dict__
