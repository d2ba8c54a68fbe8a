"""Plots for the Dagster UI: PNGs at most `MAX_WIDTH_PX` wide with labelled axes, a panel per source (or per
cell, EC, metric); `png_markdown` wraps one for `context.add_output_metadata`."""

from __future__ import annotations

import base64
import io
import struct

import numpy as np
import polars as pl
from dagster import MetadataValue

from sim.evaluate import METRIC_BETTER, PLOT_METRICS

MAX_WIDTH_PX = 1100
"""Widest PNG the UI's metadata dialog shows without scrolling at 1,280 px (issue 19: 1,200 was cut)."""
DPI = 100
PANELS_PER_ROW = 4
SOURCES_PER_ROW = 3


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig_png(fig) -> bytes:
    """The figure as a PNG (closed afterwards)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    _pyplot().close(fig)
    return buf.getvalue()


def png_markdown(png: bytes, alt: str) -> MetadataValue:
    """A PNG shown inline in the Dagster UI."""
    return MetadataValue.md(f"![{alt}](data:image/png;base64,{base64.b64encode(png).decode()})")


def png_width_px(png: bytes) -> int:
    """Width of a PNG, from its IHDR chunk."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG")
    return struct.unpack(">I", png[16:20])[0]


def _grid(n_panels: int, per_row: int, panel_h_in: float):
    """A figure exactly MAX_WIDTH_PX wide with n_panels axes in rows of `per_row` plus one free cell for the
    legend when the last row has room; returns (fig, axes as a flat list)."""
    plt = _pyplot()
    n_cols = min(per_row, max(n_panels, 1))
    n_rows = -(-n_panels // n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(MAX_WIDTH_PX / DPI, panel_h_in * n_rows), squeeze=False, dpi=DPI
    )
    flat = list(axes.flat)
    for ax in flat[n_panels:]:
        ax.axis("off")
    return fig, flat


def _title(metric: str, title: str) -> str:
    better = METRIC_BETTER.get(metric)
    return f"{title} ({better} is better)" if better else title


def summary_figure(summary: pl.DataFrame, source: str):
    """The matplotlib figure of `summary_plots` for one source (one panel per PLOT_METRICS entry): per load, a bar
    per policy with its 95 % interval; a panel's bars are one collection (a `bar` call per policy, a patch per bar,
    made a figure take seconds)."""
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    part = summary.filter(pl.col("source") == source)
    policies, loads = (sorted(part[c].unique().to_list()) for c in ("policy", "load_pct"))
    fig, axes = _grid(len(PLOT_METRICS), PANELS_PER_ROW, 2.6)
    width = 0.8 / max(len(policies), 1)
    colours = [_pyplot().get_cmap("tab20")(k % 20) for k in range(len(policies))]
    keys = pl.DataFrame({"policy": policies}).join(pl.DataFrame({"load_pct": loads}), how="cross")
    keys = keys.with_columns(pl.col("load_pct").cast(part.schema["load_pct"]))  # policy-major, as `xs`
    xs = (
        np.arange(len(loads)) + ((np.arange(len(policies)) - (len(policies) - 1) / 2) * width)[:, None]
    ).ravel()
    for ax, (metric, title) in zip(axes, PLOT_METRICS, strict=False):
        metric_rows = part.filter(pl.col("metric") == metric)
        rows = keys.join(metric_rows, on=["policy", "load_pct"], how="left", maintain_order="left")
        mean, low, high = rows.select("mean", "ci_low", "ci_high").cast(pl.Float64).to_numpy().T
        ok = np.isfinite(mean)  # a bar per (policy, load) with a row, from its four corners
        x0, h = xs[ok] - width / 2, mean[ok]
        corners = np.stack([x0, 0 * h, x0, h, x0 + width, h, x0 + width, 0 * h], 1).reshape(-1, 4, 2)
        ax.add_collection(PolyCollection(corners, facecolors=np.repeat(colours, len(loads), axis=0)[ok]))
        yerr = np.vstack([mean - low, high - mean])
        ax.errorbar(xs, mean, yerr=yerr, fmt="none", ecolor="black", capsize=1.5)
        ax.axhline(0.0, color="black", linewidth=0.5)
        ax.autoscale_view()
        ax.set_xticks(np.arange(len(loads)), [f"{x} %" for x in loads])
        ax.set_title(_title(metric, title), fontsize=8)
        ax.tick_params(labelsize=7)
    handles = [Patch(facecolor=c, label=p) for p, c in zip(policies, colours, strict=True)]
    fig.suptitle(f"{source}: mean and 95 % interval over test sequences, per load", fontsize=9)
    fig.tight_layout()
    cell, where = (axes[len(PLOT_METRICS)], "center") if len(axes) > len(PLOT_METRICS) else (axes[0], "best")
    for size in np.arange(7.0, 3.9, -0.5):  # the legend (in the grid's free cell) shrunk to fit the figure
        legend = cell.legend(handles=handles, loc=where, fontsize=size, ncol=2, title="policy")
        if fig.bbox.contains(*legend.get_window_extent(fig.canvas.get_renderer()).p1):
            break
    return fig


def summary_plots(summary: pl.DataFrame) -> dict[str, bytes]:
    """Source -> PNG (at most MAX_WIDTH_PX wide) of an evaluation summary (`sim.evaluate.summarise`)."""
    return {s: fig_png(summary_figure(summary, s)) for s in sorted(summary["source"].unique().to_list())}


def summary_plot_metadata(summary: pl.DataFrame) -> dict[str, MetadataValue]:
    """`plot_<source>` -> the source's summary figure, for `context.add_output_metadata`."""
    return {
        f"plot_{source}": png_markdown(png, f"{source}: metrics per load and policy")
        for source, png in summary_plots(summary).items()
    }


def _per_source_panels(table: pl.DataFrame, panel_h_in: float = 3.0):
    sources = sorted(table["source"].unique().to_list())
    fig, axes = _grid(len(sources), SOURCES_PER_ROW, panel_h_in)
    return fig, list(zip(sources, axes, strict=False))


def labelling_accuracy_figure(table: pl.DataFrame):
    """`labelling_accuracy_plot`'s figure: a panel per source."""
    fig, panels = _per_source_panels(table)
    for source, ax in panels:
        part = table.filter(pl.col("source") == source)
        for (load,), rows in part.sort("age_steps").group_by("load_pct", maintain_order=True):
            ax.plot(rows["age_steps"], rows["accuracy"], marker="o", label=f"{load} % load")
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("job age (steps observed)", fontsize=8)
        ax.set_ylabel("accuracy (higher is better)", fontsize=8)
        ax.set_title(source, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("EC labels predicted in the simulator vs the clustering label", fontsize=9)
    fig.tight_layout()
    return fig


def labelling_accuracy_plot(table: pl.DataFrame) -> bytes:
    """PNG of `eval__ec_labelling` (source, load_pct, age_steps, accuracy): accuracy against job age."""
    return fig_png(labelling_accuracy_figure(table))


def _split_title(source: str, rows: pl.DataFrame) -> str:
    """The panel title: the source, and how its workloads were split where the table says (split, sizes)."""
    sizes = ("split", "n_train", "n_groups_train", "n_test", "n_groups_test")
    if rows.height == 0 or any(c not in rows.columns for c in sizes):
        return source
    r = rows.row(0, named=True)
    import textwrap

    text = (
        f"split: {r['split']}; train {r['n_train']} workloads / {r['n_groups_train']} groups, "
        f"test {r['n_test']} / {r['n_groups_test']}"
    )
    return f"{source}\n" + textwrap.fill(text, 60)


def classifier_accuracy_figure(table: pl.DataFrame):
    """`classifier_accuracy_plot`'s figure: a panel per source."""
    fig, panels = _per_source_panels(table)
    for source, ax in panels:
        rows = table.filter(pl.col("source") == source).sort("prefix_bins")
        ax.plot(rows["prefix_bins"], rows["accuracy"], marker="o", label="classifier")
        if "macro_f1" in rows.columns:
            ax.plot(rows["prefix_bins"], rows["macro_f1"], marker=".", linestyle=":", label="macro F1")
        ax.plot(
            rows["prefix_bins"], rows["majority_accuracy"], linestyle="--", color="grey", label="majority EC"
        )
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("usage prefix (5-minute bins; 0 = meta only)", fontsize=8)
        ax.set_ylabel("held-out accuracy (higher is better)", fontsize=8)
        ax.set_title(_split_title(source, rows), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="best")
    fig.suptitle("EC classifier against always predicting the most common EC", fontsize=9)
    fig.tight_layout()
    return fig


def classifier_accuracy_plot(table: pl.DataFrame) -> bytes:
    """PNG of `ec__classifier_accuracy` (source, prefix_bins, accuracy, majority_accuracy, optional macro_f1)."""
    return fig_png(classifier_accuracy_figure(table))


def source_grid(
    table: pl.DataFrame,
    rows: list[tuple[str, str]],
    draw,
    *,
    xlabel: str,
    title: str,
    panel_height_in: float,
    sharex: bool | str,
) -> bytes:
    """PNG, 1,200 px wide: one row of panels per (key, ylabel) of `rows`, one column per source of `table`;
    `draw(ax, rows_of_that_source, key)` fills a panel; the first row's panels carry the source and a legend."""
    plt = _pyplot()
    sources = sorted(table["source"].unique().to_list())
    fig, axes = plt.subplots(
        len(rows),
        len(sources),
        figsize=(MAX_WIDTH_PX / DPI, panel_height_in * len(rows)),
        squeeze=False,
        sharex=sharex,
    )
    for col, source in enumerate(sources):
        part = table.filter(pl.col("source") == source)
        for row, (key, label) in enumerate(rows):
            ax = axes[row][col]
            draw(ax, part, key)
            ax.tick_params(labelsize=7)
            if row == 0:
                ax.set_title(source, fontsize=9)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
            if row == len(rows) - 1:
                ax.set_xlabel(xlabel, fontsize=8)
        axes[0][col].legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig_png(fig)


def curve_plot(curve: pl.DataFrame, panels: list[tuple[str, str]], title: str) -> bytes:
    """Learning curves on a `source_grid`: one row per (column, label) of `panels`, a line per (load, seed)."""

    def draw(ax, part: pl.DataFrame, column: str) -> None:
        for (load, seed), g in part.group_by("load_pct", "seed", maintain_order=True):
            g = g.sort("iteration").drop_nulls(column)
            ax.plot(g["iteration"], g[column], label=f"{load}% s{seed}", lw=1)

    return source_grid(
        curve, panels, draw, xlabel="iteration", title=title, panel_height_in=2.6, sharex="col"
    )


def plot_learning_curves(curve: pl.DataFrame) -> bytes:
    """PNG: the mean return's change from its first tenth of iterations (%, `models.ablation.relative_curves`) per
    iteration, one panel per source, a line per (load, seed); 1,200 px wide."""
    from models.ablation import relative_curves

    return curve_plot(
        relative_curves(curve),
        [("return_change_pct", "mean return vs its first 10 %\n(% change; up = cost fell)")],
        "TVW-RL learning curves",
    )


def dejavu_metrics_plot(table: pl.DataFrame) -> bytes:
    """PNG: one row per Dejavu metric, one column per source, a line per policy over load (95 % error bars)."""
    from models.dejavu import DEJAVU_METRICS

    def draw(ax, part: pl.DataFrame, metric: str) -> None:
        for (name,), g in part.group_by("policy", maintain_order=True):
            g = g.sort("load_pct")
            ax.errorbar(g["load_pct"], g[metric], yerr=g[f"{metric}_ci95"], marker="o", capsize=2, label=name)

    return source_grid(
        table,
        [(m, m) for m in DEJAVU_METRICS],
        draw,
        xlabel="load (%)",
        title="Dejavu's metrics (section IV-D)",
        panel_height_in=2.2,
        sharex=True,
    )


def leaderboard_plot(board: pl.DataFrame) -> bytes:
    """PNG: one panel per (source, load), each policy's mean return with its 95 % interval, ranked; the best
    heuristic and learned policies coloured, oracles grey and apart (below the ranked ones)."""
    cells = board.select("source", "load_pct").unique(maintain_order=True).rows()
    n_policies = board.group_by("source", "load_pct").len()["len"].max() or 1
    fig, axes = _grid(len(cells), SOURCES_PER_ROW, panel_h_in=0.5 + 0.16 * n_policies)
    for ax, (source, load) in zip(axes, cells, strict=False):
        part = board.filter((pl.col("source") == source) & (pl.col("load_pct") == load))
        part = part.sort(pl.col("rank").is_null(), "rank")
        colours = [
            "0.6"
            if r["is_oracle"]
            else "tab:red"
            if r["is_learned"]
            else "tab:blue"
            if r["is_best_heuristic"]
            else "0.2"
            for r in part.iter_rows(named=True)
        ]
        y = list(range(part.height))[::-1]
        ax.hlines(y, part["ci_low"], part["ci_high"], colors=colours, linewidth=1)
        ax.scatter(part["mean"], y, c=colours, s=12, zorder=3)
        ax.set_yticks(
            y,
            [p + (" (oracle)" if o else "") for p, o in zip(part["policy"], part["is_oracle"], strict=True)],
            fontsize=6,
        )
        ax.set_title(f"{source} at {load} %", fontsize=8)
        ax.set_xlabel("episode return (higher is better)", fontsize=7)
        ax.tick_params(axis="x", labelsize=6)
    fig.suptitle("Leaderboard: blue best heuristic, red learned, grey oracle (unranked)", fontsize=9)
    fig.tight_layout()
    return fig_png(fig)


EC_PROFILES_WIDTH_PX = 1100
"""Width of the `ec__profiles` plot."""


def ec_profiles_figure(profiles: pl.DataFrame):
    """`ec__profiles`: a panel per EC (4 to a row), its representative CPU and memory usage (fraction of a
    machine) against time in hours; the panel title names the mapping, the EC and its size."""
    from pipelines.schemas import BIN_SECONDS

    plt = _pyplot()
    panels = profiles.partition_by(["method", "k", "ec_label"], maintain_order=True, as_dict=True)
    n_cols = min(PANELS_PER_ROW, max(len(panels), 1))
    n_rows = -(-max(len(panels), 1) // n_cols)
    fig, axes = plt.subplots(
        n_rows, n_cols, figsize=(EC_PROFILES_WIDTH_PX / DPI, 0.6 + 2.0 * n_rows), squeeze=False, dpi=DPI
    )
    flat = list(axes.flat)
    for ax in flat[len(panels) :]:
        ax.axis("off")
    for ax, ((method, k, label), part) in zip(flat, panels.items(), strict=False):
        part = part.sort("step")
        hours = part["step"].to_numpy() * BIN_SECONDS / 3600
        ax.plot(hours, part["cpu_frac"], lw=0.8, label="CPU")
        ax.plot(hours, part["mem_frac"], lw=0.8, label="memory")
        ax.set_title(f"{method} k={k}: EC {label} (n={part['n_members'][0]})", fontsize=8)
        ax.set_xlabel("time (hours)", fontsize=7)
        ax.set_ylabel("usage (fraction)", fontsize=7)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    if panels:
        flat[0].legend(fontsize=7)
        source = profiles["source"][0]
        fig.suptitle(f"{source}: each EC's representative usage (fraction of a machine)", fontsize=9)
    fig.tight_layout()
    return fig


def ec_profiles_plot(profiles: pl.DataFrame) -> bytes:
    """PNG of `ec_profiles_figure`, 1,100 px wide."""
    return fig_png(ec_profiles_figure(profiles))
