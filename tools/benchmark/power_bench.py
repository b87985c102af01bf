#!/usr/bin/env python3
"""Sustained throughput under the GPU's power limit: each kernel runs back to back for a few
seconds while nvidia-smi samples the SM clock and the board power.

Short timings (pt_bench, progression) find the GPU at whatever clock its recent load left it at.
Under sustained tensor-core load an H100 or H200 is held at its power limit, and its clock falls
with the power that the inputs make the tensor cores draw (fp16 operands toggle more bits than
bf16 ones). For each selected configuration and each --reference SDPA backend, at the benchmark
shape of SEQ_LEN and D_HEAD (batch 16, at most 64Ki tokens; heads * d_head = 2048), this runs the
kernel in a loop for --seconds and reports, over the last two thirds of the loop: TFLOP/s (the
median of timings of 20 calls each), the median SM clock and board power, and the highest
temperature, TFLOP/s per GHz of that clock (the work done per cycle: two kernels' ratio of it is
what their schedules give apart from the clock the power leaves them), and TFLOP per joule
(TFLOP/s over watts: at the power limit, the kernel that spends less energy per FLOP keeps the
higher clock). --constant-inputs runs each once more on inputs
whose elements are all equal: the same instructions, with operands that never toggle, so its
clock and power show how far the random inputs' power holds the kernel back. --peers fa3 fa4 runs
the peers' flash_attn_func the same way (a missing peer is named under the table, with why);
--shape llama70b takes pt_bench's grouped-query shape (batch 2, 64 query heads over 8 of 128).
--dtype e4m3 runs FP8 inputs with descales of 1 given to ours and to FA3 alike, as pt_bench.py
does; the SDPA backends and FA4 take no e4m3 and are reported as missing.

Needs a GPU and nvidia-smi.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import subprocess
import sys
import time

import bench_common as common

# What nvidia-smi samples, in this order, and how often.
SMI_FIELDS = ("clocks.sm", "power.draw", "temperature.gpu")
SMI_PERIOD_MS = 100
# Calls per timed batch in the loop, and the leading share of the loop left out while the clock settles.
CALLS_PER_TIMING = 20
SETTLING_FRACTION = 1 / 3


@dataclasses.dataclass(frozen=True)
class Sample:
    """One nvidia-smi reading."""

    sm_clock_mhz: float
    power_w: float
    temperature_c: float


@dataclasses.dataclass(frozen=True)
class SustainedRun:
    """One kernel's loop: the median of its timings and of its samples after settling."""

    label: str
    inputs: str  # "random" or "constant"
    tflops: float
    sm_clock_mhz: float
    power_w: float
    max_temperature_c: float

    @property
    def tflops_per_ghz(self) -> float:
        return self.tflops / (self.sm_clock_mhz / 1000)

    @property
    def tflop_per_joule(self) -> float:
        return self.tflops / self.power_w


def parse_samples(text: str) -> list[Sample]:
    """nvidia-smi's ``--format=csv,noheader,nounits`` lines of SMI_FIELDS; lines that are not
    three numbers (a field the GPU does not report reads ``[N/A]``) are left out."""
    samples = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        try:
            values = [float(field) for field in fields]
        except ValueError:
            continue
        if len(values) == len(SMI_FIELDS):
            samples.append(Sample(*values))
    return samples


def after_settling(values: list) -> list:
    """The values after the leading SETTLING_FRACTION of them (all of them if that leaves none)."""
    rest = values[int(len(values) * SETTLING_FRACTION) :]
    return rest or values


def summarize(label: str, inputs: str, flop: float, timings_ms: list[float], samples: list[Sample]) -> SustainedRun:
    timings_ms, samples = after_settling(timings_ms), after_settling(samples)
    return SustainedRun(
        label,
        inputs,
        common.tflops(flop, statistics.median(timings_ms)),
        statistics.median(sample.sm_clock_mhz for sample in samples) if samples else float("nan"),
        statistics.median(sample.power_w for sample in samples) if samples else float("nan"),
        max(sample.temperature_c for sample in samples) if samples else float("nan"),
    )


def run_sustained(fn, seconds: float, smi: str) -> tuple[list[float], list[Sample]]:
    """Runs fn in batches of CALLS_PER_TIMING for ``seconds`` while nvidia-smi samples the GPU;
    returns each batch's time per call (ms) and the samples, in order."""
    import torch

    fn()
    torch.cuda.synchronize()
    query = ",".join(SMI_FIELDS)
    sampler = subprocess.Popen(
        [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits", f"-lms={SMI_PERIOD_MS}",
         f"--id={torch.cuda.current_device()}"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timings = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            start.record()
            for _ in range(CALLS_PER_TIMING):
                fn()
            end.record()
            end.synchronize()
            timings.append(start.elapsed_time(end) / CALLS_PER_TIMING)
    finally:
        sampler.terminate()
        output, _ = sampler.communicate()
    return timings, parse_samples(output)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("seq_len", type=common.positive_int, metavar="SEQ_LEN", help="sequence length")
    parser.add_argument("d_head", type=int, choices=common.D_HEADS, metavar="D_HEAD", help="head dimension")
    parser.add_argument(
        "--kernels",
        help="configurations to run: short forms separated by ';', or a set name; default: the KERNELS "
        "environment variable, else every compiled configuration",
    )
    common.add_dtype_argument(parser, default="fp16")
    parser.add_argument("--causal", action="store_true", help="with the causal mask (bottom-right aligned)")
    parser.add_argument(
        "--reference",
        choices=("none", *common.SDPA_REFERENCES),
        default="cudnn",
        help="an SDPA backend to run as well (default: cudnn)",
    )
    common.add_peers_argument(parser, "run")
    common.add_shape_argument(parser, "the benchmark shape of SEQ_LEN and D_HEAD")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each loop runs (default: 5)")
    parser.add_argument(
        "--constant-inputs", action="store_true", help="also run each on inputs whose elements are all equal"
    )
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi command (default: on PATH)")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    shape_error = common.shape_error(args.shape, [args.d_head])
    if shape_error:
        parser.error(shape_error)
    return args


def format_runs(runs: list[SustainedRun], missing: dict[str, str]) -> str:
    """The table of the runs, then a line per peer that did not run, with why."""
    headers = [
        "kernel", "inputs", "TFLOP/s", "SM clock (MHz)", "TFLOP/s per GHz", "power (W)", "TFLOP/J", "max temp (C)"
    ]  # fmt: skip
    rows = [
        [r.label, r.inputs, r.tflops, r.sm_clock_mhz, r.tflops_per_ghz, r.power_w, r.tflop_per_joule,
         r.max_temperature_c]
        for r in runs
    ]  # fmt: skip
    formats = {2: ".1f", 3: ".0f", 4: ".1f", 5: ".0f", 6: ".3f", 7: ".0f"}
    lines = [common.format_table(headers, rows, float_formats=formats)]
    lines += [f"{peer}: missing: {why}" for peer, why in missing.items()]
    return "\n".join(lines)


def find_nvidia_smi(tool: str, command: str) -> str | None:
    """The path of nvidia-smi (``command``), or None after saying on stderr why ``tool`` cannot
    sample the GPU: no GPU visible, or no such command."""
    if not common.gpu_available():
        print(common.no_gpu_message(tool), file=sys.stderr)
        return None
    smi = shutil.which(command)
    if smi is None:
        print(f"{command} not found: {tool} samples the clock and power with it", file=sys.stderr)
    return smi


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    smi = find_nvidia_smi("power_bench.py", args.nvidia_smi)
    if smi is None:
        return 1

    import torch

    import flash_attention

    dtype = common.dtype_from_name(args.dtype)
    problem = common.shape_problem(args.shape, args.seq_len, args.d_head, args.causal)
    try:
        selected = common.select_configs(args.kernels)
    except common.ConfigSelectionError as error:
        print(error, file=sys.stderr)
        return 1
    configs = common.fitting_configs(selected, dtype, problem)
    reference = args.reference
    if reference != "none" and (refusal := common.dtype_refusal(reference, dtype)):
        print(f"{common.SDPA_REFERENCES[reference]} cannot run {args.dtype}: {refusal}", file=sys.stderr)
        reference = "none"
    if not configs and reference == "none" and not args.peers:
        print(
            "nothing to run: no selected configuration fits this shape, no SDPA reference runs and no --peers",
            file=sys.stderr,
        )
        return 1
    peers, missing = {}, {}
    for peer in args.peers:
        refusal = common.dtype_refusal(peer, dtype)
        function, why = (None, refusal) if refusal else common.PEER_LOADERS[peer]("flash_attn_func")
        if function is None:
            missing[peer.upper()] = why
        else:
            peers[peer.upper()] = function
    flop, _ = problem.flop_counts()
    q, k, v = common.make_inputs(problem, dtype, seed=0)
    descales = common.make_descales(problem, dtype)
    inputs = {"random": (q, k, v)}
    if args.constant_inputs:
        inputs["constant"] = tuple(torch.full_like(t, 0.01) for t in (q, k, v))
    print(f"{problem.describe()}, {args.dtype}; {args.seconds:g} s per loop; TFLOP/s count {common.flop_rule(problem)}")

    runs = []
    for name, (q_in, k_in, v_in) in inputs.items():
        for cfg in configs:
            o = common.make_output(q_in)

            def ours(cfg=cfg, q_in=q_in, k_in=k_in, v_in=v_in, o=o):
                flash_attention.forward(cfg, q_in, k_in, v_in, o, causal=args.causal, **descales)

            runs.append(summarize(cfg.short_form(), name, flop, *run_sustained(ours, args.seconds, smi)))
        if reference != "none":
            try:
                call = common.sdpa_call(reference, q_in, k_in, v_in, args.causal)
            except RuntimeError as error:
                print(f"{common.SDPA_REFERENCES[reference]} cannot run this shape: {error}", file=sys.stderr)
                continue
            with common.use_sdpa_reference(reference):
                timings, samples = run_sustained(call.run, args.seconds, smi)
            runs.append(summarize(common.SDPA_REFERENCES[reference], name, flop, timings, samples))
        for label, function in peers.items():
            call = common.peer_call(function, q_in, k_in, v_in, args.causal, **descales)
            try:
                runs.append(summarize(label, name, flop, *run_sustained(call, args.seconds, smi)))
            except Exception as error:  # a peer's own checks raise what they like
                missing[label] = f"cannot run this shape: {type(error).__name__}: {error}"

    print(format_runs(runs, missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
