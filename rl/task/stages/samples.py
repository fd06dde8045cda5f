"""Each completion of a stage's step as a `records.Sample`: what the stages hand `memr1 rollout` beside
their groups. Built from what the stage already computed (outcomes, answers, bank sizes); nothing here
samples, scores or touches a bank."""
from memr1.memory_store import Add, Delete, Update
from memr1.rl.records import Sample


def store_op_rows(store_ops: list) -> list[dict]:
    """{"event", "id", "text"} of each store op (an ADD's id is the bank's to give: None)."""
    rows = []
    for op in store_ops:
        if isinstance(op, Add):
            rows.append({"event": "ADD", "id": None, "text": op.text})
        elif isinstance(op, Update):
            rows.append({"event": "UPDATE", "id": int(op.id), "text": op.text})
        elif isinstance(op, Delete):
            rows.append({"event": "DELETE", "id": int(op.id), "text": None})
    return rows


def outcome_fields(outcome) -> dict:
    """A ManagerOutcome's typed result, as Sample fields."""
    return {"status": outcome.status, "invalid_ops": int(outcome.invalid_ops), "applied": bool(outcome.applied),
            "events": list(outcome.events), "ops": store_op_rows(outcome.store_ops), "refs": list(outcome.refs)}


def shown_fields(prompt) -> dict:
    """The memories a manager prompt showed (ManagerPrompt), as Sample fields."""
    return {"shown_ids": list(prompt.bank_ids), "shown_texts": list(prompt.shown_texts)}


def manager_samples(items: list, turns: list, owners: list[int], completions: list, sc, group_size: int) -> list[Sample]:
    """One Sample per completion of ManagerStage: completion j answers items[owners[j]] (its turn
    turns[owners[j]]), sits in group j // group_size; `sc` is the stage's ManagerScores (its answers run
    over (completion, question))."""
    out, pos = [], 0
    for j, (i, c, outcome) in enumerate(zip(owners, completions, sc.outcomes)):
        it, n = items[i], len(sc.scores[j])
        out.append(Sample(group=j // group_size, index=j % group_size, item=it.source, conversation=it.conversation,
                          text=c.text, call_turns=list(it.call.get("dia_ids", ())), **outcome_fields(outcome),
                          **shown_fields(turns[i].prompt),
                          answers=[p.answer for p in sc.parsed[pos:pos + n]], golds=sc.golds[pos:pos + n],
                          scores=list(sc.scores[j]), bank_before=len(it.bank), bank_after=sc.bank_after[j]))
        pos += n
    return out


def answer_samples(items: list, completions: list, parsed: list, scores: list[float]) -> list[Sample]:
    """One Sample per completion of AnswerStage (`completions`: per item, its group; `parsed` and
    `scores` flat in the same order)."""
    out, j = [], 0
    for g, (it, group) in enumerate(zip(items, completions)):
        for k, c in enumerate(group):
            p = parsed[j]
            out.append(Sample(group=g, index=k, item=it.source, conversation=it.conversation, text=c.text,
                              status="ok" if p.has_answer_tag else "no_answer_tag", answers=[p.answer],
                              golds=[it.question.answer], scores=[scores[j]], bank_before=len(it.bank),
                              bank_after=len(it.bank)))
            j += 1
    return out


def episode_sample(group: int, index: int, item, level: str, call, completion, outcome, before: int,
                   after: int) -> Sample:
    """One call of an episode (or of a re-roll) as a Sample; its answers are scored per session, on the
    lane's bank, and stay in the reward parts."""
    return Sample(group=group, index=index, item=item.source, conversation=item.conv.sample_id,
                  text=completion.text, call_turns=list(call.get("dia_ids", ())), level=level,
                  **outcome_fields(outcome), bank_before=before, bank_after=after)
