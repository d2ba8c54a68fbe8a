"""What `tvw-run` checks before it starts and says when it ends: the trace folder, a Dask cluster's view of the
warehouse, failed checks, the per-source counts and the layer timings."""

from __future__ import annotations

import sys
from pathlib import Path

EVALUATIONS = {"eval__baselines": "eval_job", "eval__results": "results_job"}
"""The per-load evaluation tables and the job that makes them."""


def remove_unplanned_evaluations(warehouse, planned: list) -> list[str]:
    """Delete the stored partitions of the per-load evaluation tables (EVALUATIONS) whose job this invocation runs,
    for the loads it does not evaluate (left by a run with other loads): readers concatenate every stored
    partition, and must not mix in stale loads. Returns 'table[load]' per partition removed."""
    from assets.resources import partition_file_stem

    removed = []
    for table, job in EVALUATIONS.items():
        runs = [s for s in planned if s.job == job]
        if not runs:
            continue
        keep = {partition_file_stem(s.partition) for s in runs}
        for stem in sorted(set(warehouse.partition_keys_on_disk(table)) - keep):
            warehouse.remove_partition(table, stem)
            removed.append(f"{table}[{stem}]")
    return removed


class TraceFolderError(RuntimeError):
    """The trace folder lacks the shards of a source the run was asked for."""


def expected_layout(traces: Path, source: str) -> str:
    """Where a source's files go under the trace folder, and how they are named (from its `discover`)."""
    import inspect

    from pipelines.sources import SOURCES

    src = SOURCES[source]
    naming = (inspect.getdoc(type(src).discover) or "").splitlines()[0]
    return f"{source}: {traces / src.folder}/ with tables {', '.join(src.tables)} ({naming})"


def check_trace_folder(traces: Path, sources: list[str], subset_asked: bool) -> dict[str, int]:
    """Shards found per source. Stops at once, naming the folder and the layout expected per source, when the
    folder is missing or a source has no shard at all, unless the user asked for a subset of sources (then
    only the asked ones must have shards)."""
    from pipelines.sources import SOURCES
    from pipelines.sources.base import unread_file_warnings

    found = {s: sum(len(SOURCES[s].discover(traces, t)) for t in SOURCES[s].tables) for s in sources}
    empty = [s for s, n in found.items() if n == 0]
    if not traces.is_dir() or empty:
        what = "does not exist" if not traces.is_dir() else f"has no shard of {', '.join(empty)}"
        layout = "\n".join("  " + expected_layout(traces, s) for s in (empty or sources))
        present = [s for s, n in found.items() if n]
        hint = (
            f"\nTo run only the sources you have, pass --sources {','.join(present)}"
            if present and not subset_asked
            else ""
        )
        raise TraceFolderError(
            f"trace folder {traces} {what} (TVW_TRACE_DIR). Expected layout:\n{layout}{hint}"
        )
    for line in unread_file_warnings(traces, SOURCES.values(), sources):  # nothing is ignored silently
        print(f"WARNING {line}", file=sys.stderr)
    return found


def failed_check_lines(instance, outcomes: list) -> list[str]:
    """One warning line per asset check that did not pass in the runs of `outcomes` (a run whose checks fail
    still succeeds: the checks say what is wrong with its tables), naming the check, its asset and severity."""
    from dagster import DagsterEventType

    lines = []
    for o in outcomes:
        if not o.run_id:
            continue
        for record in instance.get_records_for_run(
            o.run_id, of_type=DagsterEventType.ASSET_CHECK_EVALUATION
        ).records:
            check = record.event_log_entry.dagster_event.event_specific_data
            if not check.passed:
                severity = getattr(check.severity, "value", str(check.severity))
                lines.append(
                    f"  WARNING check failed ({severity}): {check.asset_key.to_user_string()}"
                    f".{check.check_name} in {o.spec.label}"
                )
    return lines


def source_summary(
    warehouse: Path, sources: list[str], layers: tuple[str, ...], skipped: dict[str, str] | None = None
) -> list[str]:
    """Per source: workloads, long-running workloads kept, equivalence classes, job sequences; a warning line
    for a source whose thresholds kept too few workloads for the later layers (of those in `layers`: a run of
    the early layers alone is not warned about the tables it did not make)."""
    import polars as pl

    from assets.resources import Warehouse

    wh = Warehouse(root=str(warehouse))

    warnings = []

    def read(table: str, query) -> pl.DataFrame | None:
        """`query` over the table's files, or None (with a warning line) where its partitions disagree: files
        written by different versions of the code, e.g. a source not re-run since an upgrade."""
        if not wh.has_table(table):
            return None
        try:
            return query(wh.scan(table)).collect()
        except pl.exceptions.PolarsError as e:
            first = str(e).splitlines()[0]
            warnings.append(
                f"  WARNING {table}: its partitions cannot be read together ({first}); re-run the layers of "
                "the sources not run with this version, or remove their stale files"
            )
            return None

    def counts(table: str, expr: pl.Expr) -> dict[str, int]:
        df = read(table, lambda lf: lf.group_by("source").agg(expr.alias("n")))
        return {} if df is None else {s: int(n) for s, n in df.iter_rows()}

    workloads = counts("core__workloads", pl.len())
    kept = counts("core__long_running", pl.len())
    ecs = counts("ec__assignments", pl.col("ec_label").n_unique())
    seqs = counts("sim__job_sequences", pl.struct("load_pct", "split", "sequence_id").n_unique())
    rows = read("ec__method_comparison", lambda lf: lf)
    rows = [] if rows is None else list(rows.iter_rows(named=True))
    chosen = {r["source"]: f"{r['method']} k={r['k']} ({r['choice_basis']})" for r in rows if r["is_chosen"]}
    # why a source has no mapping, when the comparison says (e.g. no method beats its random control)
    reasons = {r["source"]: r["choice_reason"] for r in rows if not r["is_chosen"] and r.get("choice_reason")}
    lines = [f"  {'source':<20} {'workloads':>10} {'kept':>8} {'ECs':>5} {'sequences':>10}  EC mapping"]
    skipped = skipped or {}
    for s in sources:
        if s in skipped:
            lines.append(f"  {s:<20} {workloads.get(s, 0):>10} {'-':>8} {'-':>5} {'-':>10}  {skipped[s]}")
            continue
        row = [workloads.get(s, 0), kept.get(s, 0), ecs.get(s, 0), seqs.get(s, 0)]
        method = chosen.get(s, "-")
        lines.append(f"  {s:<20} {row[0]:>10} {row[1]:>8} {row[2]:>5} {row[3]:>10}  {method}")
        if row[1] == 0 and "per_source" in layers:
            warnings.append(
                f"  WARNING {s}: no long-running workload kept of {row[0]}: its EC and evaluation rows are "
                "empty (lower core__long_running.min_contiguous_bins in the profile, or use longer traces)"
            )
        elif row[2] == 0 and "ec" in layers and s in reasons:
            warnings.append(f"  WARNING {s}: {row[1]} kept, no equivalence classes: {reasons[s]}")
        elif row[2] == 0 and "ec" in layers:
            warnings.append(f"  WARNING {s}: {row[1]} kept, too few to map to equivalence classes")
        elif row[2] > 0 and row[3] == 0 and "cluster" in layers:
            warnings.append(f"  WARNING {s}: {row[1]} kept in {row[2]} ECs, too few to build job sequences")
    return lines + warnings


def _read_marker(path: str) -> str | None:
    """On a Dask worker: the content of the marker file, or None when this worker cannot see it."""
    try:
        return Path(path).read_text()
    except OSError:
        return None


def check_shared_warehouse(scheduler: str, warehouse: str) -> None:
    """Stop unless every worker of the Dask cluster at `scheduler` sees the warehouse folder as this process
    does (steps exchange data only through the Parquet files there): write a marker with a fresh token and
    have every worker read it back."""
    import uuid

    from distributed import Client

    root = Path(warehouse)
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    marker = root / f".tvw-shared-check-{token}"
    marker.write_text(token)
    try:
        with Client(scheduler, timeout=30) as client:
            seen = client.run(_read_marker, str(marker))
    finally:
        marker.unlink(missing_ok=True)
    blind = sorted(w for w, got in seen.items() if got != token)
    if not seen or blind:
        raise RuntimeError(
            f"TVW_WAREHOUSE_DIR={root} must be on a filesystem every Dask worker sees (NFS, Lustre, ...): "
            + (f"worker(s) {blind} cannot read {marker.name} there" if seen else "the cluster has no worker")
        )


def empty_sources(warehouse: Path, sources: list[str]) -> dict[str, int]:
    """Sources whose long-running filter kept nothing: source -> workloads it had (0 kept of them)."""
    import polars as pl

    from assets.resources import Warehouse

    wh = Warehouse(root=str(warehouse))
    if not wh.has_table("core__workloads"):
        return {}
    total = dict(wh.scan("core__workloads").group_by("source").agg(pl.len()).collect().iter_rows())
    kept = (
        dict(wh.scan("core__long_running").group_by("source").agg(pl.len()).collect().iter_rows())
        if wh.has_table("core__long_running")
        else {}
    )
    return {s: int(total.get(s, 0)) for s in sources if not kept.get(s)}


def layer_lines(outcomes: list, layers: list[str]) -> list[str]:
    """One line per layer that ran: runs made, failed, wall time, summed run time, peak RSS per worker."""
    lines = []
    for layer in layers:
        runs = [o for o in outcomes if o.spec.layer == layer]
        if runs:
            failed = sum(not o.ok for o in runs)
            wall = max(o.started_at + o.seconds for o in runs) - min(o.started_at for o in runs)
            lines.append(
                f"  {layer:<10} {len(runs):>4} run(s), {failed} failed, {wall:.0f}s wall, "
                f"{sum(o.seconds for o in runs):.0f}s of run time, peak RSS per worker "
                f"{max(o.peak_rss_mib for o in runs):.0f} MiB"
            )
    return lines


def leaderboard_lines(warehouse: Path) -> list[str]:
    """The stored `eval__leaderboard` as terminal lines, or [] when the results layer has not run."""
    from assets.resources import Warehouse
    from sim.leaderboard import leaderboard_text

    wh = Warehouse(root=str(warehouse))
    if not wh.has_table("eval__leaderboard"):
        return []
    return leaderboard_text(wh.scan("eval__leaderboard").collect())
