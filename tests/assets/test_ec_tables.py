import io

import matplotlib.image as mpimg
import numpy as np
import polars as pl
import pytest

from assets.column_docs import describe
from assets.ec import ec__mapping
from assets.plots import (
    classifier_accuracy_figure,
    classifier_accuracy_plot,
    ec_profiles_figure,
    ec_profiles_plot,
)
from models.ec_mapping import EC_DESCRIPTIONS, EC_MAPPING_CHECKS, EC_MAPPING_SCHEMAS, METHOD_COMPARISON
from pipelines.equivalence import EC_PROFILES


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


def test_method_comparison_columns_are_described():
    assert [c for c in METHOD_COMPARISON if not describe(c, "ec__method_comparison")] == []


def test_the_ec_tables_and_checks_have_descriptions():
    assert set(EC_DESCRIPTIONS) >= set(EC_MAPPING_SCHEMAS) | {"ec__method_gain", "ec__classifier_accuracy"}
    assert set(EC_MAPPING_CHECKS) == {spec.name for spec in ec__mapping.check_specs}
    assert {spec.asset_key.path[-1] for spec in ec__mapping.check_specs} <= set(EC_MAPPING_SCHEMAS)
    for key in ec__mapping.keys:
        assert ec__mapping.specs_by_key[key].description == EC_DESCRIPTIONS[key.path[-1]]


def _profiles(k: int, steps: int = 288) -> pl.DataFrame:
    t = np.arange(steps)
    return pl.DataFrame(
        {
            "source": "syn",
            "method": "dtw",
            "k": k,
            "ec_label": np.repeat(np.arange(k), steps),
            "step": np.tile(t, k),
            "cpu_frac": np.concatenate([0.1 * (c + 1) + 0.05 * np.sin(t / 20) for c in range(k)]),
            "mem_frac": np.concatenate([0.3 + 0.01 * c + 0 * t for c in range(k)]),
            "n_members": np.repeat(np.arange(k) + 2, steps),
        },
        schema=EC_PROFILES,
    )


@pytest.mark.parametrize("k", [3, 15])
def test_ec_profiles_plot_is_a_grid_1100_px_wide_with_labelled_axes(k):
    fig = ec_profiles_figure(_profiles(k))
    panels = [ax for ax in fig.axes if ax.lines]
    assert len(panels) == k
    assert all(ax.get_xlabel() == "time (hours)" and "fraction" in ax.get_ylabel() for ax in panels)
    assert panels[-1].get_title() == f"dtw k={k}: EC {k - 1} (n={k + 1})"
    # 288 five-minute bins: a day on the x axis
    assert panels[0].lines[0].get_xdata()[-1] == pytest.approx(287 / 12)
    png = ec_profiles_plot(_profiles(k))
    image = mpimg.imread(io.BytesIO(png), format="png")
    assert image.shape[1] == 1100 and image.shape[0] <= 1000


def test_the_fan_out_tables_are_described():
    from models.ec_mapping import METHOD_GAIN
    from pipelines.equivalence import EC_ASSIGNMENTS, EC_SWEEP_LABELS

    for table, schema in (
        ("ec__sweep_labels", EC_SWEEP_LABELS),
        ("ec__method_gain", METHOD_GAIN),
        ("ec__method_assignments", EC_ASSIGNMENTS),
    ):
        assert [c for c in schema if not describe(c, table)] == [], table
    assert "choice rule" in describe("k", "ec__method_assignments")
