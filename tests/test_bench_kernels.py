"""bench.kernels: its baselines compute what they claim (against float64 references), the float64
references against autograd, and a --quick run's JSON."""
import json

import pytest
import torch

from memr1.bench import kernel_baselines as base
from memr1.bench import logprobs_worker
from memr1.bench.kernels import add_ratios, headline, main


def test_verl_vectorised_matches_the_float64_reference_and_verls_singleton_rule():
    g = torch.Generator().manual_seed(0)
    gid = torch.randperm(4096, generator=g) // 8
    r = torch.rand(4096, generator=g)
    truth = base.grpo_truth64(r, gid, 8)
    assert (base.verl_vectorised(r, gid, 512).double() - truth).abs().max() < 1e-4
    assert (base.verl_loop(r[:64], gid[:64].tolist()).double() - base.verl_vectorised(r[:64], gid[:64], 512)).abs().max() < 1e-4
    # verl: a group of one keeps its reward (mean 0, std 1)
    one = base.verl_vectorised(torch.tensor([0.25, 1.0, 3.0]), torch.tensor([0, 1, 1]), 2)
    assert one[0].item() == pytest.approx(0.25, rel=1e-5)


def test_gae_batched_matches_the_scalar_loop_with_masked_gaps():
    g = torch.Generator().manual_seed(1)
    n, T = 6, 40
    r, v = torch.randn(n, T, generator=g, dtype=torch.float64), torch.randn(n, T + 1, generator=g, dtype=torch.float64)
    m = torch.rand(n, T, generator=g) < 0.7
    truth = torch.tensor(base.gae_truth(r.tolist(), v.tolist(), m.tolist(), 0.9, 0.8), dtype=torch.float64)
    m[2] = False  # a row with nothing to score
    truth = torch.tensor(base.gae_truth(r.tolist(), v.tolist(), m.tolist(), 0.9, 0.8), dtype=torch.float64)
    numba = [lambda *a, k=k: base.gae_numba(*a, kernel=k) for k in ("row", "row_parallel", "time_major")]
    for fn in (base.gae_batched, base.gae_batched_compiled, base.gae_lfilter, *numba):
        adv, ret = fn(r, v, m, 0.9, 0.8)
        assert adv.dtype == torch.float64 and adv.shape == (n, T)
        assert (adv - truth).abs().max() < 1e-12, fn
        assert (ret - torch.where(m, truth + v[:, :T], 0.0)).abs().max() < 1e-12, fn


def test_numba_loops_round_once_to_float32_as_memr1_does():
    """On float32 inputs the numba loops carry the advantage in float64 and round each output once,
    as memr1's kernel does: the same outputs to float32 rounding, the same dtype."""
    g = torch.Generator().manual_seed(2)
    n, T = 5, 70
    r, v = torch.randn(n, T, generator=g), torch.randn(n, T + 1, generator=g)
    m = torch.rand(n, T, generator=g) < 0.8
    truth = torch.tensor(base.gae_truth(r.double().tolist(), v.double().tolist(), m.tolist(), 0.99, 0.95),
                         dtype=torch.float64)
    for kernel in ("row", "row_parallel", "time_major"):
        adv, ret = base.gae_numba(r, v, m, 0.99, 0.95, kernel=kernel)
        assert adv.dtype == ret.dtype == torch.float32
        assert ((adv.double() - truth).abs() <= truth.abs() * 2.0 ** -24 + 1e-12).all(), kernel


def test_gae_bytes_counts_each_input_and_output_once():
    # rewards 4 + mask 1 + advantages 4 + returns 4 per step, values 4 per step and bootstrap column
    assert base.gae_bytes(2, 3) == 2 * 3 * 13 + 2 * 4 * 4


def test_logprob_paths_and_float64_reference_agree_with_autograd():
    hidden, weight, targets = base.logprob_inputs(12, 8, 50)
    h, w = hidden.double().requires_grad_(), weight.double().requires_grad_()
    lp = torch.log_softmax(h @ w.T, -1).gather(1, targets[:, None])[:, 0]
    lp.sum().backward()
    lp64, gh, gw = base.logprobs_truth64(hidden, weight, targets, chunk=5)
    assert (lp64 - lp.detach()).abs().max() < 1e-12
    assert (gh - h.grad).abs().max() < 1e-12 and (gw - w.grad).abs().max() < 1e-12
    assert (base.logprobs_naive(hidden, weight, targets).double() - lp64).abs().max() < 1e-5
    fn = base.trl_selective_log_softmax()
    if fn is not None:
        assert (base.logprobs_trl(hidden, weight, targets, 3, fn).double() - lp64).abs().max() < 1e-5
    chunked = base.trl_chunked_logprob()
    if chunked is not None:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = chunked(h, w, targets)
        out.sum().backward()
        assert (out.double() - lp64).abs().max() < 1e-5
        assert (h.grad.double() - gh).abs().max() < 1e-5 and (w.grad.double() - gw).abs().max() < 1e-5


@pytest.mark.parametrize("impl", ["naive", "trl_selective_log_softmax", "trl_chunked", "memr1_torch"])
def test_logprobs_worker_saves_what_the_parent_checks(tmp_path, impl):
    out = tmp_path / "res.pt"
    assert logprobs_worker.main([impl, "--shape", "2,6,8,40", "--out", str(out)]) == 0
    res = torch.load(out)
    if impl.startswith("trl_") and base.trl_selective_log_softmax() is None:
        assert res == {"skipped": "trl is not installed"}
        return
    lp64, gh, gw = base.logprobs_truth64(*base.logprob_inputs(12, 8, 40))
    assert (res["lp"].double() - lp64).abs().max() < 1e-5
    assert (res["gh"].double() - gh).abs().max() < 1e-5 and (res["gw"].double() - gw).abs().max() < 1e-5
    assert res["ms"] > 0 and res["peak_mb"] >= 0


def test_headline_is_verl_over_memr1_per_mode():
    rows = [{"kernel": "grpo_advantage", "size": 8, "case": "typical", "device": "cpu", "impl": k, "ms": ms}
            for k, ms in (("memr1_torch", 2.0), ("memr1_torch_compiled", 1.0), ("verl_vectorised", 4.0),
                          ("verl_vectorised_compiled", 3.0))]
    eager, compiled = headline(rows)
    assert (eager["value"], eager["ours"], eager["baseline"], eager["target"]) == (
        2.0, "memr1_torch 8", "verl_vectorised 8", None)
    assert (compiled["value"], compiled["ours"], compiled["target"], compiled["met"]) == (
        3.0, "memr1_torch_compiled 8", 1.0, True)
    assert compiled["mixed"] == {"best_vs_best": 3.0, "eager_vs_memr1_best": 4.0, "compiled_vs_memr1_best": 3.0,
                                 "torch_reference_eager": 2.0, "torch_reference_compiled": 3.0}
    # With the C++ path measured, the headline is taken against it: it is what `auto` runs on CPU.
    rows += [{"kernel": "grpo_advantage", "size": 8, "case": "typical", "device": "cpu", "impl": k, "ms": ms}
             for k, ms in (("memr1_native", 0.5), ("memr1_native_compiled", 0.6))]
    eager, compiled = headline(rows)
    assert (eager["value"], compiled["value"], compiled["mixed"]["best_vs_best"]) == (8.0, 5.0, 6.0)
    x = compiled["mixed"]
    assert (x["eager_vs_memr1_best"], x["compiled_vs_memr1_best"]) == (8.0, 6.0)
    assert (x["torch_reference_eager"], x["torch_reference_compiled"]) == (2.0, 3.0)
    add_ratios(rows)
    assert {r["impl"]: r["ms_vs_memr1"] for r in rows} == {
        "memr1_torch": 4.0, "memr1_torch_compiled": 1.67, "verl_vectorised": 8.0,
        "verl_vectorised_compiled": 5.0, "memr1_native": 1.0, "memr1_native_compiled": 1.0}


def test_quick_gae_run_writes_rows_and_provenance(tmp_path):
    out = tmp_path / "kernels.json"
    assert main(["--quick", "--only", "gae", "--threads", "1", "--gae-sizes", "16x40,24x67",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for size in ("16x40", "24x67"):
        impls = {r["impl"]: r for r in data["rows"] if r["size"] == size}
        assert set(impls) == {"memr1_torch", "batched_loop", "batched_loop_compiled", "scipy_lfilter", "memr1_native",
                              "numba_loop", "numba_time_major", "stream_copy"}
        floor = impls.pop("stream_copy")
        assert floor["bytes"] == base.gae_bytes(*map(int, size.split("x"))) and floor["ms"] > 0
        assert floor["gbps"] == round(floor["bytes"] / floor["ms"] / 1e6, 2)
        assert all(r["max_abs_err"] < 1e-4 and r["ms"] > 0 for r in impls.values())
        assert impls["memr1_native"]["ms_vs_memr1"] == 1.0  # the C++ path is the row the others are over
        head = {h["name"]: h for h in data["headline"]}
        h = head[f"gae {size}: over the numba loop"]
        assert h["value"] == impls["numba_loop"]["ms"] / impls["memr1_native"]["ms"]
        assert h["baseline"] == f"numba_loop {size}" and h["target"] is None  # targets only at the sizes
        assert h["floor_share"] == floor["ms"] / impls["memr1_native"]["ms"] == head[
            f"gae {size}: share of the bandwidth floor"]["value"]
        assert head[f"gae {size}: over scipy lfilter"]["baseline"] == f"scipy_lfilter {size}"
    assert data["machine"]["commit"] and data["machine"]["argv"] and data["machine"]["torch"]
    assert data["settings"]["min_calls"] >= 5 and data["settings"]["gae_sizes"] == ["16x40", "24x67"]


def test_gae_rows_are_checked_to_agree_before_timing(monkeypatch):
    """A side whose outputs differ from memr1's stops the run before anything is timed."""
    def off_by_a_bit(r, v, m, gamma, lam, kernel="row"):
        adv, ret = base.gae_batched(r, v, m, gamma, lam)
        return adv, ret + 1e-3 * (kernel == "time_major")
    monkeypatch.setattr(base, "gae_numba", off_by_a_bit)
    with pytest.raises(AssertionError, match="numba_time_major's outputs differ"):
        main(["--only", "gae", "--threads", "1", "--gae-sizes", "8x16"])


def test_gae_headline_is_numba_over_memr1_with_the_floor_share():
    def rows(size, threads_row=None):
        got = [{"kernel": "gae", "size": size, "device": "cpu", "impl": k, "ms": ms}
               for k, ms in (("memr1_native", 2.0), ("numba_loop", 4.0), ("numba_time_major", 8.0),
                             ("scipy_lfilter", 20.0), ("batched_loop_compiled", 30.0))]
        got.append({"kernel": "gae", "size": size, "device": "cpu", "impl": "stream_copy", "ms": 1.5, "bytes": 100})
        if threads_row:
            got.append({"kernel": "gae", "size": size, "device": "cpu", "impl": "numba_prange", "ms": threads_row})
        return got
    head = {h["name"]: h for h in headline(rows("256x1024") + rows("64x256"))}
    h = head["gae 256x1024: over the numba loop"]
    assert (h["value"], h["target"], h["met"], h["floor_share"], h["floor_ms"]) == (2.0, 1.5, True, 0.75, 1.5)
    share = head["gae 256x1024: share of the bandwidth floor"]
    assert (share["value"], share["unit"], share["target"], share["met"]) == (0.75, "share", 0.5, True)
    assert head["gae 64x256: over the numba loop"]["target"] is None
    assert head["gae 256x1024: over the time-major numba loop"]["value"] == 4.0
    assert not any("compiled loop" in name for name in head)  # a row, no longer a headline
    # With several threads, numba's prange loop (as many threads as memr1) is the baseline.
    h = {h["name"]: h for h in headline(rows("1024x2048", threads_row=2.5))}["gae 1024x2048: over the numba loop"]
    assert (h["value"], h["baseline"], h["met"]) == (1.25, "numba_prange 1024x2048", False)


def test_logprob_headline_is_trl_chunked_over_memr1_in_time_and_memory():
    rows = [{"kernel": "logprobs", "size": "B1", "device": "cpu", "impl": k, "ms": ms, "peak_mb": mb}
            for k, ms, mb in (("memr1_torch", 2.0, 100.0), ("trl_chunked", 3.0, 50.0), ("naive", 9.0, 900.0))]
    rows.append({"kernel": "logprobs", "size": "B1", "device": "cpu", "impl": "trl_selective_log_softmax", "ms": None})
    time_, mem = headline(rows)
    assert (time_["value"], time_["met"], mem["value"], mem["met"]) == (1.5, True, 0.5, False)
    assert headline(rows[:1]) == []  # TRL not installed: no entry, rather than a ratio over nothing


@pytest.mark.slow
def test_logprob_rows_are_medians_over_alternated_rounds(tmp_path):
    out = tmp_path / "k.json"
    assert main(["--only", "logprobs", "--logprob-shape", "2,6,8,40", "--logprob-rounds", "2", "--json", str(out)]) == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"naive", "trl_selective_log_softmax", "trl_chunked", "memr1_torch"}
    for r in rows.values():
        if r["ms"] is not None:
            assert r["rounds"] == 2 and len(r["ms_runs"]) == 2
            assert min(r["ms_runs"]) - 0.01 <= r["ms"] <= max(r["ms_runs"]) + 0.01  # their median
            assert r["max_abs_err"] < 1e-5 and r["size"] == "B2xT6xV40xH8"
