"""The Memory-R1 task: everything specific to memory management and question answering.

    agents/      the three roles' prompts and reply parsers (extract, manager, answer)
    data/        LoCoMo, MSC, LongMemEval and the synthetic set; the oracle's labels
    facts, banks, turns, rag, evidence, rewards, hints, episodes, train_items
                 per-turn facts, bank building, one manager or answer turn, the rule-built stores,
                 evidence recall, the answer metrics, hinted rollouts, session-level episodes, and the
                 items each stage trains on
    stages/      the stages as the loop sees them (calls: manager and answer; episode; warm), and the
                 per-completion samples they hand `memr1 rollout`
    eval/        evaluation of a split, its report, the LLM judge, paired statistics, the op probe

It builds on the rest of `rl/` (algorithms, losses, the records that cross stages, the generation
contract), which never imports it: another task would be a sibling folder.
"""
