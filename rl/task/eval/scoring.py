"""Eval report pieces: per-category aggregation (Mem0's category names), latency percentiles, scoring
the manager against the synthetic oracle, and the paper's table.

Oracle scoring (synthetic data only), defined here once:
- Op accuracy works per manager call (a "group" of turns). O is the multiset of the oracle's net
  ADD / UPDATE / DELETE ops for the call (`synthetic.call_ops`: a fact added and updated within one
  call is one ADD, a restated memory needs no op), or {NONE} when the call should change nothing. P
  is the multiset of the manager's ADD / UPDATE / DELETE ops, or {NONE} when it changed nothing.
  A group whose turns gave no facts made no call and counts as P = {NONE}. The score is
  sum |O & P| / sum |O | P| over groups (multiset intersection / union), so 1.0 means every call
  did exactly the oracle's changes (the warm start's target for each call), and extra or missing ops
  both cost.
- Fact recall / precision compare the bank's final memories with the oracle's `final_facts`. A memory
  matches a fact when their token-set F1 (Mem0's F1 tokens, minus a few function words) is at least
  `EvalConfig.fact_match_f1`; pairs are matched one-to-one, best F1 first. Recall = matched facts /
  facts, precision = matched memories / memories.
  Op accuracy is also reported per kind of call, and with ids (`OP_ACCURACY_VARIANTS`):
  - seen / unseen: whether the reward can see the call's ops. A call is seen when one of its turns
    touches a fact slot that some question asks about and that question's answer is final by the
    call's end (the call decides it, or restates or can overwrite a memory it reads); unseen calls set
    values that a later turn changes again, which no question of the data checks.
  - ids: an UPDATE or DELETE counts only if it hit the memory the oracle changes (the text of the
    memory it touched matches the oracle op's old memory at `fact_match_f1`), so an UPDATE of the
    wrong memory is wrong; ADDs and NONE match by event as before.
"""
from collections import Counter

import numpy as np

from memr1.rl.task.data.locomo import CATEGORY_NAMES
from memr1.rl.task.data.synthetic import call_ops
from memr1.rl.task.rewards import simple_tokens

TABLE_ORDER = ("single-hop", "multi-hop", "open-domain", "temporal")   # the paper's column order
_FUNCTION_WORDS = {"a", "an", "the", "and", "of", "to", "in", "on", "has", "have", "is", "are", "was",
                   "his", "her", "their", "s", "'s", "at", "as", "with", "for"}


def percentiles(values: list[float]) -> dict:
    """p50 / p95 and every sample (to the microsecond), which `memr1 report` draws as a distribution."""
    if not values:
        return {"p50_s": None, "p95_s": None, "n": 0, "samples_s": []}
    a = np.asarray(values, dtype=np.float64)
    return {"p50_s": float(np.percentile(a, 50)), "p95_s": float(np.percentile(a, 95)), "n": len(values),
            "samples_s": [round(float(v), 6) for v in a]}


def aggregate(records: list[dict], judged: bool) -> dict:
    """records: {"category", "f1", "bleu1", "em", "judge"} per answered question -> per-category and
    overall means in percent, with counts. J is None when the judge is off; FAILED verdicts are
    counted in j_failed and left out of J's denominator."""
    out = {}
    groups = {name: [r for r in records if CATEGORY_NAMES[r["category"]] == name] for name in TABLE_ORDER}
    groups["overall"] = records
    for name, rows in groups.items():
        n = len(rows)
        row = {"n": n}
        for key in ("f1", "bleu1", "em"):
            row[key] = 100.0 * sum(r[key] for r in rows) / n if n else None
        if judged:
            verdicts = [r["judge"] for r in rows if r["judge"] in ("CORRECT", "WRONG")]
            row["j"] = 100.0 * verdicts.count("CORRECT") / len(verdicts) if verdicts else None
            row["j_failed"] = sum(r["judge"] == "FAILED" for r in rows)
        else:
            row["j"], row["j_failed"] = None, 0
        out[name] = row
    return out


def format_table(metrics: dict, title: str) -> str:
    cols = list(TABLE_ORDER) + ["overall"]
    head = f"{'':>8}" + "".join(f"{c:>22}" for c in cols)
    sub = f"{'':>8}" + "".join(f"{'F1':>7}{'B1':>6}{'J':>6}{'n':>3}" for _ in cols)

    def num(x):
        return f"{x:.1f}" if x is not None else "-"

    row = f"{'':>8}" + "".join(f"{num(metrics[c]['f1']):>7}{num(metrics[c]['bleu1']):>6}"
                               f"{num(metrics[c]['j']):>6}{metrics[c]['n']:>3}" for c in cols)
    return "\n".join([title, head, sub, row])


# ---- oracle ----
def _tokens(text: str) -> set[str]:
    return {t for t in simple_tokens(text) if t not in _FUNCTION_WORDS}


def _token_f1(a: set, b: set) -> float:
    common = len(a & b)
    if not common:
        return 0.0
    p, r = common / len(a), common / len(b)
    return 2 * p * r / (p + r)


def match_facts(memories: list[str], facts: list[str], threshold: float) -> int:
    """One-to-one matches between memories and facts with token F1 >= threshold, best pairs first."""
    mt, ft = [_tokens(m) for m in memories], [_tokens(f) for f in facts]
    pairs = sorted(((_token_f1(m, f), i, j) for i, m in enumerate(mt) for j, f in enumerate(ft)), reverse=True)
    used_m, used_f, n = set(), set(), 0
    for score, i, j in pairs:
        if score < threshold:
            break
        if i not in used_m and j not in used_f:
            used_m.add(i)
            used_f.add(j)
            n += 1
    return n


def seen_by_reward(conv, timeline: list[dict]):
    """dia_ids -> whether the reward can see a call over those turns (module doc)."""
    order = {t.dia_id: i for i, t in enumerate(conv.turns())}
    slot_of = {e["dia_id"]: e["slot"] for e in timeline}
    final_at: dict[str, int] = {}   # slot -> the earliest turn by which a question on it is final
    for qa in conv.qa:
        turns = [d for d in qa.evidence if d in slot_of and d in order]
        if turns:
            last = max(order[d] for d in turns)
            for d in turns:
                final_at[slot_of[d]] = min(final_at.get(slot_of[d], last), last)
    return lambda dia_ids: any(slot_of[d] in final_at and final_at[slot_of[d]] <= max(order[x] for x in dia_ids)
                               for d in dia_ids if d in slot_of)


def id_matches(net: list[dict], events: list[str], touched: list[list[str]], threshold: float) -> tuple[int, int]:
    """(intersection, union) of the oracle's net ops and the manager's, where an UPDATE or DELETE must
    also have hit the oracle op's memory (module doc)."""
    o_adds = sum(op["event"] == "ADD" for op in net)
    o_changes = [(op["event"], _tokens(op["old_memory"])) for op in net if op["event"] in ("UPDATE", "DELETE")]
    p_adds = events.count("ADD")
    if not (o_adds or o_changes) and not (p_adds or touched):
        return 1, 1    # both change nothing
    inter, free = min(o_adds, p_adds), list(o_changes)
    for event, text in touched:
        hit = next((i for i, (e, old) in enumerate(free) if e == event and _token_f1(_tokens(text), old) >= threshold),
                   None)
        if hit is not None:
            free.pop(hit)
            inter += 1
    size_o = (o_adds + len(o_changes)) or 1
    size_p = (p_adds + len(touched)) or 1
    return inter, size_o + size_p - inter


def oracle_scores(conv, steps: list[dict], memories: list[str],
                  threshold: float, turns_limit: set[str] | None = None) -> dict:
    """Op accuracy and fact recall / precision of one conversation (see the module doc)."""
    timeline = [e for e in conv.oracle["timeline"] if turns_limit is None or e["dia_id"] in turns_limit]
    oracle_by_turn = {e["dia_id"]: e["event"] for e in timeline}
    seen = seen_by_reward(conv, timeline)
    done = [g for s in steps for g in s.get("groups", [])]
    called = {d for g in done for d in g["dia_ids"]}
    calls = []   # one record per manager call (and per oracle turn that never reached one): paired units
    for g in done:
        net = call_ops(timeline, g["dia_ids"])
        o = Counter(op["event"] for op in net if op["event"] != "NONE") or Counter(["NONE"])
        p = Counter(e for e in g["events"] if e != "NONE") or Counter(["NONE"])
        rec = {"sample_id": conv.sample_id, "dia_ids": list(g["dia_ids"]), "inter": sum((o & p).values()),
               "union": sum((o | p).values()), "seen": seen(g["dia_ids"])}
        if "touched" in g:
            rec["inter_ids"], rec["union_ids"] = id_matches(net, g["events"], g["touched"], threshold)
        calls.append(rec)
    for d, event in oracle_by_turn.items():   # oracle turns that never reached the manager
        if d not in called:
            calls.append({"sample_id": conv.sample_id, "dia_ids": [d], "inter": int(event == "NONE"), "union": 1,
                          "inter_ids": int(event == "NONE"), "union_ids": 1, "seen": seen([d])})
    final = list(conv.oracle["final_facts"].values()) if turns_limit is None else _facts_after(timeline)
    matched = match_facts(memories, final, threshold)
    return {"op_inter": sum(c["inter"] for c in calls), "op_union": sum(c["union"] for c in calls),
            "facts": len(final), "memories": len(memories), "matched": matched, "calls": calls}


def _facts_after(timeline: list[dict]) -> list[str]:
    """Final facts when only a prefix of the turns was used (eval.max_turns)."""
    state = {}
    for e in timeline:
        if e["event"] in ("ADD", "UPDATE"):
            state[e["slot"]] = e["memory"]
        elif e["event"] == "DELETE":
            state.pop(e["slot"], None)
    return list(state.values())


# name, intersection key, union key, which calls: the op accuracies every report and comparison gives
OP_ACCURACY_VARIANTS = (
    ("op_accuracy", "inter", "union", lambda c: True),
    ("op_accuracy_seen", "inter", "union", lambda c: c.get("seen") is True),
    ("op_accuracy_unseen", "inter", "union", lambda c: c.get("seen") is False),
    ("op_accuracy_ids", "inter_ids", "union_ids", lambda c: True),
)


def op_accuracies(calls: list[dict]) -> dict:
    """Each variant's sum |O&P| / sum |O|P| over the calls it covers (None when it covers none)."""
    out = {}
    for name, inter, union, keep in OP_ACCURACY_VARIANTS:
        chosen = [c for c in calls if inter in c and keep(c)]
        den = sum(c[union] for c in chosen)
        out[name] = sum(c[inter] for c in chosen) / den if den else None
    return out


def summarize_oracle(parts: list[dict]) -> dict | None:
    if not parts:
        return None
    facts, mems, matched = (sum(p[k] for p in parts) for k in ("facts", "memories", "matched"))
    calls = [c for p in parts for c in p["calls"]]
    return {**op_accuracies(calls),
            "fact_recall": matched / facts if facts else None,
            "fact_precision": matched / mems if mems else None,
            "n_conversations": len(parts), "n_final_facts": facts, "n_memories": mems, "n_matched": matched,
            "n_calls_seen": sum(c.get("seen") is True for c in calls), "calls": calls,
            "definition": "op accuracy: multiset |O&P|/|O|P| per manager call (seen: calls whose ops the reward "
                          "can see; ids: UPDATE/DELETE must hit the oracle's memory); facts: one-to-one token-F1 "
                          "match (function words dropped) at eval.fact_match_f1"}
