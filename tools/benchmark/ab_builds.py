#!/usr/bin/env python3
"""Measures a change against a base tree: the same kernels built in both, a benchmark run in each in turn.

    python3 tools/benchmark/ab_builds.py --base REV | --base-tree DIR [--kernels SELECTION] [--rounds N]
        [--metric NAME] [--csv PATH] [--work-dir DIR] [--no-build] -- BENCHMARK.py [ITS ARGUMENTS ...]

The base is a git revision, exported with `git archive` into WORK/base, or a tree already there (a
copy made where the repository's history is, carried to a GPU machine whose copy has none). Both
trees are built in place (`setup.py build_ext --inplace`, so each keeps its module in its own
py/flash_attention), side by side with half the MAX_JOBS each, from one FLASH_BUILD_KERNELS
selection (--kernels, default the environment's): a selection of the kernels the change touches
builds in a minute or two. Then the benchmark, a script of this tree's tools (the same timing code
for both), runs --rounds times per build, base first and the builds in turn (base, change, base,
change, ...), each run in a process of its own whose PYTHONPATH starts with that build's py/ (so it
imports that build's module and helpers: bench_common puts its own checkout's py/ after PYTHONPATH), and
writes its CSV (its --csv is added) under WORK. The peers it times (FA3, SDPA) run in every
process: their ratio between the builds is the runs' noise.

Printed last: per row of the benchmark's CSV (its columns other than the measurements, those that
differ between rows), the median of --metric (default gbps, else tflops, else time_ms) per build,
change / base, and each run's value; --csv writes every row with its build and run. Columns of
numbers one or more of which has a fraction (or is NaN) count as measurements; any other column
names the row. Build logs go to WORK/build_base.log and WORK/build_change.log; the change's build is this
checkout's module afterwards (rebuild the full set when done). --no-build reuses the modules both
trees hold. The exit status is 1 if a build or a benchmark run fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "py"))

import bench_common as common  # noqa: E402
from flash_helpers.build_env import BUILD_KERNELS_ENV  # noqa: E402

BUILDS = ("base", "change")
METRICS = ("gbps", "tflops", "time_ms")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else argv
    ours, benchmark = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], usage="%(prog)s [options] -- BENCHMARK.py [ITS ARGUMENTS ...]"
    )
    base = parser.add_mutually_exclusive_group(required=True)
    base.add_argument("--base", metavar="REV", help="the git revision to measure against")
    base.add_argument("--base-tree", metavar="DIR", type=pathlib.Path, help="a tree of the base, already exported")
    parser.add_argument(
        "--kernels", help=f"the builds' kernel selection (default: ${BUILD_KERNELS_ENV}, else the default set)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="runs of the benchmark per build (default: 2)")
    parser.add_argument(
        "--metric", help=f"the CSV column compared (default: the first present of {', '.join(METRICS)})"
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every row with its build and run to PATH")
    parser.add_argument("--work-dir", type=pathlib.Path, default=pathlib.Path("/tmp/ab_builds"))
    parser.add_argument("--no-build", action="store_true", help="run on the modules both trees already hold")
    args = parser.parse_args(ours)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not benchmark or not benchmark[0].endswith(".py"):
        parser.error("name the benchmark after '--': a Python script and its arguments (its --csv is added)")
    if "--csv" in benchmark:
        parser.error("the benchmark's --csv is ab_builds' own (each run writes its CSV under --work-dir)")
    args.benchmark = benchmark
    return args


def export_revision(rev: str, destination: pathlib.Path) -> None:
    """Writes the tree of git revision ``rev`` of this repository to ``destination`` (emptied first)."""
    shutil.rmtree(destination, ignore_errors=True)
    destination.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", rev], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"ab_builds: git archive {rev} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(destination)], input=archive.stdout, check=True)


def build(tree: pathlib.Path, log: pathlib.Path, kernels: str | None, jobs: int) -> int:
    """Builds ``tree``'s extension in place with ``jobs`` compiles at once and the kernel selection
    ``kernels`` (None: the environment's); returns setup.py's exit status (its output in ``log``)."""
    env = {**os.environ, "MAX_JOBS": str(jobs)}
    if kernels is not None:
        env[BUILD_KERNELS_ENV] = kernels
    with open(log, "w") as out:
        command = [sys.executable, "setup.py", "build_ext", "--inplace"]
        return subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode


def run_order(rounds: int) -> list[tuple[str, int]]:
    """(build, round) in the order they run: base first, the builds in turn."""
    return [(name, r) for r in range(1, rounds + 1) for name in BUILDS]


def run_benchmark(tree: pathlib.Path, benchmark: list[str], csv_path: pathlib.Path) -> subprocess.CompletedProcess:
    """One run of the benchmark script (this tree's) on ``tree``'s build."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree / "py"), os.environ.get("PYTHONPATH")]))
    script = str((REPO_ROOT / benchmark[0]) if not os.path.isabs(benchmark[0]) else benchmark[0])
    command = [sys.executable, script, *benchmark[1:], "--csv", str(csv_path)]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, check=False)


def _is_measurement(values: list[str]) -> bool:
    """A column of numbers at least one of which has a fraction (or is NaN): a measurement."""
    try:
        numbers = [float(value) for value in values]
    except ValueError:
        return False
    return any(math.isnan(x) or not x.is_integer() for x in numbers)


def summarize(rows: list[dict], metric: str | None = None) -> tuple[str, list[str], list[dict]]:
    """(metric, key columns, one line per benchmark row): rows are the CSV rows of every run, each
    with its "build" and "run"; a line has the row's key values, each build's metric per run (in run
    order) and median, and change / base."""
    if not rows:
        raise ValueError("no benchmark rows to compare")
    columns = [c for c in rows[0] if c not in ("build", "run")]
    if metric is None:
        metric = next((m for m in METRICS if m in columns), None)
        if metric is None:
            raise ValueError(f"the benchmark's CSV has none of {', '.join(METRICS)}: name --metric")
    if metric not in columns:
        raise ValueError(f"--metric {metric}: the benchmark's CSV has no such column ({', '.join(columns)})")
    keys = [c for c in columns if c != metric and not _is_measurement([row[c] for row in rows])]
    varying = [c for c in keys if len({row[c] for row in rows}) > 1]
    lines: dict[tuple, dict] = {}
    for row in sorted(rows, key=lambda r: int(r["run"])):
        key = tuple(row[c] for c in keys)
        line = lines.setdefault(key, {**{c: row[c] for c in varying}, "base": [], "change": []})
        line[row["build"]].append(float(row[metric]))
    for line in lines.values():
        for name in BUILDS:
            values = [x for x in line[name] if not math.isnan(x)]
            line[f"{name}_median"] = statistics.median(values) if values else math.nan
        base = line["base_median"]
        line["ratio"] = line["change_median"] / base if base and not math.isnan(base) else math.nan
    return metric, varying, list(lines.values())


def format_summary(metric: str, columns: list[str], lines: list[dict]) -> str:
    header = [*columns, f"base {metric}", f"change {metric}", "change/base", "base runs", "change runs"]
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(columns) + "---:|" * 3 + "---|---|"]
    runs = lambda values: ", ".join(f"{x:.4g}" for x in values)  # noqa: E731
    for line in lines:
        cells = [line[c] for c in columns]
        cells += [f"{line['base_median']:.4g}", f"{line['change_median']:.4g}", f"{line['ratio']:.3f}"]
        out.append("| " + " | ".join([*cells, runs(line["base"]), runs(line["change"])]) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.work_dir
    work.mkdir(parents=True, exist_ok=True)
    base_tree = args.base_tree
    if base_tree is None:
        base_tree = work / "base"
        if not args.no_build:
            export_revision(args.base, base_tree)
    if not (base_tree / "py").is_dir():
        print(f"ab_builds: {base_tree} holds no tree of this repository (no py/)", file=sys.stderr)
        return 1
    trees = {"base": base_tree.resolve(), "change": REPO_ROOT}
    if not args.no_build:
        jobs = max(1, int(os.environ.get("MAX_JOBS", os.cpu_count() or 2)) // 2)
        with concurrent.futures.ThreadPoolExecutor(len(BUILDS)) as pool:
            logs = {name: work / f"build_{name}.log" for name in BUILDS}
            statuses = dict(zip(BUILDS, pool.map(lambda n: build(trees[n], logs[n], args.kernels, jobs), BUILDS)))
        failed = [name for name, status in statuses.items() if status != 0]
        for name in failed:
            tail = logs[name].read_text().splitlines()[-15:]
            print(f"ab_builds: the {name} build failed ({trees[name]}); its log ends:", *tail, sep="\n",
                  file=sys.stderr)  # fmt: skip
        if failed:
            return 1
    rows = []
    for run, (name, r) in enumerate(run_order(args.rounds), start=1):
        csv_path = work / f"{name}_{r}.csv"
        print(f"run {run}: {name}, round {r}", flush=True)
        result = run_benchmark(trees[name], args.benchmark, csv_path)
        if result.returncode != 0 or not csv_path.exists():
            output = result.stdout[-3000:] + result.stderr[-3000:]
            print(f"ab_builds: the benchmark failed on the {name} build:\n{output}", file=sys.stderr)
            return 1
        with open(csv_path, newline="") as file:
            rows += [{"build": name, "run": str(run), **row} for row in csv.DictReader(file)]
    metric, columns, lines = summarize(rows, args.metric)
    if args.csv:
        common.write_csv(args.csv, rows)
    print(f"base: {trees['base']}; change: {trees['change']}; {args.rounds} round(s), in turn base, change")
    print(format_summary(metric, columns, lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
