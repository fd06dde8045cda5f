import json
import math
import random
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from memr1.engine.generation.openai_chat import OpenAIChatGenerator
from memr1.rl.generation import GREEDY, Completion
from memr1.rl.task.eval.judging import (JUDGE_SYSTEM, Judge, JudgeConfig, build_judge_messages, judge_answers,
                                        parse_judge)
from memr1.rl.task.rewards import bleu1, bleu1_tokens, exact_match, f1, normalize, score_answer, word_tokens

nltk_bleu = pytest.importorskip("nltk.translate.bleu_score", reason="nltk (test-only) not installed")
nltk_tok = pytest.importorskip("nltk.tokenize", reason="nltk (test-only) not installed")

VOCAB = ["the", "dog", "Paris", "7", "May", "2023", "don't", "Caroline's", "he'll", "I'm", "e.g.", "U.S.",
         "3.5", "$20", "50%", "(yes)", '"hi"', "a-b", "well,", "ok!", "why?", "end.", "it;", "x:y", "#tag",
         "1:56", "pm", "...", "--", "1,000", "kids'", "'cause", "gonna", "cannot", "what\u2019s", "doin'?",
         'end."', "it's!", "Sunday", "sister", "two", "dogs", "Denver", "United", "States"]


def random_text(rng: random.Random, max_words: int = 8) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(rng.randint(0, max_words)))


# ---- hand-computed cases ----
def test_normalize_and_em():
    assert normalize("  Paris, France! ") == "paris france"
    assert exact_match("paris", "Paris.") == 1.0 and exact_match("Paris France", "Paris, France") == 1.0
    assert exact_match("the Paris", "Paris") == 0.0            # no article removal
    assert exact_match("", "") == 0.0 and exact_match("x", "") == 0.0
    assert exact_match(2, "2") == 1.0                          # non-str input is stringified, never raises


def test_f1_is_over_token_sets():
    assert f1("the cat sat", "the cat") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))   # 0.8
    assert f1("a a a b", "a b") == 1.0                          # sets: {a, b} vs {a, b}
    assert f1("Cats.", "cats") == 1.0 and f1("cats", "cat") == 0.0   # no stemming
    assert f1("", "x") == 0.0 and f1("x", "") == 0.0 and f1("x y", "z") == 0.0
    assert f1("7 May 2023", "May 7, 2023") == 1.0


def test_bleu1_hand_cases():
    assert bleu1("paris", "paris") == 1.0
    # 2 of 3 hypothesis words match; hypothesis longer than reference -> no brevity penalty
    assert bleu1("the big cat", "the cat") == pytest.approx(2 / 3)
    # 1 word matching, reference 3 words: BP = exp(1 - 3/1)
    assert bleu1("cat", "the cat sat") == pytest.approx(math.exp(-2))
    assert bleu1("dog dog dog", "dog") == pytest.approx(1 / 3)    # clipped counts
    assert bleu1("", "x") == 0.0 and bleu1("x", "") == 0.0 and bleu1("a", "b") == 0.0
    assert word_tokens('He said "don\'t", 1:56 pm.') == ["he", "said", "``", "do", "n't", "''", ",", "1:56", "pm", "."]
    assert score_answer("Paris", "paris") == {"em": 1.0, "f1": 1.0, "bleu1": 1.0}


# ---- against NLTK (test-only dependency) ----
def test_bleu1_matches_nltk_on_token_lists():
    smooth = nltk_bleu.SmoothingFunction().method1
    rng = random.Random(0)
    words = "a b c d e the cat 7 may 2023".split()
    for _ in range(1500):
        hyp = [rng.choice(words) for _ in range(rng.randint(0, 9))]
        ref = [rng.choice(words) for _ in range(rng.randint(0, 9))]
        ours = bleu1_tokens(hyp, ref)
        theirs = nltk_bleu.sentence_bleu([ref], hyp, weights=(1, 0, 0, 0), smoothing_function=smooth)
        assert abs(ours - theirs) <= 1e-9, (hyp, ref, ours, theirs)


def test_bleu1_matches_nltk_end_to_end_on_strings():
    """Our tokenizer + BLEU-1 against NLTK's word tokenizer + sentence_bleu, on 2,000 fuzzed pairs."""
    smooth = nltk_bleu.SmoothingFunction().method1
    tok = nltk_tok.NLTKWordTokenizer()
    rng = random.Random(1)
    for _ in range(2000):
        pred, gold = random_text(rng), random_text(rng)
        assert word_tokens(pred) == tok.tokenize(pred.lower()), pred
        theirs = nltk_bleu.sentence_bleu([tok.tokenize(gold.lower())], tok.tokenize(pred.lower()),
                                         weights=(1, 0, 0, 0), smoothing_function=smooth)
        assert abs(bleu1(pred, gold) - theirs) <= 1e-9, (pred, gold)


def test_rewards_do_not_import_nltk_at_runtime():
    import subprocess
    import sys
    code = "import sys, memr1.rl.task.rewards as r; r.bleu1('a b', 'a'); print('nltk' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---- judge ----
class FakeJudge:
    """Replies from a script: one list of texts per generate() call."""

    def __init__(self, script):
        self.script, self.prompts = list(script), []

    def generate(self, prompts, n, sampling):
        self.prompts.append(prompts)
        replies = self.script.pop(0)
        if isinstance(replies, Exception):
            raise replies
        return [[Completion(prompt_index=i, token_ids=[], logprobs=[], text=t, finish_reason="stop", weight_version=0,
                            prompt_token_ids=[])] for i, t in enumerate(replies)]


def test_judge_prompt_and_parser():
    msgs = build_judge_messages("When?", "7 May 2023", "May 7th")
    assert msgs[0]["content"] == JUDGE_SYSTEM and "generous" in JUDGE_SYSTEM.lower()
    assert "Gold answer: 7 May 2023" in msgs[1]["content"] and "Generated answer: May 7th" in msgs[1]["content"]
    assert parse_judge('{"reasoning": "same date", "label": "CORRECT"}') == "CORRECT"
    assert parse_judge('```json\n{"LABEL": "wrong"}\n```') == "WRONG"
    assert parse_judge("The answer is CORRECT.") == "CORRECT"
    assert parse_judge("It is not wrong, it is correct") is None     # ambiguous: retried, not guessed
    assert parse_judge('{"label": "maybe"}') is None and parse_judge(None) is None and parse_judge("") is None
    with pytest.raises(TypeError, match="gold"):
        build_judge_messages("q", 5, "a")


def test_judge_retries_then_counts_failures():
    items = [("q1", "g1", "a1"), ("q2", "g2", "a2"), ("q3", "g3", "a3")]
    fake = FakeJudge([['{"label": "CORRECT"}', "garbage", "more garbage"],
                      RuntimeError("endpoint down"),
                      ['{"label": "WRONG"}', "still garbage"]])
    report = judge_answers(fake, items, GREEDY, retries=2)
    assert report.labels == ["CORRECT", "WRONG", "FAILED"]
    assert (report.n_correct, report.n_wrong, report.n_failed, report.calls) == (1, 1, 1, 3)
    assert report.score == 50.0 and "endpoint down" in report.errors[0]
    assert [len(p) for p in fake.prompts] == [3, 2, 2]   # only unreadable items are re-sent
    assert judge_answers(FakeJudge([]), [], GREEDY).score == 0.0


def test_openai_compatible_endpoint():
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            reply = {"choices": [{"message": {"content": '{"label": "CORRECT"}'}, "finish_reason": "stop"}]}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        gen = OpenAIChatGenerator(f"http://127.0.0.1:{server.server_port}/v1", "judge-model", api_key="k")
        report = Judge(gen, JudgeConfig(kind="openai", url="http://x", model="judge-model", max_new_tokens=32)).label(
            [("q", "g", "a")])
    finally:
        server.shutdown()
        thread.join()
    assert report.labels == ["CORRECT"]
    path, auth, body = seen[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k"
    assert body["model"] == "judge-model" and body["max_tokens"] == 32 and body["messages"][0]["role"] == "system"
    with pytest.raises(ValueError, match="http"):
        OpenAIChatGenerator("localhost:8000", "m")


def test_rewards_return_their_breakdown():
    from memr1.rl.task.rewards import RewardConfig, answer_reward, answer_score, manager_reward
    cfg = RewardConfig(kind="f1", answer_format_penalty=0.5, format_penalty=1.0, invalid_op_penalty=0.25,
                       memory_penalty=0.1)
    assert answer_score("two dogs", "2 dogs", "em") == 0.0 and answer_score("Dogs.", "dogs", "em") == 1.0
    assert answer_score("two dogs", "2 dogs", "f1") == pytest.approx(0.5)
    assert answer_score("anything", "x", "judge", "CORRECT") == 1.0 and answer_score("x", "x", "judge", "FAILED") == 0.0
    assert answer_reward(0.5, False, cfg) == {"f1": 0.5, "format": -0.5}
    assert answer_reward(1.0, True, cfg) == {"f1": 1.0, "format": 0.0}
    parts = manager_reward([1.0, 0.0, 0.5], True, 2, cfg)
    assert parts == {"f1": 0.5, "format": 0.0, "invalid_op": -0.5, "memory": 0.0} and sum(parts.values()) == 0.0
    assert manager_reward([], False, 0, cfg) == {"f1": 0.0, "format": -1.0, "invalid_op": 0.0, "memory": 0.0}
    # net growth costs per memory; a call that deletes more than it adds is not paid for it
    assert manager_reward([1.0], True, 0, cfg, growth=3)["memory"] == pytest.approx(-0.3)
    assert manager_reward([1.0], True, 0, cfg, growth=-2)["memory"] == 0.0
    # one memory per fact the call reads is free: only the copies beyond it cost
    assert manager_reward([1.0], True, 0, cfg, growth=2, facts=2)["memory"] == 0.0
    assert manager_reward([1.0], True, 0, cfg, growth=3, facts=2)["memory"] == pytest.approx(-0.1)
    with pytest.raises(ValueError, match="reward.kind"):
        answer_score("a", "a", "bleu")
