"""TVW-RL's ablations: each run's setting, its test simulator, its rank against the heuristics; curve trends."""

import polars as pl
import pytest

from models.ablation import (
    ABLATION_KEYS,
    ABLATIONS,
    AblationConfig,
    ablation_config,
    ablation_table,
    ablation_test_sim,
    ablation_winners,
    curve_trend,
    relabel_jobs,
    relative_curves,
)
from models.tvw_rl import TvwRlConfig


def test_ablation_winners_rank_each_run_against_the_heuristics_on_the_same_sequences():
    def rows(policy, returns, seqs=(0, 1), **extra):
        return pl.DataFrame(
            {
                "source": "s",
                "load_pct": 50,
                "policy": policy,
                "sequence_id": list(seqs),
                "episode_return": returns,
                "avg_util_cpu_frac": 0.5,
                "avg_overshoot_pct": 0.0,
                **extra,
            }
        )

    # tetris wins on sequences 0-1; best_fit's huge return on sequence 2 must not count (another sequence)
    baselines = pl.concat(
        [rows("tetris", [-10.0, -10.0]), rows("best_fit", [-30.0, -30.0]), rows("best_fit", [0.0], seqs=(2,))]
    )
    runs = pl.concat(
        [
            rows("tvw_rl", [-20.0, -20.0], ablation="advantage", value="raw", eval_noise_units=0),
            rows("tvw_rl", [-5.0, -5.0], ablation="advantage", value="scale", eval_noise_units=0),
            rows("tvw_rl", [0.0, 0.0], ablation="advantage", value="scale", eval_noise_units=3),
        ]
    ).drop("policy")
    out = ablation_winners(runs, baselines)
    assert out.select("value", "winner_by_return", "tvw_rl_rank_by_return").rows() == [
        ("raw", "tetris", 2),
        ("scale", "tvw_rl", 1),
    ]
    assert out["best_baseline_return"].to_list() == [-10.0, -10.0]


def test_learning_curves_are_plotted_relative_to_their_first_tenth():
    rows = []
    for load, scale in ((30, 1.0), (80, 3.0)):  # the same 2 % rise on returns three times the size
        rows += [
            {
                "source": "s",
                "load_pct": load,
                "seed": 0,
                "iteration": i,
                "mean_return": -scale * (100 - i * 0.2),
            }
            for i in range(20)
        ]
    out = relative_curves(pl.DataFrame(rows))
    last = out.filter(pl.col("iteration") == 19).sort("load_pct")["return_change_pct"].to_list()
    # first tenth = iterations 0-1 (mean -99.9 x scale); iteration 19: -96.2 x scale -> +3.70 % at both loads
    assert last == pytest.approx([3.7037, 3.7037], abs=1e-3)


def test_an_ablation_run_is_trained_with_its_setting_and_tested_under_the_unablated_penalties():
    base = TvwRlConfig.short()
    assert ablation_config(base, "k_overshoot", "0.0").sim.k_overshoot == 0.0  # trained without K_o
    assert ablation_config(base, "train_noise", "3").sim.noise_max_units == 3
    tested = ablation_test_sim(base, 2)
    weights = ("k_overshoot", "k_underutil", "k_contention", "k_wait")
    assert [getattr(tested, w) for w in weights] == [getattr(base.sim, w) for w in weights]
    assert tested.k_overshoot == 30000.0  # the paper's K_o, whatever the run was trained with
    assert tested.noise_max_units == 2 and not tested.is_shape_perturbed
    assert (
        tested.jobs_per_episode is None and tested.max_steps == 1000
    )  # whole test sequences, the safety cap


def test_every_ablation_value_is_one_run_and_an_unknown_setting_or_preset_is_refused() -> None:
    assert len(ABLATION_KEYS) == sum(len(v) for v in ABLATIONS.values()) and "advantage=raw" in ABLATION_KEYS
    with pytest.raises(ValueError, match="unknown ablation"):
        ablation_config(TvwRlConfig.short(), "k_nothing", "1")
    with pytest.raises(ValueError, match="unknown TVW-RL preset"):
        AblationConfig(preset="huge")
    base = AblationConfig(preset="short", n_iterations=3, seed=2).base()
    assert base.reinforce.n_iterations == 3 and base.reinforce.seed == 2 and base.obs.labels == "true"


def test_curve_trend_compares_the_first_and_last_tenth_of_each_run() -> None:
    curve = pl.DataFrame(
        {
            "source": "s",
            "load_pct": 50,
            "seed": 0,
            "iteration": list(range(10)),
            "mean_return": [float(i) for i in range(10)],
        }
    )
    assert curve_trend(curve).select("first_return", "last_return", "has_improved").rows() == [
        (0.0, 9.0, True)
    ]


def test_ablation_table_means_over_sequences_per_run_and_noise() -> None:
    rows = pl.DataFrame(
        {
            "ablation": "k_wait",
            "value": "1",
            "source": "s",
            "load_pct": 50,
            "eval_noise_units": [0, 0, 1],
            "sequence_id": [0, 1, 0],
            "episode_return": [-1.0, -3.0, -5.0],
        }
    )
    from models.ablation import ABLATION_RESULTS

    full = rows.with_columns([pl.lit(0.0).alias(c) for c in ABLATION_RESULTS if c not in rows.columns])
    out = ablation_table(full)
    assert out.select("eval_noise_units", "episode_return", "n_sequences").rows() == [
        (0, -2.0, 2),
        (1, -5.0, 1),
    ]


def test_relabel_jobs_labels_every_job_by_its_workloads_mapping() -> None:
    jobs = pl.DataFrame(
        {"workload_id": ["a", "b", "c"], "ec_label": [5, 5, 5]}, schema_overrides={"ec_label": pl.Int32}
    )
    labels = pl.DataFrame({"workload_id": ["a", "b"], "k": [2, 2], "ec_label": [1, 0]})
    lines: list[str] = []
    out = relabel_jobs(jobs, "dtw", lambda method: labels, "src", lines.append)
    assert out["ec_label"].to_list() == [1, 0, 0] and "1 of 3 workloads uncovered" in lines[0]
    with pytest.raises(ValueError, match="synthetic source"):
        relabel_jobs(jobs, "dtw", lambda method: labels.head(0), "deepplace_synthetic")
