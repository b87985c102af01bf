#!/usr/bin/env python3
"""Times whole transformers models on our attention against PyTorch's SDPA (its default backend
choice, the FLASH backend and the CUDNN backend).

Each model (--models) is built from its configuration with random weights (nothing is downloaded),
on the GPU, in eval mode, as the base model without a task head (the heads do not touch attention),
and run under torch.inference_mode on the same inputs, in one run: with our attention
implementation (flash_attention.integrations.transformers), then with transformers' "sdpa"
implementation under PyTorch's default backend choice, restricted to the FLASH backend
(FlashAttention-2) and restricted to the CUDNN backend (torch.nn.attention.sdpa_kernel). A backend
that cannot run a model is shown as '-'. Time is the median of triton.testing.do_bench (of
CUDA-event timings if triton is missing) of one forward pass.

The models, at the sizes of their public checkpoints:
  bert-base      12 layers, hidden 768, 12 heads of 64; seq 512, batch 32
  bert-large     24 layers, hidden 1024, 16 heads of 64; seq 512, batch 32
  vit-base       ViT-B/16 at 224 px (197 tokens: 196 patches and the class token); batch 64
  vit-large      ViT-L/16 at 224 px; batch 64
  llama-1b       Llama 3.2 1B's shape: 16 layers, hidden 2048, 32 query and 8 key/value heads of 64,
                 causal; seq 2048, batch 4
  llama-1b-long  the same at seq 8192, batch 1
  llama-3b       Llama 3.2 3B's shape: 28 layers, hidden 3072, 24 query and 8 key/value heads of
                 128; seq 2048, batch 4
  bert-base-padded   bert-base on a right-padded batch: 32 sequences of lengths drawn from 128 to
                 512 (seed 0), padded to 512 (the 2D attention_mask has zeros)
  llama-1b-left-padded   llama-1b on a left-padded batch, as generate() pads prompts: 8 sequences of
                 lengths drawn from 256 to 2048 (seed 0), padded on the left to 2048
By default bert-base, vit-base, llama-1b and the two padded batches, in float16 and bfloat16. On a
padded batch every implementation gets the same attention_mask: ours runs it as a batch of sequences
of their own lengths, SDPA with an explicit mask (which its FLASH backend refuses).

Prints a markdown table: milliseconds per forward, the ratios ours/SDPA, ours/FLASH and ours/CUDNN
of throughput (the other's time over ours: above 1, ours is faster), and the relative norm
difference of our output (the last hidden state, at the tokens only: padding positions are nobody's
output) from SDPA's; a difference above
MAX_RELATIVE_DIFFERENCE (a sanity bound per dtype) is reported and makes the exit status 1.
--csv PATH saves every timing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import sys

import bench_common as common

# The implementations timed, in table order: ours, then transformers' "sdpa" with PyTorch's own
# backend choice, then restricted to each of SDPA_BACKENDS (bench_common.SDPA_REFERENCES keys).
SDPA_BACKENDS = ("flash", "cudnn")
IMPLEMENTATIONS = ("ours", "sdpa", *SDPA_BACKENDS)
LABELS = {"ours": "ours", "sdpa": "SDPA", **{backend: backend.upper() for backend in SDPA_BACKENDS}}
# Our output is checked against SDPA's with its default backend choice.
CHECK_REFERENCE = "sdpa"
# Largest relative norm difference ||ours - SDPA|| / ||SDPA|| of the last hidden state accepted, per
# dtype: a sanity bound against broken outputs, the tests check the criterion precisely
# (tests/test_transformers.py). Two attention implementations that round differently put whole
# models this far apart, every layer adding its rounding: on an H200 (2026-11-21), with attention
# computed in the input dtype, up to 7.4e-3 in float16 and 6.0e-2 in bfloat16 (llama-3b; bfloat16
# keeps 3 fewer mantissa bits). The bounds are about twice those.
MAX_RELATIVE_DIFFERENCE = {"fp16": 2e-2, "bf16": 1.5e-1}
DEFAULT_REP_MS = 500  # whole models take tens of milliseconds: repeat long enough for a median

BERT_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072}
BERT_LARGE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096}
LLAMA_1B = {
    "vocab_size": 128256,
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "intermediate_size": 8192,
}
LLAMA_3B = {
    **LLAMA_1B,
    "hidden_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "head_dim": 128,
}
VIT_IMAGE = {"image_size": 224, "patch_size": 16}


@dataclasses.dataclass(frozen=True)
class Workload:
    """One model at one input size."""

    name: str
    family: str  # "bert", "vit" or "llama"
    config: dict  # the transformers configuration's fields that differ from its defaults
    batch: int
    seq_len: int = 0  # tokens per sequence of the text models; a ViT's follow from its image size
    # A padded batch: "right" or "left", each sequence's length drawn from min_len to seq_len.
    padding: str = ""
    min_len: int = 0

    @property
    def tokens(self) -> int:
        """Tokens per sequence: for a ViT, one per patch and the class token."""
        if self.family == "vit":
            return (self.config["image_size"] // self.config["patch_size"]) ** 2 + 1
        return self.seq_len


WORKLOADS = {
    workload.name: workload
    for workload in (
        Workload("bert-base", "bert", BERT_BASE, batch=32, seq_len=512),
        Workload("bert-large", "bert", BERT_LARGE, batch=32, seq_len=512),
        Workload("vit-base", "vit", {**VIT_IMAGE, **BERT_BASE}, batch=64),
        Workload("vit-large", "vit", {**VIT_IMAGE, **BERT_LARGE}, batch=64),
        Workload("llama-1b", "llama", LLAMA_1B, batch=4, seq_len=2048),
        Workload("llama-1b-long", "llama", LLAMA_1B, batch=1, seq_len=8192),
        Workload("llama-3b", "llama", LLAMA_3B, batch=4, seq_len=2048),
        Workload("bert-base-padded", "bert", BERT_BASE, batch=32, seq_len=512, padding="right", min_len=128),
        Workload("llama-1b-left-padded", "llama", LLAMA_1B, batch=8, seq_len=2048, padding="left", min_len=256),
    )
}
DEFAULT_WORKLOADS = ("bert-base", "vit-base", "llama-1b", "bert-base-padded", "llama-1b-left-padded")


@dataclasses.dataclass
class ModelTiming:
    """One implementation timed on one model: a row of the CSV file."""

    model: str
    dtype: str
    batch: int
    seq_len: int
    implementation: str  # one of IMPLEMENTATIONS
    time_ms: float  # NaN where the implementation could not run the model


def build(workload: Workload, dtype):
    """The base model of ``workload`` on the GPU in ``dtype``, eval mode, random weights."""
    import torch
    import transformers

    config_class, model_class = {
        "bert": (transformers.BertConfig, transformers.BertModel),
        "vit": (transformers.ViTConfig, transformers.ViTModel),
        "llama": (transformers.LlamaConfig, transformers.LlamaModel),
    }[workload.family]
    with torch.device(common.DEVICE):
        return model_class(config_class(**workload.config)).to(dtype).eval()


def make_inputs(workload: Workload, model) -> dict:
    """The forward's keyword arguments: random token ids (with the attention_mask of a padded
    batch), or random pixels in the model's dtype."""
    import torch

    generator = torch.Generator(device=common.DEVICE).manual_seed(0)
    if workload.family == "vit":
        size = workload.config["image_size"]
        shape = (workload.batch, 3, size, size)
        return {"pixel_values": torch.randn(shape, generator=generator, device=common.DEVICE, dtype=model.dtype)}
    shape = (workload.batch, workload.tokens)
    inputs = {"input_ids": torch.randint(model.config.vocab_size, shape, generator=generator, device=common.DEVICE)}
    if workload.padding:
        inputs["attention_mask"] = padding_mask(workload, generator)
    if workload.family == "llama":
        inputs["use_cache"] = False  # a forward pass, not the start of a generation
    return inputs


def padding_mask(workload: Workload, generator):
    """The 2D attention_mask of a padded batch: 1 at each sequence's tokens, 0 at its padding, on
    the right or (as generate() pads prompts) the left."""
    import torch

    shape = (workload.batch, 1)
    lengths = torch.randint(workload.min_len, workload.seq_len + 1, shape, generator=generator, device=common.DEVICE)
    positions = torch.arange(workload.seq_len, device=common.DEVICE)
    used = positions >= workload.seq_len - lengths if workload.padding == "left" else positions < lengths
    return used.long()


def backend_context(implementation: str):
    """Where SDPA may use only ``implementation``'s backend (so one that cannot run raises instead
    of falling back); no restriction for ours and SDPA's default choice."""
    if implementation in SDPA_BACKENDS:
        return common.use_sdpa_reference(implementation)
    return contextlib.nullcontext()


def time_workload(workload: Workload, dtype_name: str, name: str, timer, progress) -> tuple[list, float | None]:
    """Times every implementation on one model and dtype; returns the rows and the relative norm
    difference of our output from SDPA's (None if either could not run)."""
    import torch

    model = build(workload, common.dtype_from_name(dtype_name).to_torch_dtype())
    inputs = make_inputs(workload, model)
    rows, outputs = [], {}

    def forward():
        return model(**inputs).last_hidden_state

    for implementation in IMPLEMENTATIONS:
        model.set_attn_implementation(name if implementation == "ours" else "sdpa")
        with torch.inference_mode(), backend_context(implementation):
            try:
                outputs[implementation] = forward()
            except RuntimeError as error:
                progress.write(f"{LABELS[implementation]} cannot run {workload.name} in {dtype_name}: {error}")
                time_ms = math.nan
            else:
                time_ms = timer(forward)
        rows.append(ModelTiming(workload.name, dtype_name, workload.batch, workload.tokens, implementation, time_ms))
        progress.update()
    ours, reference = outputs.get("ours"), outputs.get(CHECK_REFERENCE)
    difference = None
    if ours is not None and reference is not None:
        if "attention_mask" in inputs:
            tokens = inputs["attention_mask"].bool()
            ours, reference = ours[tokens], reference[tokens]
        reference = reference.double()
        difference = ((ours.double() - reference).norm() / reference.norm()).item()
    return rows, difference


def markdown_table(headers: list[str], rows: list[list], float_formats: dict[int, str]) -> str:
    """A markdown table: numeric columns right-aligned, floats in ``float_formats[column]`` (default
    one decimal), NaN and None as '-'."""
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) for i in range(len(headers))]
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---:" if right else "---" for right in numeric) + "|",
    ]
    for row in rows:
        cells = [common.format_cell(value, float_formats.get(i, ".1f")) for i, value in enumerate(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def format_results(rows: list[ModelTiming], differences: dict[tuple[str, str], float | None]) -> str:
    headers = [
        "model",
        "dtype",
        "batch",
        "seq",
        *(f"{LABELS[i]} (ms)" for i in IMPLEMENTATIONS),
        *(f"ours/{LABELS[i]}" for i in IMPLEMENTATIONS[1:]),
        "rel. diff.",
    ]
    table = []
    for key, difference in differences.items():
        times = {r.implementation: r.time_ms for r in rows if (r.model, r.dtype) == key}
        first = next(r for r in rows if (r.model, r.dtype) == key)
        table.append(
            [
                *key,
                first.batch,
                first.seq_len,
                *(times[i] for i in IMPLEMENTATIONS),
                *(times[i] / times["ours"] for i in IMPLEMENTATIONS[1:]),
                difference,
            ]
        )
    time_columns = range(4, 4 + len(IMPLEMENTATIONS))
    ratio_columns = range(time_columns.stop, time_columns.stop + len(IMPLEMENTATIONS) - 1)
    formats = {**{i: ".2f" for i in time_columns}, **{i: ".3f" for i in ratio_columns}, len(headers) - 1: ".1e"}
    return markdown_table(headers, table, formats)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models",
        nargs="+",
        choices=[*WORKLOADS, "all"],
        default=list(DEFAULT_WORKLOADS),
        metavar="MODEL",
        help=f"the models to time ({', '.join(WORKLOADS)}), or all (default: {' '.join(DEFAULT_WORKLOADS)})",
    )
    common.add_dtype_argument(
        parser,
        default=list(common.DTYPE_NAMES),
        fp8_refusal="the models compute in a 16-bit dtype, and their attention passes no e4m3 q, k, v or descales",
    )
    parser.add_argument(
        "--rep-ms",
        type=float,
        default=DEFAULT_REP_MS,
        help="how long each timing repeats the forward, in ms (default: %(default)g)",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every timing to PATH")
    args = parser.parse_args(argv)
    if "all" in args.models:
        args.models = list(WORKLOADS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("model_bench"), file=sys.stderr)
        return 1

    name = common.register_transformers_attention()
    if name is None:
        return 1

    import torch
    import transformers
    timer, timing = common.make_timer(args.rep_ms)
    versions = f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}"
    print(f"{torch.cuda.get_device_name()}, {versions}, transformers {transformers.__version__}; {timing}")

    rows, differences = [], {}
    with common.Progress(len(args.models) * len(args.dtypes) * len(IMPLEMENTATIONS), "models") as progress:
        for model_name in args.models:
            for dtype_name in args.dtypes:
                progress.set_description(f"{model_name} {dtype_name}")
                timings, difference = time_workload(WORKLOADS[model_name], dtype_name, name, timer, progress)
                rows += timings
                differences[model_name, dtype_name] = difference
    print()
    print(format_results(rows, differences))
    if args.csv:
        common.write_csv(args.csv, rows)
    # Written so that a NaN difference fails.
    failures = [
        f"CORRECTNESS FAILURE: {model} {dtype}: ||ours - SDPA|| / ||SDPA|| = {difference:.3g} "
        f"> {MAX_RELATIVE_DIFFERENCE[dtype]}"
        for (model, dtype), difference in differences.items()
        if difference is not None and not difference <= MAX_RELATIVE_DIFFERENCE[dtype]
    ]
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
