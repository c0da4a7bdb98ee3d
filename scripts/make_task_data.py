"""Generate the small labelled data sets the task fine-tuning demo and tests use, under examples/data/:

- reviews_{train,validation}.jsonl: sequence classification, {"text", "label": "positive" | "negative"}, short
  product/film reviews from templates (negations included, so a bag of words is not enough to be perfect).
- entities_{train,validation}.jsonl: token classification, {"tokens", "ner_tags"} in IOB2 with PER, LOC, ORG
  (multi-word names, so I- tags occur), in sentence templates.

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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "examples", "data"))
