#!/usr/bin/env python3
"""Writes questions.jsonl: a RAG question set of made-up facts (so the model cannot know the
answers without the documents). Each item has 3 to 5 documents, one of which holds the answer,
a question and a short answer. Deterministic (seeded); run by hand, output committed.

Scoring (bench/cpu_bench): an answer counts when its normalised text (lower case, no
punctuation) appears in the model's normalised output: "contained exact match".
"""
import json
import random

rng = random.Random(2026)
FIRST = ["Ilse", "Tobias", "Mira", "Aurel", "Petra", "Oskar", "Lena", "Bram", "Yara", "Casimir",
         "Edda", "Fennick", "Greta", "Hollis", "Ines", "Jorund", "Katya", "Lucan", "Maren", "Nils"]
LAST = ["Varn", "Wren", "Ostrova", "Benn", "Halloway", "Drummel", "Quist", "Marlow", "Tessaly",
        "Brask", "Corrin", "Dalby", "Eskew", "Fairlie", "Gorse", "Hexley"]
PLACES = ["Kestrel Bay", "Dunmere", "Dorvel", "Pellorin", "Ashgrove", "Brinmoor", "Caldris",
          "Elderwick", "Frostholm", "Galloway Reach", "Harrowfen", "Ilvermark", "Jessop Ford",
          "Korrin Vale", "Lowmarsh", "Mistral Point", "Northcairn", "Oakhollow", "Pyrewood"]
THINGS = ["lighthouse", "bell tower", "glass archive", "clock museum", "salt mine", "observatory",
          "paper mill", "rope bridge", "seed vault", "opera house", "weather station", "canal lock"]
COLOURS = ["green", "blue", "yellow", "purple", "orange", "white", "grey", "red"]
ANIMALS = ["otters", "herons", "goats", "ravens", "seals", "foxes", "badgers", "swans"]


def person():
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def fact():
    place, thing = rng.choice(PLACES), rng.choice(THINGS)
    kind = rng.randrange(4)
    year = rng.randrange(1700, 1990)
    who = person()
    colour, animal = rng.choice(COLOURS), rng.choice(ANIMALS)
    n = rng.randrange(3, 99)
    key = f"{thing} of {place}"
    base = f"The {thing} of {place} was built in {year}."
    if kind == 0:
        doc = f"{base} It was founded by {who}, who also designed its doors. Local children say the building is haunted by {animal}."
        return doc, f"Who founded the {thing} of {place}?", who, key
    if kind == 1:
        doc = f"{base} In {year + n} it was painted {colour}, and it has kept that colour ever since. The {animal} nesting on its roof are protected."
        return doc, f"What colour is the {thing} of {place} painted?", colour, key
    if kind == 2:
        doc = f"{base} Its first keeper, {who}, kept {n} {animal} in the courtyard. Visitors may enter on Saturdays only."
        return doc, f"How many {animal} did the first keeper of the {thing} of {place} keep?", str(n), key
    doc = f"The {thing} of {place} was designed by {who} and completed in {year}. It is famous for its {colour} windows and its colony of {animal}."
    return doc, f"In which year was the {thing} of {place} completed?", str(year), key


items, seen = [], set()
while len(items) < 60:
    doc, q, a, key = fact()
    if key in seen:
        continue
    seen.add(key)
    k = rng.randrange(3, 6)
    distractors = []
    while len(distractors) < k - 1:
        d, _, _, dkey = fact()
        if dkey != key:  # no second document about the same building
            distractors.append(d)
    docs = distractors + [doc]
    rng.shuffle(docs)
    items.append({"id": len(items), "documents": docs, "question": q, "answer": a})

with open("questions.jsonl", "w") as fh:
    for it in items:
        fh.write(json.dumps(it) + "\n")
print(f"wrote {len(items)} questions")
