import json

import pytest

from data_rows import lme_item, msc_row
from memr1.rl.task.data.locomo import DataError, stats
from memr1.rl.task.data.longmemeval import load_longmemeval
from memr1.rl.task.data.msc import load_msc


def test_longmemeval(tmp_path):
    path = tmp_path / "lme.json"
    path.write_text(json.dumps([lme_item(), lme_item("q2_abs", "knowledge-update", 4)]))
    convs = load_longmemeval(path)
    assert [c.sample_id for c in convs] == ["q1", "q2_abs"]
    c = convs[0]
    assert (c.speaker_a, c.speaker_b, c.split) == ("User", "Assistant", "test")
    assert [len(s.turns) for s in c.sessions] == [2, 1]
    assert c.sessions[1].turns[0].timestamp == "2023/05/23 (Tue) 09:00"
    assert c.sessions[0].turns[1].speaker == "Assistant"
    (qa,) = c.qa
    assert qa.category == 2 and qa.kind == "temporal-reasoning" and qa.evidence == ["D1:1", "D2:1"]
    assert qa.date == "2023/05/30 (Tue) 10:00"
    assert convs[1].qa[0].answer == "4" and convs[1].qa[0].kind == "knowledge-update-abstention"
    assert convs[1].qa[0].category == 1
    assert stats(convs)["splits"]["test"]["qa"] == 2


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("question"), "missing key 'question'"),
    (lambda d: d.update(question_type="trivia"), "unknown question_type 'trivia'"),
    (lambda d: d["haystack_dates"].pop(), "2 haystack_sessions but 1 haystack_dates"),
    (lambda d: d["haystack_sessions"][0][0].update(role="system"), "session 1 turn 1: role should be"),
])
def test_longmemeval_bad_items(tmp_path, mutate, message):
    item = lme_item()
    mutate(item)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([item]))
    with pytest.raises(DataError, match=message):
        load_longmemeval(path)


def test_msc_jsonl_and_json_list(tmp_path):
    path = tmp_path / "msc.jsonl"
    path.write_text(json.dumps(msc_row()) + "\n\n" + json.dumps(msc_row("Where?", 7)) + "\n")
    convs = load_msc(path)
    assert [c.sample_id for c in convs] == ["msc-0", "msc-1"]
    c = convs[0]
    assert len(c.sessions) == 3 and c.sessions[0].date_time == "session 1 (3 days gap)"
    assert [t.speaker for t in c.sessions[1].turns] == ["Speaker 1", "Speaker 2"]   # ids filled in turn order
    assert c.sessions[2].turns[0].text == "Hi again."
    assert (c.qa[0].question, c.qa[0].answer, c.qa[0].kind) == ("What is my dog's name?", "Rex", "msc-self-instruct")
    assert convs[1].qa[0].answer == "7"
    as_list = tmp_path / "msc.json"
    as_list.write_text(json.dumps([msc_row()]))
    assert load_msc(as_list)[0].qa == c.qa


def test_msc_bad_rows(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(msc_row()) + "\n{oops\n")
    with pytest.raises(DataError, match="line 2: not valid JSON"):
        load_msc(path)
    row = msc_row()
    del row["self_instruct"]["B"]
    path.write_text(json.dumps(row))
    with pytest.raises(DataError, match="row 1: 'self_instruct' needs a question"):
        load_msc(path)
    row = msc_row()
    row["previous_dialogs"][0]["dialog"][0]["text"] = None
    path.write_text(json.dumps(row))
    with pytest.raises(DataError, match="session 1 turn 1 needs a string 'text'"):
        load_msc(path)
    with pytest.raises(DataError, match="no such file"):
        load_msc(tmp_path / "missing.jsonl")


def test_load_conversations_detects_the_format(tmp_path):
    from memr1.rl.task.data import detect_format, load_conversations
    from memr1.rl.task.data.synthetic import synthesize
    files = {"locomo": ("a.json", json.dumps(synthesize(3, seed=1))),
             "longmemeval": ("b.json", json.dumps([lme_item()])),
             "msc": ("c.jsonl", json.dumps(msc_row()) + "\n")}
    for fmt, (name, text) in files.items():
        (tmp_path / name).write_text(text)
        assert detect_format(tmp_path / name) == fmt
    assert [c.sample_id for c in load_conversations(tmp_path / "a.json")] == ["synth-1-0000", "synth-1-0001",
                                                                             "synth-1-0002"]
    assert load_conversations(tmp_path / "b.json")[0].sample_id == "q1"
    assert load_conversations(tmp_path / "c.jsonl", split="test")[0].sample_id == "msc-0"
    assert len(load_conversations(None, n=10, seed=0, split="val")) == 1
    (tmp_path / "d.json").write_text('[{"what": 1}]')
    with pytest.raises(DataError, match="cannot tell the format"):
        load_conversations(tmp_path / "d.json")
    (tmp_path / "e.json").write_text("[]")
    with pytest.raises(DataError, match="non-empty JSON list"):
        load_conversations(tmp_path / "e.json")
