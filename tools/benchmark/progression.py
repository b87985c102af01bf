#!/usr/bin/env python3
"""The optimisation history against SDPA FLASH: every step of previous_kernels/ rebuilt, then the Hopper steps.

Builds each step's source tree as its own extension module (previous_kernels/build_snapshot.py:
one module per tree, built with the tree's own generator and configuration code, cached, the trees
compiled in parallel), then at each benchmark shape (d_head
128, 16 heads, batch 16/16/16/16/8/4 for seq 512/1024/2048/4096/8192/16384) times every step's
configurations of the chosen dtype and SDPA's FLASH backend (FlashAttention-2) on the same inputs
in one run. A step's figure at a shape is its fastest configuration there; its output is checked
against FLASH's once per shape. A step's configurations are objects of its tree's own configuration
class, parsed from its kernels.txt by the tree's own code, so today's py/ plays no part in them.

The Hopper family's steps (progression_steps.SM90_PROGRESSION_STEPS: hopper_base, hopper_ws, ...; their
STEP.md files in previous_kernels/hopper/) have no tree: they follow the others, measured with today's build
(flash_attention) in the same run, each with the configurations of that step the build compiled
(d_head 128, any block size: build the prog or progall set with 9.0 in TORCH_CUDA_ARCH_LIST). On a
GPU other than sm_90, or where the build lacks them, they are skipped and the reason is printed.

Prints per step: what changed (its STEP.md's heading), % of FLASH at seq 4096, the
harmonic mean of ours/FLASH over the sequence lengths and TFLOP/s at 4096. --csv writes every
timing, --plot draws TFLOP/s by step, one line per sequence length. A tree that fails to build is
reported with the compiler's last lines, and its steps are left out; the others still run. The
exit status is 1 if any step failed to build or to match FLASH.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import math
import os
import pathlib
import subprocess
import sys

import bench_common as common
from flash_helpers.dispatch_table import arch_name
from flash_helpers.build_env import ARCH_LIST_ENV, BUILD_KERNELS_ENV
from flash_helpers.progression_steps import get_progression_steps
from flash_helpers.sm90_config import HopperForwardKernelConfig

SNAPSHOTS_DIR = pathlib.Path(__file__).resolve().parents[2] / "previous_kernels"
sys.path.insert(0, str(SNAPSHOTS_DIR))
import build_snapshot as snapshots  # noqa: E402

D_HEAD = 128
HEADLINE_SEQ_LEN = 4096
REFERENCE = "flash"
# Compiler output lines shown for a tree that fails to build.
BUILD_LOG_TAIL_LINES = 25


# ----------------------------------------------------------------------------------------------
# Steps


# The family whose progression previous_kernels/ does not hold: its steps are measured with today's
# build.
TREE_FAMILY = HopperForwardKernelConfig
# Where each of its steps (progression_steps.SM90_PROGRESSION_STEPS names them and gives their flags) has
# its STEP.md: NN_<step name>/. The heading, "# NN name: title", gives the step's title.
TREE_STEPS_DIR = snapshots.HOPPER_STEPS_DIR


def tree_step_dirs() -> dict[str, pathlib.Path]:
    """The directory of each step of TREE_FAMILY, by step name, in their order."""
    return {
        path.name.split("_", 1)[1]: path
        for path in sorted(TREE_STEPS_DIR.iterdir())
        if path.is_dir() and path.name[:2].isdigit()
    }


def tree_step_title(name: str) -> str:
    """What changed at a step of TREE_FAMILY: its STEP.md heading after the colon."""
    directory = tree_step_dirs().get(name)
    if directory is None:
        raise FileNotFoundError(f"the step {name!r} has no directory NN_{name} with its STEP.md under {TREE_STEPS_DIR}")
    heading = (directory / "STEP.md").read_text().splitlines()[0]
    return heading.split(":", 1)[1].strip()


@dataclasses.dataclass(frozen=True)
class TreeStep:
    """A step measured with today's build (flash_attention), not rebuilt from previous_kernels/: one
    progression step of TREE_FAMILY."""

    name: str
    title: str
    configs: tuple  # the step at d_head D_HEAD, every dtype and block size; those compiled are measured


@functools.cache
def tree_steps() -> tuple[TreeStep, ...]:
    """The steps of TREE_FAMILY, in order."""
    return tuple(
        TreeStep(name, tree_step_title(name), tuple(configs))
        for name, configs in get_progression_steps(TREE_FAMILY, all_block_sizes=True, d_heads=(D_HEAD,))
    )


def all_steps() -> list:
    """Every step in order: previous_kernels/'s, then today's tree's."""
    return [*snapshots.all_steps(), *tree_steps()]


def find_step(key: str):
    """A step of previous_kernels/ by its directory name or number, or a step of today's tree by its name."""
    for step in tree_steps():
        if key == step.name:
            return step
    try:
        return snapshots.find_step(key)
    except ValueError as error:
        names = ", ".join(step.name for step in tree_steps())
        raise ValueError(f"{error}; measured with today's build: {names}") from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--steps",
        nargs="+",
        metavar="STEP",
        help="steps to run, by directory name or number, or a Hopper step's name such as hopper_ws (default: all)",
    )
    parser.add_argument(
        "--seq-lens", "--seq_lens", dest="seq_lens", nargs="+", type=int, default=list(common.SEQ_LENS), metavar="SEQ"
    )
    common.add_dtype_argument(parser, default="fp16", fp8_refusal="the steps of previous_kernels/ are 16-bit kernels")
    parser.add_argument("--rep-ms", type=float, default=common.DEFAULT_REP_MS, help="how long each timing repeats")
    parser.add_argument("--csv", metavar="PATH", help="also write every timing to PATH")
    parser.add_argument("--plot", metavar="PATH", help="also draw TFLOP/s by step to the PNG file PATH")
    parser.add_argument("--cache-dir", type=pathlib.Path, default=snapshots.DEFAULT_CACHE, help="module build cache")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="parallel compiler processes in all (default: CPUs)"
    )
    args = parser.parse_args(argv)
    try:
        args.steps = all_steps() if not args.steps else [find_step(s) for s in args.steps]
    except ValueError as error:
        parser.error(str(error))
    if bad := [s for s in args.seq_lens if s <= 0]:
        parser.error(f"--seq-lens must be positive, got {bad}")
    return args


# ----------------------------------------------------------------------------------------------
# Building


@dataclasses.dataclass
class BuildResult:
    source: str
    error: str | None  # None when the module built


def build_in_subprocess(source: str, cache_dir: pathlib.Path, jobs: int) -> BuildResult:
    """Compiles one source tree's module in its own process, so trees build side by side."""
    log = cache_dir / f"{source}.build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(SNAPSHOTS_DIR / "build_snapshot.py"), source, "--cache-dir", str(cache_dir)]
    with open(log, "w") as log_file:
        status = subprocess.run(
            command, stdout=log_file, stderr=subprocess.STDOUT, env={**os.environ, "MAX_JOBS": str(jobs)}
        ).returncode
    if status == 0:
        return BuildResult(source, None)
    tail = "\n    ".join(log.read_text(errors="replace").splitlines()[-BUILD_LOG_TAIL_LINES:])
    return BuildResult(source, f"build failed (exit status {status}; full log: {log}):\n    {tail}")


@dataclasses.dataclass
class BuiltTree:
    tree: snapshots.Tree  # the tree written to the cache: its configurations come from its own code
    module: object  # the compiled module


def build_trees(steps: list[snapshots.Step], cache_dir: pathlib.Path, jobs: int) -> dict[str, BuiltTree]:
    """The tree and module of every source tree the steps need, built in parallel; trees that fail
    are reported and left out. Compiler processes are shared out by each tree's number of kernels."""
    sources = sorted({step.source for step in steps})
    # Written here, before the builds, so the parallel builds find their trees up to date.
    trees = {source: snapshots.source_tree(source, cache_dir) for source in sources}
    kernels = {source: len(trees[source].configs()) for source in sources}
    total = sum(kernels.values())
    failed = []
    print(f"building {len(sources)} source trees ({total} kernels) in {cache_dir}", file=sys.stderr)
    with concurrent.futures.ThreadPoolExecutor(len(sources)) as pool:
        futures = [
            pool.submit(build_in_subprocess, source, cache_dir, max(1, round(jobs * kernels[source] / total)))
            for source in sources
        ]
        for future in common.track(concurrent.futures.as_completed(futures), len(futures), "builds"):
            if (result := future.result()).error:
                failed.append(result)
    for result in failed:
        users = ", ".join(step.name for step in steps if step.source == result.source)
        print(f"{result.source} (steps {users}): {result.error}", file=sys.stderr)
    failed_sources = {result.source for result in failed}
    # Cached: this only loads the modules just built.
    return {
        source: BuiltTree(trees[source], snapshots.build(source, cache_dir))
        for source in sources
        if source not in failed_sources
    }


# ----------------------------------------------------------------------------------------------
# Measuring


@dataclasses.dataclass
class StepTiming:
    """One configuration of one step (or FLASH, with step "sdpa_flash") at one sequence length."""

    step: str
    config: str
    dtype: str
    seq_len: int
    batch: int
    heads: int
    time_ms: float
    tflops: float


def fits(cfg, dtype_name: str, seq_len: int) -> bool:
    """Whether a step's configuration runs the benchmark shape: its dtype, d_head D_HEAD, block sizes
    dividing seq_len. ``cfg`` may be of a step tree's own class, so the dtype is compared by name."""
    return (
        cfg.dtype.name.lower() == dtype_name
        and cfg.d_head == D_HEAD
        and seq_len % cfg.B_r == 0
        and seq_len % cfg.B_c == 0
    )


def make_inputs(batch: int, seq_len: int, dtype_name: str):
    """Random q, k, v of shape (batch, seq_len, heads, D_HEAD) on the GPU (``common.DEVICE``)."""
    import torch

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    shape = (batch, seq_len, common.heads_for_d_head(D_HEAD), D_HEAD)
    return tuple(torch.randn(shape, dtype=dtype, device=common.DEVICE) for _ in range(3))


@dataclasses.dataclass(frozen=True)
class Run:
    """One configuration of one step and the module that runs it: its tree's module, or today's
    flash_attention._C for a TreeStep. Both modules' ``forward(cfg, q, k, v, o=None)`` return the
    output first, and are called directly (no torch operator), so every step is timed alike."""

    step: str
    config: object
    module: object


def snapshot_runs(steps, built, dtype_name: str) -> list[Run]:
    """The configurations in this dtype of the steps of previous_kernels/ whose tree built (``built``
    maps a source tree to its BuiltTree)."""
    return [
        Run(step.name, cfg, built[step.source].module)
        for step in steps
        if step.source in built
        for cfg in built[step.source].tree.step_configs(step)
        if cfg.dtype.name.lower() == dtype_name
    ]


def tree_runs(
    steps: list[TreeStep], dtype_name: str, capability: tuple[int, int], gpu: str, extension
) -> tuple[list[Run], list[str]]:
    """The configurations of ``steps`` in this dtype that ``extension`` (the flash_attention package)
    compiled and this GPU runs (``cfg.runs_on``); and, for each step that has none, why it is
    skipped."""
    runs, skipped = [], []
    compiled = set(extension.compiled_configs())
    for step in steps:
        configs = [cfg for cfg in step.configs if cfg.dtype.name.lower() == dtype_name]
        if not any(cfg.runs_on(capability) for cfg in configs):
            skipped.append(
                f"{step.name}: skipped: {gpu} is {arch_name(capability)}, and the Hopper family's sm_90a code "
                "runs on sm_90 only"
            )
            continue
        measured = [cfg for cfg in configs if cfg in compiled and cfg.runs_on(capability)]
        if not measured:
            skipped.append(
                f"{step.name}: skipped: this build (kernel set '{extension.compiled_kernel_set()}') has none of its "
                f"{dtype_name} configurations; build them with {BUILD_KERNELS_ENV}=prog (or progall) and 9.0 in "
                f"{ARCH_LIST_ENV}"
            )
            continue
        runs += [Run(step.name, cfg, extension._C) for cfg in measured]
    return runs, skipped


def today_runs(steps: list[TreeStep], dtype_name: str) -> tuple[list[Run], list[str]]:
    """``tree_runs`` with today's build on the current GPU; where the build does not import, every step
    is skipped with that reason."""
    import torch

    try:
        import flash_attention
    except ImportError as error:
        reason = f"flash_attention does not import ({error}): build it with pip install --no-build-isolation -e ."
        return [], [f"{step.name}: skipped: {reason}" for step in steps]
    capability, gpu = torch.cuda.get_device_capability(), torch.cuda.get_device_name()
    return tree_runs(steps, dtype_name, capability, gpu, flash_attention)


def measure(runs: list[Run], seq_lens, dtype_name, timer) -> tuple[list[StepTiming], list[str]]:
    """Times every run and FLASH at each sequence length; returns the timings and the correctness
    failures."""
    heads = common.heads_for_d_head(D_HEAD)
    timings, failures = [], []
    with common.Progress(len(seq_lens) * (len(runs) + 1), "timing") as progress:
        for seq_len in seq_lens:
            batch = common.batch_for_seq_len(seq_len)
            attn_flop, _ = common.flop_counts(D_HEAD, batch, heads, seq_len)
            q, k, v = make_inputs(batch, seq_len, dtype_name)
            o = q.new_empty(q.shape)

            def record(step: str, config: str, time_ms: float) -> None:
                tflops = common.tflops(attn_flop, time_ms)
                timings.append(StepTiming(step, config, dtype_name, seq_len, batch, heads, time_ms, tflops))
                progress.update()

            run_flash = common.sdpa_runner(q, k, v)
            with common.use_sdpa_reference(REFERENCE):
                record(reference_name(), "", timer(run_flash))
                flash_output = run_flash()
            checked = set()
            for run in runs:
                cfg = run.config
                if not fits(cfg, dtype_name, seq_len):
                    record(run.step, cfg.short_form(), math.nan)
                    continue
                record(run.step, cfg.short_form(), timer(functools.partial(run.module.forward, cfg, q, k, v, o)))
                if run.step not in checked:
                    checked.add(run.step)
                    out = run.module.forward(cfg, q, k, v)[0]
                    what = f"{run.step} {cfg.short_form()} at seq {seq_len}"
                    if failure := common.flash_mismatch(out, flash_output, dtype_name, what):
                        failures.append(failure)
    return timings, failures


def reference_name() -> str:
    return f"sdpa_{REFERENCE}"


# ----------------------------------------------------------------------------------------------
# Reporting


def best_tflops(timings: list[StepTiming], step: str, seq_len: int) -> float:
    values = [t.tflops for t in timings if t.step == step and t.seq_len == seq_len and math.isfinite(t.tflops)]
    return max(values, default=math.nan)


def summary_rows(steps, timings, seq_lens) -> list[dict]:
    """Per step: TFLOP/s at each sequence length, % of FLASH at the headline length, harmonic mean."""
    flash = {seq_len: best_tflops(timings, reference_name(), seq_len) for seq_len in seq_lens}
    rows = []
    for step in steps:
        tflops = {seq_len: best_tflops(timings, step.name, seq_len) for seq_len in seq_lens}
        if all(math.isnan(value) for value in tflops.values()):
            continue
        ratios = [tflops[s] / flash[s] for s in seq_lens if math.isfinite(tflops[s]) and flash[s] > 0]
        rows.append(
            {
                "step": step.name,
                "what changed": step.title,
                "tflops": tflops,
                "ratio_at_headline": tflops.get(HEADLINE_SEQ_LEN, math.nan) / flash.get(HEADLINE_SEQ_LEN, math.nan),
                "harmonic_mean": common.harmonic_mean(ratios) if ratios else math.nan,
            }
        )
    return rows


def format_summary(rows: list[dict], seq_lens: list[int], dtype_name: str) -> str:
    headline = HEADLINE_SEQ_LEN in seq_lens
    headers = ["step", "what changed"]
    if headline:
        headers += [f"% of FLASH at {HEADLINE_SEQ_LEN}"]
    headers += [f"harmonic mean vs FLASH ({min(seq_lens)}-{max(seq_lens)})"]
    if headline:
        headers += [f"TFLOP/s at {HEADLINE_SEQ_LEN}"]
    table = []
    for row in rows:
        line = [row["step"], row["what changed"]]
        if headline:
            line.append(100 * row["ratio_at_headline"])
        line.append(row["harmonic_mean"])
        if headline:
            line.append(row["tflops"][HEADLINE_SEQ_LEN])
        table.append(line)
    mean_column = 3 if headline else 2
    title = f"{dtype_name}, d_head {D_HEAD}, {common.heads_for_d_head(D_HEAD)} heads; FLASH = SDPA's FlashAttention-2"
    return "\n".join([title, common.format_table(headers, table, float_formats={mean_column: ".3f"})])


def format_tflops_table(rows: list[dict], timings: list[StepTiming], seq_lens: list[int]) -> str:
    headers = ["step", *(str(s) for s in seq_lens)]
    table = [[row["step"], *(row["tflops"][s] for s in seq_lens)] for row in rows]
    table.append(["SDPA FLASH", *(best_tflops(timings, reference_name(), s) for s in seq_lens)])
    return "TFLOP/s by sequence length\n" + common.format_table(headers, table)


def plot(path: str, rows: list[dict], timings: list[StepTiming], seq_lens: list[int], dtype_name: str) -> None:
    """TFLOP/s by step, one line per sequence length, FLASH at each length as a dotted line."""
    with common.png_figure(path, panel_size=(max(7.0, 0.8 * len(rows) + 3), 5)) as (axis,):
        positions = range(len(rows))
        for seq_len in seq_lens:
            line = axis.plot(positions, [row["tflops"][seq_len] for row in rows], marker="o", label=f"seq {seq_len}")
            flash = best_tflops(timings, reference_name(), seq_len)
            axis.axhline(flash, color=line[0].get_color(), linestyle=":", linewidth=1)
        axis.set_xticks(list(positions), [row["step"] for row in rows], rotation=35, ha="right")
        title = f"{dtype_name}, d_head {D_HEAD}: each step (dotted: SDPA FLASH at the same length)"
        common.finish_tflops_axis(axis, title, legend_size="small")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("the progression"), file=sys.stderr)
        return 1
    import torch

    snapshot_steps = [step for step in args.steps if isinstance(step, snapshots.Step)]
    steps_today = [step for step in args.steps if isinstance(step, TreeStep)]
    built = build_trees(snapshot_steps, args.cache_dir, args.jobs) if snapshot_steps else {}
    runs_today, skipped = today_runs(steps_today, args.dtype) if steps_today else ([], [])
    runs = snapshot_runs(snapshot_steps, built, args.dtype) + runs_today
    timer, timer_description = common.make_timer(args.rep_ms)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {timer_description}")
    for reason in skipped:
        print(reason)
    timings, failures = measure(runs, args.seq_lens, args.dtype, timer)
    rows = summary_rows(args.steps, timings, args.seq_lens)
    print(format_summary(rows, args.seq_lens, args.dtype))
    print()
    print(format_tflops_table(rows, timings, args.seq_lens))
    if args.csv:
        common.write_csv(args.csv, timings)
        print(f"timings written to {args.csv}")
    if args.plot:
        with common.optional_import_note("matplotlib", "no plot"):
            plot(args.plot, rows, timings, args.seq_lens, args.dtype)
    for failure in failures:
        print(failure, file=sys.stderr)
    built_all = all(step.source in built for step in snapshot_steps)
    return 0 if built_all and not failures else 1


if __name__ == "__main__":
    sys.exit(main())
