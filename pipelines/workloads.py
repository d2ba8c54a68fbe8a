"""The canonical `workloads` table: one row per workload, built from a source's raw tables.

`build_workloads(source, raw)` takes the raw tables of one source (`raw`: table name -> LazyFrame in the
schema of `pipelines.raw_schemas`; a table missing from the source's folder is missing from the dict) and
returns a frame in `pipelines.schemas.WORKLOADS`. The per-source choices, precisely:

google2011 (clusterdata-2011-2)
  * Workload = task, `workload_id = "<job_id>/<task_index>"`. The set of workloads is the union of the tasks
    seen in task_usage and in task_events (a task with events and no usage is kept; the long-running filter
    reports it as `no_usage`).
  * Times: trace time in seconds, i.e. seconds since 600 s before the trace start (µs / 1e6, no shift).
    `start_time_s` = earliest usage window start, `end_time_s` = latest usage window end,
    `n_usage_records` = raw task_usage rows (valid or not).
  * Requests, priority, scheduling class: the last non-null value over the task's events in time order. A
    synthesized row (missing_info set, empty requests) therefore takes its requests from another event of
    the same task, as the trace documentation advises.
  * `final_state`: the worst outcome in the task's history. If the task was ever evicted, failed, killed or
    lost (2 EVICT, 3 FAIL, 5 KILL, 6 LOST), the last such event decides, even when it was rescheduled and later
    FINISHed: TVW-RL discards workloads that were evicted, killed or failed, and such a task's series also
    spans a restart (often on another machine). Otherwise FINISH (4) gives `finished`, and a task with events
    but no terminal event is `running`. No task_events table, or a task absent from it: `unknown`.
  * `machine_id`: the machine of the last usage record; without usage, the last machine in task_events.
  * `is_partial` (only for tasks with usage): let [c0, c1] be what task_usage covers (earliest window start,
    latest window end, over the whole table). A task is partial when
      (a) its first record starts at or after c0 + 300 s (i.e. it was not already running in the first
          window) and the data holds no SUBMIT (0) or SCHEDULE (1) event for it — its start is not recorded;
          a task scheduled at time 0 and running from the first window is NOT partial, or
      (b) its last record ends at or before c1 - 300 s (it stopped reporting at least one window before the
          data ends) and the data holds no terminal event for it — its records were cut.
    Without task_events nothing is explained, so every late starter or early stopper is partial.

alibaba2018 (cluster-trace-v2018, online containers)
  * Workload = container, `workload_id = container_id`; union of container_meta and container_usage ids.
    Usage rows with an empty/null container_id are not a workload (`pipelines.usage` counts them).
  * `start_time_s` / `end_time_s` = first / last usage sample time (samples are instants on a 10 s grid).
  * Requests from the container's last container_meta row with a value:
    `cpu_request_frac = cpu_request_centicores / 100 / cpu_num` (cpu_num of the container's machine from
    machine_meta, 96 when the machine is unknown), `mem_request_frac = mem_size_pct / 100`.
  * `final_state` from the last container_meta status: stopped -> finished (the trace does not tell a
    normal stop from a kill), started -> running, allocated -> running (resources held at the trace end);
    no meta or another status -> unknown. No priority or scheduling class (null).
  * `machine_id`: from container_meta, else the last usage sample's machine.
  * `is_partial`: the container has no container_meta row (its life is not recorded). Cut records are not
    detected: container samples are irregular (median gap ~450 s, gaps of hours), so a last sample long
    before the last meta snapshot is normal; gaps are left to the contiguity rule of the long-running filter.

google2011_derived (third-party aggregates of Google 2011, see shared/traces/google-2011-derived)
  * job_sums -> one workload `"job<job_id>"`; job_days -> one workload per (job, day) `"<job_id>_d<k>"`
    (contiguity of the days of a job is not verified, so each day stands alone).
  * Times from the usage bins (`pipelines.usage`): start = first bin, end = last bin + 300 s,
    `n_usage_records` = raw rows. No requests, priority, class or machine; `final_state = "running"`,
    never partial.
"""

from __future__ import annotations

import polars as pl

from pipelines.schemas import BIN_SECONDS, WORKLOADS, check_schema, empty_frame

US_PER_S = 1_000_000
GOOGLE_TERMINAL_STATES = {2: "evicted", 3: "failed", 4: "finished", 5: "killed", 6: "lost"}
"""Google 2011 terminal event codes -> canonical final state."""
GOOGLE_BAD_EVENTS = [2, 3, 5, 6]
"""Terminal events that disqualify a task for good, whatever happened after (see `final_state`)."""
GOOGLE_START_EVENTS = (0, 1)
"""SUBMIT and SCHEDULE: events that record a task's start."""
ALIBABA_STATES = {"stopped": "finished", "started": "running", "allocated": "running"}
"""Alibaba 2018 container_meta status -> canonical final state (anything else: unknown)."""
ALIBABA_DEFAULT_CPU_NUM = 96
"""Cores of an Alibaba 2018 machine missing from machine_meta (every known machine has 96)."""


def google_workload_id(job: str = "job_id", task: str = "task_index") -> pl.Expr:
    """Google 2011 workload id `"<job_id>/<task_index>"`."""
    return pl.format("{}/{}", pl.col(job), pl.col(task)).alias("workload_id")


def _last_value(col: str) -> pl.Expr:
    """Last non-null value of `col` (frame already sorted by time within the group)."""
    return pl.col(col).drop_nulls().last()


# google2011 ------------------------------------------------------------------------------------------------


def _google_usage_summary(usage: pl.LazyFrame) -> pl.LazyFrame:
    return usage.group_by("job_id", "task_index").agg(
        (pl.col("start_time_us").min() / US_PER_S).alias("start_time_s"),
        (pl.col("end_time_us").max() / US_PER_S).alias("end_time_s"),
        pl.len().cast(pl.Int64).alias("n_usage_records"),
        pl.col("machine_id").sort_by("end_time_us").last().alias("usage_machine_id"),
    )


def _google_event_summary(events: pl.LazyFrame) -> pl.LazyFrame:
    terminal = pl.col("event_type").is_in(list(GOOGLE_TERMINAL_STATES))
    return (
        events.sort("job_id", "task_index", "time_us", maintain_order=True)
        .group_by("job_id", "task_index")
        .agg(
            _last_value("cpu_request_frac"),
            _last_value("mem_request_frac"),
            _last_value("priority").cast(pl.Int32),
            _last_value("scheduling_class").cast(pl.Int32),
            _last_value("machine_id").alias("event_machine_id"),
            pl.coalesce(
                pl.col("event_type").filter(pl.col("event_type").is_in(GOOGLE_BAD_EVENTS)).last(),
                pl.col("event_type").filter(terminal).last(),
            ).alias("last_terminal"),
            pl.col("event_type").is_in(GOOGLE_START_EVENTS).any().alias("has_start_event"),
            terminal.any().alias("has_terminal_event"),
            pl.lit(True).alias("has_events"),
        )
    )


def _google_is_partial(c0: pl.Expr, c1: pl.Expr) -> pl.Expr:
    late_start = (pl.col("start_time_s") >= c0 + BIN_SECONDS) & ~pl.col("has_start_event")
    early_end = (pl.col("end_time_s") <= c1 - BIN_SECONDS) & ~pl.col("has_terminal_event")
    return (pl.col("n_usage_records") > 0) & (late_start | early_end)


def _google_workloads(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    usage = raw.get("task_usage")
    events = raw.get("task_events")
    if usage is None and events is None:
        return empty_frame(WORKLOADS).lazy()
    if usage is None:
        usage = empty_frame({"start_time_us": pl.Int64, "end_time_us": pl.Int64, "job_id": pl.Int64,
                             "task_index": pl.Int32, "machine_id": pl.Int64}).lazy()  # fmt: skip
    if events is None:
        events = empty_frame({"time_us": pl.Int64, "job_id": pl.Int64, "task_index": pl.Int32,
                              "machine_id": pl.Int64, "event_type": pl.Int8, "priority": pl.Int8,
                              "scheduling_class": pl.Int8, "cpu_request_frac": pl.Float64,
                              "mem_request_frac": pl.Float64}).lazy()  # fmt: skip
    coverage = usage.select(
        (pl.col("start_time_us").min() / US_PER_S).alias("c0"),
        (pl.col("end_time_us").max() / US_PER_S).alias("c1"),
    )
    state = pl.col("last_terminal").replace_strict(
        GOOGLE_TERMINAL_STATES, default=None, return_dtype=pl.String
    )
    return (
        _google_usage_summary(usage)
        .join(_google_event_summary(events), on=["job_id", "task_index"], how="full", coalesce=True)
        .join(coverage, how="cross")
        .with_columns(
            google_workload_id(),
            pl.lit("google2011").alias("source"),
            pl.coalesce("usage_machine_id", "event_machine_id").cast(pl.String).alias("machine_id"),
            pl.col("n_usage_records").fill_null(0),
            pl.col("has_start_event").fill_null(False),
            pl.col("has_terminal_event").fill_null(False),
            pl.when(pl.col("has_events"))
            .then(state.fill_null("running"))
            .otherwise(pl.lit("unknown"))
            .alias("final_state"),
        )
        .with_columns(_google_is_partial(pl.col("c0"), pl.col("c1")).alias("is_partial"))
    )


# alibaba2018 -----------------------------------------------------------------------------------------------


def alibaba_container_meta(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Per container: last known machine, requests, status and meta time span, plus its machine's cpu_num.

    Columns: container_id, meta_machine_id, cpu_request_centicores, mem_size_pct, status, meta_first_s,
    meta_last_s, cpu_num (null when the machine is not in machine_meta), has_meta (True).
    """
    meta = raw.get("container_meta")
    if meta is None:
        return empty_frame({"container_id": pl.String, "meta_machine_id": pl.String,
                            "cpu_request_centicores": pl.Float64, "mem_size_pct": pl.Float64,
                            "status": pl.String, "meta_first_s": pl.Int64, "meta_last_s": pl.Int64,
                            "cpu_num": pl.Int32, "has_meta": pl.Boolean}).lazy()  # fmt: skip
    per_container = (
        meta.filter(pl.col("container_id").is_not_null() & (pl.col("container_id") != ""))
        .sort("container_id", "time_s", maintain_order=True)
        .group_by("container_id")
        .agg(
            _last_value("machine_id").alias("meta_machine_id"),
            _last_value("cpu_request_centicores"),
            _last_value("mem_size_pct"),
            _last_value("status"),
            pl.col("time_s").min().alias("meta_first_s"),
            pl.col("time_s").max().alias("meta_last_s"),
            pl.lit(True).alias("has_meta"),
        )
    )
    machines = raw.get("machine_meta")
    if machines is None:
        return per_container.with_columns(pl.lit(None, pl.Int32).alias("cpu_num"))
    cpu_num = (
        machines.sort("machine_id", "time_s", maintain_order=True)
        .group_by("machine_id")
        .agg(_last_value("cpu_num").cast(pl.Int32))
        .rename({"machine_id": "meta_machine_id"})
    )
    return per_container.join(cpu_num, on="meta_machine_id", how="left")


def alibaba_usage_rows(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """container_usage with a non-empty container_id (empty-id rows belong to no workload)."""
    return raw["container_usage"].filter(
        pl.col("container_id").is_not_null() & (pl.col("container_id") != "")
    )


def _alibaba_workloads(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    meta = alibaba_container_meta(raw)
    if "container_usage" in raw:
        usage = (
            alibaba_usage_rows(raw)
            .group_by("container_id")
            .agg(
                pl.col("time_s").min().cast(pl.Float64).alias("start_time_s"),
                pl.col("time_s").max().cast(pl.Float64).alias("end_time_s"),
                pl.len().cast(pl.Int64).alias("n_usage_records"),
                pl.col("machine_id").sort_by("time_s").last().alias("usage_machine_id"),
            )
        )
    else:
        usage = empty_frame({"container_id": pl.String, "start_time_s": pl.Float64, "end_time_s": pl.Float64,
                             "n_usage_records": pl.Int64, "usage_machine_id": pl.String}).lazy()  # fmt: skip
    cpu_num = pl.col("cpu_num").fill_null(ALIBABA_DEFAULT_CPU_NUM)
    has_meta = pl.col("has_meta").fill_null(False)
    return usage.join(meta, on="container_id", how="full", coalesce=True).with_columns(
        pl.lit("alibaba2018").alias("source"),
        pl.col("container_id").alias("workload_id"),
        pl.coalesce("meta_machine_id", "usage_machine_id").alias("machine_id"),
        pl.col("n_usage_records").fill_null(0),
        (pl.col("cpu_request_centicores") / 100 / cpu_num).alias("cpu_request_frac"),
        (pl.col("mem_size_pct") / 100).alias("mem_request_frac"),
        pl.lit(None, pl.Int32).alias("priority"),
        pl.lit(None, pl.Int32).alias("scheduling_class"),
        pl.col("status")
        .replace_strict(ALIBABA_STATES, default="unknown", return_dtype=pl.String)
        .alias("final_state"),
        ((pl.col("n_usage_records").fill_null(0) > 0) & ~has_meta).alias("is_partial"),
    )


# google2011_derived ----------------------------------------------------------------------------------------


def _derived_workloads(raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    from pipelines.usage import derived_usage_rows  # usage builds on this module; import late

    rows = derived_usage_rows(raw)
    return (
        rows.group_by("workload_id")
        .agg(
            pl.col("bin_start_s").min().cast(pl.Float64).alias("start_time_s"),
            (pl.col("bin_start_s").max() + BIN_SECONDS).cast(pl.Float64).alias("end_time_s"),
            pl.len().cast(pl.Int64).alias("n_usage_records"),
        )
        .with_columns(
            pl.lit("google2011_derived").alias("source"),
            pl.lit(None, pl.String).alias("machine_id"),
            pl.lit(None, pl.Float64).alias("cpu_request_frac"),
            pl.lit(None, pl.Float64).alias("mem_request_frac"),
            pl.lit(None, pl.Int32).alias("priority"),
            pl.lit(None, pl.Int32).alias("scheduling_class"),
            pl.lit("running").alias("final_state"),
            pl.lit(False).alias("is_partial"),
        )
    )


WORKLOAD_BUILDERS = {
    "google2011": _google_workloads,
    "alibaba2018": _alibaba_workloads,
    "google2011_derived": _derived_workloads,
}
"""source -> raw tables -> LazyFrame with (at least) the WORKLOADS columns."""


def scan_workloads(source: str, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
    """Lazy plan of the WORKLOADS table of `source`, sorted by workload_id."""
    if source not in WORKLOAD_BUILDERS:
        raise ValueError(f"unknown source {source!r}; known: {sorted(WORKLOAD_BUILDERS)}")
    lf = WORKLOAD_BUILDERS[source](raw)
    return lf.select([pl.col(c).cast(t) for c, t in WORKLOADS.items()]).sort("workload_id")


def build_workloads(source: str, raw: dict[str, pl.LazyFrame]) -> pl.DataFrame:
    """The WORKLOADS table of `source` (one row per workload; see the module docstring for the rules)."""
    df = scan_workloads(source, raw).collect(engine="streaming")
    return check_schema(df, WORKLOADS, f"{source} workloads")
