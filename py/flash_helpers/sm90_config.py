"""The Hopper family's configuration: the Python mirror of the C++ ``flash::sm90::HopperForwardKernelConfig``.

A configuration names one tuning of the Hopper forward kernel (wgmma, TMA, an mbarrier pipeline,
warp specialization; sm_90a machine code, so it runs on sm_90 only): its fields, the values each can
take, the rules that say which combinations the kernel can run, and its textual forms (the short
form people read and type, the C++ initializer the generator writes, the demangled name profilers
print). Parsing those forms back is ``kernel_names``; the named sets are ``kernel_sets``.
Importable without torch.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from flash_helpers.dtypes import DType
from flash_helpers.kernel_config import KernelConfig, demangled_variant, mangled_variant
from flash_helpers.problem import ProblemVariant
from flash_helpers.sm80_config import MAX_SMEM_BYTES

__all__ = [
    "B_CS",
    "B_RS",
    "D_HEADS",
    "HopperForwardKernelConfig",
    "MAX_SMEM_BYTES",
    "SHORT_FORM_EXAMPLE",
    "STAGES",
    "VARLEN_CONSUMER_REGISTERS",
]

# The values each dimension of the configuration space can take: what the kernel supports (validity
# rule 1). A 16-bit head size is a multiple of 16 (a row of Q, K or V then fills whole 32-byte
# swizzled rows); 48 and 80 are the ones of those not multiples of 32 that have kernels. B_r is 64
# query rows per consumer warpgroup; every B_c is a multiple of 16, the k-extent of one wgmma of P V.
D_HEADS = (32, 48, 64, 80, 96, 128, 160, 192, 224, 256)
B_RS = (64, 128, 192)
B_CS = (64, 80, 96, 112, 128, 144, 160, 176, 192, 224)
STAGES = (1, 2, 3, 4)

SHORT_FORM_EXAMPLE = "sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap"

# The M of one wgmma instruction: the query rows of one consumer warpgroup.
_WGMMA_M = 64
_WARPGROUP_THREADS = 128
# The 32-bit registers of one SM, all of them the block's.
_SM_REGISTERS = 65536
# What setmaxnreg gives each consumer thread, by the number of consumer warpgroups (the producer
# keeps the rest: producer_registers).
_SETMAXNREG_CONSUMER_REGISTERS = {2: 240, 3: 160}
# With e4m3, where the producer warpgroup's transposing warps read V by rows: it keeps 56 registers,
# and the consumers have these.
_ROWS_TRANSPOSER_CONSUMER_REGISTERS = {2: 224, 3: 152}
# What the varlen kernels of two consumer warpgroups give each of them: their producer keeps 40.
VARLEN_CONSUMER_REGISTERS = 232
# The most registers any thread can have.
_MAX_THREAD_REGISTERS = 255
# A consumer thread's registers beyond its accumulators and P: addresses and the softmax's state.
_STATE_REGISTERS = 32
# The tiles start on 1024-byte boundaries, the atom (period) of the 128-byte swizzle, the largest of
# those they use (the traits' TILE_ALIGNMENT_BYTES): shared memory has that much slack for placing the
# first, beyond the tiles and the 8-byte words of the mbarriers and work slots, and each K and V tile
# after it is a whole number of atoms.
_TILE_ALIGNMENT_BYTES = 1024
_WORD_BYTES = 8
# A consumer warpgroup's work slot, in 8-byte words (the traits' work_slot_words).
_WORK_SLOT_WORDS = 1
# With e4m3, where the producer marks the end of its V tiles for the transposing warps: an int per
# stage (at most 4), in two 8-byte words.
_E4M3_V_STREAM_END_WORDS = 2
# A persistent cluster's ring of the work tiles it takes next: two entries, each a full and an empty
# mbarrier, and their two indices in one 8-byte word.
_CLUSTER_RING_BARRIERS = 4
_CLUSTER_RING_INDEX_WORDS = 1
# O's elements are 16-bit whatever the inputs.
_O_ELEMENT_BYTES = 2
# The B_c of an e4m3 configuration is a multiple of this: P V's k-slices are 32 one-byte keys.
_E4M3_B_C_MULTIPLE = 32
# With V_transposed_copy, B_c is a multiple of this: the keys of one 64-byte swizzled row of the
# transposed tile, which TMA loads whole.
_TRANSPOSED_V_ROW_KEYS = 64
# The e4m3 head sizes are multiples of this: a row of Q or K is d_head bytes, and the 8-bit tiles use
# the 64- and 128-byte swizzles.
_E4M3_D_HEAD_MULTIPLE = 64


@dataclasses.dataclass(frozen=True)
class HopperForwardKernelConfig(KernelConfig):
    """One configuration of the Hopper family's forward kernel.

    Field order is the C++ struct's order and defines the ordering (``KernelConfig``). Construction
    checks types only; whether the kernel can run the combination is answered by
    ``validity_error()``.
    """

    family: ClassVar[str] = "sm90"
    pads_head_with_masked_tails: ClassVar[bool] = False

    dtype: DType
    d_head: int
    # Query rows per block: 64 per consumer warpgroup.
    B_r: int
    # Keys per K/V tile: the N of the S = Q K^T wgmma.
    B_c: int
    # K/V tiles in the shared-memory pipeline.
    stages: int
    # A producer warpgroup issues the TMA loads and gives its registers to the consumers (setmaxnreg).
    warp_specialized: bool = False
    # The consumer warpgroups take turns issuing their matrix products (named barriers), so one's
    # softmax overlaps the other's wgmma.
    pingpong: bool = False
    # Inside a warpgroup, the softmax of tile j overlaps the P V product of tile j - 1.
    intra_wg_overlap: bool = False
    # One block per SM takes the work tiles in turn, loading the next one's Q, K and V while this
    # one's last products run and its O is stored (through O blocks of its own).
    persistent: bool = False
    # Each warp holds its 16 rows of Q in registers: S = Q K^T reads only K from shared memory.
    Q_in_registers: bool = False
    # Two blocks (a cluster) take consecutive query blocks of one head, and each loads half of every
    # K/V tile into both (TMA multicast): half the K/V traffic out of L2.
    multicast: bool = False
    # With e4m3, in dense calls: a copy kernel writes V transposed before the attention kernel, whose
    # TMA loads P V's operand from it as it is (no transposing warps, no second V tile per stage),
    # for one more read and write of V through memory.
    V_transposed_copy: bool = False
    # With the intra-warpgroup overlap: O's rescaling for the maxima a softmax moved waits for the
    # next turn, between S and the P V that adds to O, so the softmax does not wait for the P V in
    # flight (nor vote on whether any warp rescales). The same products in the same order: the same
    # bits as without it.
    deferred_O_rescale: bool = False

    @property
    def consumer_warpgroups(self) -> int:
        """The warpgroups that compute: one per 64 query rows."""
        return self.B_r // _WGMMA_M

    @property
    def n_threads(self) -> int:
        """Threads per block: the consumer warpgroups, and the producer's with warp specialization."""
        return _WARPGROUP_THREADS * (self.consumer_warpgroups + (1 if self.warp_specialized else 0))

    def _flags(self) -> list[str]:
        """The short form's flags, in their fixed order."""
        candidates = (
            ("ws", self.warp_specialized),
            ("pingpong", self.pingpong),
            ("overlap", self.intra_wg_overlap),
            ("persistent", self.persistent),
            ("qregs", self.Q_in_registers),
            ("mcast", self.multicast),
            ("vtcopy", self.V_transposed_copy),
            ("odefer", self.deferred_O_rescale),
        )
        return [flag for flag, present in candidates if present]

    def short_form(self) -> str:
        """The human-readable form, e.g. ``sm90(FP16, 128, 128, 128, 2): ws+pingpong+overlap``."""
        head = f"{self.family}({self.dtype.name}, {self.d_head}, {self.B_r}, {self.B_c}, {self.stages})"
        flags = self._flags()
        return f"{head}: {'+'.join(flags)}" if flags else head

    def demangled_kernel_name(self, variant: ProblemVariant = ProblemVariant()) -> str:
        """The kernel's name as Nsight Compute prints it: the demangled device symbol, which spells
        all 13 fields (the dtype as a cast) and then the problem variant's fields."""
        return (
            "void flash::sm90::hopper_forward_kernel<flash::sm90::StaticHopperKernelConfig<"
            f"{self._demangled_initializer()}>, {demangled_variant(variant)}>(flash::sm90::KernelParams)"
        )

    def mangled_kernel_name(self, variant: ProblemVariant = ProblemVariant()) -> str:
        """The kernel's device symbol (Itanium mangling), as ``cuobjdump`` lists it in the SASS.

        The SM80 family's scheme with this family's kernel, static configuration and parameter type
        (``flash::sm90::KernelParams``). It must match the symbol nvcc writes into the binary: the
        tests hold one read off a compiled cubin.
        """
        return (
            "_ZN5flash4sm9021hopper_forward_kernelINS0_24StaticHopperKernelConfigIXtlNS0_25HopperForwardKernelConfigE"
            f"{self._mangled_items()}EEEE{mangled_variant(variant)}EEvNS0_12KernelParamsE"
        )

    def file_stem(self) -> str:
        """A unique, filesystem-safe name, e.g. ``fp16_d128_br128_bc128_s2_ws_pingpong_overlap``."""
        parts = [self.dtype.name.lower(), f"d{self.d_head}", f"br{self.B_r}", f"bc{self.B_c}", f"s{self.stages}"]
        return "_".join(parts + self._flags())

    @property
    def is_fp8(self) -> bool:
        """Whether the inputs are e4m3 (FP8): 8-bit tiles, V transposed (by the producer warpgroup, or
        with V_transposed_copy by a copy kernel first), a 16-bit O."""
        return self.dtype is DType.E4M3

    @property
    def transposes_v(self) -> bool:
        """Whether the producer warpgroup transposes each V tile in shared memory (e4m3 without
        V_transposed_copy), into a transposed tile of its own per stage."""
        return self.is_fp8 and not self.V_transposed_copy

    @property
    def o_in_v_tiles(self) -> bool:
        """Whether O (16-bit) goes out through the stages' V tiles, as the traits' O_in_V: with e4m3,
        in a single pass (a persistent block's next V tiles load while O is stored), where they hold
        every consumer warpgroup's O block. The transposing warps have read every V tile by the time a
        consumer warpgroup has waited for its last transposed one (where V is transposed there:
        transposes_v)."""
        V_tiles = self.stages * self.B_c * self.dtype.element_bytes
        return self.transposes_v and not self.persistent and V_tiles >= self.B_r * _O_ELEMENT_BYTES

    def smem_bytes(self) -> int:
        """Dynamic shared memory of one block, as the kernel's traits compute it: the Q tile and, per
        pipeline stage, a K and a V tile (where the producer warpgroup transposes V, transposes_v, also
        V transposed, transposed_v_row_bytes a row),
        of the inputs' elements; an O
        tile of Q's rows, of 16-bit elements, when persistent or with e4m3 (whose O is wider than
        Q) unless it goes out through the V tiles (o_in_v_tiles); slack for aligning the tiles to
        1024 bytes; and 8-byte words: the mbarriers (a full and an empty one for each consumer
        warpgroup's Q block, and for each tile of a stage), a work slot
        of one word per consumer warpgroup, with transposes_v two words where the producer marks the end
        of its stream of V tiles, and in a persistent cluster the ring through which its first block
        hands out the work tiles."""
        O_rows = self.B_r if self.persistent or (self.is_fp8 and not self.o_in_v_tiles) else 0
        inputs = (self.B_r + self.stages * 2 * self.B_c) * self.d_head * self.dtype.element_bytes
        transposed_V = self.stages * self.d_head * self.transposed_v_row_bytes() if self.transposes_v else 0
        tiles = inputs + transposed_V + O_rows * self.d_head * _O_ELEMENT_BYTES
        kv_tiles = 3 if self.transposes_v else 2
        barriers = 2 * self.consumer_warpgroups + 2 * kv_tiles * self.stages
        stream_end = _E4M3_V_STREAM_END_WORDS if self.transposes_v else 0
        ring = _CLUSTER_RING_BARRIERS + _CLUSTER_RING_INDEX_WORDS if self.persistent and self.multicast else 0
        words = barriers + _WORK_SLOT_WORDS * self.consumer_warpgroups + stream_end + ring
        return tiles + _TILE_ALIGNMENT_BYTES + _WORD_BYTES * words

    def transposed_v_row_bytes(self) -> int:
        """With e4m3, the bytes of a transposed V tile's row, as the traits lay it out: column blocks
        of 128-byte swizzled rows where B_c is a multiple of 128 keys, else of 64-byte ones, the last
        part filled where B_c is not a multiple of 64 (224 keys: 256 bytes)."""
        swizzle_row = 128 if self.B_c % 128 == 0 else 64
        return -(-self.B_c // swizzle_row) * swizzle_row

    def runs_on(self, capability: tuple[int, int]) -> bool:
        """Whether a GPU of this compute capability runs the kernel: sm_90a machine code runs on
        sm_90 alone, which must have room for its shared memory."""
        return capability == (9, 0) and self.smem_bytes() <= MAX_SMEM_BYTES

    def consumer_registers(self, varlen: bool = False) -> int:
        """The registers per thread a consumer warpgroup has (the C++ traits' numbers), in the
        kernels of the dense problem variants or of the varlen ones. Where setmaxnreg moves the
        producer's registers to them (moves_registers): 240 each with two, 160 with three, or with
        e4m3 where the transposing warps read V by rows (transposes_v_by_rows) 224 and 152; the
        varlen kernels of two consumer warpgroups give them VARLEN_CONSUMER_REGISTERS, but where V
        is transposed by rows. Otherwise each thread has what the launch bound leaves
        (launch_registers)."""
        if not self.moves_registers:
            return self.launch_registers()
        if self.transposes_v_by_rows:
            return _ROWS_TRANSPOSER_CONSUMER_REGISTERS[self.consumer_warpgroups]
        if varlen and self.consumer_warpgroups == 2:
            return VARLEN_CONSUMER_REGISTERS
        return _SETMAXNREG_CONSUMER_REGISTERS[self.consumer_warpgroups]

    def producer_registers(self, varlen: bool = False) -> int:
        """Where setmaxnreg moves registers (moves_registers), those per thread the producer
        warpgroup keeps: what the block's registers (launch_registers for each thread) leave over
        its consumers' (24 beside two consumer warpgroups of 240, 56 where V is transposed by rows);
        otherwise launch_registers."""
        if not self.moves_registers:
            return self.launch_registers()
        warpgroups = self.consumer_warpgroups
        return self.launch_registers() * (warpgroups + 1) - warpgroups * self.consumer_registers(varlen)

    @property
    def moves_registers(self) -> bool:
        """Whether setmaxnreg moves the producer warpgroup's registers to the consumers: with warp
        specialization and two or three consumer warpgroups."""
        return self.warp_specialized and self.consumer_warpgroups >= 2

    def launch_registers(self) -> int:
        """The registers per thread the launch bound gives (one block per multiprocessor): the
        register file over the block's threads rounded down to a multiple of 8, at most the 255 a
        thread can have."""
        return min(_SM_REGISTERS // self.n_threads // 8 * 8, _MAX_THREAD_REGISTERS)

    @property
    def transposes_v_by_rows(self) -> bool:
        """With e4m3, whether the producer warpgroup's transposing warps read V by rows (56 registers,
        faster) rather than by ldmatrix and stmatrix (as few registers as the loading warp), as the
        traits choose: by rows where the consumers' register estimate fits what that leaves them, 224
        each with two consumer warpgroups and 152 with three (always without setmaxnreg)."""
        if not self.transposes_v:
            return False
        if not self.moves_registers:
            return True
        return self.register_estimate() <= _ROWS_TRANSPOSER_CONSUMER_REGISTERS[self.consumer_warpgroups]

    def register_estimate(self) -> int:
        """The registers a consumer thread needs: its share of the S accumulators (B_c / 2 floats)
        and of the O accumulators (d_head / 2 floats), P as pairs of 16-bit values (B_c / 4) or
        with e4m3 as four 8-bit values per register (B_c / 8), Q's as 16-bit pairs (d_head / 4)
        when it is held in registers, and about 32 for addresses and the softmax's state."""
        P = self.B_c * self.dtype.element_bytes // 8
        Q = self.d_head // 4 if self.Q_in_registers else 0
        return self.B_c // 2 + self.d_head // 2 + P + Q + _STATE_REGISTERS

    def validity_error(self) -> str | None:
        """Why the kernel cannot run this configuration (the first failing rule), or None if it can."""
        for field, supported in (("d_head", D_HEADS), ("B_r", B_RS), ("B_c", B_CS), ("stages", STAGES)):
            value = getattr(self, field)
            if value not in supported:
                return f"{field} must be one of {', '.join(map(str, supported))}; got {value}."

        if self.is_fp8:
            reason = self._e4m3_error()
            if reason is not None:
                return reason
        elif self.V_transposed_copy:
            return "V_transposed_copy is for e4m3 inputs: 16-bit V is P V's operand as it is (MN-major)."

        tile_bytes = self.B_c * self.d_head * self.dtype.element_bytes
        if tile_bytes % _TILE_ALIGNMENT_BYTES:
            return (
                f"the K and V tiles follow one another on {_TILE_ALIGNMENT_BYTES}-byte boundaries (the swizzle atoms "
                f"TMA writes): B_c * d_head * {self.dtype.element_bytes} must be a multiple of {_TILE_ALIGNMENT_BYTES}; "
                f"got B_c = {self.B_c} and d_head = {self.d_head} ({tile_bytes} bytes)."
            )

        if self.pingpong and not (self.warp_specialized and self.consumer_warpgroups >= 2):
            return (
                "pingpong needs warp_specialized and at least 2 consumer warpgroups (B_r >= 128) to take turns; "
                f"got B_r = {self.B_r} and warp_specialized = {self.warp_specialized}."
            )

        if self.deferred_O_rescale and not self.intra_wg_overlap:
            return (
                "deferred_O_rescale needs intra_wg_overlap: without it the softmax rescales O after P V has landed "
                "already, and there is no wait to take off its path."
            )

        if self.persistent and not self.warp_specialized:
            return "persistent needs warp_specialized: the producer warpgroup loads the next work tile."

        if self.multicast and not self.warp_specialized:
            return (
                "multicast needs warp_specialized: a producer warpgroup waits for both blocks of the cluster "
                "to release each stage."
            )

        if self.smem_bytes() > MAX_SMEM_BYTES:
            tiles = (
                "Q, a K, a V and a transposed V tile per stage, O unless the V tiles hold it"
                if self.transposes_v
                else "Q, a K and a transposed V tile per stage, O"
                if self.is_fp8
                else "Q, a K and a V tile per stage, O when persistent"
            )
            return (
                f"the tiles need {self.smem_bytes()} bytes of shared memory per block ({tiles}, with alignment "
                f"slack and mbarriers), more than the {MAX_SMEM_BYTES} sm_90 allows."
            )

        need, budget = self.register_estimate(), self.consumer_registers()
        if need > budget:
            producer = " and a producer warpgroup" if self.warp_specialized else ""
            P = "B_c / 8" if self.is_fp8 else "B_c / 4"
            return (
                f"a consumer thread needs about {need} registers (B_c / 2 for S, d_head / 2 for O, {P} for P, "
                f"{'d_head / 4 for Q, ' if self.Q_in_registers else ''}{_STATE_REGISTERS} more), more than the "
                f"{budget} it has with {self.consumer_warpgroups} consumer "
                f"warpgroup(s){producer}."
            )
        return None

    def _e4m3_error(self) -> str | None:
        """Why the kernel's e4m3 path cannot run this configuration, or None if it can."""
        if not self.warp_specialized:
            return (
                "e4m3 needs warp_specialized: the 8-bit wgmma takes both operands K-major, so the producer "
                "warpgroup transposes each V tile in shared memory."
            )
        if self.Q_in_registers:
            return "e4m3 needs Q_in_registers off: the kernel holds Q in registers only as 16-bit fragments."
        if self.multicast:
            return (
                "e4m3 needs multicast off: each block's producer warpgroup loads and transposes its own V tiles."
            )
        if self.B_c % _E4M3_B_C_MULTIPLE:
            return (
                f"e4m3 needs B_c a multiple of {_E4M3_B_C_MULTIPLE}: P V's k-slices are {_E4M3_B_C_MULTIPLE} "
                f"one-byte keys; got B_c = {self.B_c}."
            )
        if self.d_head % _E4M3_D_HEAD_MULTIPLE:
            heads = ", ".join(str(d) for d in D_HEADS if d % _E4M3_D_HEAD_MULTIPLE == 0)
            return (
                f"e4m3 needs d_head a multiple of {_E4M3_D_HEAD_MULTIPLE} ({heads}): a row of Q and K is d_head "
                f"bytes, and the 8-bit tiles use the 64- and 128-byte swizzles; got d_head = {self.d_head}."
            )
        if self.V_transposed_copy and self.B_c % _TRANSPOSED_V_ROW_KEYS:
            return (
                f"V_transposed_copy needs B_c a multiple of {_TRANSPOSED_V_ROW_KEYS}: TMA loads the transposed tile in "
                f"whole swizzled rows of keys; got B_c = {self.B_c}."
            )
        return None
