"""``python -m flash_attention``: what to paste into a bug report. The version and the torch and CUDA
it was built with, the compiled families, kernel set, configurations and architectures, the GPUs
it sees, and the dispatch table in effect on each, with the choices it makes at a few shapes."""

from __future__ import annotations

import platform
import sys

import torch

import flash_attention
from flash_attention import _C, dispatch

# Shapes whose automatic choice is shown per GPU: a short and a long sequence, with and without the
# causal mask, for the most common head size.
_SAMPLE_SEQ_LENS = (512, 4096)
_SAMPLE_D_HEAD = 128


def _compiled_architectures() -> list[str]:
    return [f"sm_{number // 10}" for number in sorted(set(_C.compiled_architectures()))]


def report() -> str:
    configs = flash_attention.compiled_configs()
    lines = [
        f"flash_attention {flash_attention.__version__} ({flash_attention.__file__})",
        f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}",
        f"kernel set: {flash_attention.compiled_kernel_set()} ({len(configs)} configurations, "
        f"{len(flash_attention.compiled_kernels())} kernels)",
        f"families: {', '.join(sorted({cfg.family for cfg in configs}))}",
        f"compiled for: {', '.join(_compiled_architectures())}",
        "configurations:",
        *(f"  {cfg.short_form()}" for cfg in configs),
    ]
    tables = sorted(path.stem for path in dispatch.TABLES_DIR.glob("*.json"))
    lines.append(f"dispatch tables shipped: {', '.join(tables) if tables else 'none'}")
    if not torch.cuda.is_available():
        lines.append("GPUs: none visible")
        return "\n".join(lines)
    for index in range(torch.cuda.device_count()):
        arch = dispatch.device_arch(index)
        table = dispatch.dispatch_table(arch)
        in_effect = f"{arch}.json ({table.gpu}, {table.date})" if table else "none: the rule chooses"
        lines.append(f"GPU {index}: {torch.cuda.get_device_name(index)}, {arch}; dispatch table: {in_effect}")
        for dtype in (torch.float16, torch.bfloat16):
            for seq_len in _SAMPLE_SEQ_LENS:
                for causal in (False, True):
                    q = torch.empty(1, seq_len, 1, _SAMPLE_D_HEAD, dtype=dtype, device="meta")
                    where = f"{str(dtype).removeprefix('torch.')} d_head {_SAMPLE_D_HEAD} seq {seq_len}"
                    where += " causal" if causal else ""
                    try:
                        choice = flash_attention.choose_config(q, q, causal=causal, arch=arch)
                    except ValueError as error:
                        lines.append(f"  {where}: {error}")
                    else:
                        lines.append(f"  {where}: {choice}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
    sys.exit(0)
