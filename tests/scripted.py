"""A generator that replies from a script, for stage tests: no model, every prompt recorded."""
import json
import zlib

from memr1.rl.generation import Completion


class ScriptedGenerator:
    """Completion j of each prompt's group is texts[j], or `reply(call, i, j)` when given (call: the
    generate call's number from 0, i: the prompt's index in it); every prompt is recorded, and
    `calls` keeps each generate call's prompts."""
    weight_version = 0

    def __init__(self, texts=("",), finish="stop", reply=None):
        self.texts, self.finish, self.reply, self.prompts, self.calls = texts, finish, reply, [], []

    def generate(self, prompts, n, sampling):
        self.prompts += prompts
        self.calls.append(list(prompts))
        call = len(self.calls) - 1

        def text(i, j):
            return self.reply(call, i, j) if self.reply else self.texts[j % len(self.texts)]

        def digest(p):   # stands in for the prompt's token ids: equal prompts, equal ids
            return [zlib.crc32(json.dumps(p).encode()) % 40000 + 1, 7]
        return [[Completion(prompt_index=i, token_ids=[5 + j, 6], logprobs=[-1.0, -1.0], text=text(i, j),
                            finish_reason=self.finish, weight_version=0, prompt_token_ids=digest(p)) for j in range(n)]
                for i, p in enumerate(prompts)]
