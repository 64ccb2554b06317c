"""Reference logits of llama.cpp with a quantized KV cache, for tests/cpu_simd/test_kv_golden.py.

Runs the golden models through llama-cpp-python 0.3.36 (built from source with AMX off: see
../shared/golden/README.md) with K and V cached as Q8_0 (llama.cpp needs flash attention for a
quantized V cache), CPU, 2 threads, n_ctx 512: for each of synthetic.json's prompts, its tokens,
the logits of every prompt position (5 decimals) and 16 greedy tokens.

  python scripts/make_kv_golden.py ../shared/golden tests/data/kv_q8_0.json

Needs llama_cpp importable (a separate virtual environment: it is not a forge dependency).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

MODELS = ["llama-q8_0.gguf", "qwen2-q4_k.gguf", "qwen3-q4_k_m.gguf", "gemma3-q4_k_m.gguf"]
GGML_TYPE_Q8_0 = 8
GREEDY = 16


def run(path: Path, prompts: list[str]) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, n_threads=2, n_batch=512, logits_all=True,
                flash_attn=True, type_k=GGML_TYPE_Q8_0, type_v=GGML_TYPE_Q8_0,
                verbose=False)  # fmt: skip
    cases = []
    for prompt in prompts:
        llm.reset()
        tokens = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        llm.eval(tokens)
        logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
        greedy = []
        for _ in range(GREEDY):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            if nxt == llm.token_eos():
                break
            greedy.append(nxt)
            llm.eval([nxt])
        cases.append({"prompt": prompt, "tokens": tokens, "greedy": greedy,
                      "logits": np.round(logits, 5).tolist()})  # fmt: skip
    return {"model": path.name, "n_vocab": llm.n_vocab(), "cases": cases}


def main() -> int:
    golden, out = Path(sys.argv[1]), Path(sys.argv[2])
    synthetic = json.loads((golden / "synthetic.json").read_text())
    prompts = [c["prompt"] for c in synthetic["models"][0]["cases"]]
    import llama_cpp

    data = {
        "generator": f"llama.cpp via llama-cpp-python {llama_cpp.__version__}, CPU, 2 threads, "
        "n_ctx 512, flash attention on, KV cache K q8_0 and V q8_0",
        "command": "python scripts/make_kv_golden.py ../shared/golden tests/data/kv_q8_0.json",
        "models": [run(golden / "models" / name, prompts) for name in MODELS],
    }
    out.write_text(json.dumps(data, separators=(",", ":")))
    print(f"wrote {out} ({out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
