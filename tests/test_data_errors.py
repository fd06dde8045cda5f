"""Plausible but awkward data never crashes a run, and bad data is one clear line: long turns and
turns without a speaker in the raw-turn (rag) pipeline, JSON nested too deep, files of no known or of
an ambiguous format, sessions and categories of the wrong type, an evaluation-only file in `train`."""
import json

import msgspec
import pytest

from data_rows import lme_item, msc_row
from memr1.engine.cli import main as cli_main
from memr1.memory_store import HashEmbedder
from memr1.rl.task.data import detect_format, load_conversations
from memr1.rl.task.data.locomo import DataError, load_locomo
from memr1.rl.task.data.synthetic import synthesize
from memr1.rl.task.eval.evaluation import EvalConfig, evaluate
from memr1.rl.task.rag import rag_bank, split_text


class Out(msgspec.Struct):
    text: str
    finish_reason: str = "stop"


class Answers:
    """Answers every prompt; records the prompts."""
    def __init__(self):
        self.prompts = []

    def generate(self, prompts, n, sampling):
        self.prompts += prompts
        return [[Out("Answer: Rome")] for _ in prompts]


def write(path, value):
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return path


def test_split_text_keeps_every_word_within_the_limit():
    text = " ".join(f"word{i}é" for i in range(2000))          # 2-byte characters, about 21 KB
    pieces = split_text(text, 4000)
    assert all(3980 <= len(p.encode()) <= 4000 for p in pieces[:-1]) and len(pieces) == 6
    assert " ".join(pieces) == text
    assert "".join(split_text("x" * 9000, 4096)) == "x" * 9000     # no space: cut inside the word
    assert split_text("short", 4096) == ["short"]


def old_split_text(text: str, limit: int) -> list[str]:
    """split_text as it was: the same cuts, the rest of the text re-encoded for each piece (quadratic)."""
    pieces = []
    while len(text.encode()) > limit:
        head = text.encode()[:limit].decode("utf-8", errors="ignore")
        cut = head.rfind(" ")
        if cut < len(head) // 2:
            cut = len(head)
        pieces.append(head[:cut].rstrip())
        text = text[cut:].lstrip()
    return pieces + ([text] if text else [])


def test_split_text_cuts_as_before_in_linear_time():
    import random
    import time
    rng = random.Random(35)
    words = ["a", "word", "\u00e9t\u00e9", "\u6771\u4eac", "\U0001f600", " ", "  ", "\n", "\u3000", "x" * 90]
    for _ in range(500):
        text = "".join(rng.choice(words) for _ in range(rng.randint(0, 200)))
        limit = rng.choice([64, 80, 100, 333])
        assert split_text(text, limit) == old_split_text(text, limit), (text, limit)
    turn = "\u00e9t\u00e9 \u6771\u4eac " * 800_000    # 10 MB of non-ASCII words
    t0 = time.process_time()
    pieces = split_text(turn, 4096)
    assert time.process_time() - t0 < 2, "split_text is not linear"    # generous: it takes ~0.1 s
    assert " ".join(pieces) == turn


def test_rag_splits_long_turns_and_skips_speakerless_ones_with_counts(tmp_path):
    """LongMemEval's 5.5 KB assistant turns and a LoCoMo turn with an empty speaker: the eval runs,
    the long turn becomes several memories, and the report counts both."""
    item = lme_item()
    long_text = "Rome has many sights. " * 250                       # 5.5 KB
    item["haystack_sessions"][0][1]["content"] = long_text
    convs = load_conversations(write(tmp_path / "lme.json", [item]))
    rep = evaluate(convs, "test", Answers(), HashEmbedder(32), EvalConfig(baseline="rag", progress=False),
                   cache_dir=tmp_path / "cache")
    assert rep["input"] == {"turns": 3, "empty_speaker_skipped": 0, "long_turns_split": 1}
    bank = rag_bank(convs[0], HashEmbedder(32), convs[0].turns())
    texts = [m.text for m in bank]
    assert len(texts) == 4 and all(len(t.encode()) <= 4096 for t in texts)   # 2 short turns + 2 pieces
    assert " ".join(t.removeprefix("Assistant: ") for t in texts[1:3]).strip() == long_text.strip()

    data = synthesize(1, seed=2)
    data[0]["conversation"]["session_1"][0]["speaker"] = ""
    convs = load_conversations(write(tmp_path / "locomo.json", data))
    rep = evaluate(convs, "test", Answers(), HashEmbedder(32), EvalConfig(baseline="rag", progress=False),
                   cache_dir=tmp_path / "cache2")
    assert rep["input"]["empty_speaker_skipped"] == 1 and rep["n_questions"] == len(convs[0].qa)
    assert len(rag_bank(convs[0], HashEmbedder(32), convs[0].turns())) == rep["input"]["turns"] - 1


def test_a_turn_the_bank_still_refuses_names_conversation_and_turn(tmp_path):
    data = synthesize(1, seed=2)
    data[0]["conversation"]["session_1"][1]["speaker"] = "S" * 4090   # no room left for any text
    convs = load_conversations(write(tmp_path / "locomo.json", data))
    with pytest.raises(DataError, match=r"^synth-2-0000 turn D1:2: the speaker name is 4090 bytes"):
        rag_bank(convs[0], HashEmbedder(32), convs[0].turns())


def test_json_nested_too_deep_is_one_line_naming_the_file(tmp_path, capsys):
    deep = write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    for load in (load_locomo, load_conversations, detect_format):
        with pytest.raises(DataError, match=r"deep\.json: not valid JSON \(nested too deeply\)"):
            load(deep)
    assert cli_main(["data", "stats", str(deep)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "deep.json" in err
    lines = write(tmp_path / "deep.jsonl", json.dumps(msc_row()) + "\n" + "[" * 100_000 + "\n")
    with pytest.raises(DataError, match=r"deep\.jsonl line 2: not valid JSON \(nested too deeply\)"):
        load_conversations(lines)


@pytest.mark.parametrize("text, match", [
    ('{"sample_id": "x", "conversation": {}}', "locomo records must be in a JSON list"),
    (json.dumps({"question_id": "q"}), "longmemeval records must be in a JSON list"),
    ('{\n  "data": [1, 2]\n}\n', "a JSON object that is not one record per line"),
    ('{"what": 1}\n', "has none of the keys sample_id, question_id, self_instruct"),
    ('[{"sample_id": "a", "question_id": "b"}]', "could be locomo or longmemeval"),
    ("sample_id,question\n", "not JSON"),
])
def test_a_file_of_no_known_or_an_ambiguous_format_is_refused(tmp_path, text, match):
    with pytest.raises(DataError, match=match):
        detect_format(write(tmp_path / "data.json", text))
    with pytest.raises(DataError, match="a directory"):
        detect_format(tmp_path)


def test_one_msc_row_per_line_is_still_msc(tmp_path):
    assert detect_format(write(tmp_path / "one.json", json.dumps(msc_row()) + "\n")) == "msc"


@pytest.mark.parametrize("mutate, match", [
    (lambda c: c["conversation"].update(session_2={"0": {"speaker": "A", "dia_id": "D2:1", "text": "hi"}}),
     "session_2 should be a list of turns, got dict"),
    (lambda c: c["qa"][0].update(category=True), "'category' should be .*int.*, got bool"),
    (lambda c: c["qa"][0].update(answer=False), "'answer' should be .*, got bool"),
    (lambda c: c["conversation"]["session_1"][0].update(dia_id=""), "'dia_id' should be 1 to 64 bytes, got 0"),
    (lambda c: c["conversation"]["session_1"][0].update(dia_id="D" * 65), "'dia_id' should be 1 to 64 bytes, got 65"),
    (lambda c: c["conversation"]["session_1"][0].update(dia_id="D\ud800"), "'dia_id' is not valid Unicode"),
    (lambda c: c["conversation"].update(session_01=c["conversation"].pop("session_1")),
     "session key 'session_01' is not session_<N>"),
    (lambda c: c["conversation"].update({"session_\u0661": c["conversation"].pop("session_1")}),
     "session key 'session_\u0661' is not session_<N>"),
    (lambda c: c["conversation"].update({"session_" + "9" * 5000: []}), "is not session_<N>"),
])
def test_wrongly_typed_locomo_fields_are_errors_not_guesses(tmp_path, mutate, match):
    data = synthesize(1, seed=2)
    mutate(data[0])
    with pytest.raises(DataError, match=match):
        load_locomo(write(tmp_path / "bad.json", data))


def test_longmemeval_question_id_true_is_an_error(tmp_path):
    with pytest.raises(DataError, match="'question_id' should be .*, got bool"):
        load_conversations(write(tmp_path / "lme.json", [lme_item(qid=True)]))


def test_any_command_prints_a_user_error_as_one_line(monkeypatch, capsys):
    import memr1.rl.task.data.locomo as locomo

    def fails(args):
        raise DataError("x.json item 3: missing key 'qa'")
    monkeypatch.setattr(locomo, "stats_cli", fails)
    assert cli_main(["data", "stats", "x.json"]) == 2
    assert capsys.readouterr().err == "error: x.json item 3: missing key 'qa'\n"


def _oracle(data) -> dict:
    return data[0]["memr1_oracle"]


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d[0].update(memr1_oracle=[]), "Expected `object`, got `array`"),
    (lambda d: d[0].update(memr1_oracle="timeline"), "Expected `object`, got `str`"),
    (lambda d: d[0].update(memr1_oracle={}), "missing required field `timeline`"),
    (lambda d: _oracle(d).update(timeline=3), r"Expected `array`, got `int` - at `\$.timeline`"),
    (lambda d: _oracle(d)["timeline"][0].pop("memory"), "missing required field `memory`"),
    (lambda d: _oracle(d)["timeline"][0].update(event="MERGE"), "Invalid enum value .MERGE."),
    (lambda d: _oracle(d)["timeline"][0].update(dia_id="D99:1"), r"turns the conversation lacks: \['D99:1'\]"),
    (lambda d: _oracle(d)["timeline"][1].update(event="UPDATE", old_memory=None), "without the old_memory"),
    (lambda d: _oracle(d).update(final_facts=["a"]), r"Expected `object`, got `array` - at `\$.final_facts`"),
])
def test_a_malformed_oracle_is_one_data_error_naming_the_conversation(tmp_path, mutate, match):
    data = synthesize(1, seed=2)
    mutate(data)
    with pytest.raises(DataError, match=f"synth-2-0000: memr1_oracle: .*{match}"):
        load_conversations(write(tmp_path / "bad.json", data))


@pytest.mark.parametrize("mutate, what", [
    (lambda c: c.update(sample_id="s\ud800"), "sample_id"),
    (lambda c: c["conversation"]["session_1"][0].update(speaker="A\udfff"), "turn 0 of session_1: speaker"),
    (lambda c: c["conversation"]["session_1"][1].update(text="hi \ud83d"), "turn 1 of session_1: text"),
    (lambda c: c["qa"][0].update(question="when\udc80?"), "qa 0: question"),
])
def test_a_lone_surrogate_is_a_data_error_naming_the_field(tmp_path, mutate, what):
    data = synthesize(1, seed=2)
    data[0].pop("memr1_oracle")
    mutate(data[0])
    with pytest.raises(DataError, match=f"{what} is not valid Unicode"):
        load_conversations(write(tmp_path / "bad.json", data))


def test_an_integer_of_5000_digits_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"big\.json: not valid JSON \(Exceeds the limit"):
        load_conversations(write(tmp_path / "big.json", '[{"sample_id": ' + "9" * 5000 + "}]"))
