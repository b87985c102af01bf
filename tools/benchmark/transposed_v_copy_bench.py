#!/usr/bin/env python3
"""V's transposed copy alone (the copy kernel of the e4m3 configurations with V_transposed_copy), at
each block size it compiles with: its time, its rate in GB/s (the bytes read plus the bytes written),
and the same bytes copied by torch (a device-to-device copy, the ceiling such a kernel reads against).

The shapes are pt_bench's: for each head size and length, its batch and heads, V a contiguous
(batch, seq, heads, d_head) e4m3 tensor of random bytes. Each block size's copy is checked bit for bit
against the transposition written in torch (keys rounded up to 16 with zeros, each 16 in the order
P's registers hold them) before it is timed. The kernels (transposed_v_copy_kernels.cu, built on the
Hopper family's header) are compiled at first use for sm_90a.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys

import bench_common as common

KERNEL_SOURCE = pathlib.Path(__file__).with_name("transposed_v_copy_kernels.cu")
TILE_KEYS = (64, 128, 256)
KERNEL_D_HEADS = (64, 128, 256)
# Within each 16 keys, slot s of the copy holds key KEY_ORDER[s]: 4u .. 4u + 3 are 2u, 2u + 1, 2u + 8, 2u + 9.
KEY_ORDER = tuple(key for u in range(4) for key in (2 * u, 2 * u + 1, 2 * u + 8, 2 * u + 9))


def expected_copy(v):
    """The transposition in torch: (batch, heads, d_head, keys rounded up to 16) bytes."""
    import torch

    batch, seq, heads, d_head = v.shape
    row_keys = -(-seq // 16) * 16
    columns = torch.zeros((batch, heads, d_head, row_keys), dtype=torch.uint8, device=v.device)
    columns[..., :seq] = v.view(torch.uint8).permute(0, 2, 3, 1)
    order = torch.tensor(KEY_ORDER, device=v.device)
    return columns.view(batch, heads, d_head, row_keys // 16, 16)[..., order].reshape(columns.shape)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="\n\n".join(__doc__.split("\n\n")[1:]),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--d-heads", type=int, nargs="+", choices=KERNEL_D_HEADS, default=list(KERNEL_D_HEADS))
    parser.add_argument("--seq-lens", type=common.positive_int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--tile-keys", type=int, nargs="+", choices=TILE_KEYS, default=list(TILE_KEYS))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("transposed_v_copy_bench.py"), file=sys.stderr)
        return 1
    import torch

    kernels = common.load_sm90a_kernels(KERNEL_SOURCE)
    headers = ["d_head", "seq", "batch", "heads", "MB", "copy", "us", "GB/s", "/ torch copy"]
    rows = []
    for d_head in args.d_heads:
        for seq in args.seq_lens:
            batch, heads = common.batch_for_seq_len(seq), common.heads_for_d_head(d_head)
            v = torch.randint(0, 256, (batch, seq, heads, d_head), dtype=torch.uint8, device="cuda")
            v = v.view(torch.float8_e4m3fn)
            expected = expected_copy(v)
            moved = v.numel() + expected.numel()
            target = torch.empty_like(v)
            torch_us = 1000 * common.median_ms_with_cuda_events(lambda: target.copy_(v))
            measured = [("torch", torch_us)]
            # Also a strided view with a partial key group and a head below the kernel's.
            ragged = v[:, : seq - 5, :, : d_head - 16]
            for tile_keys in args.tile_keys:
                for source, reference in ((v, expected), (ragged, expected_copy(ragged))):
                    if not torch.equal(kernels.transposed_copy(source, d_head, tile_keys), reference):
                        shape = "x".join(map(str, source.shape))
                        print(f"{shape}: the copy of {tile_keys}-key blocks differs from torch's", file=sys.stderr)
                        return 1
                call = functools.partial(kernels.transposed_copy, v, d_head, tile_keys)
                label = f"{tile_keys} keys" + (" (used)" if tile_keys == kernels.default_tile_keys else "")
                measured.append((label, 1000 * common.median_ms_with_cuda_events(call)))
            for label, us in measured:
                rows.append([d_head, seq, batch, heads, moved / 1e6, label, us, moved / us / 1e3, torch_us / us])
    print(f"{torch.cuda.get_device_name()}; median of CUDA-event timings")
    print(common.format_table(headers, rows, float_formats={4: ".1f", 6: ".1f", 7: ".0f", 8: ".2f"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
