"""Python and the kernels agree: the numbers of kernels/contract.h, the signatures read from the
FORGE_KERNEL declarations, the descriptor layout, and the set of kernels (no kernel the plan
cannot launch)."""

from __future__ import annotations

import pytest
from forge_hip.contract import constants, declarations, kernel_signatures
from forge_hip.library import EXPERT_TYPES, KERNELS, TYPE_IDS, TYPE_SUFFIX, plan_kernels
from forge_hip.products import DESC, descriptor
from forge_hip.step_meta import SAMPLE_FIELDS
from forge_hip.workspace import DESC_LEN

from forge.errors import ForgeRuntimeError
from forge.gguf import SUPPORTED_TYPES


def test_type_ids_follow_forges_type_order():
    assert list(TYPE_IDS) == [*TYPE_SUFFIX, *EXPERT_TYPES]
    assert list(TYPE_IDS) == [t for t in SUPPORTED_TYPES if t in TYPE_IDS]
    assert list(TYPE_IDS.values()) == list(range(len(TYPE_IDS)))
    assert all(constants()[f"T_{t}"] == i for t, i in TYPE_IDS.items())


def test_descriptor_fields_are_placed_by_the_contract():
    from forge_hip.arena import Placed

    p = Placed(ptr=1000, type="Q4_K", k=256, n=7, row_bytes=144)
    row = descriptor(p, x=2000, y=3000, bias=4000)
    assert len(row) == DESC_LEN == constants()["DESC_LEN"]
    c = constants()
    got = {f: row[c[f"DESC_{f}"]] for f in DESC}
    assert got == {"W": 1000, "X": 2000, "Y": 3000, "BIAS": 4000, "TYPE": TYPE_IDS["Q4_K"],
                   "K": 256, "N": 7, "ROW_BYTES": 144}  # fmt: skip
    assert sorted(DESC.values()) == list(range(DESC_LEN))


def test_sampling_fields_match_their_word_offsets():
    c = constants()
    assert len(SAMPLE_FIELDS) == c["F_WORDS"]
    offsets = {"F_TEMP": "s_temp", "F_TOPK": "s_topk", "F_TOPP": "s_topp0",
               "F_LMINP": "s_lminp0", "F_KEY": "s_key0", "F_CTR": "s_ctr"}  # fmt: skip
    for field, name in offsets.items():
        assert SAMPLE_FIELDS.index(name) == c[field], field


def test_the_sources_declare_exactly_the_kernels_the_plan_launches():
    declared = set(kernel_signatures())
    assert declared == plan_kernels(), (declared - plan_kernels(), plan_kernels() - declared)


def test_signatures_are_read_from_declarations():
    sig = dict(KERNELS)
    assert sig["mvq_multi_r8"] == ("mmv.hip", "piiiipiiipi")  # macro-made, ## pasted
    assert sig["mvq_glu_r1n"] == ("mmv.hip", "piiipiiipii" + "pppppf")  # object-like params
    assert sig["attn_decode_w128"][1] == "p" * 15 + "iiiiiffpffifiip"
    assert sig["embed_q4_k"] == ("embed.hip", "pppif")
    assert sig["sample_rows"] == ("sampling.hip", "pipipppp")
    assert sig["feed_ids"] == ("layer.hip", "pppi")


def test_declaration_parser_on_a_source_of_its_own():
    text = """
    #define PARAMS const float* __restrict__ a, int n
    #define MAKE(T, EXTRA) \\
        FORGE_KERNEL void __launch_bounds__(256, MIN(2)) k_##T(PARAMS, EXTRA) { }
    MAKE(one, float s)
    #if defined(X)
    MAKE(two, i64 m)
    #else
    MAKE(two, i64 m)
    #endif
    FORGE_KERNEL void plain(u32* p, unsigned u, long long q) { }
    """
    assert declarations(text) == {"k_one": "pif", "k_two": "piq", "plain": "puq"}
    with pytest.raises(ForgeRuntimeError, match="no signature letter"):
        declarations("FORGE_KERNEL void bad(double d) { }")
    with pytest.raises(ForgeRuntimeError, match="two signatures"):
        declarations("FORGE_KERNEL void k(int a) { }\nFORGE_KERNEL void k(float a) { }")


def test_contract_header_accepts_only_integer_expressions(tmp_path):
    (tmp_path / "contract.h").write_text("#define A 4\n#define B (A * 2 + 1)  // nine\n")
    assert constants(str(tmp_path)) == {"A": 4, "B": 9}
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "contract.h").write_text('#define A "text"\n')
    with pytest.raises(ForgeRuntimeError, match="A is not an integer expression"):
        constants(str(tmp_path / "x"))
