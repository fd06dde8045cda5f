"""Memory-R1's agents as prompts and parsers: fact extraction, the Memory Manager, the Answer Agent.

Nothing here runs a model: the code that does is reached through the generation contract in
`memr1.rl.generation`, so `rl/` never imports `engine/`.
"""
