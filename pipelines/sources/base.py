"""Shared machinery of the trace sources: the source protocol, streamed line chunks, vectorised CSV parsing.

A trace file (plain, gzip, or a member of a tar.gz) is read in chunks of whole lines, never whole;
each chunk is parsed with polars into the raw schema, and rows that cannot be trusted are set aside
in a quarantine frame (`pipelines.schemas.QUARANTINE`) with their 1-based line number and a reason.
"""

from __future__ import annotations

import gzip
import inspect
import io
import queue
import re
import tarfile
import threading
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

import numpy as np
import polars as pl

from pipelines.schemas import QUARANTINE
from pipelines.sources.mapping import LongRunningRule, UsageMapping

DEFAULT_BATCH_BYTES = 64 << 20
"""Uncompressed bytes per chunk: bounds peak memory (a few times this) whatever the file size."""

MAX_BAD_FIELD_FRACTION = 0.5
"""A first chunk with more than this fraction of wrong-field-count lines is a wrong file, not bad rows."""

_DECODE_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error, tarfile.TarError, OSError)


class IngestError(Exception):
    """A whole file cannot be ingested (missing, empty, not gzip, truncated, wrong format)."""

    def __init__(self, path: Path | str, message: str):
        self.path = Path(path)
        self.message = message
        super().__init__(f"{path}: {message}")


@dataclass(frozen=True)
class ParsedBatch:
    """One parsed chunk: good rows in exactly the raw schema, set-aside rows in QUARANTINE."""

    rows: pl.DataFrame
    quarantine: pl.DataFrame
    n_lines: int  # input lines (records) this chunk covered: rows + quarantine
    n_invalid_markers: int = 0  # documented invalid values (Alibaba -1/101) turned into null


class TraceSource(Protocol):
    """A public trace: the one place that knows it. Where its files are and how to parse them (raw tables),
    and how its raw tables map to the canonical `workloads` and 5-minute `usage` tables."""

    name: str
    """registry key and Dagster partition key of the canonical tables."""
    folder: str
    """sub-folder of the trace directory holding the genuine files."""
    tables: tuple[str, ...]
    """raw table names (one raw asset each)."""
    schemas: dict[str, dict[str, pl.DataType]]
    """raw table -> polars schema (units in the column names)."""
    column_docs: dict[str, dict[str, str]]
    """raw table -> column -> what it holds (units, codes, null meaning): every column of `schemas`, the
    descriptions the Dagster UI shows for the raw tables (`pipelines.column_docs`)."""
    usage: UsageMapping
    """how the raw tables become binned 5-minute usage (streamed in time chunks by `pipelines.usage`)."""
    long_running: LongRunningRule
    """the trace's long-running threshold (the default of `pipelines.long_running.LongRunningConfig`)."""

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Input partitions of `table` under `root`: partition key -> path (a file, or a folder of files)."""
        ...

    def iter_batches(self, table: str, path: Path, batch_bytes: int) -> Iterator[ParsedBatch]:
        """Parsed batches of one input partition (streamed), rows in `schemas[table]`."""
        ...

    def workloads(self, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
        """raw tables (missing ones absent) -> lazy frame with (at least) the WORKLOADS columns."""
        ...


@dataclass(frozen=True)
class CsvTable:
    """How to read and check one headerless CSV table of a trace."""

    source: str
    table: str
    schema: dict[str, pl.DataType]  # the raw schema (output columns, in file order)
    mandatory: tuple[str, ...] = ()  # empty value -> quarantine "empty <col>"
    non_negative: tuple[str, ...] = ()  # negative value -> quarantine (shorthand for a range (0, None))
    ranges: Mapping[str, tuple[float | None, float | None]] = field(default_factory=dict)
    """column -> closed valid range (lo, hi), None = unbounded on that side; a value outside -> quarantine.
    Every float column (as read) must also be finite: NaN and +-inf are quarantined wherever they appear."""
    invalid_markers: tuple[str, ...] = ()  # columns where -1 / 101 mean "invalid" -> null, counted
    order_keys: tuple[str, ...] = ()  # workload key for the time-order check (empty: no check)
    order_time: str | None = None  # time column that must not go backwards within a workload
    parse_as: dict[str, pl.DataType] = field(default_factory=dict)  # read dtype when it differs
    separator: str = ","

    @property
    def read_schema(self) -> dict[str, pl.DataType]:
        return {c: self.parse_as.get(c, t) for c, t in self.schema.items()}

    @property
    def valid_ranges(self) -> dict[str, tuple[float | None, float | None]]:
        """column -> its declared valid range (`ranges`, else (0, None) for a `non_negative` column)."""
        out: dict[str, tuple[float | None, float | None]] = dict.fromkeys(self.non_negative, (0, None))
        out.update(self.ranges)
        return out

    def undeclared_columns(self) -> list[str]:
        """Numeric columns with no declared valid range (each source declares one for every numeric column)."""
        ranges = self.valid_ranges
        return [c for c, t in self.read_schema.items() if t.is_numeric() and c not in ranges]


ORDER_STATE_MERGE_ROWS = 1_000_000
"""Fold the per-chunk order-check maxima once they hold this many rows (bounds memory)."""

INVALID_MARKER_VALUES = (-1.0, 101.0)
"""Alibaba 2018: "normalised values rescaled to [0,100]; invalid values are -1 or 101" (trace_2018.md)."""


def check_table(source: TraceSource, table: str) -> None:
    """Raise `IngestError` naming the source's tables when `table` is not one of them."""
    if table not in source.tables:
        raise IngestError(table, f"unknown {source.name} table {table!r}; known: {', '.join(source.tables)}")


def list_shards(
    source: TraceSource, table: str, folder: Path, matches: Callable[[str], bool]
) -> dict[str, Path]:
    """Shard files of `table` in `folder` whose names `matches`: file name -> path, sorted by name. An unknown
    table raises `IngestError`; a missing folder has no shards."""
    check_table(source, table)
    if not folder.is_dir():
        return {}
    return {p.name: p for p in sorted(folder.iterdir()) if p.is_file() and matches(p.name)}


# ---------------------------------------------------------------- files no table reads

COMPANION_FILE = re.compile(
    r"\..*|.*\.(md|rst|txt|pdf|html?)|(readme|licen[cs]e|notice|sha256sums?|md5sums?)(\..*)?", re.IGNORECASE
)
"""Names that are documentation or checksums beside the data (hidden files, `*.md`, `README`, `SHA256SUM`,
...): not data, so not reported as unread. A source may name more in an optional `companion_files` attribute
(a tuple of exact file names)."""


def expected_files(source: TraceSource) -> dict[str, str]:
    """Table -> the names and layout its files must have, from the source's optional `expected_files`
    attribute, else the first line of its `discover` docstring."""
    given = getattr(source, "expected_files", None)
    if given:
        return dict(given)
    doc = (inspect.getdoc(type(source).discover) or "").splitlines()
    return dict.fromkeys(source.tables, doc[0] if doc else "see the source module's docstring")


def find_unread_files(source: TraceSource, root: Path) -> list[Path]:
    """Files and folders under `<root>/<source.folder>/` that no table of `source` reads: not a shard that
    `discover` returns, not inside one (a shard folder's own files are the source's to read or quarantine),
    not a documentation or checksum file (`COMPANION_FILE`, the source's `companion_files`). A folder holding
    no shard is listed once, not file by file; empty folders are not listed. Sorted by path."""
    folder = Path(root) / source.folder
    if not folder.is_dir():
        return []
    read = {p.resolve() for t in source.tables for p in source.discover(Path(root), t).values()}
    companions = set(getattr(source, "companion_files", ()))
    unread: list[Path] = []

    def visit(d: Path) -> None:
        for p in sorted(d.iterdir()):
            rp = p.resolve()
            if rp in read or COMPANION_FILE.fullmatch(p.name) or p.name in companions:
                continue
            if p.is_dir():
                if any(r.is_relative_to(rp) for r in read):
                    visit(p)
                elif any(f.is_file() for f in p.rglob("*")):
                    unread.append(p)
            else:
                unread.append(p)

    visit(folder)
    return unread


def describe_unread_files(source: TraceSource, root: Path, unread: list[Path]) -> str:
    """One line naming the unread files (at most 10, then a count) and the names each table expects."""
    folder = Path(root) / source.folder
    names = [str(p.relative_to(folder)) + ("/" if p.is_dir() else "") for p in unread]
    shown = ", ".join(names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
    by_how: dict[str, list[str]] = {}
    for table, how in expected_files(source).items():
        by_how.setdefault(how, []).append(table)
    expected = "; ".join(f"{', '.join(tables)}: {how}" for how, tables in by_how.items())
    return (
        f"{source.name}: {len(unread)} file(s) in {folder} match no table and are not read: {shown}. "
        f"Expected names: {expected}"
    )


def find_foreign_entries(root: Path, sources: Iterable[TraceSource]) -> list[Path]:
    """Entries directly under the trace folder that are no source's folder (a trace file put there instead of
    in its source's folder, a folder of another trace), documentation and checksums aside. Sorted."""
    root = Path(root)
    if not root.is_dir():
        return []
    folders = {s.folder for s in sources}
    return [
        p for p in sorted(root.iterdir()) if p.name not in folders and not COMPANION_FILE.fullmatch(p.name)
    ]


def unread_file_warnings(
    root: Path, sources: Iterable[TraceSource], selected: Collection[str] | None = None
) -> list[str]:
    """Warning lines for everything under the trace folder that no table reads: one line for entries beside
    the folders of `sources` (all registered sources: `find_foreign_entries`), and one per source named in
    `selected` (default: all) with files in its folder that no table reads (`find_unread_files`), each line
    naming what is expected. Empty when everything is read."""
    sources = list(sources)
    out = []
    foreign = find_foreign_entries(root, sources)
    if foreign:
        names = ", ".join(p.name + ("/" if p.is_dir() else "") for p in foreign)
        expected = ", ".join(f"{s.folder}/ ({s.name})" for s in sources)
        out.append(
            f"{len(foreign)} entries in {root} are no source's folder and are not read: {names}. "
            f"Expected folders: {expected}"
        )
    for source in sources:
        if selected is not None and source.name not in selected:
            continue
        unread = find_unread_files(source, root)
        if unread:
            out.append(describe_unread_files(source, root, unread))
    return out


def empty_quarantine() -> pl.DataFrame:
    return pl.DataFrame(schema=QUARANTINE)


# ---------------------------------------------------------------- opening files


@contextmanager
def open_stream(path: Path, member: Callable[[str], bool] | None = None) -> Iterator[IO[bytes]]:
    """Open a plain, gzip or tar.gz file for streamed binary reads; `member` picks the tar member."""
    if not path.is_file():
        raise IngestError(path, "file not found")
    if path.stat().st_size == 0:
        raise IngestError(path, "empty file")
    name = path.name
    if name.endswith((".tar.gz", ".tgz", ".tar")):
        with _open_tar_member(path, member) as f:
            yield f
        return
    if name.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            yield f  # type: ignore[misc]
        return
    with open(path, "rb") as f:
        yield f


@contextmanager
def _open_tar_member(path: Path, member: Callable[[str], bool] | None) -> Iterator[IO[bytes]]:
    """Stream the first regular member of a tar(.gz) that `member` accepts (no random access needed)."""
    try:
        tar = tarfile.open(path, "r|*")
    except _DECODE_ERRORS as e:
        raise IngestError(path, f"cannot read tar archive: {e}") from e
    with tar:
        f = None
        try:
            for info in tar:
                if info.isfile() and (member is None or member(info.name)):
                    f = tar.extractfile(info)
                    break
        except _DECODE_ERRORS as e:
            raise IngestError(path, f"cannot read tar archive: {e}") from e
        if f is None:
            raise IngestError(path, "no matching member in tar archive")
        yield f


def read_or_raise(path: Path, f: IO[bytes], n: int) -> bytes:
    """`f.read(n)` with decoding errors (bad or truncated gzip) turned into IngestError."""
    try:
        return f.read(n)
    except _DECODE_ERRORS as e:
        raise IngestError(path, f"cannot decompress: {e}") from e


def iter_line_chunks(path: Path, f: IO[bytes], batch_bytes: int) -> Iterator[bytes]:
    """Chunks of about `batch_bytes` bytes that end at a line end (the last one gets a '\\n' added)."""
    carry = b""
    while True:
        data = read_or_raise(path, f, batch_bytes)
        if not data:
            if carry:
                yield carry if carry.endswith(b"\n") else carry + b"\n"
            return
        buf = carry + data if carry else data
        cut = buf.rfind(b"\n")
        if cut < 0:
            carry = buf  # a line longer than the chunk: keep reading
            continue
        carry = buf[cut + 1 :]
        yield buf[: cut + 1]


def prefetch(it: Iterator, depth: int = 1) -> Iterator:
    """Run `it` in a thread, `depth` items ahead, so decompression overlaps parsing (zlib frees the GIL)."""
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    done = object()

    def produce() -> None:
        try:
            for item in it:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put((done, None))
        except BaseException as e:  # handed to the consumer, re-raised there
            q.put((done, e))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    try:
        while True:
            item, err = q.get()
            if item is done:
                if err is not None:
                    raise err
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get(timeout=0.1)
            except queue.Empty:
                pass
        thread.join()


# ---------------------------------------------------------------- parsing one chunk


def line_bounds(chunk: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (exclusive, without '\\n') byte offsets of every line of a chunk ending in '\\n'."""
    arr = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(arr == 10)
    starts = np.empty_like(ends)
    starts[0:1] = 0
    starts[1:] = ends[:-1] + 1
    return starts, ends


def count_bytes(chunk: bytes, sep: str) -> tuple[int, int]:
    """(number of '\n', number of separators) in a chunk; numpy releases the GIL for this."""
    arr = np.frombuffer(chunk, dtype=np.uint8)
    return int(np.count_nonzero(arr == 10)), int(np.count_nonzero(arr == ord(sep)))


def raw_lines(chunk: bytes, starts: np.ndarray, ends: np.ndarray, idx: np.ndarray) -> list[str]:
    """The text of the lines at positions `idx` (for quarantine rows); bytes that are not UTF-8 are written as
    `\\xNN` escapes, so the quarantine shows them as they are in the file."""
    return [chunk[starts[i] : ends[i]].decode("utf-8", "backslashreplace").rstrip("\r") for i in idx]


def invalid_utf8_lines(chunk: bytes, starts: np.ndarray, ends: np.ndarray) -> dict[int, str]:
    """Line index -> reason (byte position in the line, offending bytes) for each line of the chunk that is not
    valid UTF-8. One C-speed decode proves a clean chunk; otherwise only lines holding a byte >= 0x80 are
    decoded one by one."""
    try:
        chunk.decode("utf-8")
        return {}
    except UnicodeDecodeError:
        pass
    high = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) >= 0x80)
    out = {}
    for i in np.unique(np.searchsorted(ends, high)):  # the line of a byte: the first line end at or after it
        line = chunk[starts[i] : ends[i]]
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            out[int(i)] = f"invalid UTF-8: {line[e.start : e.end]!r} at byte {e.start + 1}"
    return out


def field_counts(chunk: bytes, starts: np.ndarray, ends: np.ndarray, sep: int) -> np.ndarray:
    """Number of separator-delimited fields on each line."""
    arr = np.frombuffer(chunk, dtype=np.uint8)
    seps = np.flatnonzero(arr == sep)
    return np.searchsorted(seps, ends) - np.searchsorted(seps, starts) + 1


def keep_lines(chunk: bytes, starts: np.ndarray, ends: np.ndarray, keep: np.ndarray) -> bytes:
    """A new buffer holding only the lines where `keep` is True (vectorised byte mask)."""
    arr = np.frombuffer(chunk, dtype=np.uint8)
    lengths = ends - starts + 1
    mask = np.repeat(keep, lengths)
    return arr[mask].tobytes()


def quarantine_frame(source: str, table: str, source_file: str, line_numbers, reasons, lines) -> pl.DataFrame:
    n = len(reasons)
    return pl.DataFrame(
        {
            "source": [source] * n,
            "table": [table] * n,
            "source_file": [source_file] * n,
            "line_number": np.asarray(line_numbers, dtype=np.int64),
            "reason": list(reasons),
            "raw_line": list(lines),
        },
        schema=QUARANTINE,
    )


def _read(buf: bytes, schema: dict[str, pl.DataType], sep: str) -> pl.DataFrame:
    return pl.read_csv(
        io.BytesIO(buf),
        has_header=False,
        new_columns=list(schema),
        schema=schema,
        separator=sep,
        quote_char=None,
    )


def _cast_strings(df: pl.DataFrame, spec: CsvTable) -> tuple[pl.DataFrame, pl.Series]:
    """Cast an all-String frame to the read schema; returns it and a reason per row (null = parsed)."""
    exprs, reasons = [], []
    for col, dtype in spec.read_schema.items():
        if dtype == pl.String:
            exprs.append(pl.col(col))
            continue
        raw = pl.col(col).str.strip_chars()
        cast = raw.cast(dtype, strict=False)
        failed = raw.is_not_null() & (raw != "") & cast.is_null()
        exprs.append(pl.when(raw == "").then(None).otherwise(cast).alias(col))
        reasons.append(pl.when(failed).then(pl.format(f"unparsable {col}: '{{}}'", pl.col(col))))
    out = df.select(exprs)
    reason = df.select(pl.coalesce(reasons).alias("r"))["r"] if reasons else pl.Series("r", [None] * len(df))
    return out, reason


def row_conditions(spec: CsvTable, with_values: bool = True) -> list[tuple[pl.Expr, pl.Expr]]:
    """(is bad, reason) per row check of a table, in the order reasons are reported: empty mandatory fields,
    non-finite floats, values outside their declared range, malformed flags and integers. `with_values=False`:
    only the checks that are not about a value's range (flags and integers read as floats)."""
    conds = [(pl.col(c).is_null(), pl.lit(f"empty {c}")) for c in spec.mandatory] if with_values else []
    for c, dtype in (spec.read_schema if with_values else {}).items():
        if dtype.is_float():
            conds.append(
                (~pl.col(c).is_finite().fill_null(True), pl.format(f"non-finite {c}: {{}}", pl.col(c)))
            )
    for c, (lo, hi) in (spec.valid_ranges if with_values else {}).items():
        marker = pl.col(c).is_in(INVALID_MARKER_VALUES) if c in spec.invalid_markers else pl.lit(False)
        if lo is not None:
            what = f"negative {c}" if lo == 0 else f"{c} below {lo:g}"
            below = ((pl.col(c) < lo) & ~marker).fill_null(False)
            conds.append((below, pl.format(f"{what}: {{}}", pl.col(c))))
        if hi is not None:
            above = ((pl.col(c) > hi) & ~marker).fill_null(False)
            conds.append((above, pl.format(f"{c} out of range [{_fmt(lo)}, {hi:g}]: {{}}", pl.col(c))))
    for c, dtype in spec.schema.items():
        if spec.read_schema[c] == dtype:
            continue
        if dtype == pl.Boolean:
            not_flag = ~pl.col(c).is_in([0, 1]).fill_null(True)
            conds.append((not_flag, pl.format(f"{c} is not a 0/1 flag: {{}}", pl.col(c))))
        if dtype.is_integer():
            not_int = (pl.col(c) != pl.col(c).round()).fill_null(False)
            conds.append((not_int, pl.format(f"non-integer {c}: {{}}", pl.col(c))))
            low = float(np.iinfo(_NUMPY_INT[dtype]).min)
            # valid: min <= x < max + 1 = -min (exact in float, unlike max itself for int64)
            wide = ((pl.col(c) < low) | (pl.col(c) >= -low)).fill_null(False)
            conds.append((wide, pl.format(f"{c} does not fit {dtype}: {{}}", pl.col(c))))
    return conds


def any_bad_row(spec: CsvTable) -> pl.Expr:
    """True for every row that one of `row_conditions` would set aside (and maybe a few more): one comparison
    per numeric column instead of one per check, so that a clean chunk, the common case, is proven clean cheaply;
    the reasons are worked out only for a chunk where this finds something."""
    quick = [pl.col(c).is_null() for c in spec.mandatory]
    ranges = spec.valid_ranges
    for c, dtype in spec.read_schema.items():
        if not dtype.is_numeric():
            continue
        lo, hi = ranges.get(c, (None, None))
        bounded = lo is not None and hi is not None
        if bounded:
            ok = pl.col(c).is_between(lo, hi)  # false for NaN and +-inf too
        elif dtype.is_float():
            ok = pl.col(c).is_finite()
            ok = ok if lo is None else ok & (pl.col(c) >= lo)
            ok = ok if hi is None else ok & (pl.col(c) <= hi)
        elif lo is not None or hi is not None:
            ok = (pl.col(c) >= lo) if lo is not None else (pl.col(c) <= hi)
        else:
            continue
        if c in spec.invalid_markers:
            ok = ok | pl.col(c).is_in(INVALID_MARKER_VALUES)
        quick.append(~ok.fill_null(True))
    rest = [bad for bad, _ in row_conditions(spec, with_values=False)]
    return pl.any_horizontal(quick + rest) if quick or rest else pl.lit(False)


class CsvChunkParser:
    """Stateful parser of one file's chunks (state: last time per workload for the order check)."""

    def __init__(self, spec: CsvTable, source_file: str, path: Path, *, keep_line_numbers: bool = False):
        self.spec = spec
        self.keep_line_numbers = keep_line_numbers
        self.last_line_numbers: np.ndarray = np.empty(0, dtype=np.int64)  # of the last batch's rows
        self.source_file = source_file
        self.path = path
        self.lines_done = 0
        self._pending: list[pl.DataFrame] = []  # per-chunk (key, max time) frames, folded lazily
        self.conditions = row_conditions(spec)
        self.any_bad = any_bad_row(spec)
        self.state_max: int | None = None  # largest time seen so far in this file

    def parse(self, chunk: bytes, counts: tuple[int, int] | None = None) -> ParsedBatch:
        """Parse one chunk of whole lines; `counts` = (newlines, separators) if already known."""
        spec, ncols = self.spec, len(self.spec.schema)
        n_lines, n_seps = counts if counts is not None else count_bytes(chunk, spec.separator)
        first_line = self.lines_done + 1
        self.lines_done += n_lines
        df, idx, qparts, bounds = None, None, [], None
        if n_seps == n_lines * (ncols - 1):
            try:
                df = _read(chunk, spec.read_schema, spec.separator)
            except pl.exceptions.PolarsError:
                df = None
            if df is not None and df.height != n_lines:
                df = None
        if df is None:  # slow path: per-line field counts, then parse as strings and cast
            bounds = line_bounds(chunk)
            df, idx, qparts = self._parse_slow(chunk, bounds, first_line)
        df, reasons = self._check(df)
        bad = reasons.is_not_null()
        if bad.any():
            bad_pos = np.flatnonzero(bad.to_numpy())
            lines_idx = bad_pos if idx is None else idx[bad_pos]
            if bounds is None:
                bounds = line_bounds(chunk)
            qparts.append(
                quarantine_frame(
                    spec.source,
                    spec.table,
                    self.source_file,
                    lines_idx + first_line,
                    reasons.filter(bad).to_list(),
                    raw_lines(chunk, *bounds, lines_idx),
                )
            )
            df = df.filter(~bad)
        if self.keep_line_numbers:
            kept = np.arange(n_lines) if idx is None else idx
            if bad.any():
                kept = kept[~bad.to_numpy()]
            self.last_line_numbers = kept + first_line
        df, n_markers = self._null_markers(df)
        quarantine = pl.concat(qparts) if qparts else empty_quarantine()
        if quarantine.height:
            quarantine = quarantine.sort("line_number")
        rows = df.select([pl.col(c).cast(t) for c, t in spec.schema.items()])
        return ParsedBatch(rows, quarantine, n_lines, n_markers)

    def _parse_slow(self, chunk: bytes, bounds, first_line: int):
        spec, ncols = self.spec, len(self.spec.schema)
        starts, ends = bounds
        counts = field_counts(chunk, starts, ends, spec.separator.encode()[0])
        # a bare '\n' (blank line) has one "field": count it as wrong too
        good = (counts == ncols) & (ends > starts)
        n_bad = int((~good).sum())
        if first_line == 1 and n_bad > MAX_BAD_FIELD_FRACTION * len(starts):
            raise IngestError(
                self.path,
                f"{n_bad} of the first {len(starts)} lines do not have {ncols} fields: "
                f"not a {spec.source} {spec.table} file? (line 1: {raw_lines(chunk, starts, ends, [0])[0][:200]!r})",
            )
        qparts = []
        if n_bad:
            bad_idx = np.flatnonzero(~good)
            reasons = [f"wrong field count: {counts[i]} fields, expected {ncols}" for i in bad_idx]
            qparts.append(
                quarantine_frame(
                    spec.source,
                    spec.table,
                    self.source_file,
                    bad_idx + first_line,
                    reasons,
                    raw_lines(chunk, starts, ends, bad_idx),
                )
            )
        undecodable = {i: r for i, r in invalid_utf8_lines(chunk, starts, ends).items() if good[i]}
        if undecodable:
            bad_idx = np.fromiter(undecodable, dtype=np.int64)
            good[bad_idx] = False
            n_bad += len(bad_idx)
            qparts.append(
                quarantine_frame(
                    spec.source,
                    spec.table,
                    self.source_file,
                    bad_idx + first_line,
                    list(undecodable.values()),
                    raw_lines(chunk, starts, ends, bad_idx),
                )
            )
        idx = np.flatnonzero(good)
        buf = keep_lines(chunk, starts, ends, good) if n_bad else chunk
        if len(idx) == 0:
            return pl.DataFrame(schema=spec.read_schema), idx, qparts
        strings = _read(buf, dict.fromkeys(spec.schema, pl.String), spec.separator)
        df, reason = _cast_strings(strings, spec)
        bad = reason.is_not_null()
        if bad.any():
            pos = np.flatnonzero(bad.to_numpy())
            qparts.append(
                quarantine_frame(
                    spec.source,
                    spec.table,
                    self.source_file,
                    idx[pos] + first_line,
                    reason.filter(bad).to_list(),
                    raw_lines(chunk, starts, ends, idx[pos]),
                )
            )
            df, idx = df.filter(~bad), idx[~bad.to_numpy()]
        return df, idx, qparts

    def _check(self, df: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
        """Row checks on typed values; returns the frame (maybe with derived columns) and a reason per row."""
        spec, conds = self.spec, self.conditions
        reason = pl.Series("r", [None] * df.height, dtype=pl.String)
        if conds:
            any_bad = df.select(self.any_bad.alias("b"))["b"]
            if any_bad.any():
                reason = df.select(pl.coalesce([pl.when(c).then(r) for c, r in conds]).alias("r"))["r"]
        if spec.order_time is not None:
            reason = self._check_order(df, reason)
        return df, reason

    def _check_order(self, df: pl.DataFrame, reason: pl.Series) -> pl.Series:
        """Quarantine rows whose time goes backwards for the same workload (within this file).

        A row is late when its time is below the largest earlier time of its workload. Cheap tests
        prove most chunks clean (time sorted; or each workload a sorted contiguous run; and nothing
        below the file's running maximum); the exact windowed test runs only when they fail.
        """
        keys, t = list(self.spec.order_keys), self.spec.order_time
        frame = df.select([*keys, t]).with_columns(
            reason.alias("_r"), pl.when(reason.is_null()).then(pl.col(t)).alias("_t")
        )
        valid = frame.filter(pl.col("_t").is_not_null())
        lo, hi = valid["_t"].min(), valid["_t"].max()
        within = not _is_ordered_per_key(valid, keys)
        cross = self.state_max is not None and lo is not None and lo < self.state_max
        out = reason
        if within or cross:
            dtype = frame["_t"].dtype
            prev = (
                pl.col("_t").cum_max().forward_fill().shift(1).over(keys) if within else pl.lit(None, dtype)
            )
            frame = frame.with_columns(prev.cast(dtype).alias("_prev"))
            if cross:
                frame = frame.join(
                    self._merged_state(), on=keys, how="left", maintain_order="left", nulls_equal=True
                )
                frame = frame.with_columns(pl.max_horizontal("_prev", "_state").alias("_prev"))
            late = (pl.col("_t") < pl.col("_prev")).fill_null(False)
            msg = pl.format(
                f"{t} goes backwards for ({', '.join(keys)}): {{}} after {{}}", pl.col(t), pl.col("_prev")
            )
            out = frame.select(pl.when(late).then(msg).otherwise(pl.col("_r")).alias("r"))["r"]
        if hi is not None:
            self._pending.append(valid.group_by(keys).agg(pl.col("_t").max().alias("_state")))
            self.state_max = hi if self.state_max is None else max(self.state_max, hi)
            if sum(p.height for p in self._pending) > ORDER_STATE_MERGE_ROWS:
                self._merged_state()
        return out

    def _merged_state(self) -> pl.DataFrame:
        """Largest time so far per workload key (pending per-chunk maxima folded in)."""
        if len(self._pending) > 1:
            self._pending = [
                pl.concat(self._pending).group_by(list(self.spec.order_keys)).agg(pl.col("_state").max())
            ]
        return self._pending[0]

    def _null_markers(self, df: pl.DataFrame) -> tuple[pl.DataFrame, int]:
        cols = self.spec.invalid_markers
        if not cols or df.height == 0:
            return df, 0
        counts = df.select([pl.col(c).is_in(INVALID_MARKER_VALUES).sum().alias(c) for c in cols]).row(0)
        n = int(sum(counts))
        if n:
            df = df.with_columns(
                [
                    pl.when(pl.col(c).is_in(INVALID_MARKER_VALUES)).then(None).otherwise(pl.col(c)).alias(c)
                    for c in cols
                ]
            )
        return df, n


_NUMPY_INT = {pl.Int8: np.int8, pl.Int16: np.int16, pl.Int32: np.int32, pl.Int64: np.int64}


def _fmt(bound: float | None) -> str:
    return "-inf" if bound is None else f"{bound:g}"


def _is_ordered_per_key(frame: pl.DataFrame, keys: list[str]) -> bool:
    """True when no row's `_t` is below an earlier `_t` of the same key (cheap sufficient tests first)."""
    t = frame["_t"]
    if t.is_sorted():
        return True
    same = pl.all_horizontal([pl.col(k) == pl.col(k).shift(1) for k in keys]).fill_null(False)
    drop = same & (pl.col("_t") < pl.col("_t").shift(1))
    runs_ok = frame.select(
        drop.any().alias("drop"), (~same).sum().alias("runs"), pl.struct(keys).n_unique().alias("n")
    ).row(0)
    if not runs_ok[0] and runs_ok[1] == runs_ok[2]:
        return True  # each key is one contiguous, sorted run
    s = frame.sort(keys, maintain_order=True)
    return not s.select(drop.any()).item()


def iter_csv_batches(
    spec: CsvTable,
    path: Path,
    batch_bytes: int,
    member: Callable[[str], bool] | None = None,
) -> Iterator[ParsedBatch]:
    """Stream a CSV table file (plain / gzip / tar member) as parsed batches."""
    parser = CsvChunkParser(spec, path.name, path)
    n_chunks = 0
    with open_stream(path, member) as f:
        # decompression and byte counting run one chunk ahead, in a thread
        counted = ((c, count_bytes(c, spec.separator)) for c in iter_line_chunks(path, f, batch_bytes))
        chunks = prefetch(counted)
        try:
            for chunk, counts in chunks:
                n_chunks += 1
                yield parser.parse(chunk, counts)
        finally:
            chunks.close()
    if n_chunks == 0:
        raise IngestError(path, "empty file (no lines after decompression)")
