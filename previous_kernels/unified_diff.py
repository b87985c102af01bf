"""A strict reader and applier of unified diffs, in plain Python (no git, no patch(1)).

It applies the patches of previous_kernels/ (``git diff --no-index --no-renames`` output: ``a/`` and
``b/`` path prefixes, paths relative to the tree's root) to a tree held in memory as a dict from
relative path to file content (bytes). What it accepts:

- file creation (``--- /dev/null``), modification and deletion (``+++ /dev/null``), one section per
  file, introduced by ``diff --git a/P b/P`` or directly by ``--- a/P`` / ``+++ b/P``;
- git's extended header lines ``new file mode``, ``deleted file mode`` and ``index``; when an index
  line gives blob hashes, the file before and after the patch must have them (as abbreviated git
  blob ids), so a patch reproduces the exact bytes it was made from or fails;
- ``\\ No newline at end of file`` after a line of either side;
- free text before the first file (a description), and an empty line in a hunk as an empty
  context line (editors strip the lone space).

Everything else fails with PatchError naming the patch, the file and the hunk: a context or removed
line that differs from the file, a hunk that is not exactly where its header says, a hunk whose line
counts do not match its header, a created file that exists or a changed one that does not,
renames, copies, mode changes and binary patches. There is no fuzz and no offset search.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

__all__ = ["FilePatch", "Hunk", "PatchError", "apply_patch", "git_blob_id", "parse_patch"]

DEV_NULL = "/dev/null"
NO_NEWLINE_MARKER = b"\\ No newline at end of file"
_HUNK_HEADER_RE = re.compile(rb"@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)")
_INDEX_RE = re.compile(rb"index ([0-9a-f]{4,64})\.\.([0-9a-f]{4,64})(?: [0-7]{6})?")
_FILE_MODE_RE = re.compile(rb"(new|deleted) file mode 100(644|755)")
# A line of a file or of a hunk side: its text without the line feed, and whether a line feed ends it.
Line = tuple[bytes, bool]


class PatchError(ValueError):
    """A patch that is malformed, unsupported, or does not apply exactly."""


@dataclasses.dataclass(frozen=True)
class Hunk:
    header: str  # the "@@ -a,b +c,d @@" line, for messages
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[tuple[str, Line], ...]  # (" ", "-" or "+", the line)

    def side(self, kinds: str) -> list[Line]:
        return [line for kind, line in self.lines if kind in kinds]

    @property
    def old_index(self) -> int:
        """The 0-based index of the first old line (for an empty old side: of the line after which
        the new lines go, which is what the header's start means there)."""
        return self.old_start - 1 if self.old_count else self.old_start

    @property
    def new_index(self) -> int:
        return self.new_start - 1 if self.new_count else self.new_start


@dataclasses.dataclass(frozen=True)
class FilePatch:
    old_path: str | None  # None for a created file
    new_path: str | None  # None for a deleted file
    hunks: tuple[Hunk, ...]
    old_blob: str | None = None  # abbreviated git blob ids from the index line, if any
    new_blob: str | None = None

    @property
    def path(self) -> str:
        return self.new_path if self.new_path is not None else self.old_path


def git_blob_id(data: bytes) -> str:
    """The id git gives a file holding ``data`` (SHA-1 of "blob <size>\\0" + data)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def split_lines(data: bytes) -> list[Line]:
    if not data:
        return []
    texts = data.split(b"\n")
    if texts[-1] == b"":
        return [(text, True) for text in texts[:-1]]
    return [(text, True) for text in texts[:-1]] + [(texts[-1], False)]


def join_lines(lines: list[Line]) -> bytes:
    return b"".join(text + (b"\n" if newline else b"") for text, newline in lines)


class _Reader:
    """The patch's lines with a cursor, for parse errors that give the line number."""

    def __init__(self, patch: bytes, name: str):
        self.lines = split_lines(patch)
        self.name = name
        self.index = 0

    def peek(self) -> bytes | None:
        return self.lines[self.index][0] if self.index < len(self.lines) else None

    def take(self) -> bytes:
        line = self.peek()
        if line is None:
            raise self.error("unexpected end of the patch")
        self.index += 1
        return line

    def error(self, problem: str, line_number: int | None = None) -> PatchError:
        number = self.index + 1 if line_number is None else line_number
        return PatchError(f"{self.name}, line {number}: {problem}")


def _strip_prefix(reader: _Reader, field: bytes, prefix: str) -> str | None:
    """The path of a ``---``/``+++`` line: None for /dev/null, else the path after ``prefix``."""
    text = field.decode("utf-8", errors="replace")
    if text == DEV_NULL:
        return None
    if text.startswith('"'):
        raise reader.error(f"quoted path {text}: paths with special characters are not supported")
    if not text.startswith(prefix) or len(text) == len(prefix):
        raise reader.error(f"path {text!r} does not start with {prefix!r}")
    return text[len(prefix) :]


def _paths_of_git_header(reader: _Reader, line: bytes) -> str:
    """The path of ``diff --git a/P b/P`` (used only by sections without ---/+++ lines: empty files)."""
    rest = line[len(b"diff --git ") :].decode("utf-8", errors="replace")
    middle = (len(rest) - 1) // 2
    old, new = rest[:middle], rest[middle + 1 :]
    if rest[middle : middle + 1] != " " or not old.startswith("a/") or not new.startswith("b/") or old[2:] != new[2:]:
        raise reader.error(f"cannot read the paths of {line.decode(errors='replace')!r} (renames are not supported)")
    return old[2:]


def _parse_hunk(reader: _Reader, header: bytes) -> Hunk:
    match = _HUNK_HEADER_RE.fullmatch(header)
    if not match:
        raise reader.error(f"malformed hunk header {header.decode(errors='replace')!r}")
    old_start, old_count, new_start, new_count = (
        int(value) if value is not None else 1 for value in match.groups()[:4]
    )  # fmt: skip
    header_text = header.decode(errors="replace")
    start_line = reader.index
    lines: list[tuple[str, Line]] = []
    old_seen = new_seen = 0
    while old_seen < old_count or new_seen < new_count:
        raw = reader.peek()
        if raw is None or raw.startswith((b"@@ ", b"diff --git ")):
            raise reader.error(
                f"hunk {header_text} ends after {old_seen} old and {new_seen} new lines; its header says "
                f"{old_count} and {new_count}",
                start_line,
            )
        reader.take()
        kind, text = (" ", b"") if raw == b"" else (chr(raw[0]), raw[1:])
        if kind == "\\":
            if raw != NO_NEWLINE_MARKER or not lines:
                raise reader.error(f"unexpected marker line {raw.decode(errors='replace')!r} in hunk {header_text}")
            _mark_no_newline(lines)
            continue
        if kind not in " -+":
            raise reader.error(f"hunk {header_text}: a line must start with ' ', '-' or '+', got {raw[:40]!r}")
        old_seen += kind in " -"
        new_seen += kind in " +"
        if old_seen > old_count or new_seen > new_count:
            raise reader.error(f"hunk {header_text} has more lines than its header says")
        lines.append((kind, (text, True)))
    if reader.peek() is not None and reader.peek().startswith(b"\\"):
        if reader.take() != NO_NEWLINE_MARKER:
            raise reader.error(f"unknown marker line after hunk {header_text}", reader.index)
        _mark_no_newline(lines)
    return Hunk(header_text, old_start, old_count, new_start, new_count, tuple(lines))


def _mark_no_newline(lines: list[tuple[str, Line]]) -> None:
    kind, (text, _) = lines[-1]
    lines[-1] = (kind, (text, False))


def parse_patch(patch: bytes, name: str = "patch") -> list[FilePatch]:
    """The file sections of a unified diff; raises PatchError for anything malformed or unsupported."""
    reader = _Reader(patch, name)
    # Free text before the first file section is a description.
    while reader.peek() is not None and not reader.peek().startswith((b"diff --git ", b"--- ")):
        reader.take()
    files: list[FilePatch] = []
    while reader.peek() is not None:
        files.append(_parse_file(reader))
    seen = set()
    for file_patch in files:
        if file_patch.path in seen:
            raise PatchError(f"{name}: {file_patch.path} has more than one section")
        seen.add(file_patch.path)
    return files


def _parse_file(reader: _Reader) -> FilePatch:
    git_header = reader.take() if reader.peek().startswith(b"diff --git ") else None
    old_blob = new_blob = None
    mode = None
    while reader.peek() is not None and not reader.peek().startswith((b"--- ", b"diff --git ")):
        line = reader.take()
        if git_header is None:
            raise reader.error(f"unexpected line {line[:60]!r} before '--- '")
        if index := _INDEX_RE.fullmatch(line):
            old_blob, new_blob = (blob.decode() for blob in index.groups())
        elif file_mode := _FILE_MODE_RE.fullmatch(line):
            mode = file_mode.group(1).decode()
        else:
            raise reader.error(
                f"unsupported header line {line.decode(errors='replace')!r} (only new and deleted files of mode "
                "100644 or 100755, index lines and changed content are supported)"
            )
    if reader.peek() is None or reader.peek().startswith(b"diff --git "):
        # A section without content: git writes an empty created or deleted file this way.
        if git_header is None or mode is None:
            raise reader.error("a file section without '---'/'+++' lines must create or delete an empty file")
        path = _paths_of_git_header(reader, git_header)
        if mode == "new":
            return FilePatch(None, path, (), old_blob, new_blob)
        return FilePatch(path, None, (), old_blob, new_blob)
    old_path = _strip_prefix(reader, reader.take()[4:], "a/")
    plus = reader.take()
    if not plus.startswith(b"+++ "):
        raise reader.error("a '--- ' line must be followed by a '+++ ' line", reader.index)
    new_path = _strip_prefix(reader, plus[4:], "b/")
    if old_path is None and new_path is None:
        raise reader.error("both sides are /dev/null")
    if old_path is not None and new_path is not None and old_path != new_path:
        raise reader.error(f"{old_path} is renamed to {new_path}: renames are not supported")
    if (mode == "new" and old_path is not None) or (mode == "deleted" and new_path is not None):
        raise reader.error(f"the file mode lines of {old_path or new_path} contradict its '---'/'+++' lines")
    if git_header is not None and _paths_of_git_header(reader, git_header) != (old_path or new_path):
        raise reader.error(f"the 'diff --git' line of {old_path or new_path} names another file")
    hunks = []
    while reader.peek() is not None and reader.peek().startswith(b"@@"):
        hunks.append(_parse_hunk(reader, reader.take()))
    if not hunks:
        raise reader.error(f"{new_path or old_path}: no hunks")
    if reader.peek() is not None and not reader.peek().startswith((b"diff --git ", b"--- ")):
        raise reader.error(f"unexpected line {reader.peek()[:60]!r} after the hunks of {new_path or old_path}")
    return FilePatch(old_path, new_path, tuple(hunks), old_blob, new_blob)


def _apply_hunks(lines: list[Line], file_patch: FilePatch, where: str) -> list[Line]:
    result: list[Line] = []
    consumed = 0  # old lines copied or replaced so far
    growth = 0  # new lines minus old lines of the hunks applied so far
    for number, hunk in enumerate(file_patch.hunks, 1):
        what = f"{where}: hunk {number} ({hunk.header})"
        start = hunk.old_index
        if start < consumed:
            raise PatchError(f"{what}: overlaps the hunk before it or is out of order")
        if hunk.new_index != start + growth:
            raise PatchError(f"{what}: its new start line does not follow from its old one and the hunks before")
        old = hunk.side(" -")
        found = lines[start : start + len(old)]
        for offset, (expected, actual) in enumerate(zip(old, found + [None] * (len(old) - len(found)))):
            if expected != actual:
                shown = "end of file" if actual is None else repr(_describe(actual))
                raise PatchError(
                    f"{what} does not apply: line {start + offset + 1} should be {_describe(expected)!r}, "
                    f"the file has {shown}"
                )
        result += lines[consumed:start] + hunk.side(" +")
        consumed = start + len(old)
        growth += hunk.new_count - hunk.old_count
    result += lines[consumed:]
    if any(not newline for _, newline in result[:-1]):
        raise PatchError(f"{where}: the result would have a line without a line feed before its last line")
    return result


def _describe(line: Line) -> str:
    text, newline = line
    return text.decode("utf-8", errors="replace") + ("" if newline else " (no newline at end of file)")


def _check_blob(data: bytes, blob: str | None, where: str, side: str) -> None:
    if blob is None or set(blob) == {"0"}:
        return
    actual = git_blob_id(data)
    if not actual.startswith(blob):
        raise PatchError(
            f"{where}: the file {side} the patch is blob {actual[:len(blob)]}, its index line says {blob}: "
            "the patch was made from different content"
        )


def apply_patch(files: dict[str, bytes], patch: bytes, name: str = "patch") -> dict[str, bytes]:
    """The tree ``files`` (relative path -> content) with ``patch`` applied; ``files`` is unchanged.
    Raises PatchError, naming the patch, the file and the hunk, unless every file applies exactly."""
    result = dict(files)
    for file_patch in parse_patch(patch, name):
        where = f"{name}: {file_patch.path}"
        if file_patch.old_path is None:
            if file_patch.new_path in result:
                raise PatchError(f"{where}: the patch creates it, but it already exists")
            old_data = b""
        else:
            if file_patch.old_path not in result:
                raise PatchError(f"{where}: the patch changes it, but there is no such file")
            old_data = result[file_patch.old_path]
        _check_blob(old_data, file_patch.old_blob, where, "before")
        new_data = join_lines(_apply_hunks(split_lines(old_data), file_patch, where))
        if file_patch.new_path is None:
            if new_data:
                raise PatchError(f"{where}: the patch deletes it, but does not remove all of its lines")
            del result[file_patch.old_path]
            continue
        _check_blob(new_data, file_patch.new_blob, where, "after")
        result[file_patch.new_path] = new_data
    return result
