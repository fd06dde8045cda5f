"""A `Generator` over an OpenAI-compatible `/chat/completions` endpoint (urllib only, one request per
prompt): the judge's remote backend (judge.kind = "openai"), on the one `Completion` type. An endpoint
returns text only, so a completion carries no token ids or log-probs and weight version 0."""
import json
import urllib.request

from memr1.rl.generation import Completion, SamplingConfig


class OpenAIChatGenerator:
    """`url` is the API base, e.g. "http://localhost:8000/v1"."""

    def __init__(self, url: str, model: str, api_key: str | None = None, timeout: float = 60.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIChatGenerator: url must start with http:// or https://, got {url!r}")
        base = url.rstrip("/")
        self.endpoint = base if base.endswith("/chat/completions") else base + "/chat/completions"
        self.model, self.api_key, self.timeout = model, api_key, timeout
        self.tokenizer, self.weight_version = None, 0

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.endpoint, data=json.dumps(body).encode(), headers=headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return json.loads(resp.read())

    def generate(self, prompts: list, n: int, sampling: SamplingConfig) -> list[list[Completion]]:
        out = []
        for i, messages in enumerate(prompts):
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise TypeError("OpenAIChatGenerator takes chat message lists, not token ids")
            body = {"model": self.model, "messages": messages, "n": n,
                    "temperature": sampling.temperature, "max_tokens": sampling.max_new_tokens}
            choices = self._post(body).get("choices", [])
            out.append([Completion(prompt_index=i, token_ids=[], logprobs=[],
                                   text=(c.get("message") or {}).get("content") or "",
                                   finish_reason="length" if c.get("finish_reason") == "length" else "stop",
                                   weight_version=0, prompt_token_ids=[]) for c in choices])
        return out
