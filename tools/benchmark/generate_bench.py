#!/usr/bin/env python3
"""Times token generation with transformers' generate() on our attention against PyTorch's SDPA.

A Llama-3-8B-shaped causal language model (32 layers, hidden 4096, 32 query and 8 key/value heads
of 128, MLP 14336, vocabulary 128256; --layers cuts it down) is built from its configuration with
random weights (nothing is downloaded), in bfloat16 on the GPU. For each batch (--batches, default
1 and 32) a prompt of --prompt-tokens random tokens per sequence (default 128) is extended greedily
by --new-tokens tokens (default 256, no early stop) with the dynamic cache: with our attention
implementation (flash_attention.integrations.transformers: the prefill and every decode step run
our kernels), then with transformers' "sdpa" (PyTorch's default backend choice). Time is the median
of --rounds generate() calls after one warm-up; tokens/s = batch x new tokens / time.

With --continuous-batching the rows of the prompt are requests of transformers' continuous batching
instead (model.generate_batch: their prefills and decode steps batched together against its paged
cache, with its default configuration, CUDA graphs included) on our "paged|" implementation and on
"paged|sdpa"; the time is then the whole generate_batch call's, its manager's setup included.

Both generate from the same prompts. The share of generated tokens on which they agree is printed:
with random weights in bfloat16 the top logits are often near-ties that rounding decides, so a
difference is reported, not treated as a failure (tests/test_transformers.py checks generation
against SDPA on models where it is meaningful).

    python3 tools/benchmark/generate_bench.py [--batches 1 32] [--continuous-batching] [--csv generate.csv]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import bench_common as common
from model_bench import markdown_table

# Llama 3 8B's shape.
LLAMA_3_8B = dict(
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    vocab_size=128256,
    max_position_embeddings=8192,
    rope_theta=500000.0,
    tie_word_embeddings=False,
)
OURS, SDPA = "ours", "sdpa"
LABELS = {OURS: "ours", SDPA: "SDPA"}


@dataclasses.dataclass(frozen=True)
class GenerateTiming:
    """One implementation generating for one batch: a row of the CSV file."""

    batch: int
    prompt_tokens: int
    new_tokens: int
    implementation: str
    time_s: float
    tokens_per_s: float
    api: str = "generate"  # or "generate_batch" (--continuous-batching)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", nargs="+", type=common.positive_int, default=[1, 32], help="(default: 1 32)")
    parser.add_argument("--prompt-tokens", type=common.positive_int, default=128, help="(default: %(default)s)")
    parser.add_argument("--new-tokens", type=common.positive_int, default=256, help="(default: %(default)s)")
    parser.add_argument(
        "--layers", type=common.positive_int, default=LLAMA_3_8B["num_hidden_layers"], help="(default: %(default)s)"
    )
    parser.add_argument("--rounds", type=common.positive_int, default=3, help="timed generate() calls (default: 3)")
    parser.add_argument(
        "--continuous-batching",
        action="store_true",
        help="time generate_batch on the 'paged|' implementations instead of generate()",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write every timing to PATH")
    return parser.parse_args(argv)


def build(layers: int):
    """The model, on the GPU in bfloat16 with random weights (made in bfloat16: no float32 copy)."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**{**LLAMA_3_8B, "num_hidden_layers": layers})
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(common.DEVICE):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


def generate(model, prompt, new_tokens: int):
    """Greedy generation of exactly new_tokens tokens: (the generated tokens, seconds)."""
    import torch

    torch.cuda.synchronize()
    began = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )
    torch.cuda.synchronize()
    return out[:, prompt.shape[1] :], time.perf_counter() - began


def generate_continuously(model, prompt, new_tokens: int):
    """generate_batch with each row of prompt a request, exactly new_tokens tokens each: (the
    generated tokens, seconds)."""
    import torch
    import transformers

    config = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    requests = prompt.tolist()
    torch.cuda.synchronize()
    began = time.perf_counter()
    outputs = model.generate_batch(requests, generation_config=config)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - began
    generated = [output.generated_tokens for output in outputs.values()]  # in the order of the requests
    return torch.tensor(generated, device=prompt.device), seconds


def time_batch(model, args, batch: int, name: str) -> tuple[list[GenerateTiming], float]:
    """Every implementation on one batch: the rows, and the share of tokens ours and SDPA agree on."""
    import torch

    generator = torch.Generator(device=common.DEVICE).manual_seed(batch)
    prompt = torch.randint(model.config.vocab_size, (batch, args.prompt_tokens), generator=generator, device=common.DEVICE)
    paged = "paged|" if args.continuous_batching else ""
    run = generate_continuously if args.continuous_batching else generate
    api = "generate_batch" if args.continuous_batching else "generate"
    rows, tokens = [], {}
    for implementation in (OURS, SDPA):
        model.set_attn_implementation(paged + (name if implementation == OURS else "sdpa"))
        tokens[implementation], _ = run(model, prompt, args.new_tokens)  # warm-up
        seconds = statistics.median(run(model, prompt, args.new_tokens)[1] for _ in range(args.rounds))
        rows.append(
            GenerateTiming(batch, args.prompt_tokens, args.new_tokens, implementation, seconds,
                           batch * args.new_tokens / seconds, api)
        )  # fmt: skip
    agreement = (tokens[OURS] == tokens[SDPA]).float().mean().item()
    return rows, agreement


def format_results(rows: list[GenerateTiming], agreements: dict[int, float]) -> str:
    headers = ["batch", "prompt", "new tokens", "ours tokens/s", "SDPA tokens/s", "ours/SDPA", "same tokens"]
    table = []
    for batch, agreement in agreements.items():
        rate = {r.implementation: r.tokens_per_s for r in rows if r.batch == batch}
        first = next(r for r in rows if r.batch == batch)
        table.append([batch, first.prompt_tokens, first.new_tokens, rate[OURS], rate[SDPA], rate[OURS] / rate[SDPA], agreement])
    return markdown_table(headers, table, {3: ".0f", 4: ".0f", 5: ".3f", 6: ".1%"})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not common.gpu_available():
        print(common.no_gpu_message("generate_bench"), file=sys.stderr)
        return 1

    name = common.register_transformers_attention()
    if name is None:
        return 1
    import torch
    import transformers

    api = "generate_batch() (continuous batching)" if args.continuous_batching else "generate()"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}; "
          f"Llama-3-8B shape, {args.layers} layers, bfloat16, random weights; median of {args.rounds} {api} calls")  # fmt: skip
    model = build(args.layers)
    rows, agreements = [], {}
    for batch in args.batches:
        batch_rows, agreements[batch] = time_batch(model, args, batch, name)
        rows += batch_rows
    print(format_results(rows, agreements))
    if args.csv:
        common.write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
