"""Raw rows of the LongMemEval and MSC formats, as the data tests write them to files."""


def lme_item(qid="q1", qtype="temporal-reasoning", answer="3 days"):
    return {
        "question_id": qid, "question_type": qtype, "question": "How many days between the trips?",
        "answer": answer, "question_date": "2023/05/30 (Tue) 10:00",
        "haystack_session_ids": ["s1", "s2"], "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/23 (Tue) 09:00"],
        "haystack_sessions": [
            [{"role": "user", "content": "I went to Rome today.", "has_answer": True},
             {"role": "assistant", "content": "Sounds lovely!"}],
            [{"role": "user", "content": "Back from Oslo.", "has_answer": True}],
        ],
        "answer_session_ids": ["s1", "s2"],
    }


def msc_row(question="What is my dog's name?", answer="Rex"):
    return {
        "personas": [["I have a dog."], ["I like tea."]],
        "previous_dialogs": [
            {"personas": [], "dialog": [{"id": "Speaker 1", "text": "My dog Rex is great."},
                                        {"id": "Speaker 2", "text": "Cute name!"}],
             "time_num": 3, "time_unit": "days"},
            {"dialog": [{"text": "Rex learned a trick."}, {"text": "Nice."}], "time_num": 2, "time_unit": "hours"},
        ],
        "dialog": [{"id": "Speaker 1", "text": "Hi again."}],
        "self_instruct": {"B": question, "A": answer},
    }
