"""Vocabulary and sentence templates for the synthetic conversations (see synthetic.py).

A speaker's persona is a set of slots (pet, home city, job, car, a planned trip, a sister's name, a
race they ran, ...). Four of them carry a phrase rather than a single value (why a hobby was taken up,
how the speaker feels about something, what they did on a day, what they won), so that some answers are
short phrases copied from a memory, as most of LoCoMo's are, and the questions ask "why", "how" and
"what did ... do" as LoCoMo's do. Each event kind `<slot>_<what>` has first-person turn templates (what the speaker
says) and one canonical third-person fact (what a good extractor writes down, and what the memory
bank should then hold). Several turn phrasings per event keep the set varied; the facts stay in one
form so the oracle is exact. A restatement (`_same`) may say less than the memory holds ("I still
play tennis" after "every Monday with my sister"): overwriting the memory with it loses the detail.
"""
NAMES = ["Andrew", "Beatriz", "Chen", "Dmitri", "Elena", "Farah", "Gabriel", "Hana", "Ivan", "Jasmine",
         "Kofi", "Lena", "Mateo", "Nadia", "Oscar", "Priya", "Quinn", "Rosa", "Samir", "Tessa",
         "Umar", "Valentina", "Wei", "Ximena", "Yusuf", "Zoe", "Liam", "Maya", "Noah", "Ingrid"]
# Names of people the speakers talk about: never a speaker's name, so "who" answers are unambiguous, and
# given to sisters, sons and dates alike.
OTHERS = ["Alex", "Sam", "Robin", "Jordan", "Casey", "Riley", "Avery", "Morgan", "Jamie", "Taylor", "Charlie",
          "Drew", "Emery", "Frankie", "Harper", "Jesse", "Kai", "Logan", "Parker", "Reese", "Rowan", "Skyler"]

CITIES = {"Boston": "United States", "Denver": "United States", "Austin": "United States",
          "Toronto": "Canada", "Vancouver": "Canada", "Lyon": "France", "Marseille": "France",
          "Munich": "Germany", "Hamburg": "Germany", "Osaka": "Japan", "Kyoto": "Japan",
          "Seville": "Spain", "Valencia": "Spain", "Dublin": "Ireland", "Cork": "Ireland",
          "Melbourne": "Australia", "Perth": "Australia", "Milan": "Italy", "Naples": "Italy",
          "Bergen": "Norway", "Porto": "Portugal", "Krakow": "Poland", "Auckland": "New Zealand"}
# An activity as a memory states it -> as a question asks about it ("When did Rosa <this>?").
ACTIVITIES = {"volunteered at an animal shelter": "volunteer at an animal shelter",
              "attended a pottery workshop": "attend a pottery workshop",
              "went camping with family": "go camping with family", "joined a book club": "join a book club",
              "gave a talk at school": "give a talk at school", "visited an art museum": "visit an art museum",
              "helped at a food bank": "help at a food bank", "painted a mural": "paint a mural",
              "hosted a game night": "host a game night", "planted a vegetable garden": "plant a vegetable garden"}
VOCAB = {
    "pet": ["dog", "cat", "rabbit", "parrot", "hamster", "turtle", "ferret", "goldfish"],
    "city": sorted(CITIES),
    "job": ["nurse", "teacher", "chef", "plumber", "architect", "pilot", "librarian", "accountant",
            "photographer", "firefighter", "dentist", "electrician", "journalist", "pharmacist"],
    "sport": ["tennis", "golf", "soccer", "basketball", "volleyball", "badminton", "squash", "rugby",
              "hockey", "baseball", "table tennis", "cricket"],
    "day": ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"],
    "partner": ["sister", "brother", "neighbor", "cousin", "coworker", "best friend", "dad", "mom"],
    "food": ["sushi", "tacos", "lasagna", "ramen", "pizza", "curry", "paella", "dumplings", "pho",
             "falafel", "risotto", "burritos", "pad thai", "goulash"],
    "car": ["Toyota", "Honda", "Volvo", "Subaru", "Mazda", "Tesla", "Ford", "Kia", "Skoda", "Fiat"],
    "instrument": ["piano", "violin", "guitar", "cello", "flute", "drums", "saxophone", "ukulele"],
    "language": ["Spanish", "Japanese", "German", "Italian", "Korean", "Portuguese", "Arabic", "Greek",
                 "Dutch", "Turkish"],
    "place": ["Lisbon", "Rome", "Cairo", "Lima", "Hanoi", "Prague", "Oslo", "Athens", "Bali", "Iceland",
              "Morocco", "Chile"],
    "month": ["January", "February", "March", "April", "May", "June", "July", "August", "September",
              "October", "November", "December"],
    "book": ["Dune", "Emma", "Beloved", "Rebecca", "Middlemarch", "Persuasion", "Frankenstein", "Dracula",
             "Walden", "Ivanhoe", "Jane Eyre", "Moby Dick"],
    "friend": OTHERS,
    "date_name": OTHERS,
    "sibling": OTHERS,
    "relative": ["sister", "brother"],
    "kid": OTHERS,
    "child": ["daughter", "son"],
    "allergen": ["peanuts", "shellfish", "pollen", "cats", "penicillin", "bees", "dust", "gluten"],
    "subject": ["economics", "biology", "law", "history", "graphic design", "nursing", "chemistry",
                "philosophy", "statistics"],
    "movie": ["Up", "Jaws", "Alien", "Heat", "Amelie", "Coco", "Rocky", "Psycho", "Fargo", "Vertigo"],
    "race": ["half marathon", "10k race", "triathlon", "charity run"],
    "genre": ["jazz", "rock", "pop", "folk", "techno", "blues"],
    "hobby": ["pottery", "yoga", "painting", "gardening", "baking", "hiking", "photography", "knitting",
              "rock climbing", "journaling"],
    "reason": ["to relieve stress", "to meet new people", "to stay healthy", "to clear the mind",
               "to be more creative", "to spend time outdoors", "to unwind after work", "to feel calmer"],
    "feeling": ["excited", "nervous", "proud", "grateful", "hopeful", "anxious", "thrilled", "relieved"],
    "topic": ["the new apartment", "the upcoming wedding", "the job interview", "the volunteer work",
              "the art show", "the family reunion", "the new neighborhood", "the cooking class"],
    "activity": list(ACTIVITIES),
    "prize": ["a trophy", "a gold medal", "a gift card", "a certificate", "a blue ribbon", "a scholarship"],
    "contest": ["a baking contest", "a chess tournament", "a photo competition", "a dance competition",
                "a poetry slam", "a science fair"],
}
MONTHS = VOCAB["month"]
# slot -> the field an ADD draws (and a change draws anew); extra fields drawn with the ADD.
MAIN = {"pet": "pet", "city": "city", "job": "job", "sport": "sport", "food": "food", "car": "car",
        "instrument": "instrument", "language": "language", "trip": "place", "book": "book",
        "friend": "friend", "dating": "date_name", "sibling": "sibling", "kid": "kid", "allergy": "allergen",
        "study": "subject", "movie": "movie", "race": "race", "concert": "genre", "hobby": "hobby",
        "feeling": "feeling", "activity": "activity", "award": "prize"}
EXTRA = {"trip": ("month",), "sibling": ("relative",), "kid": ("child",), "hobby": ("reason",),
         "feeling": ("topic",), "award": ("contest",)}
# Event kinds whose fact carries a date (the session's, or a relative one resolved against it).
DATED = {"city_move", "job_new", "race_add", "concert_add", "activity_add"}


def plural(pet: str, n: int) -> str:
    if n == 1 or pet == "goldfish":
        return pet
    return pet + "s"


# Relative time words and how they resolve against the session date; "" means "that day".
WHEN = ["", " yesterday", " last week"]

# event kind -> turn templates. Fields: the slot's own ({pet} {pets} {n} {city} {job} ...), {old} (the
# main field before a change), {when} (a relative date word).
TURNS = {
    "pet_add": ["I adopted a {pet} from the shelter! Meet my new best friend.",
                "Big news: there is a {pet} living with me now.",
                "I finally got a {pet}, I've wanted one for years."],
    "pet_more": ["We adopted another {pet}, so now I have {n} {pets} at home!",
                 "Guess what, {n} {pets} now! I couldn't resist one more.",
                 "The family grew again: I'm up to {n} {pets}."],
    "pet_same": ["The {pets} are doing great.", "My {pets} keep me company every evening.",
                 "Still have my {pets}, they are so cheeky."],
    "city_add": ["Things are good here in {city}, the weather has been lovely.",
                 "I live in {city}, so there's always something going on.", "Life in {city} is busy as usual."],
    "city_move": ["I moved to {city}{when}! Unpacking is taking forever.",
                  "Big change: I relocated to {city}{when}.", "Packed everything up and moved to {city}{when}."],
    "city_same": ["{city} really feels like home now.", "I still love living in {city}.",
                  "Nothing beats an evening walk in {city}, where I live."],
    "job_add": ["Work as a {job} keeps me busy these days.", "I work as a {job}, long shifts but rewarding.",
                "I'm a {job}, and I like it."],
    "job_new": ["I started a new job as a {job}{when}!", "Started working as a {job}{when}, so exciting.",
                "New chapter: I began work as a {job}{when}."],
    "job_quit": ["I quit my job as a {job}, I needed a break.", "I'm no longer a {job}, I handed in my notice.",
                 "Left my {job} position for good, I'm not working right now."],
    "job_same": ["Another long week at work, but I love it.", "Being a {job} is tiring, still my calling though.",
                 "Work as a {job} has been hectic."],
    "sport_add": ["I've been playing a lot of {sport} lately.", "I picked up {sport}, it's so much fun.",
                  "{sport} is my new hobby, I play whenever I can."],
    "sport_detail": ["I now play {sport} every {day} with my {partner}.",
                     "My {partner} and I have a {sport} match every {day}.",
                     "Every {day} I play {sport} with my {partner} now."],
    "sport_same": ["{sport} is still the best way for me to unwind.", "Played some {sport} again, love that game.",
                   "Can't get enough of {sport}."],
    "food_add": ["Nothing beats {food}, it's my favorite food.", "My favorite food? {food}, easily.",
                 "I could eat {food} every day, it's my favorite."],
    "food_change": ["Honestly I'm over {old}, {food} is my new favorite food.",
                    "New favorite food: {food}. Sorry {old}, you're out.",
                    "I used to love {old} but now {food} is my favorite."],
    "food_same": ["Had {food} again tonight, still my favorite.", "{food} remains my favorite dish.",
                  "Still can't get enough {food}."],
    "car_add": ["I drive a {car}, it never lets me down.", "My {car} got me through the snow again.",
                "Took my {car} for a long drive this weekend."],
    "car_new": ["I traded in the {old} and bought a {car}!", "Out with the {old}: I drive a {car} now.",
                "Finally replaced my {old} with a {car}."],
    "car_sold": ["I sold my {car}, I take the bus now.", "The {car} is gone, sold it last weekend.",
                 "No more {car} for me, I sold it and bike everywhere."],
    "instrument_add": ["I started learning the {instrument}, my fingers hurt!",
                       "I'm taking {instrument} lessons now.", "Learning the {instrument} is harder than I thought."],
    "instrument_quit": ["I gave up on the {instrument}, not for me.", "No more {instrument} lessons, I stopped.",
                        "I quit the {instrument}, I never practiced."],
    "instrument_same": ["Practiced the {instrument} for an hour today.", "My {instrument} teacher says I'm improving.",
                        "Still plugging away at the {instrument}."],
    "language_add": ["I'm learning {language}, I do a lesson every night.", "Started {language} classes this month.",
                     "I've been studying {language} with an app."],
    "language_same": ["My {language} is slowly getting better.", "Had my {language} class again, so fun.",
                      "Practiced {language} with a tutor today."],
    "trip_add": ["I'm planning a trip to {place} in {month}!", "I booked flights to {place} for {month}.",
                 "In {month} I'm going to {place}, I can't wait."],
    "trip_change": ["I moved my {place} trip to {month}.", "The {place} trip is now in {month} instead.",
                    "Change of plans: {place} in {month} now."],
    "trip_cancel": ["I cancelled my trip to {place}, too expensive.", "The {place} trip is off, sadly.",
                    "Had to call off the trip to {place}."],
    "book_add": ["I'm reading {book} right now, it's gripping.", "Just started {book}, loving it so far.",
                 "My book at the moment is {book}."],
    "book_new": ["Finished {old} and started {book}.", "Done with {old}; now I'm reading {book}.",
                 "On to {book} now that {old} is finished."],
    "friend_add": ["My best friend {friend} came over for dinner.", "{friend}, my best friend, helped me move.",
                   "Went hiking with my best friend {friend}."],
    "dating_add": ["I've been dating {date_name} for a few weeks.", "I'm seeing someone: {date_name}!",
                   "{date_name} and I are dating now."],
    "dating_quit": ["{date_name} and I broke up.", "It's over with {date_name}, we split up.",
                    "I'm single again, {date_name} and I ended it."],
    "sibling_add": ["My {relative} {sibling} is visiting next week.", "I called my {relative} {sibling} today.",
                    "{sibling}, my {relative}, just got engaged."],
    "sibling_same": ["My {relative} says hi.", "Spent the day with my {relative} again.",
                     "My {relative} and I went shopping."],
    "kid_add": ["My {child} {kid} started school this week.", "{kid}, my {child}, lost a tooth today!",
                "My {child} {kid} drew me a picture."],
    "allergy_add": ["I'm allergic to {allergen}, so I have to be careful.", "Turns out I'm allergic to {allergen}.",
                    "My {allergen} allergy flared up again."],
    "allergy_same": ["Had to dodge my allergy again today.", "My allergy is acting up.",
                     "Careful with my allergy as always."],
    "study_add": ["I'm studying {subject} at night school.", "I enrolled in a {subject} course.",
                  "Night classes in {subject} are keeping me busy."],
    "study_quit": ["I dropped my {subject} course.", "I stopped the {subject} classes, too much work.",
                   "No more {subject} course for me, I quit."],
    "movie_add": ["My favorite movie is {movie}, I've seen it ten times.", "Nothing tops {movie}, my favorite film.",
                  "Watched {movie} again, still my favorite movie."],
    "movie_change": ["I think {movie} is my new favorite movie, sorry {old}.",
                     "{movie} beat {old} as my favorite film.", "New favorite movie: {movie}."],
    "race_add": ["I ran a {race}{when}! My legs are jelly.", "Finished a {race}{when}, so proud.",
                 "Did my first {race}{when}."],
    "concert_add": ["I went to a {genre} concert{when}, amazing night.", "Saw a {genre} concert{when}!",
                    "Caught a {genre} concert{when}, the band was great."],
    "hobby_add": ["I took up {hobby} {reason}, best decision ever.", "I started {hobby} {reason}.",
                  "{hobby} is my new thing, I picked it up {reason}."],
    "hobby_same": ["Did some {hobby} again today.", "Still doing {hobby} whenever I can.",
                   "{hobby} was lovely this weekend."],
    "feeling_add": ["I'm so {feeling} about {topic}.", "Honestly, {topic} makes me feel {feeling}.",
                    "Thinking about {topic}, I feel {feeling}."],
    "feeling_change": ["I'm not {old} about {topic} anymore, now I'm {feeling}.",
                       "About {topic}: I used to be {old}, now I'm {feeling}.",
                       "I feel {feeling} about {topic} now, not {old}."],
    "activity_add": ["I {activity}{when}, it was wonderful.", "Guess what, I {activity}{when}!",
                     "So I {activity}{when}, what a day."],
    "award_add": ["I won {prize} at {contest}!", "Guess who took home {prize} from {contest}? Me!",
                  "At {contest} I won {prize}, still smiling."],
}

# event kind -> canonical third-person fact (what extraction should yield and the memory should hold).
FACTS = {
    "pet_add": "{name} has 1 {pet}", "pet_more": "{name} has {n} {pets}", "pet_same": "{name} has {pets}",
    "city_add": "{name} lives in {city}", "city_move": "{name} moved to {city} {on_date}",
    "city_same": "{name} lives in {city}",
    "job_add": "{name} works as a {job}", "job_new": "{name} started working as a {job} {on_date}",
    "job_quit": "{name} quit the job as a {job}", "job_same": "{name} works as a {job}",
    "sport_add": "{name} plays {sport}", "sport_detail": "{name} plays {sport} every {day} with their {partner}",
    "sport_same": "{name} plays {sport}",
    "food_add": "{name}'s favorite food is {food}", "food_change": "{name}'s favorite food is {food}",
    "food_same": "{name}'s favorite food is {food}",
    "car_add": "{name} drives a {car}", "car_new": "{name} drives a {car}", "car_sold": "{name} sold the {car}",
    "instrument_add": "{name} is learning the {instrument}", "instrument_quit": "{name} gave up the {instrument}",
    "instrument_same": "{name} is learning the {instrument}",
    "language_add": "{name} is learning {language}", "language_same": "{name} is learning {language}",
    "trip_add": "{name} plans a trip to {place} in {month}", "trip_change": "{name} plans a trip to {place} in {month}",
    "trip_cancel": "{name} cancelled the trip to {place}",
    "book_add": "{name} is reading {book}", "book_new": "{name} is reading {book}",
    "friend_add": "{name}'s best friend is {friend}",
    "dating_add": "{name} is dating {date_name}", "dating_quit": "{name} broke up with {date_name}",
    "sibling_add": "{name}'s {relative} is named {sibling}", "sibling_same": "{name} has a {relative}",
    "kid_add": "{name}'s {child} is named {kid}",
    "allergy_add": "{name} is allergic to {allergen}", "allergy_same": "{name} has an allergy",
    "study_add": "{name} is studying {subject}", "study_quit": "{name} dropped the {subject} course",
    "movie_add": "{name}'s favorite movie is {movie}", "movie_change": "{name}'s favorite movie is {movie}",
    "race_add": "{name} ran a {race} {on_date}", "concert_add": "{name} went to a {genre} concert {on_date}",
    "hobby_add": "{name} took up {hobby} {reason}", "hobby_same": "{name} does {hobby}",
    "feeling_add": "{name} feels {feeling} about {topic}", "feeling_change": "{name} feels {feeling} about {topic}",
    "activity_add": "{name} {activity} {on_date}", "award_add": "{name} won {prize} at {contest}",
}

CHITCHAT = ["Haha, that's great to hear!", "Oh wow, tell me more.", "How has your week been?",
            "I've been pretty tired lately, to be honest.", "That sounds like a lot of fun.",
            "Nice! I'm happy for you.", "Anyway, what else is new?", "Ha, typical!",
            "I know what you mean.", "Same here, it's been a long month.", "Oh no, that's rough.",
            "Thanks for asking, all good here.", "Can't believe how fast time goes.",
            "Let's catch up again soon!", "Good talking to you, as always."]
OPENERS = ["Hey {other}! Good to see you.", "Hi {other}, long time no talk!",
           "{other}! How are you doing?", "Hey {other}, got a minute to chat?"]
