"""Vocabulary and sentence templates for the synthetic conversations (see synthetic.py).

Each fact template has a first-person turn (what the speaker says) and a third-person fact (what a
good extractor should write down, and what the memory bank should then hold). Several turn phrasings
per event keep the set varied; the facts stay in one canonical form so the oracle is exact.
"""
NAMES = ["Andrew", "Beatriz", "Chen", "Dmitri", "Elena", "Farah", "Gabriel", "Hana", "Ivan", "Jasmine",
         "Kofi", "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Samir", "Tessa",
         "Umar", "Valentina", "Wei", "Ximena", "Yusuf", "Zoe", "Liam", "Maya", "Noah", "Ingrid"]

CITIES = {"Boston": "United States", "Denver": "United States", "Austin": "United States",
          "Toronto": "Canada", "Vancouver": "Canada", "Lyon": "France", "Marseille": "France",
          "Munich": "Germany", "Hamburg": "Germany", "Osaka": "Japan", "Kyoto": "Japan",
          "Seville": "Spain", "Valencia": "Spain", "Dublin": "Ireland", "Cork": "Ireland",
          "Melbourne": "Australia", "Perth": "Australia", "Milan": "Italy", "Naples": "Italy",
          "Bergen": "Norway", "Porto": "Portugal", "Krakow": "Poland", "Auckland": "New Zealand"}
JOBS = ["nurse", "teacher", "chef", "plumber", "architect", "pilot", "librarian", "accountant",
        "photographer", "firefighter", "dentist", "electrician", "journalist", "pharmacist"]
SPORTS = ["tennis", "golf", "soccer", "basketball", "volleyball", "badminton", "squash", "rugby",
          "hockey", "baseball", "table tennis", "cricket"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
PARTNERS = ["sister", "brother", "neighbor", "cousin", "coworker", "best friend", "dad", "mom"]
FOODS = ["sushi", "tacos", "lasagna", "ramen", "pizza", "curry", "paella", "dumplings", "pho",
         "falafel", "risotto", "burritos", "pad thai", "goulash"]
PETS = ["dog", "cat", "rabbit", "parrot", "hamster", "turtle", "ferret", "goldfish"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]


def plural(pet: str, n: int) -> str:
    if n == 1 or pet == "goldfish":
        return pet
    return pet + "s"


# Relative time words and how they resolve against the session date; "" means "that day".
WHEN = ["", " yesterday", " last week"]

# event kind -> list of turn templates. Fields: {pet} {pets} {n} {city} {job} {sport} {day} {partner}
# {food} {old} {when}.
TURNS = {
    "pet_add": ["I adopted a {pet} from the shelter! Meet my new best friend.",
                "Big news: there is a {pet} living with me now.",
                "I finally got a {pet}, I've wanted one for years."],
    "pet_more": ["We adopted another {pet}, so now I have {n} {pets} at home!",
                 "Guess what, {n} {pets} now! I couldn't resist one more.",
                 "The family grew again: I'm up to {n} {pets}."],
    "pet_same": ["My {n} {pets} keep me company every evening.",
                 "The {pets} are doing great, all {n} of them.",
                 "Still have my {n} {pets}, they are so cheeky."],
    "city_add": ["Things are good here in {city}, the weather has been lovely.",
                 "I live in {city}, so there's always something going on.",
                 "Life in {city} is busy as usual."],
    "city_move": ["I moved to {city}{when}! Unpacking is taking forever.",
                  "Big change: I relocated to {city}{when}.",
                  "Packed everything up and moved to {city}{when}."],
    "city_same": ["{city} really feels like home now.",
                  "I still love living in {city}.",
                  "Nothing beats an evening walk in {city}, where I live."],
    "job_add": ["Work as a {job} keeps me busy these days.",
                "I work as a {job}, long shifts but rewarding.",
                "I'm a {job}, and I like it."],
    "job_new": ["I started a new job as a {job}{when}!",
                "Started working as a {job}{when}, so exciting.",
                "New chapter: I began work as a {job}{when}."],
    "job_quit": ["I quit my job as a {job}, I needed a break.",
                 "I'm no longer a {job}, I handed in my notice.",
                 "Left my {job} position for good."],
    "job_same": ["Another long week as a {job}, but I love it.",
                 "Being a {job} is tiring, still my calling though.",
                 "Work as a {job} has been hectic."],
    "sport_add": ["I've been playing a lot of {sport} lately.",
                  "I picked up {sport}, it's so much fun.",
                  "{sport} is my new hobby, I play whenever I can."],
    "sport_more": ["I now play {sport} every {day} with my {partner}.",
                   "My {partner} and I have a {sport} match every {day}.",
                   "Every {day} I play {sport} with my {partner} now."],
    "sport_same": ["{sport} is still the best way for me to unwind.",
                   "Played some {sport} again, love that game.",
                   "Can't get enough of {sport}."],
    "food_add": ["Nothing beats {food}, it's my favorite food.",
                 "My favorite food? {food}, easily.",
                 "I could eat {food} every day, it's my favorite."],
    "food_change": ["Honestly I'm over {old}, {food} is my new favorite food.",
                    "New favorite food: {food}. Sorry {old}, you're out.",
                    "I used to love {old} but now {food} is my favorite."],
    "food_same": ["Had {food} again tonight, still my favorite.",
                  "{food} remains my favorite dish.",
                  "Still can't get enough {food}, my favorite."],
}

# event kind -> canonical third-person fact (what extraction should yield and the memory should hold).
FACTS = {
    "pet_add": "{name} has 1 {pet}",
    "pet_more": "{name} has {n} {pets}",
    "pet_same": "{name} has {n} {pets}",
    "city_add": "{name} lives in {city}",
    "city_move": "{name} moved to {city} {on_date}",
    "city_same": "{name} lives in {city}",
    "job_add": "{name} works as a {job}",
    "job_new": "{name} started working as a {job} {on_date}",
    "job_quit": "{name} quit the job as a {job}",
    "job_same": "{name} works as a {job}",
    "sport_add": "{name} plays {sport}",
    "sport_more": "{name} plays {sport} every {day} with their {partner}",
    "sport_same": "{name} plays {sport}",
    "food_add": "{name}'s favorite food is {food}",
    "food_change": "{name}'s favorite food is {food}",
    "food_same": "{name}'s favorite food is {food}",
}

CHITCHAT = ["Haha, that's great to hear!", "Oh wow, tell me more.", "How has your week been?",
            "I've been pretty tired lately, to be honest.", "That sounds like a lot of fun.",
            "Nice! I'm happy for you.", "Anyway, what else is new?", "Ha, typical!",
            "I know what you mean.", "Same here, it's been a long month.", "Oh no, that's rough.",
            "Thanks for asking, all good here.", "Can't believe how fast time goes.",
            "Let's catch up again soon!", "Good talking to you, as always."]
OPENERS = ["Hey {other}! Good to see you.", "Hi {other}, long time no talk!",
           "{other}! How are you doing?", "Hey {other}, got a minute to chat?"]
