"""The UI's plots fit its dialog (<= 1,200 px wide), one figure or panel per source, every policy in the legend."""

import numpy as np
import polars as pl
from matplotlib.collections import PolyCollection

from assets.plots import (
    MAX_WIDTH_PX,
    classifier_accuracy_figure,
    classifier_accuracy_plot,
    labelling_accuracy_figure,
    labelling_accuracy_plot,
    png_width_px,
    summary_figure,
    summary_plot_metadata,
    summary_plots,
)
from sim.evaluate import PLOT_METRICS
from sim.policies import POLICIES

SOURCES = ["alibaba2018", "deepplace_synthetic", "google2011"]


def _summary() -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for source in SOURCES:
        for load in (30, 50, 80):
            for policy in sorted(POLICIES):
                for metric, _ in PLOT_METRICS:
                    mean = float(rng.uniform(0, 1))
                    rows.append((source, load, policy, metric, mean, mean - 0.05, mean + 0.05))
    cols = ["source", "load_pct", "policy", "metric", "mean", "ci_low", "ci_high"]
    return pl.DataFrame(rows, schema=cols, orient="row").with_columns(pl.col("load_pct").cast(pl.Int32))


def test_summary_is_one_figure_per_source_that_fits_the_dialog():
    summary = _summary().filter(pl.col("source") != "alibaba2018")  # two sources: each figure takes seconds
    pngs = summary_plots(summary)
    assert sorted(pngs) == SOURCES[1:]
    for png in pngs.values():
        assert 800 <= png_width_px(png) <= MAX_WIDTH_PX
    one = summary.filter(pl.col("source") == SOURCES[1])  # the metadata renders again: one source is enough
    assert sorted(summary_plot_metadata(one)) == [f"plot_{SOURCES[1]}"]
    fig = summary_figure(summary, "google2011")
    drawn = [ax for ax in fig.axes if any(isinstance(c, PolyCollection) for c in ax.collections)]
    assert len(drawn) == len(PLOT_METRICS)
    # a bar per (policy, load) with a row: 3 loads x every policy, but one policy missing at one load
    fewer = summary_figure(
        summary.filter(~((pl.col("policy") == "tetris") & (pl.col("load_pct") == 50))), SOURCES[1]
    )
    [bars] = [c for c in fewer.axes[0].collections if isinstance(c, PolyCollection)]
    assert len(bars.get_paths()) == 3 * len(POLICIES) - 1
    # policy-major, loads in order, each bar as high as its row's mean
    rows = summary.filter((pl.col("source") == SOURCES[1]) & (pl.col("metric") == PLOT_METRICS[0][0]))
    rows = rows.filter(~((pl.col("policy") == "tetris") & (pl.col("load_pct") == 50))).sort(
        "policy", "load_pct"
    )
    tops = [path.vertices[1, 1] for path in bars.get_paths()]
    assert np.allclose(tops, rows["mean"].to_numpy())
    lefts = [path.vertices[0, 0] for path in bars.get_paths()]
    # policy 0 at loads 0, 1, 2, then policy 1
    assert lefts[0] < lefts[1] < lefts[2] and lefts[3] < lefts[0] + 1
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    assert len(legends) == 1
    assert sorted(t.get_text() for t in legends[0].get_texts()) == sorted(POLICIES)
    # the legend sits inside the figure, not off to its right
    fig.canvas.draw()
    box = legends[0].get_window_extent()
    assert box.x1 <= fig.bbox.x1 and box.y0 >= 0
    assert "higher is better" in drawn[0].get_title()


def test_labelling_and_classifier_plots_have_a_panel_per_source():
    labelling = pl.DataFrame(
        {
            "source": [s for s in SOURCES for _ in range(4)],
            "load_pct": [50, 50, 80, 80] * len(SOURCES),
            "age_steps": [0, 4] * 2 * len(SOURCES),
            "accuracy": np.linspace(0.2, 0.9, 4 * len(SOURCES)),
        }
    )
    fig = labelling_accuracy_figure(labelling)
    assert sorted(ax.get_title() for ax in fig.axes if ax.lines) == SOURCES
    assert png_width_px(labelling_accuracy_plot(labelling)) <= MAX_WIDTH_PX
    accuracy = pl.DataFrame(
        {
            "source": [s for s in SOURCES[:2] for _ in range(3)],
            "prefix_bins": [0, 12, 48] * 2,
            "accuracy": [0.5, 0.6, 0.7, 0.4, 0.45, 0.8],
            "macro_f1": [0.3, 0.4, 0.5, 0.2, 0.3, 0.6],
            "majority_accuracy": [0.45] * 3 + [0.5] * 3,
        }
    )
    fig = classifier_accuracy_figure(accuracy)
    panels = [ax for ax in fig.axes if ax.lines]
    assert sorted(ax.get_title() for ax in panels) == SOURCES[:2]
    assert all("majority EC" in [t.get_text() for t in ax.get_legend().get_texts()] for ax in panels)
    assert png_width_px(classifier_accuracy_plot(accuracy)) <= MAX_WIDTH_PX


def test_learning_curves_and_dejavu_metrics_plot_as_pngs() -> None:
    from assets.plots import dejavu_metrics_plot, plot_learning_curves
    from models.dejavu import DEJAVU_METRICS

    curve = pl.DataFrame(
        {
            "source": "s",
            "load_pct": 30,
            "seed": 0,
            "iteration": list(range(20)),
            "mean_return": [-100.0 + i for i in range(20)],
        }
    )
    assert plot_learning_curves(curve)[:8] == b"\x89PNG\r\n\x1a\n"
    table = pl.DataFrame(
        {"source": "s", "load_pct": [30, 50], "policy": "dejavu"}
        | {c: [0.5, 0.6] for m in DEJAVU_METRICS for c in (m, f"{m}_ci95")}
    )
    png = dejavu_metrics_plot(table)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and png_width_px(png) <= MAX_WIDTH_PX


def test_the_leaderboard_plot_fits_the_ui_with_an_oracle_and_a_learned_policy():
    from assets.plots import MAX_WIDTH_PX, leaderboard_plot, png_width_px
    from sim.leaderboard import leaderboard

    board = leaderboard(_leaderboard_summary())
    assert png_width_px(leaderboard_plot(board)) <= MAX_WIDTH_PX


def _leaderboard_summary():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "sim" / "test_leaderboard.py"
    spec = importlib.util.spec_from_file_location("leaderboard_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.summary()
