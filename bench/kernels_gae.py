"""bench.kernels' gae section.

gae: memr1's default path (the C++ kernel on CPU, on torch's intra-op threads; Triton on CUDA) and its
torch reference against numba loops (`numba_loop`: a reverse loop over time per row, the headline
baseline; `numba_prange`: its rows under prange, the headline baseline when torch has several threads,
numba getting as many; `numba_time_major`: rows innermost), the loop over time vectorised over the batch
(verl's form), that loop with its body compiled (`batched_loop_compiled`), and on CPU
scipy.signal.lfilter over each sequence's masked-in steps (`scipy_lfilter`); errors against a scalar
float64 loop, every side's outputs checked against memr1's before timing. `stream_copy` is the
bandwidth floor: a copy of as many bytes as GAE must read and write at the least (torch's copy_, on
the same threads as memr1), timed in the same rounds; the headline gives its share of memr1's time. Sizes 64x256, 256x1024 (quick: these two)
and 1024x2048, rows of random length with a masked step inside each; glibc's malloc thresholds are
pinned for these rows (pin_malloc) so that no row pays page faults for the row before it.
"""
import torch

from memr1.bench import kernel_baselines as base
from memr1.bench.kernel_timing import measure, print_row
from memr1.kernels import gae
from memr1.kernels._dispatch import native_available, triton_available

GAE_SIZES = ((64, 256), (256, 1024), (1024, 2048))  # quick runs stop at 256x1024
GAE_TARGET_SIZES = ("256x1024", "1024x2048")  # the sizes the targets are set at


def pin_malloc() -> str:
    """Fix glibc's malloc thresholds for the GAE rows: by default they move with what was freed last,
    and a heap trimmed after one impl's free hands the next impl fresh pages, a page fault per 4 KB of
    output (several ms at 1024x2048), so a row's time would depend on the row before it. Pinned, every
    impl reuses freed memory, as a trainer's long-running process does once its allocator has settled."""
    import ctypes
    try:
        libc = ctypes.CDLL("libc.so.6")
        ok = libc.mallopt(-3, 32 << 20) and libc.mallopt(-1, 1 << 30)  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD
    except (OSError, AttributeError):
        ok = False
    return "glibc mallopt: mmap threshold 32 MiB, trim threshold 1 GiB" if ok else "allocator defaults"


def bench_gae(device, quick, rows, sizes=None):
    """memr1's GAE against numba loops (per row, the headline baseline; rows under prange when torch has
    several threads; time-major), verl's batched loop eager and with its body compiled, scipy's filter;
    and a copy of the bytes GAE must move at the least (`stream_copy`: the bandwidth floor)."""
    threads = torch.get_num_threads()
    malloc = pin_malloc() if device == "cpu" else None
    if device == "cpu" and threads > 1:
        import numba
        numba.set_num_threads(threads)
    for n, T in sizes or (GAE_SIZES[:2] if quick else GAE_SIZES):
        g = torch.Generator().manual_seed(T)
        r = torch.randn(n, T, generator=g, dtype=torch.float64).float()
        v = torch.randn(n, T + 1, generator=g, dtype=torch.float64).float()
        m = torch.arange(T)[None, :] < torch.randint(1, T + 1, (n,), generator=g)[:, None]
        m[:, T // 3] = False  # a masked gap inside every response (tool output)
        truth = torch.tensor(base.gae_truth(r.double().tolist(), v.double().tolist(), m.tolist(), 0.99, 0.95),
                             dtype=torch.float64)
        rd, vd, md = r.to(device), v.to(device), m.to(device)
        impls = {"memr1_torch": lambda: gae(rd, vd, md, 0.99, 0.95, impl="torch"),
                 "batched_loop": lambda: base.gae_batched(rd, vd, md, 0.99, 0.95),
                 "batched_loop_compiled": lambda: base.gae_batched_compiled(rd, vd, md, 0.99, 0.95)}
        floor = {}
        if device == "cpu":  # scipy and numba take numpy arrays
            impls["scipy_lfilter"] = lambda: base.gae_lfilter(rd, vd, md, 0.99, 0.95)
            impls["numba_loop"] = lambda: base.gae_numba(rd, vd, md, 0.99, 0.95)
            impls["numba_time_major"] = lambda: base.gae_numba(rd, vd, md, 0.99, 0.95, "time_major")
            if threads > 1:
                impls["numba_prange"] = lambda: base.gae_numba(rd, vd, md, 0.99, 0.95, "row_parallel")
            # The floor: read half the bytes, write the other half, on as many threads as memr1 gets
            # (torch's copy_ splits a large copy over its intra-op threads).
            floor["bytes"] = base.gae_bytes(n, T)
            src = torch.ones(floor["bytes"] // 2, dtype=torch.uint8)
            dst = torch.empty_like(src)
            impls["stream_copy"] = lambda: (dst.copy_(src), None)
        if device == "cuda" and triton_available():
            impls["memr1_triton"] = lambda: gae(rd, vd, md, 0.99, 0.95, impl="triton")
        if device == "cpu" and native_available():
            impls["memr1_native"] = lambda: gae(rd, vd, md, 0.99, 0.95, impl="native")
        # Every side is checked before any is timed: the same outputs, to float32 rounding.
        ours = gae(rd, vd, md, 0.99, 0.95)
        for name, fn in impls.items():
            if name != "stream_copy":
                adv, ret = fn()
                for got, want in ((adv, ours[0]), (ret, ours[1])):
                    if not torch.allclose(got.double().cpu(), want.double().cpu(), rtol=1e-4, atol=1e-4):
                        raise AssertionError(f"gae {n}x{T}: {name}'s outputs differ from memr1's")
        outs, ms, _ = measure(impls, device, 10)
        for impl in impls:
            row = {"kernel": "gae", "impl": impl, "size": f"{n}x{T}", "device": device, "ms": ms[impl]}
            if impl == "stream_copy":
                row.update(max_abs_err=None, bytes=floor["bytes"], gbps=round(floor["bytes"] / ms[impl] / 1e6, 2))
            else:
                row["max_abs_err"] = max((outs[impl][0].double().cpu() - truth).abs().max().item(),
                                         (outs[impl][1].double().cpu() - torch.where(m, truth + v[:, :T].double(), 0.0))
                                         .abs().max().item())
            if malloc:
                row["malloc"] = malloc
            rows.append(row)
            print_row(row)
