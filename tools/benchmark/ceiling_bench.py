#!/usr/bin/env python3
"""What this GPU can do at all, sustained under its power limit: the ceilings an attention
kernel's TFLOP/s and GB/s are read against.

- tensor: the tensor pipe with nothing else to do. Three warpgroups per multiprocessor issue wgmma
  m64nNk16 (k32 for e4m3) back to back on random operands in shared memory: no global memory, no
  softmax, no other instruction in the loop (ceiling_kernels.cu, built on the Hopper family's wgmma
  wrappers and compiled at first use for sm_90a). An attention kernel issues the same products and
  more besides, so at the same power limit it cannot run faster than this.
- matmul: torch.matmul of 8192 x 8192 x 8192 (cuBLAS); e4m3 through torch._scaled_mm.
- read: HBM read bandwidth, a 4 GiB buffer read once per call in 16-byte streaming loads.
- copy: a 4 GiB device-to-device copy; GB/s counts the bytes read and the bytes written.

Each runs back to back for --seconds while nvidia-smi samples the SM clock and board power
(power_bench's loop); reported over the last two thirds of the loop: the rate (median of timings
of 20 calls each), the median clock and power, and the rate per watt. A ceiling that cannot run
(an e4m3 matmul this torch lacks) is named under the table, with why.

Needs nvidia-smi, and for tensor and read a GPU of compute capability 9.0 and nvcc (the kernels are
compiled for sm_90a; elsewhere read is named as missing).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

import bench_common as common
import power_bench

WHAT = ("tensor", "matmul", "read", "copy")
WGMMA_NS = (64, 128, 176, 256)
DTYPES = ("bf16", "fp16", "e4m3")
# Enough wgmma groups per launch that one launch lasts milliseconds at any N.
TENSOR_ITERATIONS = 2000
MATMUL_SIZE = 8192
STREAM_BYTES = 4 << 30
KERNEL_SOURCE = pathlib.Path(__file__).with_name("ceiling_kernels.cu")


@dataclasses.dataclass(frozen=True)
class Ceiling:
    """One sustained loop's rate (TFLOP/s or GB/s), clock and power."""

    label: str
    unit: str
    rate: float
    sm_clock_mhz: float
    power_w: float

    @property
    def rate_per_watt(self) -> float:
        return self.rate / self.power_w


def tensor_flop(sms: int, n: int, element_bytes: int, iterations: int, kernels) -> float:
    """The FLOP one tensor_pipe launch does: every warpgroup's products, each 2 * M * N * K."""
    k = kernels.wgmma_k_bytes // element_bytes
    products = sms * kernels.warpgroups_per_sm * iterations * kernels.products_per_iteration
    return products * 2.0 * kernels.wgmma_m * n * k


def ceiling_from(label: str, unit: str, amount: float, timings_ms: list[float], samples) -> Ceiling:
    """amount (FLOP, or bytes) per call over the settled median time, in TFLOP/s or GB/s: power_bench's
    summary of a loop (whose rate counts amount / 1e12 per second), in this unit."""
    run = power_bench.summarize(label, "random", amount, timings_ms, samples)
    rate = run.tflops if unit == "TFLOP/s" else run.tflops * 1000
    return Ceiling(label, unit, rate, run.sm_clock_mhz, run.power_w)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--what", nargs="+", choices=WHAT, default=list(WHAT), help="the ceilings to measure (default: all)")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["bf16"], help="tensor and matmul dtypes (default: bf16)")
    parser.add_argument("--n", nargs="+", type=int, choices=WGMMA_NS, default=[256], help="wgmma N of the tensor loop (default: 256)")
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each loop runs (default: 5)")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi command (default: on PATH)")
    args = parser.parse_args(argv)
    if not args.seconds > 0:
        parser.error(f"--seconds must be positive, got {args.seconds}")
    return args


def format_ceilings(ceilings: list[Ceiling], missing: dict[str, str]) -> str:
    """The table, then a line per ceiling that did not run, with why."""
    headers = ["ceiling", "rate", "unit", "SM clock (MHz)", "power (W)", "rate per W"]
    rows = [[c.label, c.rate, c.unit, c.sm_clock_mhz, c.power_w, c.rate_per_watt] for c in ceilings]
    lines = [common.format_table(headers, rows, float_formats={1: ".1f", 3: ".0f", 4: ".0f", 5: ".3f"})]
    lines += [f"{label}: missing: {why}" for label, why in missing.items()]
    return "\n".join(lines)


def torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn}[name]


def random_operand(shape, dtype_name: str):
    import torch

    return torch.randn(shape, device="cuda").to(torch_dtype(dtype_name))


def tensor_call(kernels, dtype_name: str, n: int):
    import torch

    # A's 64 rows and B's N rows, each operand_row_bytes long.
    elements = (kernels.wgmma_m + n) * kernels.operand_row_bytes // torch_dtype(dtype_name).itemsize
    operands = random_operand(elements, dtype_name)
    sink = torch.empty(4096, device="cuda", dtype=torch.float32)
    return lambda: kernels.tensor_pipe(operands, n, TENSOR_ITERATIONS, sink)


def matmul_call(dtype_name: str):
    import torch

    a = random_operand((MATMUL_SIZE, MATMUL_SIZE), dtype_name)
    b = random_operand((MATMUL_SIZE, MATMUL_SIZE), dtype_name)
    if dtype_name != "e4m3":
        return lambda: torch.matmul(a, b)
    one = torch.ones((), device="cuda")
    b_columns = b.t()  # _scaled_mm takes its second operand column-major
    return lambda: torch._scaled_mm(a, b_columns, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    smi = power_bench.find_nvidia_smi("ceiling_bench.py", args.nvidia_smi)
    if smi is None:
        return 1

    import torch

    ceilings, missing = [], {}

    def measure(label: str, unit: str, amount: float, call) -> None:
        try:
            ceilings.append(ceiling_from(label, unit, amount, *power_bench.run_sustained(call, args.seconds, smi)))
        except (RuntimeError, TypeError) as error:
            missing[label] = f"{type(error).__name__}: {error}"

    if "tensor" in args.what:
        if torch.cuda.get_device_capability() != (9, 0):
            missing["tensor"] = "the wgmma loop runs on compute capability 9.0 alone"
        else:
            kernels = common.load_sm90a_kernels(KERNEL_SOURCE)
            sms = torch.cuda.get_device_properties(0).multi_processor_count
            for dtype_name in args.dtypes:
                element_bytes = torch_dtype(dtype_name).itemsize
                for n in args.n:
                    flop = tensor_flop(sms, n, element_bytes, TENSOR_ITERATIONS, kernels)
                    measure(f"tensor pipe, wgmma {dtype_name} N={n}", "TFLOP/s", flop, tensor_call(kernels, dtype_name, n))
    if "matmul" in args.what:
        for dtype_name in args.dtypes:
            measure(f"torch.matmul {MATMUL_SIZE}^3 {dtype_name}", "TFLOP/s", 2.0 * MATMUL_SIZE**3, matmul_call(dtype_name))
    if "read" in args.what or "copy" in args.what:
        source = torch.empty(STREAM_BYTES, device="cuda", dtype=torch.uint8).random_()
        if "read" in args.what:
            kernels = common.load_sm90a_kernels(KERNEL_SOURCE)
            sink = torch.empty(1, device="cuda", dtype=torch.int32)
            measure("HBM read", "GB/s", STREAM_BYTES, lambda: kernels.read_every_byte(source, sink))
        if "copy" in args.what:
            target = torch.empty_like(source)
            measure("HBM copy (read + write)", "GB/s", 2 * STREAM_BYTES, lambda: target.copy_(source))
    print(f"{torch.cuda.get_device_name()}; {args.seconds:g} s per loop")
    print(format_ceilings(ceilings, missing))
    return 0


if __name__ == "__main__":
    sys.exit(main())
