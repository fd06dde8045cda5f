"""The budgeted task (`data.kind = "budget"`, configs/budget.toml): memory under a retrieval budget,
built so that memory operations pay as they do in real memory systems, through what a bounded
retrieval can show and through history a destructive edit would lose.

On the default synthetic set (synthetic.py) facts arrive already merged and an append-only bank still
holds every answer in its top 5. Here each speaker has three kinds of slot:
- *changing* slots (home city, job, car) take 2 to 4 values over the dialogue. An ADD-every-fact bank
  holds one memory per value, and a question about the slot competes with all of them for the top-k;
  the oracle holds one memory with the current value and, newest first, the ones before it
  ("Rosa lives in Denver since 3 May 2023; before that in Austin, and before that in Boston");
- *delta* slots (pets adopted one at a time, trips taken) arrive as deltas ("adopted another dog
  named Max") that the oracle merges into one memory ("Rosa has 2 dogs: Rex and Max"); a count needs
  every delta in view, or the merged memory;
- *static* slots (favourite food, a book, an allergy, ...) are said once and never change: the filler
  every real bank has, which competes for the same budget.
Questions ask about current values, about past values ("Where did Rosa live before moving to Denver?",
so an UPDATE that drops the history costs), about when a change happened, and about merged counts.
No fact is deleted: DELETE is the default set's subject, and this task isolates what retrieval budgets
make of UPDATE and merging.

Distributions and their reasons (LoCoMo's train and val conversations, never test, where a statistic
exists; the test split is not read):
- facts per speaker per session: LoCoMo's observations give 4.4 and 4.8 per speaker and session; here
  a speaker has 2-3 changing, 1-2 delta and 3-4 static slots (about 15 facts) over 3-4 sessions,
  about 4.3 per session;
- values per changing slot, 2-4 (uniform), and events per delta slot, 1-4: LoCoMo annotates no fact
  changes, so these are chosen to exceed the retrieval budget (top-3 per speaker in budget.toml): an
  append-only bank cannot show a slot's whole history, the oracle's one memory can;
- question kinds: time questions are 27% of LoCoMo's train and val questions (63 of 233 outside the
  adversarial category); here past values and dates are about a third of the questions, because they
  are what this task tests; current values about 45%, merged counts and first items the rest.
Layout and oracle are synthetic.py's (LoCoMo JSON, `memr1_split`, `memr1_kind`, `memr1_oracle` with
`timeline` and `final_facts`), so every loader, oracle and evaluation path reads it unchanged; sample
ids are `budget-<seed>-<index>`, so caches never mix it with the default set. Conversation i depends
only on (seed, i).
"""
import random

from memr1.rl.task.data import synth_text as T
from memr1.rl.task.data.synthetic import Dialogue, fmt_date, split_for

PET_NAMES = ["Rex", "Max", "Bo", "Luna", "Milo", "Nala", "Ziggy", "Pepper", "Olive", "Biscuit", "Mochi", "Juno"]

# slot -> vocabulary field, turn templates for the first value and for a change, the extracted fact of
# each, the oracle's merged memory, and the questions (now / before / when).
CHANGING = {
    "city": dict(vocab="city",
                 first=["Life in {v} is good, I've been here a while now.", "I live in {v}, it's a lovely place."],
                 change=["Big news: I moved to {v}! Boxes everywhere.", "We just moved to {v}, new chapter!"],
                 fact_first="{name} lives in {v}", fact_change="{name} moved to {v} on {date}",
                 memory="{name} lives in {v} since {date}", past=" in {p}",
                 now="Where does {name} live?", before="Where did {name} live before moving to {v}?",
                 when="When did {name} move to {v}?"),
    "job": dict(vocab="job",
                first=["I work as {a_v}, it keeps me busy.", "Being {a_v} is hard work but I like it."],
                change=["I started a new job as {a_v}!", "Guess what, I'm {a_v} now, started this week."],
                fact_first="{name} works as {a_v}", fact_change="{name} started working as {a_v} on {date}",
                memory="{name} works as {a_v} since {date}", past=" as {a_p}",
                now="What is {name}'s job?", before="What was {name}'s job before becoming {a_v}?",
                when="When did {name} start working as {a_v}?"),
    "car": dict(vocab="car",
                first=["I drive a {v}, it never lets me down.", "My {v} got me through the snow again."],
                change=["I sold the {old} and bought a {v}!", "Out with the {old}: I drive a {v} now."],
                fact_first="{name} drives a {v}", fact_change="{name} bought a {v} on {date}",
                memory="{name} drives a {v} since {date}", past=" a {p}",
                now="What car does {name} drive?", before="What car did {name} drive before the {v}?",
                when="When did {name} buy the {v}?"),
}
DELTA = {
    "pet": dict(first=["I adopted a {kind} named {x}!", "Meet {x}, my new {kind} from the shelter."],
                more=["We adopted another {kind}, {x}!", "Say hi to {x}, our newest {kind}."],
                fact_first="{name} adopted a {kind} named {x}", fact_more="{name} adopted another {kind} named {x}",
                memory="{name} has {n} {kinds}: {xs}",
                count="How many {kinds} does {name} have?", first_q="What is the name of {name}'s first {kind}?"),
    "trip": dict(first=["Just got back from {x}, what a trip!", "I spent a week in {x}, loved it."],
                 more=["Another trip done: {x} this time!", "Back from {x}, my second home now."],
                 fact_first="{name} took a trip to {x}", fact_more="{name} took another trip, to {x}",
                 memory="{name} has taken {n} trips: to {xs}",
                 count="How many trips has {name} taken?", first_q="Where did {name} go on the first trip?"),
}
STATIC = {
    "food": ("food", "My favorite food is {v}, no contest.", "{name}'s favorite food is {v}",
             "What is {name}'s favorite food?"),
    "book": ("book", "I'm reading {v} at the moment.", "{name} is reading {v}", "Which book is {name} reading?"),
    "movie": ("movie", "{v} is my all-time favorite movie.", "{name}'s favorite movie is {v}",
              "What is {name}'s favorite movie?"),
    "sport": ("sport", "I play {v} most weekends.", "{name} plays {v}", "What sport does {name} play?"),
    "instrument": ("instrument", "I'm learning the {v}.", "{name} is learning the {v}",
                   "Which instrument is {name} learning?"),
    "allergy": ("allergen", "I'm allergic to {v}, sadly.", "{name} is allergic to {v}", "What is {name} allergic to?"),
    "friend": ("friend", "My best friend {v} came over for dinner.", "{name}'s best friend is {v}",
               "Who is {name}'s best friend?"),
}


def fill(template: str, **fields) -> str:
    """`template` with `fields`, plus `a_v` / `a_p`: the value with its article ("an architect")."""
    for key in ("v", "p"):
        if key in fields:
            fields[f"a_{key}"] = ("an " if fields[key][:1].lower() in "aeiou" else "a ") + fields[key]
    return template.format(**fields)


def join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def changing_memory(spec: dict, name: str, values: list[str], date: str) -> str:
    """The oracle's one memory of a changing slot: the current value, then the earlier ones, newest first."""
    if len(values) == 1:
        return fill(spec["fact_first"], name=name, v=values[0])
    earlier = [fill(spec["past"], p=p) for p in reversed(values[:-1])]
    return (fill(spec["memory"], name=name, v=values[-1], date=date) + "; before that" + earlier[0]
            + "".join(", and before that" + e for e in earlier[1:]))


def _streams(rng: random.Random, name: str) -> list[list[tuple]]:
    """One list of (speaker, slot, step, value) per slot the speaker has, in the slot's own order."""
    out, taken = [], set()

    def draw(field: str) -> str:
        value = rng.choice([x for x in T.VOCAB[field] if x not in taken])
        taken.add(value)
        return value

    for slot in rng.sample(sorted(CHANGING), rng.randint(2, 3)):
        out.append([(name, slot, k, draw(CHANGING[slot]["vocab"])) for k in range(rng.randint(2, 4))])
    for slot in rng.sample(sorted(DELTA), rng.randint(1, 2)):
        pool = PET_NAMES if slot == "pet" else T.VOCAB["place"]
        out.append([(name, slot, k, x) for k, x in enumerate(rng.sample(pool, rng.randint(1, 4)))])
    for slot in rng.sample(sorted(STATIC), rng.randint(3, 4)):
        out.append([(name, slot, 0, draw(STATIC[slot][0]))])
    return out


def _one_conversation(seed: int, index: int) -> dict:
    rng = random.Random(f"memr1-budget:{seed}:{index}")
    names = rng.sample(T.NAMES, 2)
    pet_kind = {n: rng.choice(T.VOCAB["pet"]) for n in names}
    n_sessions = rng.randint(3, 4)
    # Each event of a slot falls in a session of its own, in order (nobody moves twice between two chats);
    # within a session the slots' events come in random order.
    chunks: list[list[tuple]] = [[] for _ in range(n_sessions)]
    for stream in (s for n in names for s in _streams(rng, n)):
        stream = stream[:n_sessions]
        for event, session in zip(stream, sorted(rng.sample(range(n_sessions), len(stream)))):
            chunks[session].append(event)
    for chunk in chunks:
        rng.shuffle(chunk)

    timeline = []
    history: dict[str, list[tuple[str, str, str]]] = {}   # "<name>/<slot>" -> (value, date, dia_id) per event
    memory: dict[str, str] = {}
    dialogue = Dialogue(rng, names)
    for chunk in chunks:
        day = fmt_date(dialogue.open_session())
        for name, slot, step, value in chunk:
            dialogue.alternate(name)
            key = f"{name}/{slot}"
            past = history.setdefault(key, [])
            values = [v for v, _, _ in past] + [value]
            if slot in CHANGING:
                spec = CHANGING[slot]
                text = fill(rng.choice(spec["first" if step == 0 else "change"]), v=value, old=past[-1][0] if past else "")
                fact = fill(spec["fact_first" if step == 0 else "fact_change"], name=name, v=value, date=day)
                merged = changing_memory(spec, name, values, day)
            elif slot in DELTA:
                spec, kind = DELTA[slot], pet_kind[name]
                text = rng.choice(spec["first" if step == 0 else "more"]).format(x=value, kind=kind)
                fact = spec["fact_first" if step == 0 else "fact_more"].format(name=name, x=value, kind=kind)
                merged = fact if step == 0 else spec["memory"].format(
                    name=name, n=len(values), kinds=T.plural(kind, len(values)), xs=join(values))
            else:
                _, turn, fact_t, _ = STATIC[slot]
                text, fact = turn.format(v=value), fact_t.format(name=name, v=value)
                merged = fact
            dia_id = dialogue.say(name, text)
            past.append((value, day, dia_id))
            entry = {"dia_id": dia_id, "speaker": name, "slot": key, "event": "ADD" if step == 0 else "UPDATE",
                     "fact": fact, "memory": merged, "date": day}
            if key in memory:
                entry["old_memory"] = memory[key]
            memory[key] = merged
            timeline.append(entry)
            dialogue.chat_back(name)
        dialogue.close_session()

    return {"sample_id": f"budget-{seed}-{index:04d}", "conversation": dialogue.conv,
            "qa": _questions(history, pet_kind, rng), "memr1_split": split_for(index),
            "memr1_oracle": {"timeline": timeline, "final_facts": dict(memory)}}


def _questions(history: dict, pet_kind: dict, rng: random.Random) -> list[dict]:
    """Current values, one past value and the date of the latest change per changing slot, counts and
    first items of delta slots. Categories use Mem0's numbering (1 single-hop, 2 temporal, 3 multi-hop)."""
    qa = []

    def ask(question, answer, evidence, category, kind):
        qa.append({"question": question, "answer": str(answer), "evidence": evidence, "category": category,
                   "memr1_kind": kind})

    for key, past in history.items():
        name, slot = key.split("/")
        values, ids = [v for v, _, _ in past], [i for _, _, i in past]
        if slot in CHANGING:
            spec = CHANGING[slot]
            ask(fill(spec["now"], name=name), values[-1], [ids[-1]], 1, f"{slot}-now")
            if len(values) > 1:
                j = rng.randint(1, len(values) - 1)   # the change asked about
                ask(fill(spec["before"], name=name, v=values[j]), values[j - 1], [ids[j - 1], ids[j]], 2,
                    f"{slot}-before")
                # when the current value came: the date the oracle's merged memory keeps
                ask(fill(spec["when"], name=name, v=values[-1]), past[-1][1], [ids[-1]], 2, f"{slot}-when")
        elif slot in DELTA:
            spec, kind = DELTA[slot], pet_kind[name]
            ask(spec["count"].format(name=name, kinds=T.plural(kind, 2)), len(values), ids, 3, f"{slot}-count")
            ask(spec["first_q"].format(name=name, kind=kind), values[0], [ids[0]], 1, f"{slot}-first")
        else:
            ask(STATIC[slot][3].format(name=name), values[0], [ids[0]], 1, slot)
    return qa


def synthesize_budget(n: int = 20, seed: int = 0) -> list[dict]:
    """`n` budgeted-task conversations as LoCoMo-format dicts (JSON-ready)."""
    if n < 1:
        raise ValueError(f"number of conversations must be >= 1, got {n}")
    return [_one_conversation(seed, i) for i in range(n)]
