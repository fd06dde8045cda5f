"""The run's judge (the J metric, and the reward when reward.kind = "judge"), built one way for
`memr1 train`'s stages and `memr1 eval`."""
import os

from memr1.engine.config.run import RunConfig
from memr1.engine.generation.openai_chat import OpenAIChatGenerator
from memr1.rl.task.eval.judging import Judge


def make_judge(cfg: RunConfig, local):
    """A `rl.task.eval.judging.Judge` for `cfg.judge`, or None when judge.kind = "off". A local judge runs on
    `local` (a generator holding the base model: the run's swapping engine's view of it); an openai one
    on the configured OpenAI-compatible endpoint, its key read from the environment."""
    if cfg.judge.kind == "off":
        return None
    if cfg.judge.kind == "local":
        return Judge(local, cfg.judge)
    return Judge(OpenAIChatGenerator(cfg.judge.url, cfg.judge.model, os.environ.get(cfg.judge.api_key_env)), cfg.judge)
