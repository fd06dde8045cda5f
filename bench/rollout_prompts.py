"""The prompts bench.rollout generates from, as token ids: a fresh set for every round, so no engine can
reuse a previous round's prefill.

  short     a synthetic question alone as the user message (tens of tokens)
  manager   Memory-R1 manager turns (rl/task/turns.manager_turns) on the synthetic oracle's banks
  answer    Memory-R1 answer turns (rl/task/turns.answer_prompts) on the oracle's banks
The manager and answer prompts are built exactly as the training stages build them, with the default
config's manager and answer settings (configs/default.toml). Retrieval uses the hashing embedder: a
synthetic speaker has at most 5 memories and the default top-k is 5, so every embedder shows the same
memories (in id order), and the prompts are the ones training sees."""
from memr1.rl.task.data import load_conversations
from memr1.rl.generation import chat_prompt_ids

KINDS = ("short", "manager", "answer")


def prompt_sets(cfg, tokenizer, sets: int, prompts: int, kinds=KINDS) -> dict[str, list[list[list[int]]]]:
    """kind -> `sets` disjoint lists of `prompts` token-id prompts. `cfg` is a RunConfig (its manager,
    answer and items settings)."""
    convs = load_conversations(None, n=40, split="train")
    need = sets * prompts
    out = {}
    if "short" in kinds:
        questions = list(dict.fromkeys(qa.question for c in convs for qa in c.qa))
        out["short"] = [[{"role": "user", "content": q}] for q in _take(questions, need, "questions")]
    if "manager" in kinds or "answer" in kinds:  # the bank's native core: only when these kinds are asked for
        from memr1.memory_store import HashEmbedder
        from memr1.rl.task.facts import oracle_facts
        from memr1.rl.task.train_items import answer_items, manager_calls, manager_items, oracle_bank
        from memr1.rl.task.turns import AnswerRequest, answer_prompts, manager_turns

        embedder = HashEmbedder(64)
    if "manager" in kinds:
        facts = {c.sample_id: oracle_facts(c) for c in convs}
        specs = manager_calls(convs, facts, cfg.manager.turns_per_call)
        items = _take(manager_items(specs, [oracle_bank(s, s.conv, embedder) for s in specs], cfg.items, seed=0),
                      need, "manager items")
        turns = manager_turns([(it.bank, it.call) for it in items],
                              embedder, cfg.manager)
        out["manager"] = [t.prompt.messages for t in turns]
    if "answer" in kinds:
        banks = {c.sample_id: oracle_bank(None, c, embedder) for c in convs}
        items = _take(answer_items(convs, banks, seed=0), need, "answer items")
        out["answer"] = answer_prompts([AnswerRequest(it.bank, it.question.question, it.speakers) for it in items],
                                       embedder, cfg.answer)
    return {kind: [[chat_prompt_ids(tokenizer, m) for m in msgs[i * prompts:(i + 1) * prompts]] for i in range(sets)]
            for kind, msgs in out.items()}


def _take(xs: list, need: int, what: str) -> list:
    if len(xs) < need:
        raise ValueError(f"the synthetic set holds {len(xs)} {what}; {need} are needed (fewer rounds or prompts)")
    return xs[:need]
