"""The dispatch table: for one GPU architecture, the configurations ranked fastest first at each
(dtype, d_head, mask, sequence length) measured there. ``tools/benchmark/autotune.py
--dispatch-table`` writes it from a sweep on that GPU; ``flash_attention.choose_config`` reads it.
The tables ship as JSON files under ``flash_attention/dispatch_tables/``, one per architecture,
named ``<arch>.json`` (``sm_90.json``).

A table keeps every measured configuration's place and time, not only the winner: a build compiles
only a subset of them, and the fastest compiled one is wanted; and the times let automatic
configuration carry a ranking to lengths the sweep did not measure, where configurations with other
block sizes leave different amounts of their last tiles empty (``flash_attention.choose_config``).
Importable without torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from pathlib import Path

__all__ = ["FORMAT_VERSION", "DispatchTable", "TableEntry", "arch_name"]

# Bumped when the file layout changes; a reader refuses other versions rather than misread them.
# 2: each ranked configuration with its time.
FORMAT_VERSION = 2


def arch_name(capability: tuple[int, int]) -> str:
    """``sm_90`` for compute capability (9, 0): the tables' names for architectures."""
    major, minor = capability
    return f"sm_{major}{minor}"


@dataclasses.dataclass(frozen=True)
class TableEntry:
    """The ranking at one shape: dtype (a DType's name: ``FP16``, ``BF16``, ``E4M3``), head size,
    causal or not, and the length the sweep measured (seqlen_q = seqlen_k); configurations as short
    forms, fastest first, and each one's measured time in milliseconds, in the same order."""

    dtype: str
    d_head: int
    causal: bool
    seq_len: int
    ranked: tuple[str, ...]
    times_ms: tuple[float, ...]

    def __post_init__(self):
        if len(self.times_ms) != len(self.ranked):
            raise ValueError(f"{len(self.ranked)} ranked configurations but {len(self.times_ms)} times")
        if list(self.times_ms) != sorted(self.times_ms):
            raise ValueError("the ranked configurations' times must not decrease: fastest first")


@dataclasses.dataclass(frozen=True)
class DispatchTable:
    """One architecture's rankings, with where they were measured and the command that measured them."""

    arch: str
    gpu: str
    date: str
    command: str
    entries: tuple[TableEntry, ...]

    def entry_for(self, dtype: str, d_head: int, causal: bool, seqlen_q: int) -> TableEntry | None:
        """The ranking that speaks for a problem: among the entries of its dtype, head size and mask,
        the one measured at the smallest length >= seqlen_q, else the longest. The query length
        decides because it sets how many thread blocks there are."""
        matching = sorted(
            (e for e in self.entries if (e.dtype, e.d_head, e.causal) == (dtype, d_head, causal)),
            key=lambda e: e.seq_len,
        )
        if not matching:
            return None
        return next((e for e in matching if e.seq_len >= seqlen_q), matching[-1])

    def to_json(self) -> str:
        entries = [
            {
                **{field: getattr(entry, field) for field in ("dtype", "d_head", "causal", "seq_len")},
                "ranked": [{"config": c, "time_ms": t} for c, t in zip(entry.ranked, entry.times_ms, strict=True)],
            }
            for entry in self.entries
        ]
        header = {field: getattr(self, field) for field in ("arch", "gpu", "date", "command")}
        document = {"format_version": FORMAT_VERSION, **header, "entries": entries}
        return json.dumps(document, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> DispatchTable:
        document = json.loads(text)
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"dispatch table format {version!r}; this version reads format {FORMAT_VERSION}")
        entries = tuple(
            TableEntry(
                e["dtype"],
                int(e["d_head"]),
                bool(e["causal"]),
                int(e["seq_len"]),
                tuple(str(r["config"]) for r in e["ranked"]),
                tuple(float(r["time_ms"]) for r in e["ranked"]),
            )
            for e in document["entries"]
        )
        return cls(document["arch"], document["gpu"], document["date"], document["command"], entries)

    @classmethod
    def load(cls, path: str | Path) -> DispatchTable:
        return cls.from_json(Path(path).read_text())

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    def merged_into(self, older: DispatchTable) -> DispatchTable:
        """This table's rankings over an older one's of the same architecture: the older entries at
        shapes this table does not rank stay, those it ranks anew are replaced. The date is this
        table's and the command records both measurements, older first."""
        if (older.arch, older.gpu) != (self.arch, self.gpu):
            raise ValueError(f"a table of {self.arch} ({self.gpu}) cannot merge into one of {older.arch} ({older.gpu})")
        shapes = {(e.dtype, e.d_head, e.causal, e.seq_len) for e in self.entries}
        kept = (e for e in older.entries if (e.dtype, e.d_head, e.causal, e.seq_len) not in shapes)
        return DispatchTable.from_rankings(
            self.arch, self.gpu, self.date, f"{older.command} && {self.command}", (*kept, *self.entries)
        )

    @classmethod
    def from_rankings(
        cls, arch: str, gpu: str, date: str, command: str, rankings: Iterable[TableEntry]
    ) -> DispatchTable:
        """A table of these rankings, sorted so that re-measuring the same winners rewrites the same file."""
        entries = tuple(sorted(rankings, key=lambda e: (e.dtype, e.d_head, e.causal, e.seq_len)))
        return cls(arch, gpu, date, command, entries)
