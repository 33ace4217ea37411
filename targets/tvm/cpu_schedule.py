"""CPU schedules for the fused Relax kernels: register-tiled, vectorized, parallel loop nests."""

from __future__ import annotations

import logging
from typing import List, Optional

from passctl.targets.tvm.support import import_tvm

logger = logging.getLogger(__name__)

#: Register tile of the second-to-last output axis (rows of a matmul, output columns of an NHWC
#: convolution): the first of these that divides the axis' extent.
ROW_TILES = (8, 7, 6, 4, 3, 2)


def _extent(sch, loop) -> Optional[int]:
    from tvm import tirx

    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def _lanes(target) -> int:
    """float32 lanes of the target's vector registers (16 with AVX-512, 8 with AVX2)."""
    from tvm.target.codegen import llvm_get_vector_width

    bits = llvm_get_vector_width(target)
    return max((bits if bits > 0 else 128) // 32, 4)


def _divisor(n: Optional[int], choices) -> int:
    if n is None:
        return 1
    return next((c for c in choices if c <= n and n % c == 0), 1)


def _tile_reduction(sch, block, lanes: int, epilogues: List) -> bool:
    """Rule 1: a matmul-like reduction block (>= 2 spatial axes, reduction >= 8)."""
    from tvm.s_tir.dlight.analysis import get_sblock_info

    info = get_sblock_info(sch, block)
    kinds = info.dom_kind()
    loops = sch.get_loops(block)
    if len(loops) != len(kinds):
        return False
    spatial = [lp for lp, k in zip(loops, kinds) if k == "S"]
    reduce = [lp for lp, k in zip(loops, kinds) if k == "R"]
    if len(spatial) < 2 or not reduce or kinds.index("R") < len(spatial):
        return False  # reductions must be the inner loops (normalize_prim_func's layout)
    red = 1
    for lp in reduce:
        red *= _extent(sch, lp) or 1
    n_last = _extent(sch, spatial[-1])
    if red < 8 or n_last is None:
        return False
    vec = _divisor(n_last, (2 * lanes, lanes, lanes // 2, 4))
    row = _divisor(_extent(sch, spatial[-2]), ROW_TILES)
    j_o, j_i = sch.split(spatial[-1], [None, vec])
    i_o, i_i = sch.split(spatial[-2], [None, row])
    outer = spatial[:-2] + [i_o, j_o]
    sch.reorder(*outer, *reduce, i_i, j_i)
    fused = sch.fuse(*outer)
    sch.parallel(fused)
    # Accumulate in a local [row, vec] tile (kept in vector registers), written back per tile.
    local = sch.cache_write(block, 0, "local")
    from tvm.s_tir.dlight.base.common_schedules import try_inline

    # Epilogue (bias, activation, residual add): intermediate blocks inlined into their consumers
    # (GELU reads its input twice: 0.5 * x * (1 + erf(x / sqrt 2))); each remaining one inlined
    # into the write-back block when it reads only that block's output, else computed per tile
    # right after the write-back (reverse_compute_at), in order.
    remaining = try_inline(sch, epilogues[:-1]) + epilogues[-1:]
    per_tile = []
    for ep in remaining:
        # NOTE: only into a producer that ep is the sole consumer of: TVM 0.27's
        # reverse_compute_inline also rewrites a producer whose output other blocks still read,
        # leaving them reading a buffer that no longer exists.
        producers = sch.get_producers(ep)
        if all(len(sch.get_consumers(p)) == 1 for p in producers):
            try:
                sch.reverse_compute_inline(ep)
                continue
            except Exception:  # reads another buffer too (a residual, a parameter region)
                pass
        per_tile.append(ep)
    sch.reverse_compute_at(local, fused, preserve_unit_loops=True)
    for ep in per_tile:
        sch.reverse_compute_at(ep, fused, preserve_unit_loops=True)
    for b in [local] + per_tile:
        b_loops = sch.get_loops(b)
        if vec > 1 and len(b_loops) > 1 and _extent(sch, b_loops[-1]) == vec:
            sch.vectorize(b_loops[-1])
    # NOTE: vectorize and unroll before decompose_reduction: after it, the update block has no
    # init and the vectorize primitive refuses it ("not a local reduction block").
    sch.unroll(i_i)
    if vec > 1:
        sch.vectorize(j_i)
    init = sch.decompose_reduction(block, reduce[0])
    if vec > 1:
        sch.vectorize(sch.get_loops(init)[-1])
    return True


def _schedule_injective(sch, block, lanes: int) -> None:
    """Rule 3: one parallel outer loop and a vectorized inner loop (float and 32/64-bit integer
    outputs only: LLVM vectors of bool are stored as int8 lanes, which TIR refuses)."""
    loops = sch.get_loops(block)
    if not loops:
        return
    writes = sch.get(block).writes
    if any(str(w.buffer.dtype) not in ("float32", "float16", "int32", "int64") for w in writes):
        lanes = 1 << 30  # never vectorize
    last = _extent(sch, loops[-1])
    if len(loops) > 1:
        outer = sch.fuse(*loops[:-1])
        sch.parallel(outer)
        if last is not None and last % lanes == 0 and last > lanes:
            _, inner = sch.split(loops[-1], [None, lanes])
            sch.vectorize(inner)
        elif last is not None and last in (4, 8, 16):
            sch.vectorize(loops[-1])
    else:
        sch.parallel(loops[0])


def _lowers(sch, target) -> bool:
    """Whether the scheduled function survives TIR lowering up to vectorization (the passes of
    ``s_tir.pipeline.default_s_tir_pipeline`` where an invalid schedule fails: buffer
    compaction, flattening, vector legalization). A schedule that does not is dropped."""
    import tvm
    from tvm import s_tir, tirx

    passes = [s_tir.transform.CanonicalizeLoop(), s_tir.transform.LowerInitBlock(),
              s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
              s_tir.transform.ConvertBlocksToOpaque(), s_tir.transform.CompactBufferAllocation(),
              s_tir.transform.LowerMatchBuffer(), s_tir.transform.LowerOpaqueBlock(),
              tirx.transform.FlattenBuffer(), tirx.transform.VectorizeLoop(True)]
    try:
        with target:
            tvm.transform.Sequential(passes)(sch.mod)
        return True
    except Exception as e:  # TVM raises InternalError / TypeError for invalid schedules
        logger.debug("schedule dropped, it does not lower: %s", str(e).splitlines()[-1:])
        return False


def _schedule_func(func, target):
    """Schedule one PrimFunc; returns the Schedule or None (then TVM's unscheduled form stays)."""
    from tvm import s_tir
    from tvm.s_tir.dlight.analysis import normalize_prim_func
    from tvm.s_tir.dlight.base.common_schedules import try_inline

    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    blocks = [i.block_rv for i in infos]
    reductions = [i for i in infos if not i.is_injective()]
    lanes = _lanes(target)
    if len(reductions) == 1:
        idx = infos.index(reductions[0])
        try_inline(sch, blocks[:idx])  # injective producers (padding, transposes)
        return sch if _tile_reduction(sch, blocks[idx], lanes, blocks[idx + 1:]) else None
    if not reductions:
        remaining = try_inline(sch, blocks[:-1]) + [blocks[-1]]
        for b in remaining:
            _schedule_injective(sch, b, lanes)
        return sch
    return None  # several reductions (softmax, norms): dlight's CPU Reduction rule


def ScheduleCpuKernels(target):  # noqa: N802 (a TVM pass factory)
    """A module pass scheduling every PrimFunc of a Relax module for the ``llvm`` ``target``.

    Rules, tried per kernel (a kernel whose rule fails, or whose schedule does not lower, keeps
    TVM's serial loop nest):
      1. One reduction block with >= 2 spatial axes and a reduction of >= 8 (matmul, batched
         matmul, NHWC convolution after :func:`conv_layout_pass`): injective producers (padding,
         transposes) inlined; the last output axis split into a vector tile (2x or 1x the
         register's float32 lanes), the one before it into a row tile (:data:`ROW_TILES`); outer
         tile loops fused and parallel; reduction loops between the outer loops and the register
         tile; a local accumulator tile written back once per tile with the epilogue (bias, ReLU,
         residual add) inlined into the write-back. The classic CPU GEMM blocking (Goto & van de
         Geijn 2008, "Anatomy of high-performance matrix multiplication", register-blocked
         micro-kernel).
      2. Several reduction blocks (softmax, normalizations): TVM's DLight ``cpu.Reduction`` rule.
      3. Injective kernels: producers inlined; outer loops fused and parallel, the innermost loop
         vectorized.
    """
    import_tvm()
    from tvm.s_tir import dlight as dl
    from tvm.s_tir.dlight.base import ScheduleRule

    class _Tiled(ScheduleRule):
        def apply(self, func, tgt, tunable):
            try:
                sch = _schedule_func(func, tgt)
            except Exception as e:  # a rule that cannot apply leaves the kernel unscheduled
                logger.debug("cpu schedule skipped: %s", str(e).splitlines()[-1:])
                return None
            return sch if sch is not None and _lowers(sch, tgt) else None

    class _Guard(ScheduleRule):
        def __init__(self, rule):
            self.rule = rule

        def apply(self, func, tgt, tunable):
            try:
                sch = self.rule.apply(func, tgt, tunable)
            except Exception as e:
                logger.debug("dlight rule skipped: %s", str(e).splitlines()[-1:])
                return None
            if isinstance(sch, list):
                sch = sch[0] if len(sch) == 1 else None
            return sch if sch is not None and _lowers(sch, tgt) else None

    return dl.ApplyDefaultSchedule(_Tiled(), _Guard(dl.cpu.Reduction()), _Guard(dl.cpu.GEMV()))


def conv_layout_pass():
    """Relax pass: ``nn.conv2d`` in NHWC / HWIO, so the output channel axis is the contiguous
    last axis of both the output and the weights (vectorizable by rule 1)."""
    import_tvm()
    from tvm import relax

    # NOTE: conv2d_transpose pinned to NCHW: layout inference would otherwise carry NHWC into it,
    # and TVM 0.27 cannot legalize an NHWC conv2d_transpose (PP-OCR det's upsampling).
    return relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "HWIO"],
                                          "relax.nn.conv2d_transpose": ["NCHW", "IOHW"]})


__all__ = ["ROW_TILES", "ScheduleCpuKernels", "conv_layout_pass"]
