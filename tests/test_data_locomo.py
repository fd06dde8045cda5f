import copy
import json
from pathlib import Path

import pytest

from memr1.engine.cli import main as cli_main
from memr1.rl.task.data.locomo import (CATEGORY_NAMES, DataError, by_split, load_locomo, parse_locomo, split_of,
                                  stats)

SHARED = Path("/work/shared/data/locomo_train_val.json")
needs_shared = pytest.mark.skipif(not SHARED.is_file(), reason=f"LoCoMo file {SHARED} not present on this machine")


def tiny() -> list[dict]:
    """A two-session conversation with the quirks of the real file."""
    return [{
        "sample_id": "conv-26",
        "conversation": {
            "speaker_a": "Caroline", "speaker_b": "Melanie",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Caroline", "dia_id": "D1:1", "text": "Hi Mel!"},
                {"speaker": "Melanie", "dia_id": "D1:2", "text": "Look at this.", "img_url": ["x"],
                 "blip_caption": "a photo of a sunset over a lake", "query": "sunset"},
            ],
            "session_2_date_time": "2:00 pm on 9 May, 2023",
            "session_2": [{"speaker": "Caroline", "dia_id": "D2:1", "text": "I have 2 cats."}],
            "session_3_date_time": "3:00 pm on 10 May, 2023",   # date key without a session
        },
        "qa": [
            {"question": "How many cats?", "answer": 2, "evidence": ["D2:1"], "category": 1},
            {"question": "When?", "answer": "8 May 2023", "evidence": ["D1:1"], "category": 2},
            {"question": "Adversarial?", "evidence": ["D1:2"], "category": 5, "adversarial_answer": "x"},
        ],
        "event_summary": {}, "observation": {}, "session_summary": {},
    }]


def test_parse_quirks():
    (conv,) = parse_locomo(tiny())
    assert conv.sample_id == "conv-26" and conv.split == "train"
    assert [s.index for s in conv.sessions] == [1, 2]            # session_3 has only a date key
    img = conv.sessions[0].turns[1]
    assert img.text == "Look at this. [image: a photo of a sunset over a lake]"
    assert img.timestamp == "1:56 pm on 8 May, 2023"
    assert [q.answer for q in conv.qa] == ["2", "8 May 2023"]    # int -> str, category 5 dropped
    assert [q.category for q in conv.qa] == [1, 2]
    assert len(conv.turns()) == 3


def test_split_rule():
    assert split_of("conv-26") == "train" and split_of("conv-30") == "val" and split_of("conv-41") == "test"
    raw = tiny() + [dict(copy.deepcopy(tiny()[0]), sample_id=s) for s in ("conv-30", "conv-44")]
    groups = by_split(parse_locomo(raw))
    assert [len(groups[s]) for s in ("train", "val", "test")] == [1, 1, 1]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d[0].pop("sample_id"), "missing key 'sample_id'"),
    (lambda d: d[0]["conversation"].pop("speaker_b"), "missing key 'speaker_b'"),
    (lambda d: d[0]["conversation"]["session_1"][0].pop("dia_id"), "session_1 turn 0: missing key 'dia_id'"),
    (lambda d: d[0]["qa"][0].update(category=9), "unknown category 9"),
    (lambda d: d[0]["qa"][1].pop("answer"), "qa 1: missing key 'answer'"),
    (lambda d: d.append(copy.deepcopy(d[0])), "duplicate sample_id 'conv-26'"),
    (lambda d: [d[0]["conversation"].pop(k) for k in ("session_1", "session_2")], "no session_<N> lists"),
])
def test_bad_input_names_the_problem(mutate, message):
    data = tiny()
    mutate(data)
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace("<", "<")):
        parse_locomo(data)


def test_bad_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_locomo(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        load_locomo(bad)
    bad.write_text('{"a": 1}')
    with pytest.raises(DataError, match="expected a JSON list"):
        load_locomo(bad)


def test_stats_cli_json(tmp_path, capsys):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny()))
    assert cli_main(["data", "stats", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    train = out["splits"]["train"]
    assert train == {"conversations": 1, "sessions": 2, "turns": 3, "qa": 2,
                     "by_category": {"single-hop": 1, "temporal": 1, "multi-hop": 0, "open-domain": 0},
                     "by_category_number": {"1": 1, "2": 1, "3": 0, "4": 0}}
    assert cli_main(["data", "stats", str(path)]) == 0
    table = capsys.readouterr().out
    assert "single-hop" in table and "train" in table
    assert cli_main(["data", "stats", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


@needs_shared
def test_shared_file_counts():
    convs = load_locomo(SHARED)
    s = stats(convs)["splits"]
    assert s["train"]["qa"] == 152 and s["val"]["qa"] == 81 and s["test"]["qa"] == 0
    assert [s["train"]["by_category"][CATEGORY_NAMES[k]] for k in (1, 2, 3, 4)] == [32, 37, 13, 70]
    assert [s["val"]["by_category"][CATEGORY_NAMES[k]] for k in (1, 2, 3, 4)] == [11, 26, 0, 44]
    assert s["train"]["conversations"] == 1 and s["val"]["conversations"] == 1
    # conv-26 lists 35 date keys but has 19 sessions; image turns carry their caption.
    train = by_split(convs)["train"][0]
    assert len(train.sessions) == 19
    assert sum("[image:" in t.text for t in train.turns()) == 116
    assert all(isinstance(q.answer, str) for c in convs for q in c.qa)
