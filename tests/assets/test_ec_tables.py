import io

import matplotlib.image as mpimg
import polars as pl

from assets.column_docs import describe
from assets.ec import METHOD_COMPARISON, _table_markdown
from assets.plots import classifier_accuracy_figure, classifier_accuracy_plot


def test_classifier_plot_is_a_png_at_most_1200_px_wide():
    table = pl.DataFrame(
        {
            "source": ["syn"] * 3,
            "prefix_bins": [0, 6, 12],
            "accuracy": [0.4, 0.6, 0.7],
            "macro_f1": [0.3, 0.5, 0.6],
            "majority_accuracy": [0.45, 0.45, 0.45],
            "n_train": [40, 40, 40],
            "n_test": [10, 10, 10],
            "n_groups_train": [8, 8, 8],
            "n_groups_test": [2, 2, 2],
            "split": ["by workload group (a group wholly on one side)"] * 3,
        }
    )
    title = next(ax.get_title() for ax in classifier_accuracy_figure(table).axes if ax.lines)
    assert title.startswith("syn\nsplit: by workload group") and "test 10 / 2" in title
    png = classifier_accuracy_plot(table)
    image = mpimg.imread(io.BytesIO(png), format="png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert 300 <= image.shape[1] <= 1200 and image.shape[0] <= 1200


def test_method_comparison_columns_are_described_and_the_markdown_shows_the_paired_test():
    assert [c for c in METHOD_COMPARISON if not describe(c, "ec__method_comparison")] == []
    row = {c: None for c in METHOD_COMPARISON}
    row.update(
        method="dtw",
        k=3,
        k_rule="silhouette_best",
        eg_pct=5.0,
        eg_pct_ci_low=-1.0,
        eg_pct_ci_high=11.0,
        f_frac=0.5,
        f_frac_ci_low=0.2,
        f_frac_ci_high=0.8,
        control_eg_pct=1.0,
        control_eg_pct_ci_low=-2.0,
        control_eg_pct_ci_high=4.0,
        eg_diff_pct=4.0,
        eg_diff_pct_ci_low=1.5,
        eg_diff_pct_ci_high=6.5,
        eg_diff_p_value=0.004,
        eg_diff_pct_median=3.0,
        eg_diff_pct_median_ci_low=0.5,
        eg_diff_pct_median_ci_high=7.0,
        n_seeds_diff_positive=9,
        n_seeds_diff_negative=1,
        n_seeds=10,
        eg_diff_sign_p_value=0.0107,
        eg_diff_sign_p_holm=0.032,
        beats_control=True,
        ari_time_halves=0.61,
        ari_time_halves_shuffled_95=0.08,
        is_chosen=True,
    )
    md = _table_markdown(pl.DataFrame([row], schema=METHOD_COMPARISON))
    assert "paired EG - control" in md.splitlines()[0] and "Holm p" in md.splitlines()[0]
    assert "| 4.00 (1.50, 6.50), 0.004 | 3.00 (0.50, 7.00), +9 -1 of 10 | 0.0107, 0.032 | True |" in md
    assert "| 0.61 (0.08) | True |" in md


def test_the_fan_out_tables_are_described():
    from assets.ec import EC_SWEEP_LABELS, METHOD_GAIN
    from pipelines.equivalence import EC_ASSIGNMENTS

    for table, schema in (
        ("ec__sweep_labels", EC_SWEEP_LABELS),
        ("ec__method_gain", METHOD_GAIN),
        ("ec__method_assignments", EC_ASSIGNMENTS),
    ):
        assert [c for c in schema if not describe(c, table)] == [], table
    assert "choice rule" in describe("k", "ec__method_assignments")
