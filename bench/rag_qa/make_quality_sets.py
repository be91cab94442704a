#!/usr/bin/env python3
"""Writes the quality question sets of bench/rag_qa (issue 25): made-up facts, so the model
cannot answer without the documents.

  single_hop_{dev,test}.jsonl  the answer is one fact of one document
  multi_hop_{dev,test}.jsonl   the answer needs a fact of one document (a bridge: a person)
                               and a fact of another document about that person

Every document is 150-500 tokens of filler sentences about its subject with the needed fact at
a recorded depth: `fact_char` (single hop) or `facts[i].char` (multi hop) is the character
offset of the fact's sentence inside its document; rag_qa_bench turns it into a token depth with
the model's tokenizer. Most facts lie beyond the first 32 tokens. Each question has 3-8
documents; distractor documents carry facts of the same kinds about other subjects.

Deterministic (seeded, Python standard library only, no network): `python3 make_quality_sets.py`
in this folder rewrites the four files byte for byte. dev is for choosing settings, test
(held out) for reporting. `--large DIR [--questions 300]` writes larger dev and test splits of
the same kinds into DIR instead (not committed: 60 questions move EM/FULL by 3-9 points each).

Line format: {"id", "kind": "single"|"multi", "documents": [text...], "question", "answer",
  "fact_doc": i, "fact_char": c}                      (single)
  "facts": [{"doc": i, "char": c}, {"doc": j, "char": c2}]   (multi; the second is the answer)
"""
import json
import random

FIRST = ["Ilse", "Tobias", "Mira", "Aurel", "Petra", "Oskar", "Lena", "Bram", "Yara", "Casimir",
         "Edda", "Fennick", "Greta", "Hollis", "Ines", "Jorund", "Katya", "Lucan", "Maren", "Nils",
         "Odile", "Pavel", "Quilla", "Rufus", "Selma", "Tamsin", "Ulric", "Vesna", "Wendel", "Zora"]
LAST = ["Varn", "Wren", "Ostrova", "Benn", "Halloway", "Drummel", "Quist", "Marlow", "Tessaly",
        "Brask", "Corrin", "Dalby", "Eskew", "Fairlie", "Gorse", "Hexley", "Ibbot", "Jarrow",
        "Kettering", "Lusk", "Moberly", "Nettle", "Orrin", "Pask", "Rudd", "Sallow", "Thorne"]
PLACES = ["Kestrel Bay", "Dunmere", "Dorvel", "Pellorin", "Ashgrove", "Brinmoor", "Caldris",
          "Elderwick", "Frostholm", "Galloway Reach", "Harrowfen", "Ilvermark", "Jessop Ford",
          "Korrin Vale", "Lowmarsh", "Mistral Point", "Northcairn", "Oakhollow", "Pyrewood",
          "Quellbrook", "Ravensholt", "Saltmere", "Thistledown", "Umberfield", "Wolfscar"]
THINGS = ["lighthouse", "bell tower", "glass archive", "clock museum", "salt mine", "observatory",
          "paper mill", "rope bridge", "seed vault", "opera house", "weather station",
          "canal lock", "map library", "tide mill", "silk market", "printing house"]
TOWNS = ["Vellmar", "Osterby", "Cairnwick", "Hollesk", "Brightwater", "Amberley", "Tarrow",
         "Fenmouth", "Greyhaven", "Lindqvist", "Marrowdale", "Penhallow", "Rookridge", "Stavely"]
INSTRUMENTS = ["cello", "harp", "oboe", "violin", "accordion", "flute", "trumpet", "banjo"]
COLOURS = ["green", "blue", "yellow", "purple", "orange", "white", "grey", "red"]
ANIMALS = ["otters", "herons", "goats", "ravens", "seals", "foxes", "badgers", "swans"]

# Documents per question: 3-8, fewer more often (each question's FULL prefill is the cost of the
# CPU run).
NUM_DOCS = [3, 3, 4, 4, 5, 5, 6, 7, 8]

# Filler: sentences about the subject that state no fact of a kind any question asks about (no
# years, names, colours, towns, instruments or counts).
FILLER = [
    "The {s} stands a short walk from the old market square.",
    "Visitors often remark on the quiet inside the {s}.",
    "Most of the paths around the {s} are lined with low stone walls.",
    "On windy days the flags above the {s} can be heard from the harbour.",
    "Guides at the {s} tell long stories about the early days of the town.",
    "A small garden of herbs grows beside the main entrance of the {s}.",
    "Repairs to the roof of the {s} are usually carried out in late summer.",
    "School classes visit the {s} as part of their local history lessons.",
    "The floors of the {s} are made of wide oak boards that creak underfoot.",
    "Several paintings of the {s} hang in the reading room of the town hall.",
    "In the evenings the windows of the {s} glow softly over the water.",
    "A narrow staircase leads from the ground floor of the {s} to a viewing platform.",
    "The town council meets once a season to discuss the upkeep of the {s}.",
    "Local bakers sell a sweet bun that is named after the {s}.",
    "Travellers who arrive by boat can see the {s} long before they land.",
    "The archive of the {s} keeps letters, ledgers and old drawings.",
    "Moss covers the northern side of the {s} for most of the year.",
    "A festival with music and lanterns is held near the {s} every spring.",
    "The {s} was restored carefully so that its original character remained.",
    "Photographers like to visit the {s} early in the morning when the light is soft.",
    "Many families in the area have a story about the {s} that they pass down.",
    "The road to the {s} crosses two small bridges and a meadow.",
    "Inside the {s} there is a long hall with benches along both walls.",
    "The bells of a nearby chapel can be heard from the courtyard of the {s}.",
    "Volunteers keep the grounds of the {s} tidy and plant flowers each year.",
    "Storms sometimes damage the fences that surround the {s}.",
    "A wooden model of the {s} is on display in the local museum.",
    "The caretakers of the {s} live in a cottage just behind it.",
]
PERSON_FILLER = [
    "{p} was known for a patient and careful manner.",
    "Friends described {p} as someone who listened more than spoke.",
    "{p} kept detailed notebooks full of sketches and measurements.",
    "In later life {p} enjoyed long walks along the coast.",
    "{p} wrote many letters to relatives who lived far away.",
    "Neighbours remembered {p} as generous with time and advice.",
    "{p} spent many winters reading by the fire.",
    "The handwriting of {p} was small, neat and easy to recognise.",
    "{p} often travelled on foot rather than by coach.",
    "Students who worked with {p} recalled long conversations about craft.",
    "{p} preferred simple food and early mornings.",
    "A portrait of {p} hangs in the hall of the local library.",
    "{p} was fond of gardens and grew vegetables behind the house.",
    "Stories about {p} are still told at gatherings in the region.",
    "{p} rarely spoke about private matters in public.",
    "The journals of {p} were later given to the town archive.",
    "{p} took great care over every detail of the work.",
    "During hard years {p} helped many families in the area.",
]

# Single-hop fact kinds: (sentence, question, answer) builders.
def subject_facts(rng, s):
    who = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    year, n = rng.randrange(1700, 1990), rng.randrange(3, 99)
    colour, animal = rng.choice(COLOURS), rng.choice(ANIMALS)
    return [
        (f"The {s} was founded by {who}.", f"Who founded the {s}?", who),
        (f"The doors of the {s} are painted {colour}.",
         f"What colour are the doors of the {s} painted?", colour),
        (f"The first keeper of the {s} kept {n} {animal} in the courtyard.",
         f"How many {animal} did the first keeper of the {s} keep?", str(n)),
        (f"The {s} was completed in the year {year}.", f"In which year was the {s} completed?",
         str(year)),
    ]


def approx_tokens(text):
    # SmolLM2's BPE averages about 1.3 tokens per English word; the bench measures exactly.
    return int(len(text.split()) * 1.3)


def build_doc(rng, filler, fill, facts_at, target_tokens):
    """Filler sentences about `fill` up to about target_tokens, with the (sentence, index)
    pairs of facts_at inserted at those sentence indices. Returns the text and the character
    offset of each fact sentence."""
    sentences = []
    pool = filler[:]
    rng.shuffle(pool)
    need_facts = sorted(facts_at, key=lambda f: f[1])
    i = 0
    while True:
        for fact, at in need_facts:
            if at == len(sentences):
                sentences.append(("fact", fact))
        if approx_tokens(" ".join(t for _, t in sentences)) >= target_tokens and \
                all(at < len(sentences) for _, at in need_facts):
            break
        sentences.append(("fill", pool[i % len(pool)].format(s=fill, p=fill)))
        i += 1
    text, offsets = "", {}
    for kind, t in sentences:
        if text:
            text += " "
        if kind == "fact":
            offsets[t] = len(text)
        text += t
    return text, [offsets[f] for f, _ in facts_at]


def fact_index(rng):
    # About 1 in 6 facts opens the document (depth < 32 tokens); the rest lie deeper.
    r = rng.random()
    if r < 1 / 6:
        return 0
    if r < 0.45:
        return rng.randrange(2, 6)
    return rng.randrange(6, 16)


def single_hop(rng, n):
    items, used = [], set()
    while len(items) < n:
        place, thing = rng.choice(PLACES), rng.choice(THINGS)
        s = f"{thing} of {place}"
        if s in used:
            continue
        used.add(s)
        kind = rng.randrange(4)
        num_docs = rng.choice(NUM_DOCS)
        docs, target = [], None
        subjects = [s]
        while len(subjects) < num_docs:
            o = f"{rng.choice(THINGS)} of {rng.choice(PLACES)}"
            if o not in subjects:
                subjects.append(o)
        for k, subj in enumerate(subjects):
            facts = subject_facts(rng, subj)
            # Every document opens with its subject, then states two facts (the asked kind is
            # always among the distractors' too) at their depths.
            other = (kind + 1 + rng.randrange(3)) % 4
            at_main, at_other = fact_index(rng), fact_index(rng)
            if at_other == at_main:
                at_other += 1
            opening = f"This is a description of the {subj}."
            size = rng.randrange(150, 400)
            body, offs = build_doc(rng, FILLER, subj,
                                   [(facts[kind][0], at_main), (facts[other][0], at_other)], size)
            text = opening + " " + body
            docs.append(text)
            if k == 0:
                target = (facts[kind][1], facts[kind][2], len(opening) + 1 + offs[0])
        order = list(range(num_docs))
        rng.shuffle(order)
        docs = [docs[i] for i in order]
        fact_doc = order.index(0)
        items.append({"id": len(items), "kind": "single", "documents": docs,
                      "question": target[0], "answer": target[1],
                      "fact_doc": fact_doc, "fact_char": target[2]})
    return items


def multi_hop(rng, n):
    """Bridge questions: document A says who founded a subject; document B, about that person,
    says where the person was born (or which instrument the person played). The question names
    only the subject."""
    items, used = [], set()
    while len(items) < n:
        place, thing = rng.choice(PLACES), rng.choice(THINGS)
        s = f"{thing} of {place}"
        if s in used:
            continue
        used.add(s)
        asks_town = rng.random() < 0.5
        num_docs = rng.choice(NUM_DOCS)
        people = []
        while len(people) < 2:
            p = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            if p not in people:
                people.append(p)
        founder, other_person = people
        subjects = [s]
        while len(subjects) < max(2, num_docs - 2):
            o = f"{rng.choice(THINGS)} of {rng.choice(PLACES)}"
            if o not in subjects:
                subjects.append(o)
        docs, facts = [], {}
        # Document A (the subject) and distractor subjects founded by other people.
        for k, subj in enumerate(subjects):
            who = founder if k == 0 else other_person if k == 1 else None
            while who is None or (k > 1 and who in people):
                who = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
            at = fact_index(rng)
            opening = f"This is a description of the {subj}."
            body, offs = build_doc(rng, FILLER, subj,
                                   [(f"The {subj} was founded by {who}.", at)],
                                   rng.randrange(150, 400))
            docs.append(opening + " " + body)
            if k == 0:
                facts["a"] = len(opening) + 1 + offs[0]
        # Document B (the founder) and a distractor person document.
        town_of = {}
        for k, person in enumerate([founder, other_person]):
            town, instrument = rng.choice(TOWNS), rng.choice(INSTRUMENTS)
            while k == 1 and (town == town_of.get("town") or instrument == town_of.get("inst")):
                town, instrument = rng.choice(TOWNS), rng.choice(INSTRUMENTS)
            if k == 0:
                town_of = {"town": town, "inst": instrument}
            f_town = f"{person} was born in the town of {town}."
            f_inst = f"{person} played the {instrument} every evening."
            at1, at2 = fact_index(rng), fact_index(rng)
            if at2 == at1:
                at2 += 1
            opening = f"This is a short biography of {person}."
            body, offs = build_doc(rng, PERSON_FILLER, person, [(f_town, at1), (f_inst, at2)],
                                   rng.randrange(150, 400))
            docs.append(opening + " " + body)
            if k == 0:
                facts["b"] = len(opening) + 1 + (offs[0] if asks_town else offs[1])
        if asks_town:
            question = f"In which town was the founder of the {s} born?"
            answer = town_of["town"]
        else:
            question = f"Which instrument did the founder of the {s} play?"
            answer = town_of["inst"]
        a_index, b_index = 0, len(subjects)
        order = list(range(len(docs)))
        rng.shuffle(order)
        docs = [docs[i] for i in order]
        items.append({"id": len(items), "kind": "multi", "documents": docs, "question": question,
                      "answer": answer,
                      "facts": [{"doc": order.index(a_index), "char": facts["a"]},
                                {"doc": order.index(b_index), "char": facts["b"]}]})
    return items


def write(name, items):
    with open(name, "w") as fh:
        for it in items:
            fh.write(json.dumps(it) + "\n")
    print(f"wrote {name}: {len(items)} questions")


if __name__ == "__main__":
    import argparse
    import os
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large", metavar="DIR",
                    help="instead write the large splits (dev_large, test_large: --questions "
                         "per set, their own seeds) into DIR; not committed, rewritten the same "
                         "byte for byte by every run")
    ap.add_argument("--questions", type=int, default=300, help="questions per large set")
    args = ap.parse_args()
    if args.large:
        os.makedirs(args.large, exist_ok=True)
        for split, seed in (("dev_large", 2503), ("test_large", 2504)):
            rng = random.Random(seed)
            write(os.path.join(args.large, f"single_hop_{split}.jsonl"),
                  single_hop(rng, args.questions))
            write(os.path.join(args.large, f"multi_hop_{split}.jsonl"),
                  multi_hop(rng, args.questions))
    else:
        for split, seed in (("dev", 2501), ("test", 2502)):
            rng = random.Random(seed)
            write(f"single_hop_{split}.jsonl", single_hop(rng, 60))
            write(f"multi_hop_{split}.jsonl", multi_hop(rng, 60))
