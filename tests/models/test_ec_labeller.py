"""EC labelling in the simulator (TVW-RL Algorithm 1): relabel, TrueLabeller, ClassifierLabeller, job meta."""

import numpy as np
import polars as pl
import pytest

from models.ec_classifier import META_COLUMNS, ClassifierConfig, train_classifier
from models.ec_labeller import ClassifierLabeller
from pipelines.job_sequences import JOB_SEQUENCES, SequenceConfig, build_job_sequences
from pipelines.synthetic import DeepRMConfig, build_deeprm_sequences
from sim import core
from sim.config import SimConfig
from sim.gym_env import TvwEnv, TvwVectorEnv
from sim.jobs import JOB_META_COLUMNS, JobBatch, pad_job_batch, stack_job_batches
from sim.labelling import (
    LABEL_ACCURACY,
    Labeller,
    TrueLabeller,
    label_accuracy_by_age,
    labelled_jobs,
    most_frequent_label,
    observed_steps,
)

LOW, HIGH = 2, 5  # the two EC labels of the toy classifier
META_LOW, META_HIGH = [0.1, 0.5, 0.0, 1.0], [0.9, 0.5, 0.0, 1.0]


@pytest.fixture(scope="module")
def clf():
    """m = 4 bins. Without usage the label follows meta (cpu request 0.9 -> HIGH, 0.1 -> LOW); with 4 bins of
    usage it follows the usage (7/8 of a machine -> HIGH, 1/8 -> LOW), whatever the meta."""
    rng = np.random.default_rng(0)
    n = 160
    is_meta_high, is_use_high = rng.random(n) < 0.5, rng.random(n) < 0.5
    has_prefix = np.arange(n) % 2 == 1
    meta = np.array([META_HIGH if h else META_LOW for h in is_meta_high])
    prefixes = np.repeat(np.where(is_use_high, 7 / 8, 1 / 8)[:, None, None], 2, axis=1).repeat(4, axis=2)
    prefixes[~has_prefix] = np.nan
    labels = np.where(np.where(has_prefix, is_use_high, is_meta_high), HIGH, LOW)
    cfg = ClassifierConfig(prefix_bins=4, hidden_sizes=(16, 16), epochs=80, batch_size=32, lr=1e-2)
    return train_classifier(meta, prefixes, labels, cfg)


def toy_jobs() -> JobBatch:
    """Job A (label LOW, meta HIGH, 1 unit of cpu/mem then 7 from step 3) arrives at 0; job B (label HIGH, meta
    HIGH, 7 units) arrives at 3."""
    a = dict(arrival_step=0, usage=[[1, 1]] * 3 + [[7, 7]] * 3, ec_label=LOW, meta=META_HIGH, workload_id="a")
    b = dict(arrival_step=3, usage=[[7, 7]] * 4, ec_label=HIGH, meta=META_HIGH, workload_id="b")
    return JobBatch.from_jobs([[a, b]])


CFG = SimConfig(n_machines=2, history_steps=4)


def test_meta_column_order_matches_the_classifier():
    assert JOB_META_COLUMNS == META_COLUMNS


# relabel and TrueLabeller


def random_jobs(rng, n_seqs, n_jobs=6):
    return JobBatch.from_jobs(
        [
            [
                dict(
                    arrival_step=int(a),
                    usage=rng.integers(1, 4, size=(int(rng.integers(1, 6)), 2)).tolist(),
                    ec_label=int(rng.integers(8)),
                )
                for a in rng.integers(0, 5, size=n_jobs)
            ]
            for _ in range(n_seqs)
        ]
    )


def test_relabel_changes_only_the_observation_not_rewards():
    rng = np.random.default_rng(0)
    cfg = SimConfig(n_machines=3)
    jobs = random_jobs(rng, 4)
    plain = core.reset(cfg, jobs, 0)
    other = core.reset(cfg, jobs, 0)
    n_label_diffs = 0
    for _ in range(200):
        if plain.is_done.all():
            break
        other = core.relabel(cfg, other, (jobs.ec_label + 1 + rng.integers(0, 6, jobs.ec_label.shape)) % 8)
        obs_p, obs_o = core.observe(cfg, plain), core.observe(cfg, other)
        for key in ("scheduled", "backlog", "action_mask"):
            assert np.array_equal(obs_p[key], obs_o[key])
        assert np.array_equal(obs_p["machines"] > 0, obs_o["machines"] > 0)  # same units, other colours
        assert np.array_equal(obs_p["queue"][..., 1:], obs_o["queue"][..., 1:])
        n_label_diffs += int((obs_p["queue"][..., 0] != obs_o["queue"][..., 0]).sum())
        mask = core.action_mask(cfg, plain)
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        plain, r_p, *_ = core.step(cfg, plain, actions)
        other, r_o, *_ = core.step(cfg, other, actions)
        assert np.array_equal(r_p, r_o)
        assert other.obs_label is not None  # step carries the labels along
    assert plain.is_done.all() and n_label_diffs > 0
    assert np.array_equal(plain.penalty_totals, other.penalty_totals)


def test_relabel_rejects_labels_outside_the_colour_range_and_wrong_shapes():
    state = core.reset(CFG, toy_jobs(), 0)
    with pytest.raises(
        ValueError, match=rf"job 1 \(workload b\): label {CFG.n_labels} outside 0..{CFG.n_labels - 1}"
    ):
        core.relabel(CFG, state, np.array([[0, CFG.n_labels]]))
    with pytest.raises(ValueError, match="shape"):
        core.relabel(CFG, state, np.array([0, 1]))


def test_true_labeller_reproduces_the_default_observation_and_vector_env():
    rng = np.random.default_rng(1)
    cfg = SimConfig(n_machines=2)
    jobs = random_jobs(rng, 5)
    assert isinstance(TrueLabeller(), Labeller)
    plain, labelled = TvwVectorEnv(jobs, 3, cfg), TvwVectorEnv(jobs, 3, cfg, labeller=TrueLabeller())
    obs_p, _ = plain.reset(seed=4)
    obs_l, _ = labelled.reset(seed=4)
    for _ in range(60):  # several autoresets happen on the way
        assert all(np.array_equal(obs_p[k], obs_l[k]) for k in obs_p)
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in obs_p["action_mask"]])
        obs_p, r_p, *_ = plain.step(actions)
        obs_l, r_l, *_ = labelled.step(actions)
        assert np.array_equal(r_p, r_l)
    assert labelled.state.obs_label is not None and plain.state.obs_label is None


# ClassifierLabeller


def test_queued_jobs_are_labelled_from_meta_and_running_ones_with_observed_usage(clf):
    labeller = ClassifierLabeller(clf, prefix_bins_per_step=2)
    state = core.reset(CFG, toy_jobs(), 0)
    assert labelled_jobs(CFG, state).tolist() == [[True, False]]  # B has not arrived
    assert labeller.labels(CFG, state)[0, 0] == HIGH  # A queued: meta says HIGH
    state, *_ = core.step(CFG, state, np.array([0]))  # A placed at t=0, time runs to B's arrival at t=3
    assert state.t.tolist() == [3] and observed_steps(state).tolist() == [[3, 0]]
    labels = labeller.labels(CFG, state)
    assert labels.tolist() == [[LOW, HIGH]]  # A's 1-unit usage overrides its meta; B queued: meta
    obs = core.observe(CFG, core.relabel(CFG, state, labels))
    assert obs["queue"][0, 0, 0] == HIGH + 1
    colour = 1 + LOW * CFG.max_instances  # A's units in the image carry the predicted label's colour
    assert obs["machines"][0, 0, 0, -1, 0] == colour


def test_predictions_equal_the_classifier_called_directly(clf):
    labeller = ClassifierLabeller(clf, prefix_bins_per_step=2)
    state, *_ = core.step(CFG, core.reset(CFG, toy_jobs(), 0), np.array([0]))  # t = 3, A running since 0
    # A: steps 0..2 observed; the model reads 4 bins = steps 0, 1 (2 bins each) of 1/8 cpu and mem; B: meta only
    prefixes = np.array([[[1 / 8] * 4, [1 / 8] * 4], [[np.nan] * 4, [np.nan] * 4]])
    direct = clf.predict(np.array([META_HIGH, META_HIGH]), prefixes)
    assert np.array_equal(labeller.labels(CFG, state)[0], direct)
    got = labeller.prefix_inputs(
        CFG, state.jobs, np.array([0, 0]), np.array([0, 1]), observed_steps(state)[0]
    )
    assert np.array_equal(got, prefixes, equal_nan=True)


def test_label_table_equals_predicting_at_every_decision(clf):
    """The per-batch table (one prediction per job and age) gives the labels a direct predict call gives at every
    decision of a random rollout, ages past the m prefix bins included; a new batch gets its own table."""
    rng = np.random.default_rng(5)
    cfg = SimConfig(n_machines=2, history_steps=4)
    jobs = JobBatch.from_jobs(
        [
            [
                dict(
                    arrival_step=int(a),
                    usage=rng.integers(1, 8, size=(int(rng.integers(1, 9)), 2)).tolist(),
                    ec_label=LOW,
                    meta=META_HIGH if rng.random() < 0.5 else META_LOW,
                )
                for a in np.sort(rng.integers(0, 10, size=6))
            ]
            for _ in range(4)
        ]
    )
    labeller = ClassifierLabeller(clf, prefix_bins_per_step=2)
    assert labeller.n_ages() == 3  # ages 0, 1 and >= 2 (4 bins = 2 steps)
    state, n_checked = core.reset(cfg, jobs, 0), 0
    while not state.is_done.all():
        bi, ji = np.nonzero(labelled_jobs(cfg, state))
        direct = labeller.predict_jobs(cfg, state.jobs, bi, ji, observed_steps(state)[bi, ji])
        assert np.array_equal(labeller.labels(cfg, state)[bi, ji], direct)
        n_checked += int((observed_steps(state)[bi, ji] > 2).sum())
        mask = core.action_mask(cfg, state)
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        state, *_ = core.step(cfg, state, actions, mask=mask)
    assert n_checked > 0  # jobs older than the prefix were labelled from the table's last age
    other = jobs.select(np.array([1, 0]))
    assert np.array_equal(labeller.label_table(cfg, other)[0], labeller.label_table(cfg, jobs)[1])


def test_label_table_is_predicted_once_per_batch_and_follows_queue_reorderings(clf):
    """The table rides with its batch (`JobBatch.rider`): reordering the queue in place moves each job's labels
    with the job instead of predicting again, and equals predicting the reordered batch afresh; a copy owns
    its own table."""
    jobs = JobBatch.from_jobs(
        [
            [
                dict(arrival_step=0, usage=[[1, 1]] * 5, ec_label=LOW, meta=META_LOW),
                dict(arrival_step=0, usage=[[7, 7]] * 5, ec_label=HIGH, meta=META_HIGH),
                dict(arrival_step=1, usage=[[7, 7]] * 2, ec_label=HIGH, meta=META_LOW),
            ]
        ]
    ).owned_copy()
    labeller = ClassifierLabeller(clf, prefix_bins_per_step=2)
    calls = []
    predict = labeller.predict_jobs
    labeller.predict_jobs = lambda *a: calls.append(1) or predict(*a)
    before = labeller.label_table(CFG, jobs).copy()
    copy = jobs.owned_copy()
    jobs.rotate_in_place(np.array([0]), np.array([0]), np.array([2]))  # job 2 to the front
    after = labeller.label_table(CFG, jobs)
    assert len(calls) == 1
    np.testing.assert_array_equal(after, before[:, [2, 0, 1]])
    fresh = ClassifierLabeller(clf, prefix_bins_per_step=2).label_table(CFG, jobs.owned_copy())
    np.testing.assert_array_equal(after, fresh)
    np.testing.assert_array_equal(labeller.label_table(CFG, copy), before)  # the copy kept its order
    assert len(calls) == 1
    with pytest.raises(ValueError, match="does not start with the batch's"):
        jobs.rider("bad", lambda: np.zeros((2, 3)))


def test_prefix_holds_only_observed_steps_scaled_back_to_fractions(clf):
    labeller = ClassifierLabeller(clf, prefix_bins_per_step=2, usage_scale=(2.0, 0.5))
    jobs = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[2, 4], [6, 8], [6, 8]], ec_label=0)]])
    one = labeller.prefix_inputs(CFG, jobs, np.array([0]), np.array([0]), np.array([1]))
    # step 0 observed: cpu 2 / 8 / 2.0, mem 4 / 8 / 0.5; step 1 (6, 8) is the future: NaN
    assert np.array_equal(one, [[[0.125, 0.125, np.nan, np.nan], [1.0, 1.0, np.nan, np.nan]]], equal_nan=True)
    assert np.isnan(labeller.prefix_inputs(CFG, jobs, np.array([0]), np.array([0]), np.array([0]))).all()


def test_gym_env_shows_the_labellers_labels(clf, tmp_path):
    path = tmp_path / "clf.pt"
    clf.save(path)
    env = TvwEnv(toy_jobs(), CFG, labeller=ClassifierLabeller(path, prefix_bins_per_step=2))
    obs, _ = env.reset(seed=0)
    assert obs["queue"][0, 0] == HIGH + 1  # A is labelled LOW by the clustering, HIGH from its meta
    obs, *_ = env.step(0)
    assert obs["queue"][0, 0] == HIGH + 1 and env.state.obs_label[0].tolist() == [LOW, HIGH]


def test_label_accuracy_by_age(clf):
    labeller = ClassifierLabeller(clf, prefix_bins_per_step=2)
    table = label_accuracy_by_age(labeller, CFG, toy_jobs(), [0, 2, 4, 10])
    assert table.schema == pl.Schema(LABEL_ACCURACY)
    assert list(LABEL_ACCURACY)[:4] == ["age_steps", "n_jobs", "n_correct", "accuracy"]
    # age 0: meta says HIGH for both, right for B only; age 2: A's low usage makes it LOW; age 4: only A
    # (6 steps) still runs; age 10: none. No constant label given: its columns are null
    assert [r[:4] for r in table.rows()[:3]] == [(0, 2, 1, 0.5), (2, 2, 2, 1.0), (4, 1, 1, 1.0)]
    assert table.row(3)[:3] == (10, 0, 0) and np.isnan(table.row(3)[3])
    constant_columns = table.select("constant_label", "n_constant_correct", "constant_accuracy")
    assert constant_columns.null_count().row(0) == (4, 4, 4)


class _AlwaysLabel:
    """An AgeLabeller that predicts one label for every job at every age."""

    def __init__(self, label: int) -> None:
        self.label = label

    def predict_jobs(self, cfg, jobs, rows, job_index, n_observed):
        return np.full(len(rows), self.label, dtype=np.int64)


def test_constant_baseline_by_age_on_a_hand_made_case():
    # four jobs: labels 3, 3, 5, 7 lasting 1, 3, 3, 2 steps; training jobs say 3 is the most frequent label
    jobs = JobBatch.from_jobs(
        [
            [
                dict(arrival_step=0, usage=[[1, 1]] * 1, ec_label=3),
                dict(arrival_step=0, usage=[[1, 1]] * 3, ec_label=3),
            ],
            [
                dict(arrival_step=0, usage=[[1, 1]] * 3, ec_label=5),
                dict(arrival_step=1, usage=[[1, 1]] * 2, ec_label=7),
            ],
        ]
    )
    constant = most_frequent_label(np.array([3, 5, 3, 7, 5, 3]))
    assert constant == 3 and most_frequent_label(np.array([5, 2, 2, 5])) == 2  # a tie: the smallest
    table = label_accuracy_by_age(_AlwaysLabel(5), CFG, jobs, [0, 1, 2, 3], constant_label=constant)
    # alive: 4 jobs at age 0, 3 at age 1 (3, 5, 7), 2 at age 2 (3, 5), none at 3
    counts = table.select("age_steps", "n_jobs", "n_correct", "constant_label", "n_constant_correct")
    assert counts.rows() == [
        (0, 4, 1, 3, 2),
        (1, 3, 1, 3, 1),
        (2, 2, 1, 3, 1),
        (3, 0, 0, 3, 0),
    ]
    assert table["constant_accuracy"].to_list()[:3] == [0.5, 1 / 3, 0.5]
    assert np.isnan(table["constant_accuracy"][3])
    with pytest.raises(ValueError, match="no labels"):
        most_frequent_label(np.array([], dtype=np.int64))


# job meta in sequences and batches


def test_job_sequence_meta_is_filled_for_real_sources_and_null_for_synthetic():
    n_bins = 500
    usage = pl.DataFrame(
        {
            "source": "s",
            "workload_id": np.repeat(["w0", "w1", "w2"], n_bins),
            "bin_start_s": np.tile(np.arange(n_bins) * 300, 3),
            "cpu_frac": np.tile(0.05 + 0.02 * np.sin(np.arange(n_bins) / 30), 3),
            "mem_frac": 0.03,
        }
    )
    long_running = pl.DataFrame(
        {
            "source": "s",
            "workload_id": ["w0", "w1", "w2"],
            "run_start_s": 0,
            "n_run_bins": n_bins,
            "cpu_request_frac": [0.1, 0.2, None],
            "mem_request_frac": [0.3, 0.4, 0.5],
            "priority": pl.Series([9, 0, 2], dtype=pl.Int32),
            "scheduling_class": pl.Series([1, 2, 3], dtype=pl.Int32),
        }
    )
    cfg = SequenceConfig(loads_pct=(30,), n_train_sequences=1, n_test_sequences=1, arrival_steps=10)
    df, stats = build_job_sequences(usage, long_running, None, cfg)
    assert df.schema == pl.Schema(JOB_SEQUENCES) and stats["meta_columns_missing"] == []
    expected = {r[1]: r[4:] for r in long_running.rows()}
    got = df.select("workload_id", *JOB_META_COLUMNS).rows()
    assert len(got) > 2 and all(row[1:] == expected[row[0]] for row in got)
    jobs = JobBatch.from_frame(df)
    first = df.sort("source", "load_pct", "split", "sequence_id", "arrival_step", "job_index").row(
        0, named=True
    )
    want = [np.nan if first[c] is None else first[c] for c in JOB_META_COLUMNS]
    assert np.array_equal(jobs.meta[0, 0], want, equal_nan=True)

    synthetic = build_deeprm_sequences(DeepRMConfig(n_train_sequences=1, n_test_sequences=0, loads_pct=(30,)))
    assert (
        synthetic.select(pl.all_horizontal(pl.col(c).is_null() for c in JOB_META_COLUMNS)).to_series().all()
    )
    assert np.isnan(JobBatch.from_frame(synthetic).meta).all()


def test_batch_operations_carry_meta():
    with_meta = toy_jobs()
    without = JobBatch.from_jobs([[dict(arrival_step=0, usage=[[1, 1]], ec_label=0)]])
    assert without.meta is None and with_meta.meta.shape == (1, 2, 4)
    stacked = stack_job_batches([without, with_meta])
    assert np.isnan(stacked.meta[0]).all() and np.array_equal(stacked.meta[1], with_meta.meta[0])
    assert np.array_equal(stacked.select([1]).meta, with_meta.meta)
    padded = pad_job_batch(with_meta, 4, 8)
    assert padded.meta.shape == (1, 4, 4) and np.isnan(padded.meta[0, 2:]).all()
    state = core.reset(CFG, pad_job_batch(stacked, 2, 6), 0)
    fresh = core.relabel(CFG, core.reset(CFG, pad_job_batch(with_meta, 2, 6), 0), np.array([[1, 3]]))
    spliced = core.splice_states(state, np.array([0]), fresh)
    assert np.array_equal(spliced.jobs.meta[0], with_meta.meta[0])
    assert spliced.obs_label.tolist() == [[1, 3], with_meta.ec_label[0].tolist()]
