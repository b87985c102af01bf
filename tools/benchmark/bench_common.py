"""What the benchmark and analysis tools share: the benchmark shapes, inputs, timing, the PyTorch
SDPA references, the float32 reference check, configuration selection, tables, CSV files and
progress bars.

Importing this module imports neither torch nor the compiled extension (they are imported inside
the functions that need them), so every tool's ``--help`` is instant and the parsers and
summaries that need no GPU work on any machine.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import math
import os
import pathlib
import statistics
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]

# The tools use the packages of the checkout they belong to (where `pip install -e .` builds the
# extension in place), not another installed copy; this also lets the tools that need no build
# (SASS, summaries) run from a bare checkout.
if str(REPO_ROOT / "py") not in sys.path:
    sys.path.insert(0, str(REPO_ROOT / "py"))

from flash_helpers.dtypes import DTYPES, DType  # noqa: E402
from flash_helpers.kernel_sets import BUILD_KERNELS_ENV, KERNELS_ENV, get_kernel_configs  # noqa: E402
from flash_helpers.problem import attention_flop, total_flop  # noqa: E402
from flash_helpers.sm80_config import D_HEADS, FlashForwardKernelConfig  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Benchmark shapes

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)
# The dtypes as the command lines and CSV files spell them; the d_heads are the kernel's (D_HEADS).
DTYPE_NAMES = tuple(dtype.name.lower() for dtype in DTYPES)
# The model width heads * d_head of every benchmark shape.
MODEL_WIDTH = 2048
# Sequences per batch, and the most tokens (batch * seq) a batch may hold.
MAX_BATCH = 16
MAX_TOKENS = 65536


def batch_for_seq_len(seq_len: int) -> int:
    """16 sequences, capped at 64Ki tokens: the seeds' batches 16/16/16/16/8/4 for seq 512 to 16384,
    and a comparable batch for any other length."""
    return max(1, min(MAX_BATCH, MAX_TOKENS // seq_len))


def heads_for_d_head(d_head: int) -> int:
    """Heads such that heads * d_head is the model width: 16 for d_head 128, 32 for d_head 64."""
    return MODEL_WIDTH // d_head


BATCH_BY_SEQ_LEN = {seq_len: batch_for_seq_len(seq_len) for seq_len in SEQ_LENS}
HEADS_BY_D_HEAD = {d_head: heads_for_d_head(d_head) for d_head in D_HEADS}


def dtype_from_name(name: str) -> DType:
    """The DType of a command-line or CSV dtype name (fp16, bf16)."""
    return DType.from_string(name)


def flop_counts(d_head: int, batch: int, heads: int, seq_len: int) -> tuple[int, int]:
    """(attention FLOPs, total FLOPs) of one forward pass: the counts of ``flash_helpers.problem``."""
    return attention_flop(batch, heads, seq_len, d_head), total_flop(batch, heads, seq_len, d_head)


def tflops(flop: float, time_ms: float) -> float:
    """TFLOP/s of ``flop`` operations done in ``time_ms`` milliseconds (NaN for a missing time)."""
    if not time_ms > 0:
        return math.nan
    return flop / time_ms / 1e9


def fits(cfg: FlashForwardKernelConfig, dtype: DType, d_head: int, seq_len: int) -> bool:
    """Whether ``cfg`` can run this shape: same dtype and d_head, block sizes dividing seq_len."""
    return cfg.dtype == dtype and cfg.d_head == d_head and seq_len % cfg.B_r == 0 and seq_len % cfg.B_c == 0


# ----------------------------------------------------------------------------------------------
# GPU, inputs and timing


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def no_gpu_message(tool: str) -> str:
    return f"no CUDA GPU visible: {tool} needs one"


def make_inputs(batch: int, seq_len: int, heads: int, d_head: int, dtype: DType, seed: int | None = None):
    """Random q, k, v of shape (batch, seq_len, heads, d_head) on the current GPU (never zeros:
    every kernel must do its real work)."""
    import torch

    generator = torch.Generator(device="cuda")
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    shape = (batch, seq_len, heads, d_head)
    return tuple(
        torch.randn(shape, dtype=DType(dtype).to_torch_dtype(), device="cuda", generator=generator) for _ in range(3)
    )


# Warm-up and measurement budget of the CUDA-event fallback, like do_bench's defaults.
DEFAULT_REP_MS = 100
_EVENT_WARMUP_CALLS = 5
_EVENT_MIN_REPEATS, _EVENT_MAX_REPEATS = 10, 1000


def median_ms_with_cuda_events(fn: Callable[[], object], rep_ms: float = DEFAULT_REP_MS) -> float:
    """Median time of ``fn`` in ms from CUDA events, repeated for about ``rep_ms`` after a warm-up."""
    import torch

    def timed_calls(count: int) -> list[float]:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(count)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]

    estimate = statistics.median(timed_calls(_EVENT_WARMUP_CALLS))
    repeats = int(min(_EVENT_MAX_REPEATS, max(_EVENT_MIN_REPEATS, rep_ms / max(estimate, 1e-3))))
    return statistics.median(timed_calls(repeats))


def make_timer(rep_ms: float = DEFAULT_REP_MS) -> tuple[Callable[[Callable[[], object]], float], str]:
    """The timing function (fn -> median milliseconds) and a description of it for the report.

    triton.testing.do_bench flushes the L2 cache between calls and repeats for ``rep_ms``; without
    triton, CUDA events around each call give the same median without the flush.
    """
    try:
        from triton.testing import do_bench
    except ImportError:
        return (
            lambda fn: median_ms_with_cuda_events(fn, rep_ms),
            f"median of CUDA-event timings over about {rep_ms:g} ms (triton is not installed)",
        )
    return (
        lambda fn: do_bench(fn, rep=rep_ms, return_mode="median"),
        f"median of triton.testing.do_bench over about {rep_ms:g} ms",
    )


# ----------------------------------------------------------------------------------------------
# PyTorch SDPA references

# Reference name (as the command lines spell it) -> column label.
SDPA_REFERENCES = {"flash": "SDPA FLASH", "cudnn": "SDPA CUDNN", "efficient": "SDPA EFFICIENT"}


def sdpa_backend(reference: str):
    from torch.nn.attention import SDPBackend

    return {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }[reference]


def use_sdpa_reference(reference: str):
    """A context in which scaled_dot_product_attention may use only this reference's backend, so a
    backend that cannot run the shape raises instead of silently falling back to another."""
    from torch.nn.attention import sdpa_kernel

    return sdpa_kernel(sdpa_backend(reference))


def sdpa_runner(q, k, v) -> Callable[[], object]:
    """SDPA on the same tensors: it takes (batch, heads, seq, d_head), so it gets transposed views of
    our (batch, seq, heads, d_head) inputs, and returns the output in our layout. Call it inside
    ``use_sdpa_reference`` (entered once around the timing, not per call, to keep the CPU cost of
    the context out of the measurement)."""
    import torch.nn.functional as F

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    return lambda: F.scaled_dot_product_attention(q, k, v).transpose(1, 2)


# Largest |ours - SDPA FLASH| accepted: a loose sanity bound for outputs of magnitude up to ~1, where
# one unit in the last place is about 1e-3 in fp16 and 8e-3 in bf16 (the tests check precisely).
MAX_ABS_DIFFERENCE = {"fp16": 1e-2, "bf16": 4e-2}


def flash_mismatch(out, flash_output, dtype_name: str, what: str) -> str | None:
    """The correctness-failure message for ``what`` when ``out`` is further from SDPA FLASH's output
    than MAX_ABS_DIFFERENCE allows (or is NaN), else None."""
    difference = (out.float() - flash_output.float()).abs().max().item()
    if difference <= MAX_ABS_DIFFERENCE[dtype_name]:
        return None
    return (
        f"CORRECTNESS FAILURE: {what}: max |ours - {SDPA_REFERENCES['flash']}| = {difference:.3g} "
        f"> {MAX_ABS_DIFFERENCE[dtype_name]}"
    )


# ----------------------------------------------------------------------------------------------
# Selecting configurations


class ConfigSelectionError(ValueError):
    """The requested configurations cannot be run with this build."""


def _names_configs_explicitly(key: str) -> bool:
    """Whether ``key`` lists configurations (short forms or initializers) rather than naming a set."""
    return "(" in key or "{" in key


def select_compiled_configs(
    key: str | None, compiled: Sequence[FlashForwardKernelConfig], compiled_set: str, default_key: str | None = None
) -> list[FlashForwardKernelConfig]:
    """The compiled configurations that ``key`` selects, in the compiled order.

    ``key`` (a ``--kernels`` value) falls back to the KERNELS environment variable, then to
    ``default_key``; with none of them every compiled configuration is selected. Configurations named
    one by one must all be compiled; a named set (tune, prog, 'B_r,B_c', ...) is intersected with the
    build, and only an empty intersection is an error. Errors say how to build what is missing.
    """
    key = key or os.environ.get(KERNELS_ENV) or default_key
    if not key:
        return list(compiled)
    build_hint = f"build them with {BUILD_KERNELS_ENV}='{key}' pip install --no-build-isolation -e ."
    try:
        requested = get_kernel_configs(key)
    except ValueError as error:
        raise ConfigSelectionError(str(error)) from None
    compiled_configs = set(compiled)
    missing = [cfg for cfg in requested if cfg not in compiled_configs]
    if missing and _names_configs_explicitly(key):
        listed = "\n  ".join(cfg.short_form() for cfg in missing)
        raise ConfigSelectionError(
            f"{len(missing)} requested configuration(s) are not compiled into this build (kernel set "
            f"'{compiled_set}'):\n  {listed}\n{build_hint}"
        )
    selected = [cfg for cfg in compiled if cfg in set(requested)]
    if not selected:
        raise ConfigSelectionError(
            f"none of the {len(requested)} configurations of '{key}' is compiled into this build (kernel set "
            f"'{compiled_set}'); {build_hint}"
        )
    if missing:
        print(
            f"note: {len(selected)} of the {len(requested)} configurations of '{key}' are compiled (kernel set "
            f"'{compiled_set}') and run; to run them all, {build_hint}",
            file=sys.stderr,
        )
    return selected


def select_configs(key: str | None, default_key: str | None = None) -> list[FlashForwardKernelConfig]:
    """``select_compiled_configs`` against the built extension."""
    import flash_attention

    return select_compiled_configs(
        key, flash_attention.compiled_configs(), flash_attention.compiled_kernel_set(), default_key
    )


# ----------------------------------------------------------------------------------------------
# Results: timing rows, CSV files, tables, means


@dataclasses.dataclass
class TimingRow:
    """One timed implementation at one shape: a row of the benchmark and autotuning CSV files."""

    dtype: str
    d_head: int
    seq_len: int
    batch: int
    heads: int
    implementation: str  # "ours", or "sdpa_" + an SDPA_REFERENCES key
    config: str  # our configuration's short form; empty for SDPA
    time_ms: float  # NaN where the implementation could not run
    tflops: float  # attention TFLOP/s: 4 * batch * heads * seq^2 * d_head / time


TIMING_FIELDS = [field.name for field in dataclasses.fields(TimingRow)]


def timing_row(
    dtype: str, d_head: int, seq_len: int, batch: int, heads: int, implementation: str, config: str, time_ms: float
) -> TimingRow:
    attn_flop, _ = flop_counts(d_head, batch, heads, seq_len)
    return TimingRow(dtype, d_head, seq_len, batch, heads, implementation, config, time_ms, tflops(attn_flop, time_ms))


def read_timing_csv(path: str | os.PathLike) -> list[TimingRow]:
    """Rows written by ``TimingCsvWriter`` or ``write_csv`` (pt_bench and autotune files)."""
    types = {field.name: field.type for field in dataclasses.fields(TimingRow)}
    converters = {"int": int, "float": float, "str": str}
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        absent = set(TIMING_FIELDS) - set(reader.fieldnames or [])
        if absent:
            raise ValueError(f"{path}: not a timing CSV file, it lacks the columns {', '.join(sorted(absent))}")
        return [TimingRow(**{name: converters[types[name]](row[name]) for name in TIMING_FIELDS}) for row in reader]


def write_csv(path: str | os.PathLike, rows: Sequence[object], fieldnames: Sequence[str] | None = None) -> None:
    """Writes dataclass instances or dicts to a CSV file, creating its directory."""
    dicts = [dataclasses.asdict(row) if dataclasses.is_dataclass(row) else dict(row) for row in rows]
    if fieldnames is None:
        fieldnames = list(dicts[0]) if dicts else []
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(dicts)


class TimingCsvWriter:
    """Appends timing rows to a CSV file as they are measured, so an interrupted sweep keeps them."""

    def __init__(self, path: str | os.PathLike):
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w", newline="")
        self._writer = csv.DictWriter(self._file, fieldnames=TIMING_FIELDS)
        self._writer.writeheader()

    def write(self, row: TimingRow) -> None:
        self._writer.writerow(dataclasses.asdict(row))
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TimingCsvWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def harmonic_mean(values: Iterable[float]) -> float:
    """Harmonic mean of the finite positive values (NaN if there are none): the mean of rates over
    workloads of equal size, dominated by the slow ones."""
    usable = [value for value in values if math.isfinite(value) and value > 0]
    return statistics.harmonic_mean(usable) if usable else math.nan


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def format_cell(value: object, float_format: str = ".1f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return format(value, float_format)
    return str(value)


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], float_formats: dict[int, str] | None = None
) -> str:
    """A plain-text table: a header, a rule, then the rows. Numeric columns are right-aligned, text
    columns left-aligned; floats use ``float_formats[column]`` (default one decimal), NaN and None
    show as '-'."""
    float_formats = float_formats or {}
    cells = [[format_cell(value, float_formats.get(i, ".1f")) for i, value in enumerate(row)] for row in rows]
    numeric = [
        all(_is_number(row[i]) or row[i] is None for row in rows) if rows else False for i in range(len(headers))
    ]
    widths = [max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line(headers), rule, *(line(row) for row in cells)])


# ----------------------------------------------------------------------------------------------
# Progress


class Progress:
    """A progress bar on stderr: tqdm's on a terminal if tqdm is installed, else a plain line.

    The plain line is rewritten in place on a terminal; in a log (stderr not a terminal) it is
    printed at every tenth of the work, so logs stay short.
    """

    def __init__(self, total: int, description: str = ""):
        self.total, self.description, self.done = total, description, 0
        self._interactive = sys.stderr.isatty()
        self._last_tenth = -1
        self._bar = None
        if self._interactive:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=total, desc=description, file=sys.stderr, leave=False, dynamic_ncols=True)

    def set_description(self, description: str) -> None:
        self.description = description
        if self._bar is not None:
            self._bar.set_description(description, refresh=False)

    def update(self, count: int = 1) -> None:
        self.done += count
        if self._bar is not None:
            self._bar.update(count)
        elif self._interactive:
            print(f"\r{self.description} {self.done}/{self.total}\033[K", end="", file=sys.stderr, flush=True)
        elif (tenth := 10 * self.done // max(self.total, 1)) != self._last_tenth:
            self._last_tenth = tenth
            print(f"{self.description} {self.done}/{self.total}", file=sys.stderr, flush=True)

    def write(self, message: str) -> None:
        """Prints a message to stderr without breaking the bar."""
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
            return
        if self._interactive:
            print("\r\033[K", end="", file=sys.stderr)
        print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._interactive and self.done:
            print("\r\033[K", end="", file=sys.stderr, flush=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def track(items: Iterable, total: int | None = None, description: str = "") -> Iterator:
    """Yields ``items`` while a Progress shows how many have been handled."""
    items = list(items) if total is None else items
    with Progress(len(items) if total is None else total, description) as progress:
        for item in items:
            yield item
            progress.update()


# ----------------------------------------------------------------------------------------------
# Plots


@contextlib.contextmanager
def png_figure(path: str, panels: int = 1, panel_size: tuple[float, float] = (5.5, 4.5)):
    """Yields ``panels`` matplotlib axes side by side; on exit the figure is written to the PNG
    file ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display is needed (or present on the GPU machine)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, panels, figsize=(panel_size[0] * panels, panel_size[1]), squeeze=False)
    try:
        yield list(axes[0])
        figure.tight_layout()
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)
    print(f"plot written to {path}")


def finish_tflops_axis(axis, title: str, legend_size: str = "medium") -> None:
    """TFLOP/s from zero on the y axis, the title, a light grid and the legend."""
    axis.set_ylim(bottom=0)
    axis.set_ylabel("TFLOP/s")
    axis.set_title(title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=legend_size)


@contextlib.contextmanager
def optional_import_note(module: str, consequence: str):
    """Runs the body; if it fails because ``module`` is missing, prints why and what is skipped."""
    try:
        yield
    except ModuleNotFoundError as error:
        if error.name != module:
            raise
        print(f"note: {module} is not installed: {consequence}", file=sys.stderr)
