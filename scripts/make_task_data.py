"""Generate the small labelled data sets the task fine-tuning demo and tests use, under examples/data/:

- reviews_{train,validation}.jsonl: sequence classification, {"text", "label": "positive" | "negative"}, short
  product/film reviews from templates (negations included, so a bag of words is not enough to be perfect).
- entities_{train,validation}.jsonl: token classification, {"tokens", "ner_tags"} in IOB2 with PER, LOC, ORG
  (multi-word names, so I- tags occur), in sentence templates.
- pairs_{train,validation}.jsonl: sentence embeddings, {"anchor", "positive"} (and in training a hard
  "negative"): a negated adjective and its antonym ("the hotel is not cheap" / "the hotel is expensive"), the
  negative the lexically closer wrong sentence ("the hotel is cheap"). Off-the-shelf embeddings rank that one
  first; validation holds both directions of every antonym pair for held-out nouns, so retrieval must get it right.
- reading_{train,validation}.jsonl: extractive question answering in SQuAD form, {"id", "context", "question",
  "answers": {"text": [...], "answer_start": [...]}}: a context of 3-4 facts about different people (where they
  live, whom they work for, when they were born, what they play), a question about one of them; the other facts
  are distractors of the same kinds, so the answer depends on the person asked about.

No data set can be downloaded here, so these are generated; they are dedicated to the public domain (CC0).
Deterministic: rerunning writes the same files. The validation files use names and nouns held out of training.

    python scripts/make_task_data.py [examples/data]
"""

import json
import os
import random
import sys

NOUNS = [
    "film",
    "book",
    "phone",
    "camera",
    "hotel",
    "meal",
    "laptop",
    "show",
    "album",
    "game",
    "chair",
    "car",
    "service",
    "concert",
    "novel",
    "course",
    "jacket",
    "coffee",
    "printer",
    "movie",
]
HELD_OUT_NOUNS = ["tablet", "restaurant", "play", "watch"]
GOOD = ["great", "wonderful", "excellent", "superb", "delightful", "fantastic", "lovely", "brilliant", "good"]
BAD = ["terrible", "awful", "boring", "dreadful", "poor", "disappointing", "horrible", "bad", "useless"]
OPENERS = ["honestly", "overall", "to be fair", "in short", "all in all", ""]
TEMPLATES = [
    "the {noun} was {adj}",
    "this {noun} is {adj}",
    "what a {adj} {noun}",
    "i found the {noun} {adj}",
    "the {noun} was not {neg}",
    "a {adj} {noun}, i would say",
    "the {noun} is really {adj}",
]

PEOPLE = [
    "Anna Schmidt",
    "John",
    "Maria Lopez",
    "Kenji Sato",
    "Peter",
    "Fatima Khan",
    "Luis",
    "Olga Petrova",
    "David Miller",
    "Chen Wei",
    "Amara Okafor",
    "Sophie",
]
HELD_OUT_PEOPLE = ["Lars Nilsson", "Priya", "Tom Baker"]
PLACES = ["Paris", "New York", "Berlin", "Tokyo", "Cape Town", "Lima", "Oslo", "Buenos Aires", "Cairo", "Madrid"]
HELD_OUT_PLACES = ["Hanoi", "San Diego", "Vienna"]
ORGS = [
    "Acme Corp",
    "the United Nations",
    "Google",
    "Red Cross",
    "Siemens",
    "the World Bank",
    "Toyota",
    "Bank of Spain",
]
HELD_OUT_ORGS = ["Nokia", "Oxfam", "General Motors"]
SENTENCES = [
    "{PER} lives in {LOC} .",
    "{PER} works for {ORG} in {LOC} .",
    "{ORG} opened an office in {LOC} .",
    "yesterday {PER} met {PER} in {LOC} .",
    "{PER} left {ORG} last year .",
    "the new director of {ORG} is {PER} .",
    "{LOC} is far from {LOC} .",
]


def review(rng: random.Random, nouns: list[str]) -> dict:
    positive = rng.random() < 0.5
    template = rng.choice(TEMPLATES)
    adj, neg = (rng.choice(GOOD), rng.choice(BAD)) if positive else (rng.choice(BAD), rng.choice(GOOD))
    text = template.format(noun=rng.choice(nouns), adj=adj, neg=neg)
    opener = rng.choice(OPENERS)
    return {"text": f"{opener}, {text}" if opener else text, "label": "positive" if positive else "negative"}


def sentence(rng: random.Random, people, places, orgs) -> dict:
    tokens, tags = [], []
    for part in rng.choice(SENTENCES).split():
        kind = part.strip("{}") if part.startswith("{") else None
        words = rng.choice({"PER": people, "LOC": places, "ORG": orgs}[kind]).split() if kind else [part]
        tokens += words
        tags += [f"B-{kind}"] + [f"I-{kind}"] * (len(words) - 1) if kind else ["O"]
    return {"tokens": tokens, "ner_tags": tags}


ANTONYMS = [
    ("cheap", "expensive"),
    ("hot", "cold"),
    ("fast", "slow"),
    ("big", "small"),
    ("new", "old"),
    ("open", "closed"),
    ("full", "empty"),
    ("loud", "quiet"),
    ("heavy", "light"),
    ("clean", "dirty"),
    ("early", "late"),
    ("wet", "dry"),
]
NEGATED = ["the {noun} is not {adj}", "the {noun} isn't {adj}", "the {noun} is not {adj} at all"]


def pairs(rng: random.Random, nouns: list[str], negatives: bool) -> list[dict]:
    """Every (noun, antonym pair, direction) once, shuffled: no two rows share a positive."""
    out = []
    for noun in nouns:
        for a, b in ANTONYMS:
            for said, meant in ((a, b), (b, a)):
                row = {"anchor": rng.choice(NEGATED).format(noun=noun, adj=said), "positive": f"the {noun} is {meant}"}
                out.append({**row, "negative": f"the {noun} is {said}"} if negatives else row)
    rng.shuffle(out)
    return out


FACTS = {  # relation: (fact, question, answers)
    "live": ("{PER} lives in {X}.", "Where does {PER} live?", PLACES),
    "work": ("{PER} works for {X}.", "Who does {PER} work for?", ORGS),
    "born": ("{PER} was born in {X}.", "When was {PER} born?", [str(y) for y in range(1950, 2005)]),
    "play": ("{PER} plays the {X}.", "What does {PER} play?", ["piano", "violin", "guitar", "cello", "drums"]),
}
HELD_OUT = {"live": HELD_OUT_PLACES, "work": HELD_OUT_ORGS}


def reading(rng: random.Random, people: list[str], held_out: bool, n: int, prefix: str) -> list[dict]:
    out = []
    for i in range(n):
        names = rng.sample(people, rng.choice((3, 4)))
        facts = []
        for person in names:
            kind = rng.choice(sorted(FACTS))
            values = HELD_OUT.get(kind, FACTS[kind][2]) if held_out else FACTS[kind][2]
            facts.append((person, kind, rng.choice(values)))
        person, kind, value = rng.choice(facts)
        context, start = "", None
        for p, k, v in facts:
            fact = FACTS[k][0].format(PER=p, X=v)
            if p == person:
                start = len(context) + fact.index(v, len(p))
            context += fact + " "
        question = FACTS[kind][1].format(PER=person)
        record = {"id": f"{prefix}{i}", "context": context.strip(), "question": question}
        out.append({**record, "answers": {"text": [value], "answer_start": [start]}})
    return out


def write(path: str, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def main(directory: str) -> None:
    rng = random.Random(12)
    write(os.path.join(directory, "reviews_train.jsonl"), [review(rng, NOUNS) for _ in range(400)])
    write(os.path.join(directory, "reviews_validation.jsonl"), [review(rng, HELD_OUT_NOUNS) for _ in range(100)])
    write(os.path.join(directory, "entities_train.jsonl"), [sentence(rng, PEOPLE, PLACES, ORGS) for _ in range(400)])
    write(
        os.path.join(directory, "entities_validation.jsonl"),
        [sentence(rng, HELD_OUT_PEOPLE, HELD_OUT_PLACES, HELD_OUT_ORGS) for _ in range(100)],
    )
    rng = random.Random(13)  # its own stream: the files above stay as they were
    write(os.path.join(directory, "pairs_train.jsonl"), pairs(rng, NOUNS, negatives=True))
    write(os.path.join(directory, "pairs_validation.jsonl"), pairs(rng, HELD_OUT_NOUNS, negatives=False))
    rng = random.Random(14)
    write(os.path.join(directory, "reading_train.jsonl"), reading(rng, PEOPLE, False, 400, "train-"))
    people = PEOPLE[:4] + HELD_OUT_PEOPLE  # held-out names among known ones: at least 3 per context
    write(os.path.join(directory, "reading_validation.jsonl"), reading(rng, people, True, 100, "validation-"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "examples", "data"))
