"""Synthetic multi-session dialogues with a known fact timeline, written in LoCoMo's JSON layout.

Two speakers chat over a few dated sessions. Persona facts (pets, home city, job, sport, favorite
food) are introduced (ADD), refined or superseded (UPDATE), contradicted (DELETE) and restated in other
words (NONE), among chit-chat turns that carry no fact. Questions are asked at the end and their gold
answers follow the LATEST state ("How many dogs does Andrew have?" after a second adoption -> "2").

Extra keys next to LoCoMo's: `memr1_split` (train/val/test by conversation index: 8/1/1 of every 10)
and `memr1_oracle` with
- `timeline`: one entry per fact-bearing turn, in dialogue order: `dia_id`, `speaker`, `slot`,
  `event` (ADD/UPDATE/DELETE/NONE, the manager's vocabulary), `fact` (what extraction should yield),
  `memory` (the slot's text after the event; for DELETE the text removed), `old_memory` (before).
- `final_facts`: slot -> memory text after the last turn.
Conversation i depends only on (seed, i), so `synthesize(5)` is a prefix of `synthesize(50)`.
"""
import datetime as dt
import json
import random
import sys
from pathlib import Path

from memr1.rl.data import synth_text as T
from memr1.rl.data.locomo import Conversation, parse_locomo

EVENT_OF = {"add": "ADD", "more": "UPDATE", "move": "UPDATE", "new": "UPDATE", "change": "UPDATE",
            "quit": "DELETE", "same": "NONE"}


def _slot_plan(rng: random.Random) -> dict[str, list[str]]:
    """Which event kinds each chosen slot goes through, in order."""
    plans = {
        "pet": ["pet_add"] + ["pet_more"] * rng.choice([0, 1, 1, 2]) + ["pet_same"] * rng.randint(0, 1),
        "city": [rng.choice(["city_add", "city_move"])] + ["city_move"] * rng.choice([0, 1, 1, 2])
                + ["city_same"] * rng.randint(0, 1),
        "job": ["job_add"] + rng.choice([[], ["job_same"], ["job_quit"], ["job_quit", "job_new"],
                                         ["job_new"]]),
        "sport": ["sport_add"] + ["sport_more"] * rng.randint(0, 1) + ["sport_same"] * rng.randint(0, 1),
        "food": ["food_add"] + ["food_change"] * rng.choice([0, 1, 1, 2]) + ["food_same"] * rng.randint(0, 1),
    }
    chosen = rng.sample(sorted(plans), rng.randint(3, 5))
    return {k: plans[k] for k in chosen}


def split_for(index: int) -> str:
    """Built-in split by conversation index: of every ten, eight train, one val, one test."""
    return {8: "val", 9: "test"}.get(index % 10, "train")


def _fmt_date(d: dt.date) -> str:
    return f"{d.day} {T.MONTHS[d.month - 1]} {d.year}"


def _fmt_datetime(d: dt.date, rng: random.Random) -> str:
    hour, minute = rng.randint(1, 12), rng.randint(0, 59)
    return f"{hour}:{minute:02d} {rng.choice(['am', 'pm'])} on {d.day} {T.MONTHS[d.month - 1]}, {d.year}"


class _Speaker:
    """One speaker's hidden persona state while the dialogue is written."""

    def __init__(self, name: str, rng: random.Random):
        self.name, self.rng = name, rng
        self.v = {"pet": rng.choice(T.PETS), "n": 0, "city": None, "job": None, "sport": rng.choice(T.SPORTS),
                  "day": None, "partner": None, "food": None}
        self.memory: dict[str, str] = {}      # slot -> current memory text
        self.source: dict[str, dict] = {}     # slot -> {"dia_id", "date"} of the event that set it

    def fill(self, kind: str, date: dt.date) -> dict:
        """Draw the new values this event introduces and return the template fields."""
        rng, v = self.rng, self.v
        old_food = v["food"]
        when = ""
        if kind == "pet_add":
            v["n"] = 1
        elif kind == "pet_more":
            v["n"] += 1
        elif kind in ("city_add", "city_move"):
            v["city"] = rng.choice([c for c in T.CITIES if c != v["city"]])
        elif kind in ("job_add", "job_new"):
            v["job"] = rng.choice([j for j in T.JOBS if j != v["job"]])
        elif kind == "sport_more":
            v["day"], v["partner"] = rng.choice(T.DAYS), rng.choice(T.PARTNERS)
        elif kind in ("food_add", "food_change"):
            v["food"] = rng.choice([f for f in T.FOODS if f != v["food"]])
        if kind in ("city_move", "job_new"):
            when = rng.choice(T.WHEN)
        if when == " yesterday":
            on_date = "on " + _fmt_date(date - dt.timedelta(days=1))
        elif when == " last week":
            on_date = "the week before " + _fmt_date(date)
        else:
            on_date = "on " + _fmt_date(date)
        return dict(v, name=self.name, pets=T.plural(v["pet"], v["n"]), old=old_food, when=when,
                    on_date=on_date)


def _one_conversation(seed: int, index: int) -> dict:
    rng = random.Random(f"memr1-synth:{seed}:{index}")
    names = rng.sample(T.NAMES, 2)
    people = {n: _Speaker(n, rng) for n in names}
    other_of = {names[0]: names[1], names[1]: names[0]}
    # Interleave every (speaker, slot) stream at random, keeping each stream's own order.
    streams = [[(n, slot, kind) for kind in kinds] for n in names for slot, kinds in _slot_plan(rng).items()]
    events = []
    while streams:
        s = rng.choice(streams)
        events.append(s.pop(0))
        if not s:
            streams.remove(s)
    n_sessions = rng.randint(3, min(6, len(events)))
    cuts = sorted(rng.sample(range(1, len(events)), n_sessions - 1))
    chunks = [events[a:b] for a, b in zip([0] + cuts, cuts + [len(events)])]

    conv = {"speaker_a": names[0], "speaker_b": names[1]}
    timeline = []
    date = dt.date(2022, 1, 1) + dt.timedelta(days=rng.randint(0, 500))
    for s_idx, chunk in enumerate(chunks, start=1):
        date += dt.timedelta(days=rng.randint(3, 40))
        conv[f"session_{s_idx}_date_time"] = _fmt_datetime(date, rng)
        turns = []

        def say(speaker: str, text: str) -> str:
            dia_id = f"D{s_idx}:{len(turns) + 1}"
            turns.append({"speaker": speaker, "dia_id": dia_id, "text": text[0].upper() + text[1:]})
            return dia_id

        opener = rng.choice(names)
        say(opener, rng.choice(T.OPENERS).format(other=other_of[opener]))
        for name, slot, kind in chunk:
            if turns[-1]["speaker"] == name:   # the other speaker replies first, so turns alternate
                say(other_of[name], rng.choice(T.CHITCHAT))
            person = people[name]
            fields = person.fill(kind, date)
            dia_id = say(name, rng.choice(T.TURNS[kind]).format(**fields))
            fact = T.FACTS[kind].format(**fields)
            event = EVENT_OF[kind.split("_")[1]]
            old = person.memory.get(slot)
            if event == "UPDATE" and old is None:
                event = "ADD"   # e.g. a move mentioned before any home city was known
            entry = {"dia_id": dia_id, "speaker": name, "slot": f"{name}/{slot}", "event": event,
                     "fact": fact, "memory": fact if event in ("ADD", "UPDATE") else old,
                     "date": _fmt_date(date)}
            if old is not None:
                entry["old_memory"] = old
            timeline.append(entry)
            if event in ("ADD", "UPDATE"):
                person.memory[slot] = fact
                person.source[slot] = {"dia_id": dia_id, "on_date": fields["on_date"]}
            elif event == "DELETE":
                del person.memory[slot]
                person.source.pop(slot)
            if rng.random() < 0.5:
                say(other_of[name], rng.choice(T.CHITCHAT))
        say(other_of[turns[-1]["speaker"]], rng.choice(T.CHITCHAT))
        conv[f"session_{s_idx}"] = turns

    final = {f"{n}/{slot}": text for n in names for slot, text in people[n].memory.items()}
    return {"sample_id": f"synth-{seed}-{index:04d}", "conversation": conv,
            "qa": _questions(people, names),
            "memr1_split": split_for(index),
            "memr1_oracle": {"timeline": timeline, "final_facts": final}}


def _questions(people: dict, names: list[str]) -> list[dict]:
    """Questions whose answers follow the final state. Categories use Mem0's numbering."""
    qa = []

    def ask(question, answer, evidence, category, kind):
        qa.append({"question": question, "answer": str(answer), "evidence": evidence,
                   "category": category, "memr1_kind": kind})

    for name in names:
        p = people[name]
        v, src = p.v, p.source
        if "pet" in src:
            ask(f"How many {T.plural(v['pet'], 2)} does {name} have?", v["n"], [src["pet"]["dia_id"]], 1, "count")
        if "city" in src:
            ask(f"Where does {name} live?", v["city"], [src["city"]["dia_id"]], 1, "city")
            ask(f"In which country does {name} live?", T.CITIES[v["city"]], [src["city"]["dia_id"]], 4,
                "country")
            if "moved" in p.memory["city"]:
                ask(f"When did {name} move to {v['city']}?", _date_answer(src["city"]["on_date"]),
                    [src["city"]["dia_id"]], 2, "move-date")
        if "job" in src:
            ask(f"What is {name}'s job?", v["job"], [src["job"]["dia_id"]], 1, "job")
            if "started" in p.memory["job"]:
                ask(f"When did {name} start working as a {v['job']}?", _date_answer(src["job"]["on_date"]),
                    [src["job"]["dia_id"]], 2, "job-date")
        if "sport" in src:
            ask(f"What sport does {name} play?", v["sport"], [src["sport"]["dia_id"]], 1, "sport")
            if v["day"] and "every" in p.memory["sport"]:
                ask(f"On which day of the week does {name} play {v['sport']}?", v["day"],
                    [src["sport"]["dia_id"]], 1, "sport-day")
        if "food" in src:
            ask(f"What is {name}'s favorite food?", v["food"], [src["food"]["dia_id"]], 1, "food")
    a, b = (people[n] for n in names)
    if "pet" in a.source and "pet" in b.source:
        ask(f"How many pets do {a.name} and {b.name} have in total?", a.v["n"] + b.v["n"],
            [a.source["pet"]["dia_id"], b.source["pet"]["dia_id"]], 3, "pet-total")
    for p, q in ((a, b), (b, a)):
        if "job" in p.source and "city" in p.source and (q.v["job"] != p.v["job"] or "job" not in q.source):
            ask(f"Which city does the {p.v['job']} among {a.name} and {b.name} live in?", p.v["city"],
                [p.source["job"]["dia_id"], p.source["city"]["dia_id"]], 3, "job-city")
    return qa


def _date_answer(on_date: str) -> str:
    return on_date[3:] if on_date.startswith("on ") else on_date


def synthesize(n: int = 20, seed: int = 0) -> list[dict]:
    """`n` conversations as LoCoMo-format dicts (JSON-ready)."""
    if n < 1:
        raise ValueError(f"number of conversations must be >= 1, got {n}")
    return [_one_conversation(seed, i) for i in range(n)]


def load_synthetic(n: int = 20, seed: int = 0, split: str | None = None) -> list[Conversation]:
    convs = parse_locomo(synthesize(n, seed), source=f"synthetic(n={n}, seed={seed})")
    return [c for c in convs if split is None or c.split == split]


def call_ops(timeline: list[dict], dia_ids) -> list[dict]:
    """The oracle's net ops for one manager call, over the timeline events of its turns (`dia_ids`), in
    order: what a perfect manager does in that call, at most one op per memory.
    - a slot the call ADDs is one ADD of its last text (updates within the call fold into it), or
      nothing if the call deletes it again;
    - a memory from before the call is one UPDATE (to its last text), one DELETE, or one NONE when the
      call only restates it;
    - a memory deleted and then set again in the same call is a DELETE and an ADD.
    Each op is {"event", "slot", "text"}, plus "old_memory" (the text before the call) on ops of
    memories from before the call; ADDs come last."""
    existing: dict[str, dict] = {}     # slot -> op on a memory from before the call
    adds: dict[str, dict] = {}         # slot -> a memory this call adds
    for e in (e for e in timeline if e["dia_id"] in dia_ids):
        slot, event = e["slot"], e["event"]
        if event == "ADD":
            adds[slot] = {"event": "ADD", "slot": slot, "text": e["memory"]}
        elif slot in adds:             # a memory of this very call changes again
            if event == "UPDATE":
                adds[slot]["text"] = e["memory"]
            elif event == "DELETE":
                del adds[slot]
        else:
            op = existing.setdefault(slot, {"event": "NONE", "slot": slot, "text": e["old_memory"],
                                            "old_memory": e["old_memory"]})
            if event == "UPDATE":
                op.update(event="UPDATE", text=e["memory"])
            elif event == "DELETE":
                op.update(event="DELETE", text=op["old_memory"])
    return list(existing.values()) + list(adds.values())


def apply_oracle(timeline: list[dict]) -> dict[str, str]:
    """Replay the oracle ops on a plain dict (slot -> text), checking each op is legal."""
    state: dict[str, str] = {}
    for e in timeline:
        slot, event, old = e["slot"], e["event"], e.get("old_memory")
        if event == "ADD":
            if slot in state:
                raise ValueError(f"{e['dia_id']}: ADD to occupied slot {slot}")
            state[slot] = e["memory"]
        elif event in ("UPDATE", "DELETE", "NONE"):
            if state.get(slot) != old:
                raise ValueError(f"{e['dia_id']}: {event} expects {old!r} in {slot}, found {state.get(slot)!r}")
            if event == "UPDATE":
                state[slot] = e["memory"]
            elif event == "DELETE":
                del state[slot]
        else:
            raise ValueError(f"{e['dia_id']}: unknown event {event!r}")
    return state


def synth_cli(args) -> int:
    """`memr1 data synth --out PATH [--conversations N --seed S]`."""
    out = Path(args.out)
    # Only the file is created: a mistyped folder is an error, not a new directory tree.
    problem = ("is a directory" if out.is_dir() else
               f"its folder {out.parent} does not exist" if not out.parent.is_dir() else None)
    if problem or args.conversations < 1:
        print(f"error: --out {out}: {problem}" if problem else
              f"error: --conversations must be >= 1, got {args.conversations}", file=sys.stderr)
        return 2
    data = synthesize(args.conversations, args.seed)
    out.write_text(json.dumps(data, indent=1))
    n_turns = sum(len(v) for c in data for k, v in c["conversation"].items() if isinstance(v, list))
    n_qa = sum(len(c["qa"]) for c in data)
    splits = {s: sum(c["memr1_split"] == s for c in data) for s in ("train", "val", "test")}
    print(f"wrote {out}: {len(data)} conversations ({splits}), {n_turns} turns, {n_qa} questions")
    return 0
