"""The questions of a synthetic conversation (synthetic.py), asked at its end: their gold answers
follow each speaker's final state, a slot emptied by a DELETE is answered "none", and a few need two
memories (a pet total, the city of the one with a job). Phrase slots are asked the way LoCoMo asks
("Why did ...", "How does ... feel about ...", "What did ... do on ..."), with answers copied from the
memory. Categories use Mem0's numbering.
"""
from memr1.rl.task.data import synth_text as T


def slot_questions(name: str, slot: str, v: dict, memory: str | None, on_date: str) -> list[tuple]:
    """(question, answer, category, kind) about one slot's final state; `memory` is None when a
    DELETE emptied it, and the slot's main question then has the answer "none"."""
    date = date_answer(on_date)
    main = {
        "pet": (f"How many {T.plural(v.get('pet', ''), 2)} does {name} have?", v.get("n"), 1, "count"),
        "city": (f"Where does {name} live?", v.get("city"), 1, "city"),
        "job": (f"What is {name}'s job?", v.get("job"), 1, "job"),
        "sport": (f"What sport does {name} play?", v.get("sport"), 1, "sport"),
        "food": (f"What is {name}'s favorite food?", v.get("food"), 1, "food"),
        "car": (f"What car does {name} drive?", v.get("car"), 1, "car"),
        "instrument": (f"Which instrument is {name} learning?", v.get("instrument"), 1, "instrument"),
        "language": (f"Which language is {name} learning?", v.get("language"), 1, "language"),
        "trip": (f"Where is {name} planning to travel?", v.get("place"), 1, "trip"),
        "book": (f"Which book is {name} reading?", v.get("book"), 1, "book"),
        "friend": (f"Who is {name}'s best friend?", v.get("friend"), 1, "friend"),
        "dating": (f"Who is {name} dating?", v.get("date_name"), 1, "dating"),
        "sibling": (f"What is the name of {name}'s {v.get('relative')}?", v.get("sibling"), 1, "sibling"),
        "kid": (f"What is the name of {name}'s {v.get('child')}?", v.get("kid"), 1, "kid"),
        "allergy": (f"What is {name} allergic to?", v.get("allergen"), 1, "allergy"),
        "study": (f"What is {name} studying?", v.get("subject"), 1, "study"),
        "movie": (f"What is {name}'s favorite movie?", v.get("movie"), 1, "movie"),
        "race": (f"When did {name} run a {v.get('race')}?", date, 2, "race-date"),
        "concert": (f"When did {name} go to a {v.get('genre')} concert?", date, 2, "concert-date"),
        "hobby": (f"Why did {name} take up {v.get('hobby')}?", v.get("reason"), 1, "hobby-why"),
        "feeling": (f"How does {name} feel about {v.get('topic')}?", v.get("feeling"), 1, "feeling"),
        "activity": (f"When did {name} {T.ACTIVITIES.get(v.get('activity'))}?", date, 2, "activity-date"),
        "award": (f"What did {name} win at {v.get('contest')}?", v.get("prize"), 1, "award"),
    }[slot]
    if memory is None:
        return [(main[0], "none", main[2], main[3] + "-none")]
    out = [main]
    if slot == "city":
        out.append((f"In which country does {name} live?", T.CITIES[v["city"]], 4, "country"))
        if "moved" in memory:
            out.append((f"When did {name} move to {v['city']}?", date, 2, "move-date"))
    if slot == "job" and "started" in memory:
        out.append((f"When did {name} start working as a {v['job']}?", date, 2, "job-date"))
    if slot == "sport" and "every" in memory:
        out.append((f"On which day of the week does {name} play {v['sport']}?", v["day"], 1, "sport-day"))
    if slot == "activity" and on_date.startswith("on "):
        out.append((f"What did {name} do {on_date}?", v["activity"], 1, "activity-what"))
    if slot == "trip":
        out.append((f"In which month is {name}'s trip to {v['place']}?", v["month"], 2, "trip-month"))
    return out


def questions(people: dict, names: list[str]) -> list[dict]:
    """Questions whose answers follow the final state. Categories use Mem0's numbering."""
    qa = []

    def ask(question, answer, evidence, category, kind):
        qa.append({"question": question, "answer": str(answer), "evidence": evidence,
                   "category": category, "memr1_kind": kind})

    for name in names:
        p = people[name]
        for slot, v in p.v.items():
            src = p.source.get(slot)
            evidence = [src["dia_id"]] if src else [p.dropped[slot]]
            on_date = src["on_date"] if src else ""
            for question, answer, category, kind in slot_questions(name, slot, v, p.memory.get(slot), on_date):
                ask(question, answer, evidence, category, kind)
    a, b = (people[n] for n in names)
    if "pet" in a.source and "pet" in b.source:
        ask(f"How many pets do {a.name} and {b.name} have in total?", a.v["pet"]["n"] + b.v["pet"]["n"],
            [a.source["pet"]["dia_id"], b.source["pet"]["dia_id"]], 3, "pet-total")
    for p, q in ((a, b), (b, a)):
        if "job" in p.source and "city" in p.source and ("job" not in q.source or q.v["job"]["job"] != p.v["job"]["job"]):
            ask(f"Which city does the {p.v['job']['job']} among {a.name} and {b.name} live in?", p.v["city"]["city"],
                [p.source["job"]["dia_id"], p.source["city"]["dia_id"]], 3, "job-city")
    return qa


def date_answer(on_date: str) -> str:
    return on_date[3:] if on_date.startswith("on ") else on_date
