"""Bitbrains GWA-T-12 (Shen, van Beek, Iosup, CCGrid 2015): per-VM performance series of a managed-hosting provider.

Genuine layout under `<root>/bitbrains-gwa-t-12/`: a folder per set (`rnd/`: 500 VMs, three months;
`fastStorage/`: 1,250 VMs, one month) with month sub-folders (`2013-7/`) of one file per VM (`<vm>.csv`, also
`.csv.gz`), or the original archives `rnd.zip` / `fastStorage.zip` holding the same folders, read in place (the
zip's central directory gives each member; members are decompressed as streams, nothing is unpacked to disk).
When a set's folder and its zip are both present the folder is read and the zip ignored (it is its archive).

One raw table, `vm_usage`; one partition per month folder (`rnd_2013-7`), per set folder without months, or per
zip (`rnd.zip`). A file: a header line, then one sample per line, fields separated by `;` and a TAB:
`Timestamp [ms]; CPU cores; CPU capacity provisioned [MHZ]; CPU usage [MHZ]; CPU usage [%]; Memory capacity
provisioned [KB]; Memory usage [KB]; Disk read throughput [KB/s]; Disk write throughput [KB/s]; Network received
throughput [KB/s]; Network transmitted throughput [KB/s]`. Quirks kept in mind:
  * the `[ms]` timestamp is Unix epoch SECONDS (2013-06-30 ... 2013-09-29): the raw column is `timestamp_s`;
  * numbers may be in E notation (`1.6703488E7`), read as floats; cores and timestamps must be whole numbers;
  * memory usage is 0 for whole stretches of some VMs (not measured): kept as 0, counted (`rows_mem_zero`);
  * provisioned capacity (cores, MHz, KB) can change between samples (resizing): kept per row.
Bad input: a row with the wrong field count, an unparsable or non-integer number, a negative value, or a
timestamp going backwards within a VM goes to the quarantine with file, line and reason (`raw_line` as in the
file). The TAB after each `;` needs no rewriting: numbers are parsed with leading blanks allowed. Files are judged
one by one: a VM file that is empty, has no data row, has another header, or cannot be decompressed (truncated
gzip, corrupt zip member) is quarantined whole, as one quarantine row (line 1 and the header when the header is
at fault, else line 0) counted as one input record, and the other VM files of its partition are ingested. Only a
partition that cannot be listed (a zip whose directory is unreadable, a folder without VM files) fails whole.

Canonical mapping:
  * Workload = VM, `workload_id = "<set>/<vm>"` (e.g. `rnd/14`): the same VM across months is one workload.
  * `start_time_s` / `end_time_s` = first sample time / last sample time + 300 s (the sampling interval);
    `n_usage_records` = raw rows. No machine (hosts are not in the trace), priority or class;
    `final_state = "running"` (services, no lifecycle events), never partial (nothing marks a VM as cut;
    gaps are left to the long-running rule).
  * Requests = what the VM was provisioned, at its largest over the series (a resized VM must fit at its
    largest): `cpu_request_frac = max cpu_capacity_mhz / reference_cpu_mhz`,
    `mem_request_frac = max mem_capacity_kb / reference_mem_kb`.
  * Usage: t = timestamp_s; the samples of a bin are averaged with equal weights, `n_samples` = samples;
    `cpu_frac = cpu_usage_mhz / reference_cpu_mhz`, `mem_frac = mem_usage_kb / reference_mem_kb`, i.e.
    fractions of the reference machine (`BitbrainsConfig`).
  * Long-running: 6000 contiguous 5-minute bins (TVW-RL's Google rule: VMs are sampled every 5 minutes like
    Google's usage windows). Measured on the 84 shared rnd VMs: a single missed sample leaves an empty bin and
    breaks a run, so with no gap filling 5 VMs pass (longest runs 2,954-8,352 bins); filling gaps of one bin
    (hold) 52 pass (runs 5,506-8,640, median 6,447), of two bins all 84. Runs end at the month boundaries
    (gaps of about a day).
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pipelines.schemas import WORKLOADS, empty_frame
from pipelines.sources.base import (
    _DECODE_ERRORS,
    DEFAULT_BATCH_BYTES,
    CsvChunkParser,
    CsvTable,
    IngestError,
    ParsedBatch,
    check_table,
    empty_quarantine,
    iter_line_chunks,
    open_stream,
    prefetch,
    quarantine_frame,
)
from pipelines.sources.mapping import (
    LongRunningRule,
    TimeChunks,
    UsageMapping,
    bad_reason,
    bin_start,
    count_reasons,
    counts_frame,
    mean_per_bin,
)

NAME = "bitbrains"
FOLDER = "bitbrains-gwa-t-12"
TABLE = "vm_usage"
SETS = ("rnd", "fastStorage")
"""The two GWA-T-12 sets (folder or zip names)."""

HEADER = (
    "Timestamp [ms]",
    "CPU cores",
    "CPU capacity provisioned [MHZ]",
    "CPU usage [MHZ]",
    "CPU usage [%]",
    "Memory capacity provisioned [KB]",
    "Memory usage [KB]",
    "Disk read throughput [KB/s]",
    "Disk write throughput [KB/s]",
    "Network received throughput [KB/s]",
    "Network transmitted throughput [KB/s]",
)
"""The genuine header, field by field (compared after stripping blanks)."""

I64, I32, F64, STR = pl.Int64, pl.Int32, pl.Float64, pl.String

FILE_COLUMNS: dict[str, pl.DataType] = {
    "timestamp_s": I64,  # "Timestamp [ms]", in fact Unix epoch seconds
    "cpu_cores": I32,
    "cpu_capacity_mhz": F64,
    "cpu_usage_mhz": F64,
    "cpu_usage_pct": F64,  # = cpu_usage_mhz / cpu_capacity_mhz * 100
    "mem_capacity_kb": F64,
    "mem_usage_kb": F64,
    "disk_read_kb_per_s": F64,
    "disk_write_kb_per_s": F64,
    "net_rx_kb_per_s": F64,
    "net_tx_kb_per_s": F64,
}
"""The file's columns, in order, with units in the names."""

SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    TABLE: {"vm_set": STR, "vm_id": STR, "month": STR, **FILE_COLUMNS},
}
"""Raw table: set (`rnd` / `fastStorage`), VM id (file name), month folder (`2013-7`, empty without one), then
every column of the file."""

COLUMN_DOCS: dict[str, dict[str, str]] = {
    TABLE: {
        "vm_set": "GWA-T-12 set the VM belongs to: rnd or fastStorage (folder or zip name)",
        "vm_id": "VM id: the file's name without .csv",
        "month": "month folder the file was read from (e.g. 2013-7); empty when the files sit in no month folder",
        "timestamp_s": "sample time, Unix epoch seconds (the header says [ms], the values are seconds); one "
        "sample about every 300 s",
        "cpu_cores": "virtual CPU cores provisioned to the VM (can change between samples when it is resized)",
        "cpu_capacity_mhz": "CPU capacity provisioned to the VM, MHz",
        "cpu_usage_mhz": "CPU the VM used, MHz",
        "cpu_usage_pct": "CPU the VM used, % of its provisioned capacity (= cpu_usage_mhz / cpu_capacity_mhz x "
        "100; bursts go above 100)",
        "mem_capacity_kb": "memory provisioned to the VM, KB",
        "mem_usage_kb": "memory the VM used, KB (0 over whole stretches for VMs whose memory was not measured)",
        "disk_read_kb_per_s": "disk read throughput, KB/s",
        "disk_write_kb_per_s": "disk write throughput, KB/s",
        "net_rx_kb_per_s": "network received throughput, KB/s",
        "net_tx_kb_per_s": "network transmitted throughput, KB/s",
    },
}
"""Raw table -> column -> what it holds (the genuine header, shared/traces/bitbrains-gwa-t-12/SOURCE.md)."""

VALID_RANGES: dict[str, tuple[float, float]] = {
    "timestamp_s": (946_684_800, 2_147_483_647),  # 2000-01-01 .. 2038 in epoch seconds (the trace: 2013)
    "cpu_cores": (0, 1024),
    "cpu_capacity_mhz": (0, 1024 * 10_000.0),  # 1024 cores at 10 GHz
    "cpu_usage_mhz": (0, 1024 * 10_000.0),
    # above 100 in the trace (up to 154.6 in rnd/2013-7: bursts over the provisioned capacity)
    "cpu_usage_pct": (0, 1000),
    "mem_capacity_kb": (0, 2.0**34),  # 16 TiB in KiB
    "mem_usage_kb": (0, 2.0**34),
    "disk_read_kb_per_s": (0, 1e9),  # 1 TB/s
    "disk_write_kb_per_s": (0, 1e9),
    "net_rx_kb_per_s": (0, 1e9),
    "net_tx_kb_per_s": (0, 1e9),
}
"""Valid range of every file column: physical bounds far above the trace (largest VM: 32 cores, 86,400 MHz,
64 GiB), so that a corrupt value (1e300, a timestamp in ms) is quarantined while every genuine sample passes.
Every value must also be finite."""

FILE_SPEC = CsvTable(
    source=NAME,
    table=TABLE,
    schema=FILE_COLUMNS,
    mandatory=("timestamp_s",),
    ranges=VALID_RANGES,
    # E notation and "2.0" are legal floats: read as float, require whole numbers
    parse_as={"timestamp_s": F64, "cpu_cores": F64},
    separator=";",
)

READ_THREADS = 4
"""Threads decompressing VM files of a folder partition."""
READ_AHEAD_FILES = 16
"""Files decompressed ahead of the parser (bounds memory: a VM-month file is ~1.5 MB of text)."""

VM_FILE = re.compile(r"(?P<vm>[^/]+)\.csv(\.gz)?")
MONTH_FOLDER = re.compile(r"(?P<year>\d{4})-(?P<month>\d{1,2})")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class BitbrainsConfig:
    """Reference machine that usage and requests are fractions of, and the long-running rule.

    Default reference: the smallest round host that holds the largest VM provisioned in the rnd set
    (32 cores at up to 2,700 MHz = 86,400 MHz, 63.7 GiB): 32 cores at 2,926 MHz, the set's most common
    per-core clock (93,632 MHz), and 64 GiB. Every VM then fits one reference machine, as in Google's
    normalisation (fractions of the largest machine)."""

    reference_cpu_mhz: float = 32 * 2926.0
    """CPU capacity of the reference machine, MHz."""
    reference_mem_kb: float = 64 * 1024 * 1024
    """memory of the reference machine, KB (KiB, as the trace's [KB])."""
    long_running: LongRunningRule = field(default_factory=lambda: LongRunningRule("contiguous_bins", 6000))
    """default long-running rule of this source."""

    def __post_init__(self) -> None:
        if not (self.reference_cpu_mhz > 0 and self.reference_mem_kb > 0):
            raise ValueError(
                f"BitbrainsConfig reference machine must be positive; got "
                f"{self.reference_cpu_mhz} MHz, {self.reference_mem_kb} KB"
            )


# ---------------------------------------------------------------- discovering partitions


def _month_order(name: str) -> tuple[int, int, str]:
    m = MONTH_FOLDER.fullmatch(name)
    return (int(m["year"]), int(m["month"]), name) if m else (0, 0, name)


def _vm_files(folder: Path) -> list[Path]:
    return sorted(
        (p for p in folder.iterdir() if p.is_file() and VM_FILE.fullmatch(p.name)),
        key=lambda p: _vm_order(VM_FILE.fullmatch(p.name)["vm"]),
    )


def _vm_order(vm: str) -> tuple[int, str]:
    return (int(vm), vm) if vm.isdigit() else (1 << 62, vm)


def discover_partitions(root: Path) -> dict[str, Path]:
    """Partition key -> month folder, set folder (VM files without months) or zip, sorted by key."""
    base = Path(root) / FOLDER
    out: dict[str, Path] = {}
    for vm_set in SETS:
        folder, archive = base / vm_set, base / f"{vm_set}.zip"
        found: dict[str, Path] = {}
        if folder.is_dir():
            months = [p for p in folder.iterdir() if p.is_dir() and _vm_files(p)]
            for month in sorted(months, key=lambda p: _month_order(p.name)):
                found[f"{vm_set}_{month.name}"] = month
            if _vm_files(folder):
                found[vm_set] = folder
        if not found and archive.is_file():
            found[archive.name] = archive
        out.update(found)
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- reading files


@dataclass(frozen=True)
class _Piece:
    """Data lines of one file inside a parse buffer, or (`problem` set, no lines) a file quarantined whole."""

    label: str  # file as named in errors and the quarantine
    vm_set: str
    vm_id: str
    month: str
    first_line: int  # line number in the file of the piece's first line
    n_lines: int
    n_seps: int  # ';' in the piece (the parser's fast-path test)
    problem: IngestError | None = None  # why the whole file is quarantined


class BadVmFile(IngestError):
    """A VM file whose header line is at fault (wrong, or nothing after it): `line` is that header."""

    def __init__(self, path: Path | str, message: str, line: bytes):
        super().__init__(path, message)
        self.line = line


def _check_header(label: str, line: bytes) -> None:
    got = tuple(f.strip() for f in line.decode("utf-8", "replace").rstrip("\r\n").split(";"))
    if got != HEADER:
        raise BadVmFile(label, f"wrong header: expected {';'.join(HEADER)!r}, got {line[:300]!r}", line)


def _file_chunks(name: str, f, batch_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(first line number, chunk of whole data lines) of one VM file, header checked; `name` is the file as
    errors name it."""
    chunks = iter_line_chunks(Path(name), f, batch_bytes)
    first = next(chunks, None)
    if first is None:
        raise IngestError(name, "empty file")
    cut = first.find(b"\n")
    _check_header(name, first[:cut])
    header, line, body = first[:cut], 2, first[cut + 1 :]
    seen_data = False
    for chunk in [body] if body else []:
        seen_data = True
        yield line, chunk
        line += chunk.count(b"\n")
    for chunk in chunks:
        seen_data = True
        yield line, chunk
        line += chunk.count(b"\n")
    if not seen_data:
        raise BadVmFile(name, "no data rows after the header", header)


def _folder_files(path: Path) -> Iterator[tuple[str, str, str, str, Path]]:
    """(label, set, vm, month, path) of each VM file of a month or set folder."""
    if path.parent.name in SETS:
        vm_set, month = path.parent.name, path.name
    else:
        vm_set, month = path.name, ""
    for p in _vm_files(path):
        yield (
            f"{vm_set}/{month + '/' if month else ''}{p.name}",
            vm_set,
            VM_FILE.fullmatch(p.name)["vm"],
            month,
            p,
        )


def _zip_members(archive: zipfile.ZipFile) -> list[tuple[str, str, str]]:
    """(member name, vm, month) of each VM file in the zip, months in date order, VMs by number."""
    found = []
    for info in archive.infolist():
        parts = info.filename.rstrip("/").split("/")
        m = VM_FILE.fullmatch(parts[-1])
        if info.is_dir() or m is None or parts[-1].startswith("."):
            continue
        month = parts[-2] if len(parts) >= 2 and MONTH_FOLDER.fullmatch(parts[-2]) else ""
        found.append((info.filename, m["vm"], month))
    return sorted(found, key=lambda x: (_month_order(x[2]), _vm_order(x[1])))


def _piece(label: str, vm_set: str, vm: str, month: str, line: int, chunk: bytes) -> tuple[_Piece, bytes]:
    return _Piece(label, vm_set, vm, month, line, chunk.count(b"\n"), chunk.count(b";")), chunk


def _file_pieces(label: str, vm_set: str, vm: str, month: str, name: str, f, batch_bytes: int):
    """Every piece of one VM file, read whole before any is passed on, so that a file found bad at any point
    (header, decompression) becomes one piece with its `problem` and nothing else of it is parsed."""
    try:
        return [_piece(label, vm_set, vm, month, line, c) for line, c in _file_chunks(name, f, batch_bytes)]
    except IngestError as e:
        return [(_Piece(label, vm_set, vm, month, 0, 0, 0, problem=e), b"")]


def _bad_file_batch(piece: _Piece) -> ParsedBatch:
    """The one quarantine row of a VM file quarantined whole (counted as one input record)."""
    err = piece.problem
    header = isinstance(err, BadVmFile)
    raw = err.line.decode("utf-8", "backslashreplace").rstrip("\r")[:1000] if header else ""
    reason = f"whole file quarantined: {err.message}"
    q = quarantine_frame(NAME, TABLE, piece.label, [1 if header else 0], [reason], [raw])
    return ParsedBatch(pl.DataFrame(schema=SCHEMAS[TABLE]), q, 1, 0)


def _folder_pieces(path: Path, batch_bytes: int) -> Iterator[tuple[_Piece, bytes]]:
    """Pieces of the VM files of a folder; a few files are decompressed at once, in threads (zlib frees the
    GIL), at most READ_AHEAD_FILES ahead of the parser."""
    files = list(_folder_files(path))
    if not files:
        raise IngestError(path, "no <vm>.csv[.gz] files in the folder")

    def load(item: tuple[str, str, str, str, Path]) -> list[tuple[_Piece, bytes]]:
        label, vm_set, vm, month, p = item
        try:
            with open_stream(p) as f:
                return _file_pieces(label, vm_set, vm, month, str(p), f, batch_bytes)
        except IngestError as e:  # missing or empty file
            return [(_Piece(label, vm_set, vm, month, 0, 0, 0, problem=e), b"")]

    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        for i in range(0, len(files), READ_AHEAD_FILES):
            for pieces in pool.map(load, files[i : i + READ_AHEAD_FILES]):
                yield from pieces


def _zip_pieces(path: Path, batch_bytes: int) -> Iterator[tuple[_Piece, bytes]]:
    """Pieces of the VM members of a zip, member after member (decompressed as streams, in place)."""
    if not path.is_file():
        raise IngestError(path, "file not found")
    if path.stat().st_size == 0:
        raise IngestError(path, "empty file")
    vm_set = path.name.removesuffix(".zip")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, *_DECODE_ERRORS) as e:
        raise IngestError(path, f"cannot read zip archive (truncated?): {e}") from e
    with archive:
        members = _zip_members(archive)
        if not members:
            raise IngestError(path, "zip archive has no <vm>.csv members")
        for member, vm, month in members:
            label = f"{path.name}:{member}"
            try:
                with archive.open(member) as f:
                    pieces = _file_pieces(label, vm_set, vm, month, f"{path}:{member}", f, batch_bytes)
            except (zipfile.BadZipFile, *_DECODE_ERRORS) as e:
                problem = IngestError(f"{path}:{member}", f"cannot decompress zip member: {e}")
                pieces = [(_Piece(label, vm_set, vm, month, 0, 0, 0, problem=problem), b"")]
            yield from pieces


def _iter_pieces(path: Path, batch_bytes: int) -> Iterator[tuple[_Piece, bytes]]:
    """Every data chunk of every VM file of one partition, in order, with where it comes from."""
    if path.is_dir():
        return _folder_pieces(path, batch_bytes)
    return _zip_pieces(path, batch_bytes)


# ---------------------------------------------------------------- parsing a buffer of pieces


class _OrderState:
    """Largest timestamp seen so far per VM (the order check spans chunks and, in a zip, months)."""

    def __init__(self) -> None:
        self.last: dict[tuple[str, str], int] = {}

    def carried(self, pieces: list[_Piece]) -> np.ndarray:
        return np.array(
            [self.last.get((p.vm_set, p.vm_id), np.iinfo(np.int64).min) for p in pieces], dtype=np.int64
        )

    def update(self, pieces: list[_Piece], piece_idx: np.ndarray, t: np.ndarray) -> None:
        if len(t) == 0:
            return
        idx, tt = piece_idx, t  # rows come piece by piece, pieces in order
        starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
        for i, m in zip(idx[starts], np.maximum.reduceat(tt, starts), strict=True):
            key = (pieces[i].vm_set, pieces[i].vm_id)
            self.last[key] = max(self.last.get(key, m), int(m))


def _parse_buffer(pieces: list[_Piece], chunks: list[bytes], state: _OrderState) -> ParsedBatch:
    """Parse the concatenated chunks of several files at once; line numbers and files mapped back per piece."""
    buf = b"".join(chunks)
    label = pieces[0].label if len(pieces) == 1 else f"{pieces[0].label} .. {pieces[-1].label}"
    parser = CsvChunkParser(FILE_SPEC, label, Path(label), keep_line_numbers=True)
    parser.lines_done = 1  # past the whole-file format check: headers are checked per file
    batch = parser.parse(buf, (sum(p.n_lines for p in pieces), sum(p.n_seps for p in pieces)))
    starts = np.cumsum([0] + [p.n_lines for p in pieces[:-1]])

    def locate(buffer_line: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.asarray(buffer_line, dtype=np.int64) - 2  # parser numbered the buffer from line 2
        idx = np.searchsorted(starts, pos, side="right") - 1
        first = np.array([p.first_line for p in pieces], dtype=np.int64)
        return idx, first[idx] + pos - starts[idx]

    # rows: which piece each comes from, then the within-VM order check
    row_piece, row_line = locate(parser.last_line_numbers)
    t = batch.rows["timestamp_s"].to_numpy()
    prev = _running_max_before(row_piece, t, state.carried(pieces))
    late = t < prev
    quarantine = [_relabel(batch.quarantine, pieces, locate)] if batch.quarantine.height else []
    if late.any():
        raw = [line.decode("utf-8", "replace") for line in buf.split(b"\n")]
        pos = parser.last_line_numbers[late] - 2
        quarantine.append(
            quarantine_frame(
                NAME,
                TABLE,
                "",
                row_line[late],
                [
                    f"timestamp_s goes backwards for VM {pieces[i].vm_set}/{pieces[i].vm_id}: {a} after {b}"
                    for i, a, b in zip(row_piece[late], t[late], prev[late], strict=True)
                ],  # fmt: skip
                [raw[i] for i in pos],
            ).with_columns(pl.Series("source_file", [pieces[i].label for i in row_piece[late]]))
        )
    keep = ~late
    state.update(pieces, row_piece[keep], t[keep])
    info = pl.DataFrame(
        {
            "vm_set": [p.vm_set for p in pieces],
            "vm_id": [p.vm_id for p in pieces],
            "month": [p.month for p in pieces],
        }
    )[row_piece[keep]]
    rows = pl.concat([info, batch.rows.filter(pl.Series(keep))], how="horizontal")
    q = pl.concat(quarantine).sort("source_file", "line_number") if quarantine else empty_quarantine()
    return ParsedBatch(rows.select(list(SCHEMAS[TABLE])), q, batch.n_lines, 0)


def _running_max_before(piece: np.ndarray, t: np.ndarray, carried: np.ndarray) -> np.ndarray:
    """Per row: the largest timestamp of its VM before it (earlier rows of its piece, or carried state)."""
    if len(t) == 0:
        return t
    out = np.empty_like(t)
    starts = np.flatnonzero(np.r_[True, piece[1:] != piece[:-1]])  # rows come piece by piece, in order
    ends = np.r_[starts[1:], len(t)]
    for s, e in zip(starts, ends, strict=True):
        seg = np.maximum.accumulate(t[s:e])
        out[s] = carried[piece[s]]
        out[s + 1 : e] = np.maximum(seg[:-1], carried[piece[s]])
    return out


def _relabel(q: pl.DataFrame, pieces: list[_Piece], locate) -> pl.DataFrame:
    idx, line = locate(q["line_number"].to_numpy())
    return q.with_columns(
        pl.Series("source_file", [pieces[i].label for i in idx], dtype=pl.String),
        pl.Series("line_number", line, dtype=pl.Int64),
    )


def iter_vm_batches(path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES) -> Iterator[ParsedBatch]:
    """Parsed batches of one partition (month folder, set folder or zip): files are read as streams and
    parsed several at a time, about `batch_bytes` of text per batch."""
    state = _OrderState()
    pieces: list[_Piece] = []
    chunks: list[bytes] = []
    size = 0
    # decompression of the next files overlaps parsing (zlib frees the GIL)
    for piece, chunk in prefetch(_iter_pieces(Path(path), batch_bytes), depth=16):
        if piece.problem is not None:
            yield _bad_file_batch(piece)
            continue
        pieces.append(piece)
        chunks.append(chunk)
        size += len(chunk)
        if size >= batch_bytes:
            yield _parse_buffer(pieces, chunks, state)
            pieces, chunks, size = [], [], 0
    if pieces:
        yield _parse_buffer(pieces, chunks, state)


# ---------------------------------------------------------------- canonical mapping


def _workload_id() -> pl.Expr:
    return pl.format("{}/{}", pl.col("vm_set"), pl.col("vm_id")).alias("workload_id")


def build_workloads(raw: dict[str, pl.LazyFrame], cfg: BitbrainsConfig) -> pl.LazyFrame:
    """One workload per VM (all months) -> WORKLOADS columns (rules in the module docstring)."""
    if TABLE not in raw:
        return empty_frame(WORKLOADS).lazy()
    return (
        raw[TABLE]
        .group_by(_workload_id())
        .agg(
            pl.col("timestamp_s").min().cast(pl.Float64).alias("start_time_s"),
            (pl.col("timestamp_s").max() + 300).cast(pl.Float64).alias("end_time_s"),
            pl.len().cast(pl.Int64).alias("n_usage_records"),
            (pl.col("cpu_capacity_mhz").max() / cfg.reference_cpu_mhz).alias("cpu_request_frac"),
            (pl.col("mem_capacity_kb").max() / cfg.reference_mem_kb).alias("mem_request_frac"),
        )
        .with_columns(
            pl.lit(NAME).alias("source"),
            pl.lit(None, pl.String).alias("machine_id"),
            pl.lit(None, pl.Int32).alias("priority"),
            pl.lit(None, pl.Int32).alias("scheduling_class"),
            pl.lit("running").alias("final_state"),
            pl.lit(False).alias("is_partial"),
        )
    )


def usage_mapping(cfg: BitbrainsConfig) -> UsageMapping:
    """vm_usage binned by sample time, as fractions of the reference machine."""

    def bins(raw: dict[str, pl.LazyFrame]) -> tuple[pl.LazyFrame, pl.LazyFrame]:
        rows = raw[TABLE].select(
            _workload_id(),
            "timestamp_s",
            (pl.col("cpu_usage_mhz") / cfg.reference_cpu_mhz).alias("cpu_frac"),
            (pl.col("mem_usage_kb") / cfg.reference_mem_kb).alias("mem_frac"),
        )
        rows = rows.with_columns(bad_reason(pl.col("cpu_frac"), pl.col("mem_frac")).alias("bad_reason"))
        binned = (
            rows.filter(pl.col("bad_reason").is_null())
            .select(
                "workload_id", bin_start(pl.col("timestamp_s")).alias("bin_start_s"), "cpu_frac", "mem_frac"
            )
            .pipe(mean_per_bin, NAME)
        )
        mem_zero = counts_frame(rows.select((pl.col("mem_frac") == 0).sum().alias("rows_mem_zero")), NAME)
        return binned, pl.concat([count_reasons(rows, NAME), mem_zero])

    # a raw month partition holds whole VM-months, so each row group spans about a month of trace time and every
    # time chunk reads its month's row groups: 48 h chunks (46 over rnd's three months) re-read 8x less than 6 h
    # ones (measured on the 84 shared VMs: 8.8 s instead of 63 s, benchmarks/bench_bitbrains.py --ec)
    return UsageMapping(bins, TABLE, {TABLE: (pl.col("timestamp_s"), 1)}, chunking=TimeChunks(48 * 3600))


class BitbrainsSource:
    """The Bitbrains GWA-T-12 trace under `<root>/bitbrains-gwa-t-12/` (sets `rnd`, `fastStorage`)."""

    name = NAME
    folder = FOLDER
    tables = (TABLE,)
    schemas = SCHEMAS
    column_docs = COLUMN_DOCS

    def __init__(self, config: BitbrainsConfig = BitbrainsConfig()):
        self.config = config
        self.usage = usage_mapping(config)
        self.long_running = config.long_running

    def discover(self, root: Path, table: str) -> dict[str, Path]:
        """Partitions of `table`: `<set>_<month>` -> month folder, `<set>` -> set folder, `<set>.zip` -> zip."""
        check_table(self, table)
        return discover_partitions(root)

    def iter_batches(
        self, table: str, path: Path, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedBatch]:
        """Parsed batches of one partition (streamed, several VM files per batch)."""
        check_table(self, table)
        yield from iter_vm_batches(Path(path), batch_bytes)

    def workloads(self, raw: dict[str, pl.LazyFrame]) -> pl.LazyFrame:
        """The WORKLOADS columns of every VM (rules in the module docstring)."""
        return build_workloads(raw, self.config)
