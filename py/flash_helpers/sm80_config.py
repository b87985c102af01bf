"""The SM80 family's configuration: the Python mirror of the C++ ``flash::sm80::FlashForwardKernelConfig``.

A configuration names one tuning of the SM80 forward kernel (mma.sync, ldmatrix, cp.async): its
fields, the values each can take, the rules that say which combinations the kernel can run, and its
textual forms (the short form people read and type, the C++ initializer the generator writes, the
demangled name profilers print). Parsing those forms back is ``kernel_names``; the named sets are
``kernel_sets``. Importable without torch.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from flash_helpers.dtypes import DTYPES, DType
from flash_helpers.kernel_config import KernelConfig, demangled_variant, mangled_variant
from flash_helpers.problem import ProblemVariant

__all__ = ["B_CS", "B_RS", "D_HEADS", "FlashForwardKernelConfig", "LOAD_TILES", "MAX_SMEM_BYTES", "N_WARPS", "SHORT_FORM_EXAMPLE", "smem_limit"]

# The values each dimension of the configuration space can take. The first four are also what the
# kernel supports (validity rule 1); the load-tile counts and booleans are further constrained by
# the other rules.
D_HEADS = (32, 64, 96, 128, 192, 256)
B_RS = (16, 32, 64, 128)
B_CS = (32, 64, 128)
N_WARPS = (4, 8)
LOAD_TILES = (0, 1, 2, 4)


# The k-dimension of one mma.sync.m16n8k16 instruction: GEMMs are split into slices this deep.
_MMA_K = 16
# The M of one mma.sync.m16n8k16 instruction: the granularity of a warp's query rows.
_MMA_M = 16
# The most dynamic shared memory a block can have on any GPU the family runs on (sm_90's opt-in
# limit, 227 KiB; sm_80 allows 163 KiB, which the binding checks at call time).
MAX_SMEM_BYTES = 232448


def smem_limit(capability: tuple[int, int]) -> int:
    """A block's opt-in dynamic shared memory on a GPU of this compute capability (the CUDA
    programming guide's table): 163 KiB on sm_80 and sm_87, 99 KiB on the other sm_8x, 227 KiB from
    sm_90 on."""
    if capability >= (9, 0):
        return MAX_SMEM_BYTES
    return 166912 if capability in ((8, 0), (8, 7)) else 101376

SHORT_FORM_EXAMPLE = "(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles"


@dataclasses.dataclass(frozen=True)
class FlashForwardKernelConfig(KernelConfig):
    """One configuration of the SM80 family's forward kernel.

    Field order is the C++ struct's order and defines the ordering (``KernelConfig``). Construction
    checks types only; whether the kernel can run the combination is answered by
    ``validity_error()``.
    """

    family: ClassVar[str] = "sm80"
    pads_head_with_masked_tails: ClassVar[bool] = True

    dtype: DType
    d_head: int
    B_r: int
    B_c: int
    n_warps: int
    async_copy: bool = False
    eager_load_blocks: bool = False
    swizzled: bool = False
    Q_mma_load_K_tiles: int = 0
    K_mma_load_K_tiles: int = 0
    V_mma_load_K_tiles: int = 0
    mma_double_buffer_loads: bool = False
    optimized_softmax: bool = False

    def _flags(self) -> list[str]:
        """The short form's flags, in their fixed order."""
        tiles = (self.Q_mma_load_K_tiles, self.K_mma_load_K_tiles, self.V_mma_load_K_tiles)
        candidates = (
            ("async", self.async_copy),
            ("eager", self.eager_load_blocks),
            ("swizzled", self.swizzled),
            ("load_{}_{}_{}_tiles".format(*tiles), any(tiles)),
            ("buffer", self.mma_double_buffer_loads),
            ("opt_softmax", self.optimized_softmax),
        )
        return [flag for flag, present in candidates if present]

    def short_form(self) -> str:
        """The human-readable form, e.g. ``(FP16, 128, 64, 64, 4): async+load_0_2_2_tiles``."""
        head = f"({self.dtype.name}, {self.d_head}, {self.B_r}, {self.B_c}, {self.n_warps})"
        flags = self._flags()
        return f"{head}: {'+'.join(flags)}" if flags else head

    def demangled_kernel_name(self, variant: ProblemVariant = ProblemVariant()) -> str:
        """The kernel's name as Nsight Compute prints it: the demangled device symbol, which spells
        all 13 fields (the dtype as a cast) and then the problem variant's fields."""
        return (
            "void flash::sm80::flash_forward_kernel<flash::sm80::StaticForwardKernelConfig<"
            f"{self._demangled_initializer()}>, {demangled_variant(variant)}>(flash::ForwardParams)"
        )

    def mangled_kernel_name(self, variant: ProblemVariant = ProblemVariant()) -> str:
        """The kernel's device symbol (Itanium mangling), as ``cuobjdump`` lists it in the SASS."""
        return (
            "_ZN5flash4sm8020flash_forward_kernelINS0_25StaticForwardKernelConfigIXtlNS0_24FlashForwardKernelConfigE"
            f"{self._mangled_items()}EEEE{mangled_variant(variant)}EEvNS_13ForwardParamsE"
        )

    def file_stem(self) -> str:
        """A unique, filesystem-safe name, e.g. ``fp16_d128_br64_bc64_w4_async_load_0_2_2``.

        The flags are the short form's (their fixed set and order keep the name unique); the tile
        flag's ``_tiles`` suffix adds nothing in a file name and is dropped.
        """
        parts = [self.dtype.name.lower(), f"d{self.d_head}", f"br{self.B_r}", f"bc{self.B_c}", f"w{self.n_warps}"]
        parts += [flag.removesuffix("_tiles") for flag in self._flags()]
        return "_".join(parts)

    def smem_bytes(self) -> int:
        """Dynamic shared memory of one block: the Q tile, and a K and a V tile per pipeline stage
        (two with eager_load_blocks), of 2-byte elements; rows of d_head 32 or 96 are one 16-byte
        chunk longer in the conflict-free layout. The kernel's traits lay the same tiles out, and
        the tests compare the two."""
        padded = self.swizzled and self.d_head % 64 != 0
        row_bytes = 2 * self.d_head + (16 if padded else 0)
        stages = 2 if self.eager_load_blocks else 1
        return (self.B_r + 2 * stages * self.B_c) * row_bytes

    @property
    def n_threads(self) -> int:
        """Threads per block: n_warps warps."""
        return 32 * self.n_warps

    @property
    def row_warps(self) -> int:
        """Warps that share a KV tile's keys and split the block's rows, 16 or more each: all of them
        unless the block has fewer than 16 rows per warp."""
        return min(self.n_warps, self.B_r // _MMA_M)

    @property
    def key_groups(self) -> int:
        """How many ways each KV tile's keys are split over the warps: 1, or n_warps / row_warps for
        a block of fewer than 16 rows per warp (decoding's few query rows), whose warps each take
        16 rows and B_c / key_groups of every tile's keys, merged at the end."""
        return self.n_warps // self.row_warps

    @property
    def warp_keys(self) -> int:
        """A warp's keys per KV tile: B_c, or its key group's share."""
        return self.B_c // self.key_groups

    def _key_group_exchange_bytes(self) -> int:
        """Shared memory the key groups' merge writes over the block's tiles (sm80/key_groups.cuh):
        per warp and lane its rows' maxima, and per warp outside key group 0 its row sums and
        d_head / 8 * 4 outputs per 16-row tile."""
        m_tiles = self.B_r // self.row_warps // _MMA_M
        max_words = m_tiles * 2
        partial_words = m_tiles * 2 + m_tiles * (self.d_head // 8) * 4
        return (self.n_warps * max_words + (self.n_warps - self.row_warps) * partial_words) * 32 * 4

    def runs_on(self, capability: tuple[int, int]) -> bool:
        """Whether a GPU of this compute capability runs the kernel: sm_80 or newer, with room for
        its shared memory."""
        return capability >= (8, 0) and self.smem_bytes() <= smem_limit(capability)

    def validity_error(self) -> str | None:
        """Why the kernel cannot run this configuration (the first failing rule), or None if it can."""
        if self.dtype not in DTYPES:
            return (
                f"dtype {self.dtype.name}: the SM80 family runs 16-bit inputs (FP16, BF16) only; e4m3 inputs run on the "
                "Hopper family's configurations (sm90(E4M3, ...))."
            )
        for field, supported in (("d_head", D_HEADS), ("B_r", B_RS), ("B_c", B_CS), ("n_warps", N_WARPS)):
            value = getattr(self, field)
            if value not in supported:
                return f"{field} must be one of {', '.join(map(str, supported))}; got {value}."

        if self.warp_keys % _MMA_K:
            return (
                f"B_c ({self.B_c}) must give each of the {self.key_groups} key groups a multiple of 16 keys: with "
                f"B_r = {self.B_r} rows over {self.n_warps} warps (fewer than 16 each) the warps take 16 rows each "
                f"and split every KV tile's keys {self.key_groups} ways."
            )

        if self.eager_load_blocks and not self.async_copy:
            return "eager_load_blocks requires async_copy: only cp.async copies can be in flight during compute."

        # A warp's P V runs over its keys of a tile: B_c, or its key group's share.
        warp_keys = "B_c" if self.key_groups == 1 else f"B_c / {self.key_groups} key groups"
        for field, extent, slices, gemm in (
            ("Q_mma_load_K_tiles", "d_head", self.d_head // _MMA_K, "Q K^T"),
            ("K_mma_load_K_tiles", "d_head", self.d_head // _MMA_K, "Q K^T"),
            ("V_mma_load_K_tiles", warp_keys, self.warp_keys // _MMA_K, "P V"),
        ):
            tiles = getattr(self, field)
            if tiles != 0 and not (tiles > 0 and tiles & (tiles - 1) == 0 and tiles < slices and slices % tiles == 0):
                return (
                    f"{field} must be 0 (the whole operand at once) or a power of two (1, 2, 4, ...) below and "
                    f"dividing the {slices} k-slices of the {gemm} GEMM ({extent} / 16); got {tiles}."
                )

        if self.Q_mma_load_K_tiles not in (0, self.K_mma_load_K_tiles):
            return (
                f"Q_mma_load_K_tiles must be 0 (Q fragments loaded once and kept in registers) or equal to "
                f"K_mma_load_K_tiles = {self.K_mma_load_K_tiles} (Q and K slices loaded together); "
                f"got {self.Q_mma_load_K_tiles}."
            )

        if self.smem_bytes() > MAX_SMEM_BYTES:
            return (
                f"the tiles need {self.smem_bytes()} bytes of shared memory per block (B_r + 2 * B_c per stage "
                f"rows of d_head), more than the {MAX_SMEM_BYTES} any supported GPU allows."
            )

        if self.key_groups > 1 and self._key_group_exchange_bytes() > self.smem_bytes():
            return (
                f"the key groups' merge needs {self._key_group_exchange_bytes()} bytes of shared memory, more than "
                f"the block's {self.smem_bytes()} it overlays."
            )

        if self.mma_double_buffer_loads and not (self.K_mma_load_K_tiles or self.V_mma_load_K_tiles):
            return (
                "mma_double_buffer_loads needs K or V loaded in chunks (a nonzero K_mma_load_K_tiles or "
                "V_mma_load_K_tiles): with whole operands there is no next chunk to load early."
            )
        return None
