"""Block timeline of one replayed decode step on the hip backend (NVIDIA sm_90+ only): for every
launch, when its blocks left the grid wait, when the mvq products had x ready, and when the
blocks ended, from a copy of kernels/ whose FORGE_GRID_WAIT() records each block's thread 0
(%globaltimer, 256 ns steps on the H100/H200 here; %smid).

  python benchmarks/block_timeline.py [--model llama8b] [--pos 128] [--work /tmp/twins] [--out DIR]

Prints, per kernel and grid, the mean over the step's launches (us): the gap from the previous
launch's last block to this one's first wait exit, wait exit to x ready (mvq products), x ready
to the median block's end, median to last end, and the launch's span; --out writes the raw
records (timeline.npz). The recording lengthens every kernel's end: a change that removes
launches looks better here than it is (session 19: a 5% gain in the traced step was a 0.8% loss
without the recording). Use it for phases inside kernels; time changes with the plain step.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins" / "hip"), str(ROOT / "benchmarks")]

CAP = 131072  # records per module
RECORD = np.dtype([("t0", "u8"), ("t1", "u8"), ("tx", "u8"), ("t2", "u8"), ("smid", "u4"),
                   ("block", "u4"), ("grid", "u4"), ("tag", "u4"), ("name", "S16")])  # fmt: skip

TRACE = r"""#if defined(FORGE_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
struct ForgeTraceRec {
    unsigned long long t0, t1, tx, t2;
    unsigned int smid, block, grid, tag;
    char name[16];
};
__device__ unsigned int forge_trace_n;
__device__ ForgeTraceRec forge_trace_buf[CAP];
__device__ __forceinline__ unsigned long long ft_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
struct ForgeTrace {  // thread 0's record; the end is stamped when the kernel's scope closes
    int slot = -1;
    __device__ void mark(unsigned tag) {
        if (slot >= 0) forge_trace_buf[slot].tx = ft_now(), forge_trace_buf[slot].tag = tag;
    }
    __device__ ~ForgeTrace() {
        if (slot >= 0) forge_trace_buf[slot].t2 = ft_now();
    }
};
#define FORGE_GRID_WAIT()                                                            \
    ForgeTrace forge_tr_;                                                            \
    {                                                                                \
        const bool lead_ = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0; \
        const unsigned s_ = lead_ ? atomicAdd(&forge_trace_n, 1u) : 0u;              \
        const unsigned long long t0_ = ft_now();                                     \
        if (lead_ && s_ < CAP) {                                                     \
            int i_ = 0;                                                              \
            for (; i_ < 15 && __func__[i_]; ++i_) forge_trace_buf[s_].name[i_] = __func__[i_]; \
            forge_trace_buf[s_].name[i_] = 0;                                        \
        }                                                                            \
        asm volatile("griddepcontrol.wait;" ::: "memory");                           \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");              \
        if (lead_ && s_ < CAP) {                                                     \
            ForgeTraceRec& r_ = forge_trace_buf[s_];                                 \
            unsigned sm_;                                                            \
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm_));                         \
            r_.t0 = t0_, r_.t1 = ft_now(), r_.tx = 0, r_.tag = 0, r_.smid = sm_;     \
            r_.block = blockIdx.x + blockIdx.y * gridDim.x;                          \
            r_.grid = gridDim.x * gridDim.y;                                         \
            forge_tr_.slot = (int)s_;                                                \
        }                                                                            \
    }
#define FORGE_TRACE_MARK(tag) forge_tr_.mark(tag)
#else""".replace("CAP", str(CAP))
X_READY = "    const int lane = threadIdx.x % G, grp = threadIdx.x / G;\n"  # mvq_body, x quantized


def traced_kernels(src: Path, dst: Path) -> None:
    """kernels/ copied into dst with the recording FORGE_GRID_WAIT() (and x-ready marks)."""
    header = (src / "forge_hip.h").read_text()
    wait = "#if defined(FORGE_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900\n"
    at = header.find(wait + "#define FORGE_GRID_WAIT()")
    mmv = (src / "mmv.hip").read_text()
    if at < 0 or mmv.count(X_READY) != 1:
        raise SystemExit("kernels/ changed: update block_timeline.py's anchors")
    end = header.index("#else", at)
    close = header.index("#endif", end) + len("#endif")
    rest = "\n#ifndef FORGE_TRACE_MARK\n#define FORGE_TRACE_MARK(tag) (void)0\n#endif"
    header = header[:at] + TRACE + header[end + len("#else") : close] + rest + header[close:]
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_text(f.read_text())
    (dst / "forge_hip.h").write_text(header)
    mark = "    FORGE_TRACE_MARK((unsigned)first | ((unsigned)items << 12));\n"
    (dst / "mmv.hip").write_text(mmv.replace(X_READY, mark + X_READY))


def read_records(runner) -> np.ndarray:
    """Every module's records, after zeroing the counters and replaying `runner`'s graph once."""
    drv = runner.rt._drv
    found = []
    for module in runner.plan.lib._modules.values():
        err, n_ptr, _ = drv.cuModuleGetGlobal(module, b"forge_trace_n")
        err2, buf, _ = drv.cuModuleGetGlobal(module, b"forge_trace_buf")
        if int(err) == 0 and int(err2) == 0:
            found.append((n_ptr, buf))
    runner.rt.synchronize(runner.stream)  # the warm-up replays count too until they are done
    for n_ptr, _ in found:
        drv.cuMemsetD8(n_ptr, 0, 4)
    runner.rt.synchronize()
    runner.rt.replay(runner.graphs.graphs["timeline"], runner.stream)
    runner.rt.synchronize(runner.stream)
    parts = []
    for n_ptr, buf in found:
        n = np.zeros(1, np.uint32)
        drv.cuMemcpyDtoH(n.ctypes.data, n_ptr, 4)
        part = np.zeros(min(int(n[0]), CAP), RECORD)
        if len(part):
            drv.cuMemcpyDtoH(part.ctypes.data, buf, part.nbytes)
        parts.append(part)
    recs = np.concatenate(parts)
    return recs[np.argsort(recs["t1"], kind="stable")]


def phases(recs: np.ndarray) -> dict:
    """Mean phases (us) per (kernel, grid): launches are runs of records of one kernel and grid
    in wait-exit order (a launch's blocks leave the wait only after the previous one ended)."""
    runs, start = [], 0
    for i in range(1, len(recs) + 1):
        key = lambda j: (recs[j]["name"], recs[j]["grid"])  # noqa: E731
        if i == len(recs) or key(i) != key(start):
            runs.append(recs[start:i])
            start = i
    out, prev_end = defaultdict(list), None
    for r in runs:
        t1, t2 = r["t1"].astype(np.int64), r["t2"].astype(np.int64)
        tx = np.where(r["tx"] > 0, r["tx"], r["t1"]).astype(np.int64)
        gap = 0 if prev_end is None else t1.min() - prev_end
        mid = np.median(t2)
        out[f"{r['name'][0].decode(errors='replace')} x{int(r['grid'][0])}"].append(
            (
                gap,
                np.median(tx) - t1.min(),
                mid - np.median(tx),
                t2.max() - mid,
                t2.max() - t1.min(),
            )
        )
        prev_end = t2.max()
    return {k: np.array(v) / 1e3 for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama8b", choices=["default", "llama8b"])
    ap.add_argument("--pos", type=int, default=128)
    ap.add_argument("--work", default="/tmp/twins")
    ap.add_argument("--out")
    args = ap.parse_args()
    from forge_hip.sources import kernel_dir

    tmp = tempfile.TemporaryDirectory(prefix="forge-timeline-")
    traced_kernels(kernel_dir(), Path(tmp.name))
    os.environ["FORGE_KERNEL_DIR"] = tmp.name
    from gpu_bench import model_path, whole_cache

    import forge
    from forge.backend import SeqBatch

    path, label = model_path(args.model, Path(args.work))
    model = forge.load(path, backend="hip", n_ctx=1024)
    whole_cache(model)
    runner = model.runner
    table = np.arange(1024 // 16, dtype=np.int32)
    rows, _, n_bt = runner._prepare([SeqBatch(np.array([7], np.int32), args.pos, table)])
    runner.meta.upload(n_bt, runner.stream)
    runner.graphs.run("timeline", lambda: runner._decode_step(rows))
    for _ in range(10):
        runner.rt.replay(runner.graphs.graphs["timeline"], runner.stream)
    recs = read_records(runner)
    runner.close()
    print(f"{label}, one decode step at position {args.pos}: {len(recs)} blocks (us, means)")
    print(f"{'kernel x grid':28s} {'n':>4s} {'gap':>6s} {'wait->x':>8s} {'x->med':>8s} "
          f"{'med->last':>9s} {'span':>7s}")  # fmt: skip
    for key, v in phases(recs).items():
        gap, ready, body, tail, span = v.mean(axis=0)
        print(f"{key:28s} {len(v):4d} {gap:6.2f} {ready:8.2f} {body:8.2f} {tail:9.2f} {span:7.2f}")
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.savez_compressed(Path(args.out) / "timeline.npz", records=recs)


if __name__ == "__main__":
    main()
