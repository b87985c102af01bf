"""A debug check of the per-sequence arguments' contents, on request: FLASH_ATTENTION_CHECK_SEQLENS=1.

The extension checks the shapes, dtypes and devices of cu_seqlens, seqused and leftpad but not
their contents: reading them would synchronize with the GPU on every call. Its kernels clamp
contents that break the rules instead of reading or writing out of bounds, so a wrong length gives
a wrong answer, not an error. With the environment variable FLASH_ATTENTION_CHECK_SEQLENS set to 1
(read on every call that has per-sequence arguments; calls without them never look), each such call
first reads them (this synchronizes) and raises ValueError, naming the argument, at the first
rule broken:

- cu_seqlens_q / cu_seqlens_k start at >= 0, never decrease, and end at <= the rows of q / k;
- leftpad_q / leftpad_k are >= 0 and at most the slot's length (a slot: a sequence's rows between
  two cu_seqlens entries, or a batch entry of a 4-D tensor);
- seqused_q / seqused_k are >= 0, and leftpad + seqused is at most the slot's length;
- every sequence's used length (seqused, or the slot's length less leftpad) is at most
  max_seqlen_q / max_seqlen_k;
- kv_batch_idx's entries are batch entries of k (>= 0 and < k's batch); a sequence's slot is then
  that entry;
- with block_table, a sequence's slot is what its pages hold (pages_per_sequence * page_size keys);
  cu_seqlens_k then starts at >= 0 and never decreases (k has no rows of its own to end in), and
  each difference is at most a slot; the table's entries that a sequence's used keys reach are
  pages of k (>= 0 and < num_pages).

flash_attn_with_kvcache's cache_seqlens and cache_leftpad are checked the same way, by their own
names (check_cache_contents), before the new keys are written:

- cache_seqlens is >= 0, and cache_seqlens + the new keys at most the cache's rows;
- cache_leftpad is >= 0 and at most cache_seqlens.

Arguments whose shapes disagree with the tensors are left to the extension, which names them. Under
torch.compile the contents are not known while tracing, and nothing is checked.
"""

from __future__ import annotations

import os

import torch

__all__ = ["ENVIRONMENT_VARIABLE", "check_cache_contents", "check_sequence_contents", "requested"]

ENVIRONMENT_VARIABLE = "FLASH_ATTENTION_CHECK_SEQLENS"


def requested() -> bool:
    """Whether FLASH_ATTENTION_CHECK_SEQLENS=1 asks for the check (read now: it may change between calls)."""
    return os.environ.get(ENVIRONMENT_VARIABLE) == "1"


def check_sequence_contents(q, k, sequences: dict) -> None:
    """Raises ValueError at the first rule the contents of ``sequences`` (the per-sequence
    arguments given, by name) break for these q and k."""
    for side, tensor in (("q", q), ("k", k)):
        if isinstance(tensor, torch.Tensor):
            used = _check_side(side, tensor, sequences)
            if side == "k" and used is not None and "block_table" in sequences:
                _check_pages(sequences["block_table"], tensor, used)


def check_cache_contents(cache_rows: int, new_rows: int, cache_seqlens, cache_leftpad) -> None:
    """Raises ValueError at the first rule flash_attn_with_kvcache's cache_seqlens and cache_leftpad
    ((batch,) tensors; cache_leftpad may be None) break for a cache of cache_rows rows receiving
    new_rows new keys per sequence."""
    lengths = cache_seqlens.tolist()
    lefts = [0] * len(lengths) if cache_leftpad is None else cache_leftpad.tolist()
    for b, (length, left) in enumerate(zip(lengths, lefts)):
        if not 0 <= length <= cache_rows - new_rows:
            raise ValueError(
                f"cache_seqlens: must be >= 0 with cache_seqlens + the {new_rows} new keys at most the cache's "
                f"{cache_rows} rows; sequence {b} has {length}"
            )
        if not 0 <= left <= length:
            raise ValueError(f"cache_leftpad: must be in [0, cache_seqlens]; sequence {b} has {left} with cache_seqlens {length}")


def _check_side(side: str, tensor, sequences: dict) -> list[int] | None:
    """The rules of one side: q, or k (whose sequences v shares). Returns each sequence's used
    length, or None where the shapes disagree (the extension names those)."""
    cu_seqlens = sequences.get(f"cu_seqlens_{side}")
    if side == "k" and ("block_table" in sequences or "kv_batch_idx" in sequences):
        slots = _indexed_key_slots(tensor, sequences)
    elif cu_seqlens is not None:
        slots = _slot_lengths(side, tensor, cu_seqlens)
    else:
        slots = _batch_entries(tensor)
    leftpad, seqused = sequences.get(f"leftpad_{side}"), sequences.get(f"seqused_{side}")
    if slots is None or not all(_per_sequence(t, len(slots)) for t in (leftpad, seqused) if t is not None):
        return None
    lengths = []
    lefts = [0] * len(slots) if leftpad is None else leftpad.tolist()
    used_rows = None if seqused is None else seqused.tolist()
    # max_seqlen without cu_seqlens is the extension's error to name.
    max_seqlen = sequences.get(f"max_seqlen_{side}") if cu_seqlens is not None else None
    for b, (slot, left) in enumerate(zip(slots, lefts)):
        if not 0 <= left <= slot:
            raise ValueError(f"leftpad_{side}: must be in [0, the slot's length]; sequence {b} has {left} in a slot of {slot}")
        used = slot - left if used_rows is None else used_rows[b]
        if not 0 <= used <= slot - left:
            raise ValueError(
                f"seqused_{side}: must be >= 0 with leftpad + seqused at most the slot's length; sequence {b} uses "
                f"{used} rows from row {left} of a slot of {slot}"
            )
        if isinstance(max_seqlen, int) and used > max_seqlen:
            raise ValueError(
                f"max_seqlen_{side}: must be at least every sequence's length; sequence {b} uses {used} rows, "
                f"max_seqlen_{side} is {max_seqlen}"
            )
        lengths.append(used)
    return lengths


def _indexed_key_slots(k, sequences: dict) -> list[int] | None:
    """The keys' slots where an index finds them: each sequence's pages (block_table), or the batch
    entry kv_batch_idx names (its entries checked); None where the shapes disagree."""
    table, index = sequences.get("block_table"), sequences.get("kv_batch_idx")
    if k.dim() != 4:
        return None
    if table is not None:
        if not (_readable(table) and table.dim() == 2):
            return None
        capacity = table.shape[1] * k.shape[1]
        cu_seqlens = sequences.get("cu_seqlens_k")
        if cu_seqlens is None:
            return [capacity] * table.shape[0]
        lengths = _prefix_differences("cu_seqlens_k", cu_seqlens)
        for b, length in enumerate(lengths or []):
            if length > capacity:
                raise ValueError(
                    f"cu_seqlens_k: sequence {b} has {length} keys, more than its {table.shape[1]} pages of "
                    f"{k.shape[1]} rows hold"
                )
        return lengths
    if not (_readable(index) and index.dim() == 1):
        return None
    for b, entry in enumerate(index.tolist()):
        if not 0 <= entry < k.shape[0]:
            raise ValueError(f"kv_batch_idx: entries must be in [0, {k.shape[0]}) (k's batch entries); sequence {b} has {entry}")
    return [k.shape[1]] * index.numel()


def _check_pages(table, k, used: list[int]) -> None:
    """The block_table entries each sequence's used keys reach are pages of k."""
    page_size, num_pages = k.shape[1], k.shape[0]
    for b, (row, keys) in enumerate(zip(table.tolist(), used)):
        for column, page in enumerate(row[: -(-keys // page_size)]):
            if not 0 <= page < num_pages:
                raise ValueError(
                    f"block_table: entries must be in [0, {num_pages}) (the pages of k); sequence {b} has {page} in "
                    f"column {column}"
                )


def _slot_lengths(side: str, tensor, cu_seqlens) -> list[int] | None:
    """The slots' lengths from cu_seqlens, checked against the (total, heads, d) tensor's rows; None
    where the shapes disagree."""
    if tensor.dim() != 3 or not (_readable(cu_seqlens) and cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 1):
        return None
    name, total = f"cu_seqlens_{side}", tensor.shape[0]
    lengths = _prefix_differences(name, cu_seqlens)
    end = int(cu_seqlens[-1])
    if end > total:
        raise ValueError(f"{name}: must end at <= {total} (the rows of {side}), got {end}")
    return lengths


def _prefix_differences(name: str, cu_seqlens) -> list[int] | None:
    """The lengths of a cu_seqlens that starts at >= 0 and never decreases; None where it is not a
    readable (batch + 1,) tensor."""
    if not (_readable(cu_seqlens) and cu_seqlens.dim() == 1 and cu_seqlens.numel() >= 1):
        return None
    bounds = cu_seqlens.tolist()
    if bounds[0] < 0:
        raise ValueError(f"{name}: must start at >= 0, got {bounds[0]}")
    for b, (start, end) in enumerate(zip(bounds, bounds[1:])):
        if end < start:
            raise ValueError(f"{name}: must not decrease; entry {b} is {start} and entry {b + 1} is {end}")
    return [end - start for start, end in zip(bounds, bounds[1:])]


def _batch_entries(tensor) -> list[int] | None:
    """The slots of a 4-D (batch, seqlen, heads, d) tensor: each batch entry, seqlen rows long."""
    return [tensor.shape[1]] * tensor.shape[0] if tensor.dim() == 4 else None


def _per_sequence(values, batch: int) -> bool:
    """Whether seqused or leftpad has one entry per sequence (the extension names it otherwise)."""
    return _readable(values) and values.dim() == 1 and values.numel() == batch


def _readable(values) -> bool:
    """Whether ``values`` is a tensor whose contents exist (meta tensors have none)."""
    return isinstance(values, torch.Tensor) and values.device.type != "meta"
