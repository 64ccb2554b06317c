"""Fuzzing the load path: truncated, bit-flipped and absurd-field variants of small valid models.

Each variant must either load (open_gguf, then build_spec and tokenizer_from_metadata) or raise a
ForgeError subclass: never another exception type, never a hang, never a large allocation.
Cases are generated from fixed seeds, so a failure names a reproducible case.
"""

from __future__ import annotations

import random
import signal
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as V

from forge.errors import ForgeError
from forge.gguf import open_gguf
from forge.models import build_spec
from forge.tokenizer import tokenizer_from_metadata
from tests.support.gguf_factory import read_source, tiny_model, write_gguf

SEED = 20261121
CASES_PER_MODEL = {"truncate": 70, "flip": 90, "field": 90}
MAX_CASE_BYTES = 50 << 20  # traced allocation peak allowed per case
CASE_TIMEOUT_S = 2
U64_VALUES = (2**63, 2**40, 2**64 - 1, 2**32, 1 << 20, 0, 1)
U32_VALUES = (2**32 - 1, 2**31, 0, 5, 9, 8, 13, 99)
# well-formed values of the wrong kind or range, put in place of each metadata key in turn
HOSTILE = [
    ("", V.STRING, None), ("x" * 300, V.STRING, None), ("gpt2", V.STRING, None),
    ("{% for %}", V.STRING, None), (0, V.UINT32, None), (-1, V.INT32, None),
    (2**63, V.UINT64, None), (2**32 - 1, V.UINT32, None), (1.5, V.FLOAT32, None),
    (float("nan"), V.FLOAT32, None), (float("-inf"), V.FLOAT64, None), (True, V.BOOL, None),
    ([1, 2], V.ARRAY, V.INT32), ([-5], V.ARRAY, V.INT64), (["a"], V.ARRAY, V.STRING),
    ([""], V.ARRAY, V.STRING), ([1.0, float("nan")], V.ARRAY, V.FLOAT32),
    ([True], V.ARRAY, V.BOOL), ([[1], [2]], V.ARRAY, V.ARRAY),
]  # fmt: skip
# optional keys the tiny models leave out, so that they get hostile values too
OPTIONAL = [
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_eos_token",
    "tokenizer.ggml.add_space_prefix", "tokenizer.ggml.pre", "tokenizer.ggml.merges",
    "tokenizer.ggml.scores", "tokenizer.chat_template", "general.alignment",
    "{arch}.rope.scaling.type", "{arch}.rope.scaling.factor", "{arch}.attention.key_length",
    "{arch}.attention.value_length", "{arch}.rope.dimension_count", "{arch}.vocab_size",
]  # fmt: skip
VOCAB_EDITS = {
    V.STRING: ["", " ", "a", "\u0120", "<0xZZ>", "<0x41>", "a b c", "ab", "\x00", "<s>", "x y"],
    V.INT32: [-1, 7, 100, 6, 0, 2**31 - 1],
    V.FLOAT32: [float("nan"), float("inf"), -1e30],
}


def field_slots(path: Path) -> list[tuple[int, int]]:
    """(offset, width) of every integer field of the header (lengths, counts, types, dims,
    offsets, scalar values), found with gguf.GGUFReader."""
    r = gguf.GGUFReader(str(path))
    fields = list(r.fields.values()) + [t.field for t in r.tensors]
    slots = []
    for field in fields:
        pos = field.offset
        for part in field.parts:
            if part.dtype.kind in "ui" and part.dtype.itemsize in (4, 8) and part.size == 1:
                slots.append((pos, part.dtype.itemsize))
            pos += part.nbytes
    return slots


def cases(data: bytes, header_end: int, slots: list, seed: int) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(seed)
    size = len(data)
    n = CASES_PER_MODEL
    # truncations: every region of the header densely, the data section sparsely
    cuts = sorted({*range(0, 64), *rng.sample(range(64, header_end), n["truncate"] - 64 - 6),
                   *(rng.randrange(header_end, size) for _ in range(6))})  # fmt: skip
    for cut in cuts:
        yield f"truncate at {cut}", data[:cut]
    for i in range(n["flip"]):
        buf = bytearray(data)
        where = []
        for _ in range(rng.randint(1, 4)):
            # mostly inside the header: flips in weight bytes are not format errors
            pos = rng.randrange(header_end) if rng.random() < 0.9 else rng.randrange(size)
            bit = rng.randrange(8)
            buf[pos] ^= 1 << bit
            where.append(f"{pos}.{bit}")
        yield f"flip #{i} bits {','.join(where)}", bytes(buf)
    for i in range(n["field"]):
        pos, width = rng.choice(slots)
        value = rng.choice(U64_VALUES if width == 8 else U32_VALUES)
        buf = bytearray(data)
        buf[pos : pos + width] = value.to_bytes(width, "little")
        yield f"field #{i} u{width * 8} at {pos} = {value}", bytes(buf)


def load_path(path: Path) -> str:
    """Run the load path on one file; the name of the stage it reached."""
    g = open_gguf(path)
    for name in g.tensors:
        g.raw(name)
    spec = build_spec(g)
    tok = tokenizer_from_metadata(g.metadata)
    ids = tok.encode("ab a b ab")
    tok.decode(ids)
    return f"loaded {spec.arch}"


def hostile_variants(src: Path, seed: int) -> Iterator[tuple[str, list, list, str]]:
    """(label, metadata, tensors, arch) variants of `src` with one hostile metadata value each:
    every key x every HOSTILE value, then single-element edits of the vocabulary arrays."""
    arch, kvs, tensors = read_source(src)
    base = {k: (k, v, t, sub) for k, v, t, sub in kvs}
    keys = list(base) + [k.format(arch=arch) for k in OPTIONAL if k.format(arch=arch) not in base]
    for key in keys:
        for value, vtype, sub in HOSTILE:
            kv = dict(base, **{key: (key, value, vtype, sub)})
            yield f"{key} = {value!r:.40}", list(kv.values()), tensors, arch
    rng = random.Random(seed)
    arrays = [k for k, (_, v, t, sub) in base.items() if t == V.ARRAY and sub in VOCAB_EDITS]
    for _ in range(150):
        key = rng.choice(arrays)
        _, values, vtype, sub = base[key]
        values = list(values)
        i = rng.randrange(len(values))
        values[i] = rng.choice(VOCAB_EDITS[sub])
        kv = dict(base, **{key: (key, values, vtype, sub)})
        yield f"{key}[{i}] = {values[i]!r}", list(kv.values()), tensors, arch


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise CaseTimeout


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fuzzed_files_raise_only_forge_errors(tmp_path, arch):
    src = tiny_model(tmp_path / f"{arch}.gguf", arch)
    data = src.read_bytes()
    header_end = open_gguf(src).data_offset
    slots = field_slots(src)
    assert len(slots) > 50
    path = tmp_path / "fuzzed.gguf"
    outcomes: Counter = Counter()
    failures = []
    worst_peak = 0
    t0 = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    tracemalloc.start()
    try:
        for label, variant in cases(data, header_end, slots, SEED + len(arch)):
            path.write_bytes(variant)
            tracemalloc.reset_peak()
            signal.alarm(CASE_TIMEOUT_S)
            try:
                outcomes[load_path(path)] += 1
            except ForgeError as e:
                outcomes[type(e).__name__] += 1
            except CaseTimeout:
                failures.append(f"{label}: no result after {CASE_TIMEOUT_S} s")
            except Exception as e:  # noqa: BLE001 - the point: nothing else may escape
                failures.append(f"{label}: {type(e).__name__}: {e}")
            finally:
                signal.alarm(0)
            peak = tracemalloc.get_traced_memory()[1]
            worst_peak = max(worst_peak, peak)
            if peak > MAX_CASE_BYTES:
                failures.append(f"{label}: allocated {peak / 2**20:.0f} MiB")
    finally:
        tracemalloc.stop()
        signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - t0
    n = sum(outcomes.values()) + len([f for f in failures if "MiB" not in f])
    print(f"\nfuzz {arch}: {n} cases in {elapsed:.1f} s, worst traced peak "
          f"{worst_peak / 2**20:.1f} MiB, outcomes {dict(outcomes)}")  # fmt: skip
    assert not failures, "\n".join(failures[:20])
    assert n == sum(CASES_PER_MODEL.values())
    # the fuzzer must reach every stage, not only the reader's first checks
    assert outcomes["GGUFFormatError"] > 50
    assert outcomes[f"loaded {arch}"] > 5
    assert elapsed < 20


def test_cases_are_deterministic(tmp_path):
    src = tiny_model(tmp_path / "m.gguf")
    data = src.read_bytes()
    slots = field_slots(src)
    first = [(label, hash(v)) for label, v in cases(data, 2000, slots, SEED)]
    again = [(label, hash(v)) for label, v in cases(data, 2000, slots, SEED)]
    assert first == again
    assert len({v for _, v in first}) > 0.9 * len(first)


def test_field_slots_point_at_the_counts(tmp_path):
    src = tiny_model(tmp_path / "m.gguf")
    data = src.read_bytes()
    slots = dict(field_slots(src))
    # header: version (u32 at 4), tensor count (u64 at 8), kv count (u64 at 16)
    assert slots[4] == 4 and slots[8] == 8 and slots[16] == 8
    assert int.from_bytes(data[16:24], "little") == len(open_gguf(src).metadata)
    assert np.frombuffer(data, np.uint64, 1, 8)[0] == len(open_gguf(src).tensors)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_hostile_metadata_values_raise_only_forge_errors(tmp_path, arch):
    src = tiny_model(tmp_path / f"{arch}.gguf", arch)
    path = tmp_path / "hostile.gguf"
    outcomes: Counter = Counter()
    failures = []
    for label, kvs, tensors, name in hostile_variants(src, SEED):
        write_gguf(path, kvs, tensors, arch=name)
        try:
            outcomes[load_path(path)] += 1
        except ForgeError as e:
            outcomes[type(e).__name__] += 1
        except Exception as e:  # noqa: BLE001
            failures.append(f"{label}: {type(e).__name__}: {e}")
    print(f"\nhostile metadata {arch}: {sum(outcomes.values())} cases, {dict(outcomes)}")
    assert not failures, "\n".join(failures[:20])
    assert outcomes["ModelError"] > 50 and outcomes[f"loaded {arch}"] > 50
