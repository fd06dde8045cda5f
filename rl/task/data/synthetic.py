"""Synthetic multi-session dialogues with a known fact timeline, written in LoCoMo's JSON layout.

Two speakers chat over a few dated sessions. Each speaker has many distinct facts (seven to eleven
slots of twenty-three: pets, home, job, car, a planned trip, a sister, a race they ran, why they took up
a hobby, how they feel about something, what they did on a day, ...), so most
fact-bearing turns introduce something new (ADD), as in real dialogue. Some facts change (UPDATE: a
move, a new job, a second pet), some stop being true (DELETE: a quit job, a sold car, a cancelled
trip), and some are restated, often with less detail than the memory holds (NONE: "I still love
living in Denver" after "moved to Denver on 3 May"). Chit-chat turns carry no fact. Questions are
asked at the end and their gold answers follow the LATEST state: "How many dogs does Andrew have?"
after a second adoption is "2", and "What car does Andrew drive?" after he sold it is "none".

So every op kind changes an answer: a missed ADD loses a fact, an ADD instead of an UPDATE keeps a
stale value beside the new one, a missed DELETE keeps a fact that is no longer true, and an UPDATE
with a restatement loses detail that a question asks for (a move's date, a weekly match's day).

Extra keys next to LoCoMo's: `memr1_split` (train/val/test by conversation index: 8/1/1 of every 10),
`memr1_kind` on each question, and `memr1_oracle` with
- `timeline`: one entry per fact-bearing turn, in dialogue order: `dia_id`, `speaker`, `slot`,
  `event` (ADD/UPDATE/DELETE/NONE, the manager's vocabulary), `fact` (what extraction should yield),
  `memory` (the slot's text after the event; for DELETE and NONE the text kept or removed),
  `old_memory` (before), `date`.
- `final_facts`: slot -> memory text after the last turn.
Conversation i depends only on (seed, i), so `synthesize(5)` is a prefix of `synthesize(50)`.
"""
import datetime as dt
import random

from memr1.rl.task.data import synth_text as T
from memr1.rl.task.data.synth_questions import questions

EVENT_OF = {"add": "ADD", "more": "UPDATE", "move": "UPDATE", "new": "UPDATE", "change": "UPDATE",
            "detail": "UPDATE", "quit": "DELETE", "sold": "DELETE", "cancel": "DELETE", "same": "NONE"}
REDRAW = {"add", "move", "new", "change"}   # events that draw the slot's main value anew


def _slot_plan(rng: random.Random) -> dict[str, list[str]]:
    """Which event kinds each chosen slot goes through, in order."""
    pick = rng.choice
    plans = {
        "pet": ["pet_add"] + ["pet_more"] * pick([0, 0, 1, 2]) + ["pet_same"] * rng.randint(0, 1),
        "city": [pick(["city_add", "city_move"])] + ["city_move"] * pick([0, 0, 1]) + ["city_same"] * rng.randint(0, 1),
        "job": ["job_add"] + pick([[], [], ["job_same"], ["job_quit"], ["job_quit", "job_new"], ["job_new"]]),
        "sport": ["sport_add"] + ["sport_detail"] * rng.randint(0, 1) + ["sport_same"] * rng.randint(0, 1),
        "food": ["food_add"] + ["food_change"] * pick([0, 0, 1]) + ["food_same"] * rng.randint(0, 1),
        "car": ["car_add"] + pick([[], [], ["car_new"], ["car_sold"]]),
        "instrument": ["instrument_add"] + pick([[], ["instrument_same"], ["instrument_quit"]]),
        "language": ["language_add"] + pick([[], [], ["language_same"]]),
        "trip": ["trip_add"] + pick([[], [], ["trip_change"], ["trip_cancel"]]),
        "book": ["book_add"] + pick([[], ["book_new"]]),
        "friend": ["friend_add"],
        "dating": ["dating_add"] + pick([[], [], ["dating_quit"]]),
        "sibling": ["sibling_add"] + pick([[], [], ["sibling_same"]]),
        "kid": ["kid_add"],
        "allergy": ["allergy_add"] + pick([[], ["allergy_same"]]),
        "study": ["study_add"] + pick([[], [], ["study_quit"]]),
        "movie": ["movie_add"] + pick([[], ["movie_change"]]),
        "race": ["race_add"],
        "concert": ["concert_add"],
        "hobby": ["hobby_add"] + ["hobby_same"] * rng.randint(0, 1),
        "feeling": ["feeling_add"] + pick([[], ["feeling_change"]]),
        "activity": ["activity_add"],
        "award": ["award_add"],
    }
    chosen = rng.sample(sorted(plans), rng.randint(7, 11))
    return {k: plans[k] for k in chosen}


def split_for(index: int) -> str:
    """Built-in split by conversation index: of every ten, eight train, one val, one test."""
    return {8: "val", 9: "test"}.get(index % 10, "train")


def fmt_date(d: dt.date) -> str:
    return f"{d.day} {T.MONTHS[d.month - 1]} {d.year}"


def _fmt_datetime(d: dt.date, rng: random.Random) -> str:
    hour, minute = rng.randint(1, 12), rng.randint(0, 59)
    return f"{hour}:{minute:02d} {rng.choice(['am', 'pm'])} on {d.day} {T.MONTHS[d.month - 1]}, {d.year}"


class Dialogue:
    """A LoCoMo-format conversation between two speakers, written session by session (budget.py writes
    its dialogues with it too). Sessions are 3 to 40 days apart; each opens with a greeting and closes
    with a chitchat turn, and turns alternate: the other speaker chats between two turns of one."""

    def __init__(self, rng: random.Random, names: list[str]):
        self.rng, self.names = rng, names
        self.other = {names[0]: names[1], names[1]: names[0]}
        self.conv: dict = {"speaker_a": names[0], "speaker_b": names[1]}
        self.date = dt.date(2022, 1, 1) + dt.timedelta(days=rng.randint(0, 500))
        self.session, self.turns = 0, []

    def open_session(self) -> dt.date:
        """Start the next session with its greeting; returns its date."""
        self.session += 1
        self.date += dt.timedelta(days=self.rng.randint(3, 40))
        self.conv[f"session_{self.session}_date_time"] = _fmt_datetime(self.date, self.rng)
        self.turns = []
        opener = self.rng.choice(self.names)
        self.say(opener, self.rng.choice(T.OPENERS).format(other=self.other[opener]))
        return self.date

    def say(self, speaker: str, text: str) -> str:
        """Append a turn; returns its dia_id."""
        dia_id = f"D{self.session}:{len(self.turns) + 1}"
        self.turns.append({"speaker": speaker, "dia_id": dia_id, "text": text[0].upper() + text[1:]})
        return dia_id

    def alternate(self, speaker: str) -> None:
        """Before `speaker`'s turn: the other speaker chats first if `speaker` spoke last."""
        if self.turns[-1]["speaker"] == speaker:
            self.say(self.other[speaker], self.rng.choice(T.CHITCHAT))

    def chat_back(self, speaker: str) -> None:
        """After `speaker`'s fact, the other speaker answers with chitchat half the time."""
        if self.rng.random() < 0.5:
            self.say(self.other[speaker], self.rng.choice(T.CHITCHAT))

    def close_session(self) -> None:
        self.say(self.other[self.turns[-1]["speaker"]], self.rng.choice(T.CHITCHAT))
        self.conv[f"session_{self.session}"] = self.turns


class _Speaker:
    """One speaker's hidden persona state while the dialogue is written."""

    def __init__(self, name: str, rng: random.Random):
        self.name, self.rng = name, rng
        self.v: dict[str, dict] = {}          # slot -> its fields (kept after a DELETE, for the question)
        self.memory: dict[str, str] = {}      # slot -> current memory text
        self.source: dict[str, dict] = {}     # slot -> {"dia_id", "on_date"} of the event that set it
        self.dropped: dict[str, str] = {}     # slot -> dia_id of the DELETE that emptied it
        self.people: set[str] = set()         # names already given to someone in this persona

    def _draw(self, field: str, avoid) -> str:
        pool = [x for x in T.VOCAB[field] if x != avoid and not (T.VOCAB[field] is T.OTHERS and x in self.people)]
        value = self.rng.choice(pool)
        if T.VOCAB[field] is T.OTHERS:
            self.people.add(value)
        return value

    def fill(self, kind: str, date: dt.date) -> dict:
        """Draw the new values this event introduces and return the template fields."""
        slot, what = kind.split("_")
        v, main = self.v.setdefault(slot, {}), T.MAIN[slot]
        old = v.get(main)
        if what in REDRAW:
            if kind == "trip_change":
                v["month"] = self._draw("month", v["month"])
            else:
                v[main] = self._draw(main, old)
            if what == "add":
                v.update({f: self._draw(f, None) for f in T.EXTRA.get(slot, ())})
                v["n"] = 1
        elif what == "more":
            v["n"] += 1
        elif what == "detail":
            v["day"], v["partner"] = self._draw("day", None), self._draw("partner", None)
        when = self.rng.choice(T.WHEN) if kind in T.DATED else ""
        if when == " yesterday":
            on_date = "on " + fmt_date(date - dt.timedelta(days=1))
        elif when == " last week":
            on_date = "the week before " + fmt_date(date)
        else:
            on_date = "on " + fmt_date(date)
        pet = v.get("pet", "")
        return dict(v, name=self.name, old=old, when=when, on_date=on_date, pets=T.plural(pet, v.get("n", 1)),
                    pets_any=T.plural(pet, 2))


def _one_conversation(seed: int, index: int) -> dict:
    rng = random.Random(f"memr1-synth:{seed}:{index}")
    names = rng.sample(T.NAMES, 2)
    people = {n: _Speaker(n, rng) for n in names}
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

    timeline = []
    dialogue = Dialogue(rng, names)
    for chunk in chunks:
        date = dialogue.open_session()
        for name, slot, kind in chunk:
            dialogue.alternate(name)
            person = people[name]
            fields = person.fill(kind, date)
            dia_id = dialogue.say(name, rng.choice(T.TURNS[kind]).format(**fields))
            fact = T.FACTS[kind].format(**fields)
            event = EVENT_OF[kind.split("_")[1]]
            old = person.memory.get(slot)
            if event == "UPDATE" and old is None:
                event = "ADD"   # e.g. a move mentioned before any home city was known, a job after quitting
            entry = {"dia_id": dia_id, "speaker": name, "slot": f"{name}/{slot}", "event": event,
                     "fact": fact, "memory": fact if event in ("ADD", "UPDATE") else old,
                     "date": fmt_date(date)}
            if old is not None:
                entry["old_memory"] = old
            timeline.append(entry)
            if event in ("ADD", "UPDATE"):
                person.memory[slot] = fact
                person.source[slot] = {"dia_id": dia_id, "on_date": fields["on_date"]}
                person.dropped.pop(slot, None)
            elif event == "DELETE":
                del person.memory[slot]
                person.source.pop(slot)
                person.dropped[slot] = dia_id
            dialogue.chat_back(name)
        dialogue.close_session()

    final = {f"{n}/{slot}": text for n in names for slot, text in people[n].memory.items()}
    return {"sample_id": f"synth-{seed}-{index:04d}", "conversation": dialogue.conv,
            "qa": questions(people, names),
            "memr1_split": split_for(index),
            "memr1_oracle": {"timeline": timeline, "final_facts": final}}


def synthesize(n: int = 20, seed: int = 0) -> list[dict]:
    """`n` conversations as LoCoMo-format dicts (JSON-ready)."""
    if n < 1:
        raise ValueError(f"number of conversations must be >= 1, got {n}")
    return [_one_conversation(seed, i) for i in range(n)]


def call_ops(timeline: list[dict], dia_ids) -> list[dict]:
    """The oracle's net ops for one manager call, over the timeline events of its turns (`dia_ids`): what
    a perfect manager does in that call, at most one op per memory.
    - a slot the call ADDs is one ADD of its last text (updates within the call fold into it), or
      nothing if the call deletes it again;
    - a memory from before the call is one UPDATE (to its last text), one DELETE, or one NONE when the
      call only restates it;
    - a memory deleted and then set again in the same call is a DELETE and an ADD.
    Each op is {"event", "slot", "text", "fact"}, plus "old_memory" (the text before the call) on ops
    of memories from before the call; "fact" is the fact of the op's last event. Ops come in the order
    of their last events, which is the order of the call's facts."""
    existing: dict[str, dict] = {}     # slot -> op on a memory from before the call
    adds: dict[str, dict] = {}         # slot -> a memory this call adds
    last: dict[int, int] = {}          # id(op) -> index of its last event
    for n, e in enumerate(e for e in timeline if e["dia_id"] in dia_ids):
        slot, event, fact = e["slot"], e["event"], e.get("fact", e["memory"])
        if event == "ADD":
            op = adds[slot] = {"event": "ADD", "slot": slot, "text": e["memory"], "fact": fact}
        elif slot in adds:             # a memory of this very call changes again
            op = adds[slot]
            op["fact"] = fact
            if event == "UPDATE":
                op["text"] = e["memory"]
            elif event == "DELETE":
                del adds[slot]
        else:
            op = existing.setdefault(slot, {"event": "NONE", "slot": slot, "text": e["old_memory"], "fact": fact,
                                            "old_memory": e["old_memory"]})
            op["fact"] = fact
            if event == "UPDATE":
                op.update(event="UPDATE", text=e["memory"])
            elif event == "DELETE":
                op.update(event="DELETE", text=op["old_memory"])
        last[id(op)] = n
    return sorted([*existing.values(), *adds.values()], key=lambda op: last[id(op)])
