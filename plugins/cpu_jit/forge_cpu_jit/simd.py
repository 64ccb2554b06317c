"""SIMD vectors for numba: LLVM vector types as numba values and the few operations kernels use.

numba compiles Python loops through LLVM but has no vector types of its own, and LLVM does not turn
the integer dot products of quantized blocks into VNNI instructions on its own. These intrinsics
(numba's documented `numba.extending.intrinsic` API, code generated with llvmlite) give the kernels
512-bit values they keep in registers across a loop:

- `U8x64`, `I8x64`: 64 bytes (unsigned weight codes, signed activation codes); `I32x16`, `F32x16`.
- loads and stores at an element index of a 1-D array (`load_u8x64(row, i)` reads row[i : i + 64]);
- `dot4(acc, a, b)`: acc[l] + sum over j < 4 of a[4l + j] * b[4l + j] (unsigned a, signed b): one
  `vpdpbusd` where the CPU has AVX512-VNNI, portable LLVM vector code (same result) elsewhere;
- float arithmetic (`fma`, `fmul`, `to_f32`), `hsum`, `splat_f32`, `zeros_*`, and the scalar
  `f16_to_f32` / `bits_to_f32` conversions (exact for every finite half).

Every vector is 512 bits: where the CPU has narrower registers LLVM splits the operations.
"""

from __future__ import annotations

import llvmlite.binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

_I8, _I16, _I32, _I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F32 = ir.FloatType()


def host_features() -> frozenset[str]:
    """The LLVM feature names the host CPU has ("avx512vnni", "avx2", ...), as numba targets it."""
    try:
        flat = llvm_binding.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM does not know this host's features
        return frozenset()
    return frozenset(f[1:] for f in flat.split(",") if f.startswith("+"))


HAS_VNNI = "avx512vnni" in host_features() and "avx512bw" in host_features()


class Vec(types.Type):
    """A numba type for one LLVM vector value (<n x elem>)."""

    def __init__(self, kind: str, n: int):
        self.kind, self.n = kind, n
        super().__init__(name=f"forge_vec_{kind}x{n}")


_ELEM = {"u8": _I8, "i8": _I8, "i32": _I32, "f32": _F32}
_DTYPE = {"u8": types.uint8, "i8": types.int8, "i32": types.int32, "f32": types.float32}


@register_model(Vec)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):  # noqa: ANN001
        super().__init__(dmm, fe_type, ir.VectorType(_ELEM[fe_type.kind], fe_type.n))


U8x64, I8x64, I32x16, F32x16 = Vec("u8", 64), Vec("i8", 64), Vec("i32", 16), Vec("f32", 16)


def _vec_ptr(context, builder, arr_type, arr, idx, vec_llty):  # noqa: ANN001
    """Pointer to arr[idx] as a pointer to the vector type (arr: a 1-D array)."""
    ary = context.make_array(arr_type)(context, builder, arr)
    return builder.bitcast(builder.gep(ary.data, [idx]), vec_llty.as_pointer())


def _check(arr, idx, vec: Vec) -> bool:  # noqa: ANN001
    return (
        isinstance(arr, types.Array)
        and arr.ndim == 1
        and arr.dtype == _DTYPE[vec.kind]
        and isinstance(idx, types.Integer)
    )


def _make_load(vec: Vec):
    def load(typingctx, arr, idx):  # noqa: ANN001
        if not _check(arr, idx, vec):
            return None

        def codegen(context, builder, sig, args):  # noqa: ANN001
            llty = context.get_value_type(vec)
            return builder.load(_vec_ptr(context, builder, sig.args[0], args[0], args[1], llty),
                                align=1)  # fmt: skip

        return vec(arr, idx), codegen

    load.__name__ = f"load_{vec.kind}x{vec.n}"
    return intrinsic(load)


def _make_store(vec: Vec):
    def store(typingctx, arr, idx, value):  # noqa: ANN001
        if not _check(arr, idx, vec) or value != vec:
            return None

        def codegen(context, builder, sig, args):  # noqa: ANN001
            llty = context.get_value_type(vec)
            ptr = _vec_ptr(context, builder, sig.args[0], args[0], args[1], llty)
            builder.store(args[2], ptr, align=1)
            return context.get_dummy_value()

        return types.void(arr, idx, value), codegen

    store.__name__ = f"store_{vec.kind}x{vec.n}"
    return intrinsic(store)


load_u8x64, load_i8x64 = _make_load(U8x64), _make_load(I8x64)
load_i32x16, load_f32x16 = _make_load(I32x16), _make_load(F32x16)
store_u8x64, store_i32x16, store_f32x16 = (
    _make_store(U8x64), _make_store(I32x16), _make_store(F32x16))  # fmt: skip


def _const_vec(elem, values):  # noqa: ANN001
    return ir.Constant(ir.VectorType(elem, len(values)), list(values))


def _splat(builder, value, n: int):  # noqa: ANN001
    vt = ir.VectorType(value.type, n)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vt, ir.Undefined), _const_vec(_I32, [0] * n))


def _dot4_generic(builder, acc, a, b):  # noqa: ANN001
    """acc + sums of 4 adjacent products a (u8) * b (i8), in portable vector code."""
    wide = ir.VectorType(_I32, 64)
    prod = builder.mul(builder.zext(a, wide), builder.sext(b, wide))
    total = acc
    for j in range(4):
        part = builder.shuffle_vector(prod, prod, _const_vec(_I32, range(j, 64, 4)))
        total = builder.add(total, part)
    return total


@intrinsic
def dot4(typingctx, acc, a, b):  # noqa: ANN001
    """acc[l] + sum_{j<4} a[4l+j] * b[4l+j] for unsigned bytes a, signed bytes b."""
    if (acc, a, b) != (I32x16, U8x64, I8x64):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        if HAS_VNNI:
            fnty = ir.FunctionType(ir.VectorType(_I32, 16),
                                   [ir.VectorType(_I32, 16), ir.VectorType(_I8, 64),
                                    ir.VectorType(_I8, 64)])  # fmt: skip
            fn = cgutils.get_or_insert_function(builder.module, fnty,
                                                "llvm.x86.avx512.vpdpbusd.512")  # fmt: skip
            return builder.call(fn, args)
        return _dot4_generic(builder, *args)

    return I32x16(I32x16, U8x64, I8x64), codegen


@intrinsic
def neg_shl(typingctx, v, shift):  # noqa: ANN001
    """-(v << shift) for each int32 lane."""
    if v != I32x16 or not isinstance(shift, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        s = args[1]
        s = builder.trunc(s, _I32) if s.type.width > 32 else builder.zext(s, _I32) \
            if s.type.width < 32 else s  # fmt: skip
        shifted = builder.shl(args[0], _splat(builder, s, 16))
        return builder.sub(ir.Constant(shifted.type, None), shifted)

    return I32x16(I32x16, shift), codegen


@intrinsic
def to_f32(typingctx, v):  # noqa: ANN001
    if v != I32x16:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return builder.sitofp(args[0], ir.VectorType(_F32, 16))

    return F32x16(I32x16), codegen


def _float_binop(name: str, fn):
    def op(typingctx, a, b):  # noqa: ANN001
        if (a, b) != (F32x16, F32x16):
            return None

        def codegen(context, builder, sig, args):  # noqa: ANN001
            return fn(builder, *args)

        return F32x16(F32x16, F32x16), codegen

    op.__name__ = name
    return intrinsic(op)


fmul = _float_binop("fmul", lambda b, x, y: b.fmul(x, y))
fadd = _float_binop("fadd", lambda b, x, y: b.fadd(x, y))


@intrinsic
def fma(typingctx, a, b, c):  # noqa: ANN001
    """a * b + c (contracted to one fused multiply-add where the CPU has it)."""
    if (a, b, c) != (F32x16, F32x16, F32x16):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        vt = ir.VectorType(_F32, 16)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3),
                                            "llvm.fmuladd.v16f32")  # fmt: skip
        return builder.call(fn, args)

    return F32x16(F32x16, F32x16, F32x16), codegen


@intrinsic
def zeros_f32x16(typingctx):  # noqa: ANN001
    def codegen(context, builder, sig, args):  # noqa: ANN001
        return ir.Constant(ir.VectorType(_F32, 16), None)

    return F32x16(), codegen


@intrinsic
def zeros_i32x16(typingctx):  # noqa: ANN001
    def codegen(context, builder, sig, args):  # noqa: ANN001
        return ir.Constant(ir.VectorType(_I32, 16), None)

    return I32x16(), codegen


@intrinsic
def splat_f32(typingctx, x):  # noqa: ANN001
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return _splat(builder, args[0], 16)

    return F32x16(types.float32), codegen


@intrinsic
def hsum(typingctx, v):  # noqa: ANN001
    """The sum of the 16 lanes (pairwise halves: the order is fixed, not reassociated)."""
    if v != F32x16:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        x, n = args[0], 16
        while n > 1:
            h = n // 2
            lo = builder.shuffle_vector(x, x, _const_vec(_I32, range(h)))
            hi = builder.shuffle_vector(x, x, _const_vec(_I32, range(h, n)))
            x, n = builder.fadd(lo, hi), h
        return builder.extract_element(x, ir.Constant(_I32, 0))

    return types.float32(F32x16), codegen


@intrinsic
def bits_to_f32(typingctx, bits):  # noqa: ANN001
    """The float32 whose bit pattern is the low 32 bits of an integer."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        v = args[0]
        if v.type.width > 32:
            v = builder.trunc(v, _I32)
        elif v.type.width < 32:
            v = builder.zext(v, _I32)
        return builder.bitcast(v, _F32)

    return types.float32(bits), codegen


@intrinsic
def f32_to_bits(typingctx, x):  # noqa: ANN001
    """The bit pattern of a float32, as uint32."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return builder.bitcast(args[0], _I32)

    return types.uint32(types.float32), codegen


# -- byte vectors: unpacking weight codes in registers -----------------------------------------

U8x16, U8x32 = Vec("u8", 16), Vec("u8", 32)
load_u8x16, load_u8x32 = _make_load(U8x16), _make_load(U8x32)
store_u8x32 = _make_store(U8x32)


def _is_bytes(v) -> bool:  # noqa: ANN001
    return isinstance(v, Vec) and v.kind == "u8"


def _scalar_i8(builder, value, n: int):  # noqa: ANN001
    """An integer scalar truncated to a byte and splat over n lanes."""
    if value.type.width > 8:
        value = builder.trunc(value, _I8)
    elif value.type.width < 8:
        value = builder.zext(value, _I8)
    return _splat(builder, value, n)


def _byte_op(name: str, fn):
    def op(typingctx, v, s):  # noqa: ANN001
        if not _is_bytes(v) or not isinstance(s, types.Integer):
            return None

        def codegen(context, builder, sig, args):  # noqa: ANN001
            return fn(builder, args[0], _scalar_i8(builder, args[1], sig.args[0].n))

        return v(v, s), codegen

    op.__name__ = name
    return intrinsic(op)


band = _byte_op("band", lambda b, v, s: b.and_(v, s))  # v & s per byte
bxor = _byte_op("bxor", lambda b, v, s: b.xor(v, s))  # v ^ s
shr = _byte_op("shr", lambda b, v, s: b.lshr(v, s))  # v >> s (logical; s < 8)
shl = _byte_op("shl", lambda b, v, s: b.shl(v, s))  # v << s (s < 8)


@intrinsic
def bor(typingctx, a, b):  # noqa: ANN001
    if not _is_bytes(a) or a != b:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return builder.or_(*args)

    return a(a, b), codegen


@intrinsic
def cat(typingctx, a, b):  # noqa: ANN001
    """The bytes of a, then those of b."""
    if not _is_bytes(a) or a != b or a.n not in (16, 32):
        return None
    out = Vec("u8", 2 * a.n)

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return builder.shuffle_vector(args[0], args[1], _const_vec(_I32, range(2 * a.n)))

    return out(a, b), codegen


@intrinsic
def bits32(typingctx, word):  # noqa: ANN001
    """32 bytes: byte j is bit j of the (32-bit) integer word, 0 or 1 (with AVX-512 the word is
    used as a mask register: two instructions)."""
    if not isinstance(word, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        w = args[0]
        w = builder.trunc(w, _I32) if w.type.width > 32 else builder.zext(w, _I32) \
            if w.type.width < 32 else w  # fmt: skip
        mask = builder.bitcast(w, ir.VectorType(ir.IntType(1), 32))
        return builder.zext(mask, ir.VectorType(_I8, 32))

    return U8x32(word), codegen


@intrinsic
def zeros_u8x32(typingctx):  # noqa: ANN001
    def codegen(context, builder, sig, args):  # noqa: ANN001
        return ir.Constant(ir.VectorType(_I8, 32), None)

    return U8x32(), codegen


def _lanes_of(builder, values, n: int = 16):  # noqa: ANN001
    """A float vector of n lanes: values[i] repeated n / len(values) times, in order."""
    k = len(values)
    small = ir.Constant(ir.VectorType(_F32, k), ir.Undefined)
    for i, v in enumerate(values):
        small = builder.insert_element(small, v, ir.Constant(_I32, i))
    return _spread(builder, small, n)


def _spread(builder, small, n: int = 16):  # noqa: ANN001
    """Each lane of a short vector repeated n / len times, in order (one permute)."""
    k = small.type.count
    return builder.shuffle_vector(small, small, _const_vec(_I32, [i * k // n for i in range(n)]))


@intrinsic
def f32x16_2(typingctx, a, b):  # noqa: ANN001
    """Lanes 0-7 a, 8-15 b."""
    if (a, b) != (types.float32, types.float32):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return _lanes_of(builder, args)

    return F32x16(a, b), codegen


@intrinsic
def f32x16_4(typingctx, a, b, c, d):  # noqa: ANN001
    """Lanes 0-3 a, 4-7 b, 8-11 c, 12-15 d."""
    if (a, b, c, d) != (types.float32,) * 4:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        return _lanes_of(builder, args)

    return F32x16(a, b, c, d), codegen


@intrinsic
def scales_i8x4(typingctx, arr, at, d):  # noqa: ANN001
    """The 4 int8 at bytes at .. at + 3 of a uint8 array, each times d, as lanes 0-3, 4-7,
    8-11, 12-15 (one load and one vector multiply; the same products as four scalar ones)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.uint8
            and isinstance(at, types.Integer) and d == types.float32):  # fmt: skip
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        ptr = _vec_ptr(context, builder, sig.args[0], args[0], args[1], ir.VectorType(_I8, 4))
        codes = builder.sitofp(builder.load(ptr, align=1), ir.VectorType(_F32, 4))
        return _spread(builder, builder.fmul(codes, _splat(builder, args[2], 4)))

    return F32x16(arr, at, d), codegen


@intrinsic
def k4_scales(typingctx, arr, at, d, mdmin):  # noqa: ANN001
    """The eight 6-bit scales and eight 6-bit minimums packed in the 12 bytes at `at` of a
    Q4_K/Q5_K super-block (ggml's get_scale_min_k4 layout), as lanes 0-7 d * scale[j] and lanes
    8-15 mdmin * min[j]: byte shuffles and one vector multiply, the same products as scalar
    code. Reads 16 bytes (the block's quants follow its scales)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.uint8
            and isinstance(at, types.Integer) and d == mdmin == types.float32):  # fmt: skip
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        q = builder.load(_vec_ptr(context, builder, sig.args[0], args[0], args[1],
                                  ir.VectorType(_I8, 16)), align=1)  # fmt: skip

        def pick(idx):  # noqa: ANN001, ANN202
            return builder.shuffle_vector(q, q, _const_vec(_I32, idx))

        def bits(v, shift, mask):  # noqa: ANN001, ANN202 - (v >> shift) & mask per lane
            v = builder.lshr(v, _const_vec(_I8, shift))
            return builder.and_(v, _const_vec(_I8, mask))

        low4, high4 = [0, 0, 0, 0], [4, 4, 4, 4]
        # scale j: q[j] & 63 (j < 4), else (q[j + 4] & 15) | (q[j - 4] >> 6) << 4
        scale = builder.or_(
            bits(pick([0, 1, 2, 3, 8, 9, 10, 11]), low4 * 2, [63] * 4 + [15] * 4),
            bits(pick([0, 0, 0, 0, 0, 1, 2, 3]), [2] * 8, [0] * 4 + [48] * 4),
        )
        # min j: q[j + 4] & 63 (j < 4), else (q[j + 4] >> 4) | (q[j] >> 6) << 4
        mins = builder.or_(
            bits(pick([4, 5, 6, 7, 8, 9, 10, 11]), low4 + high4, [63] * 4 + [15] * 4),
            bits(pick([0, 0, 0, 0, 4, 5, 6, 7]), [2] * 8, [0] * 4 + [48] * 4),
        )
        both = builder.shuffle_vector(scale, mins, _const_vec(_I32, range(16)))
        f = builder.uitofp(both, ir.VectorType(_F32, 16))
        factors = builder.shuffle_vector(_splat(builder, args[2], 8), _splat(builder, args[3], 8),
                                         _const_vec(_I32, range(16)))  # fmt: skip
        return builder.fmul(f, factors)

    return F32x16(arr, at, d, mdmin), codegen


@intrinsic
def pair_lanes(typingctx, v, i):  # noqa: ANN001
    """Lanes 0-7 v[i], lanes 8-15 v[i + 1] (one permute when i is a constant)."""
    if v != F32x16 or not isinstance(i, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        i0 = builder.trunc(args[1], _I32) if args[1].type.width > 32 else args[1]
        i1 = builder.add(i0, ir.Constant(_I32, 1))
        pair = [builder.extract_element(args[0], i0), builder.extract_element(args[0], i1)]
        return _lanes_of(builder, pair)

    return F32x16(v, i), codegen


@intrinsic
def half_at(typingctx, arr, at):  # noqa: ANN001
    """The IEEE half at bytes at, at + 1 of a uint8 array as float32 (exact; `vcvtph2ps` where
    the CPU has F16C)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.uint8
            and isinstance(at, types.Integer)):  # fmt: skip
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        h = _load_i16(context, builder, sig.args[0], args[0], args[1])
        one = builder.insert_element(ir.Constant(ir.VectorType(_I16, 1), ir.Undefined), h,
                                     ir.Constant(_I32, 0))  # fmt: skip
        return builder.extract_element(_f16_vec(builder, one), ir.Constant(_I32, 0))

    return types.float32(arr, at), codegen


def _make_float_load(name: str, width: int, convert):
    """A load of 16 floats stored as `width`-bit values at byte index i of a uint8 array."""

    def load(typingctx, arr, idx):  # noqa: ANN001
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.uint8
                and isinstance(idx, types.Integer)):  # fmt: skip
            return None

        def codegen(context, builder, sig, args):  # noqa: ANN001
            vt = ir.VectorType(ir.IntType(width), 16)
            raw = builder.load(_vec_ptr(context, builder, sig.args[0], args[0], args[1], vt),
                               align=1)  # fmt: skip
            return convert(builder, raw)

        return F32x16(arr, idx), codegen

    load.__name__ = name
    return intrinsic(load)


HAS_F16C = "f16c" in host_features()


def _f16_vec(builder, raw):  # noqa: ANN001
    """IEEE halves (<n x i16>) to float32: `vcvtph2ps` where the CPU has F16C, else integer
    code; both exact for every finite half (subnormals included)."""
    n = raw.type.count
    if HAS_F16C:
        return builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), n)),
                             ir.VectorType(_F32, n))  # fmt: skip
    i32 = ir.VectorType(_I32, n)
    wide = builder.zext(raw, i32)
    mag = builder.shl(builder.and_(wide, _const_vec(_I32, [0x7FFF] * n)),
                      _const_vec(_I32, [13] * n))  # fmt: skip
    f = builder.fmul(builder.bitcast(mag, ir.VectorType(_F32, n)),
                     _const_vec(_F32, [5.192296858534828e33] * n))  # 2**112  # fmt: skip
    sign = builder.shl(builder.and_(wide, _const_vec(_I32, [0x8000] * n)),
                       _const_vec(_I32, [16] * n))  # fmt: skip
    return builder.bitcast(builder.or_(builder.bitcast(f, i32), sign), ir.VectorType(_F32, n))


def _load_i16(context, builder, arr_type, arr, idx):  # noqa: ANN001
    ary = context.make_array(arr_type)(context, builder, arr)
    ptr = builder.bitcast(builder.gep(ary.data, [idx]), ir.IntType(16).as_pointer())
    return builder.load(ptr, align=1)


@intrinsic
def halves2(typingctx, arr, a, b):  # noqa: ANN001
    """The f16 at bytes a and b of a uint8 array, as float32 lanes 0-7 and 8-15."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.uint8
            and isinstance(a, types.Integer) and isinstance(b, types.Integer)):  # fmt: skip
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        small = ir.Constant(ir.VectorType(ir.IntType(16), 2), ir.Undefined)
        for i, at in enumerate(args[1:]):
            h = _load_i16(context, builder, sig.args[0], args[0], at)
            small = builder.insert_element(small, h, ir.Constant(_I32, i))
        return _spread(builder, _f16_vec(builder, small))

    return F32x16(arr, a, b), codegen


def _bf16_vec(builder, raw):  # noqa: ANN001
    i32 = ir.VectorType(_I32, 16)
    bits = builder.shl(builder.zext(raw, i32), _const_vec(_I32, [16] * 16))
    return builder.bitcast(bits, ir.VectorType(_F32, 16))


load_f16x16 = _make_float_load("load_f16x16", 16, _f16_vec)
load_bf16x16 = _make_float_load("load_bf16x16", 16, _bf16_vec)
load_f32x16_bytes = _make_float_load(
    "load_f32x16_bytes", 32, lambda b, raw: b.bitcast(raw, ir.VectorType(_F32, 16))
)


@intrinsic
def prefetch(typingctx, arr, idx):  # noqa: ANN001
    """Hint the cache line of arr[idx] (a 1-D array) into the caches for reading."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), _I8.as_pointer())
        fnty = ir.FunctionType(ir.VoidType(), [_I8.as_pointer(), _I32, _I32, _I32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


# -- what the thread pool (pool.py) needs: atomics, pause, pointers, indirect calls -------------

IS_X86 = llvm_binding.get_process_triple().startswith(("x86_64", "i386", "i686"))


def _elem_ptr(context, builder, arr_type, arr, idx):  # noqa: ANN001
    ary = context.make_array(arr_type)(context, builder, arr)
    return builder.gep(ary.data, [idx])


def _int64_array(arr, idx) -> bool:  # noqa: ANN001
    return (isinstance(arr, types.Array) and arr.ndim == 1 and arr.dtype == types.int64
            and isinstance(idx, types.Integer))  # fmt: skip


@intrinsic
def atomic_add(typingctx, arr, idx, value):  # noqa: ANN001
    """arr[idx] += value atomically (sequentially consistent); returns the old value."""
    if not _int64_array(arr, idx) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, "seq_cst")

    return types.int64(arr, idx, value), codegen


@intrinsic
def atomic_load(typingctx, arr, idx):  # noqa: ANN001
    """arr[idx], read atomically with acquire ordering."""
    if not _int64_array(arr, idx):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(arr, idx), codegen


@intrinsic
def atomic_store(typingctx, arr, idx, value):  # noqa: ANN001
    """arr[idx] = value, written atomically with release ordering."""
    if not _int64_array(arr, idx) or not isinstance(value, types.Integer):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        ptr = _elem_ptr(context, builder, sig.args[0], args[0], args[1])
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        builder.store_atomic(v, ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(arr, idx, value), codegen


@intrinsic
def cpu_pause(typingctx):  # noqa: ANN001
    """The spin-wait hint (`pause` on x86; nothing elsewhere)."""

    def codegen(context, builder, sig, args):  # noqa: ANN001
        if IS_X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")  # fmt: skip
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


def _make_ptr(dtype):
    def as_ptr(typingctx, addr):  # noqa: ANN001
        if not isinstance(addr, types.Integer):
            return None
        ptr_type = types.CPointer(dtype)

        def codegen(context, builder, sig, args):  # noqa: ANN001
            return builder.inttoptr(args[0], context.get_value_type(ptr_type))

        return ptr_type(addr), codegen

    as_ptr.__name__ = f"as_{dtype}_ptr"
    return intrinsic(as_ptr)


as_u8_ptr, as_i8_ptr = _make_ptr(types.uint8), _make_ptr(types.int8)
as_i32_ptr, as_f32_ptr = _make_ptr(types.int32), _make_ptr(types.float32)
as_i64_ptr = _make_ptr(types.int64)


@intrinsic
def call_entry(typingctx, addr, args_addr, lo, hi):  # noqa: ANN001
    """Call the compiled entry at address `addr`: void(int64* args, int64 lo, int64 hi)."""
    if not all(isinstance(a, types.Integer) for a in (addr, args_addr, lo, hi)):
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        fnty = ir.FunctionType(ir.VoidType(), [_I64.as_pointer(), _I64, _I64])
        fn = builder.inttoptr(args[0], fnty.as_pointer())
        cast = [context.cast(builder, a, t, types.int64) for a, t in zip(args[1:], sig.args[1:])]
        builder.call(fn, [builder.inttoptr(cast[0], _I64.as_pointer()), cast[1], cast[2]])
        return context.get_dummy_value()

    return types.void(addr, args_addr, lo, hi), codegen


# E2M1 (MXFP4) codes as ggml multiplies them (doubled: 0, 1, 2, 3, 4, 6, 8, 12 and negatives),
# plus 16 so that they are unsigned bytes for `dot4`
E2M1_PLUS_16 = (16, 17, 18, 19, 20, 22, 24, 28, 16, 15, 14, 13, 12, 10, 8, 4)


@intrinsic
def e2m1_codes(typingctx, v):  # noqa: ANN001
    """32 nibble codes (0..15 in bytes) as E2M1_PLUS_16 values: one byte shuffle (pshufb) on
    x86, a chain of selects elsewhere."""
    if v != U8x32:
        return None

    def codegen(context, builder, sig, args):  # noqa: ANN001
        vt = ir.VectorType(_I8, 32)
        table = _const_vec(_I8, E2M1_PLUS_16 * 2)
        if IS_X86 and "avx2" in host_features():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]),
                                                "llvm.x86.avx2.pshuf.b")  # fmt: skip
            return builder.call(fn, [table, args[0]])
        out = ir.Constant(vt, None)
        for code, value in enumerate(E2M1_PLUS_16):
            hit = builder.icmp_unsigned("==", args[0], _const_vec(_I8, [code] * 32))
            out = builder.select(hit, _const_vec(_I8, [value] * 32), out)
        return out

    return U8x32(U8x32), codegen
