"""config/: the run config and what is derived from it, once per run.

Owns: run.py (RunConfig from TOML and overrides; the run-level settings of data, banks, rollout
sampling and the loop), toml_out.py (the resolved config written back as TOML), stages.py (stage
names and their settings), errors.py (ConfigError and its messages), resolve.py (the resolved run:
paths, ranks, the task, each stage's learner config and sampling), plan.py (`memr1 train
--dry-run`), and what `memr1 train` and `memr1 eval` share without importing each other: caches.py
(the extraction and bank cache keys) and judge.py (the judge).
May import: rl/, observe/, generation/, training/ and every folder's config module. run.py,
stages.py, errors.py and resolve.py load no torch, so reading a config stays cheap
(tests/test_config.py checks it); plan.py does, to see the device.
"""
