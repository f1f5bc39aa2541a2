"""Topics and chat-pair encoding for the demo model (tools/train_demo.py's data side).

Kept apart from the stages so the corpus rules and the batch layout can be read and
tested without the training loop around them.
"""
from __future__ import annotations

import hashlib
import random
import re
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # only an annotation here; a runtime import would be circular
    from tools.train_demo import Config

# --------------------------------------------------------------------------- corpus

NAMES = ["Max", "Lily", "Tim", "Ben", "Sue", "Tom", "Anna", "Sam", "Mia", "Jack", "Lucy", "Sara", "Bob",
         "Spot", "Amy", "Kitty", "Molly", "Jane", "Joe", "Mark", "Emma", "Lola", "Fluffy", "Buddy",
         "Zoe", "Leo", "Kim", "Jill", "Bill", "Dan", "Tweety", "Daisy", "Bella", "Rex", "Pip", "Timmy",
         "Sally", "Rosie", "Toby", "Ellie"]
ANIMALS = ["dog", "cat", "bird", "bunny", "fish", "frog", "bear", "duck", "mouse", "lion", "pig", "cow",
           "horse", "owl", "fox", "monkey", "turtle", "puppy", "kitten", "elephant", "dragon", "squirrel"]
PEOPLE = ["girl", "boy"]
OBJECTS = ["ball", "car", "kite", "hat", "box", "balloon", "boat", "doll", "truck", "flower", "shell",
           "crayon", "book", "cup", "train", "rock", "tree", "cake", "toy", "bike", "drum", "blanket"]
COLOURS = ["red", "blue", "green", "yellow", "pink", "purple", "big", "shiny", "little", "old", "soft"]
PLACES = ["park", "forest", "garden", "beach", "farm", "house", "town", "pond", "jungle", "sky", "school"]

# Openings the story model continues; each names the topic so the story starts on it.
CHARACTER_OPENINGS = [
    "Once upon a time, there was a {kind} named {name}.",
    "Once upon a time, there was a little {kind} named {name}. {Pro} lived in a {place}.",
    "One day, a {kind} named {name} went to the {place}.",
    "{name} was a happy {kind}. {Pro} liked to play in the {place}.",
    "There once was a {kind} called {name}.",
    "Once upon a time, in a big {place}, there lived a {kind} named {name}.",
]
OBJECT_OPENINGS = [
    "Once upon a time, there was a {colour} {thing}.",
    "One day, {name} found a {colour} {thing} in the {place}.",
    "Once upon a time, a little {person} named {name} had a {colour} {thing}.",
    "{name} had a {colour} {thing}. {Pro} loved it very much.",
]
FINDS_OPENINGS = [
    "Once upon a time, there was a {person} named {name}. One day, {pro} found a {thing}.",
    "One day, a little {person} named {name} found a {thing} in the {place}.",
]
# The user's side: varied phrasings of the same request.
CHARACTER_REQUESTS = [
    "Tell me a story about a {kind} named {name}.",
    "Write a short story about {name} the {kind}.",
    "Can you tell me a story about a {kind} called {name}?",
    "I would like a story about a {kind} named {name}, please.",
    "Please write a story about a {kind} whose name is {name}.",
    "Tell me a bedtime story about {name}, a little {kind}.",
    "Story time! Something about a {kind} named {name}.",
    "Could you make up a story about a {kind} named {name}?",
]
OBJECT_REQUESTS = [
    "Write a short story about a {colour} {thing}.",
    "Tell me a story about a {colour} {thing}.",
    "Can you tell me a story about a {colour} {thing}?",
    "I want a story about a {colour} {thing}.",
    "Please tell me a little story about a {colour} {thing}.",
    "Make up a story about a {colour} {thing}, please.",
]
FINDS_REQUESTS = [
    "Can you tell me a story about a {person} who finds a {thing}?",
    "Tell me a story about a {person} who finds a {thing}.",
    "Write a short story about a {person} who found a {thing}.",
    "Please tell me a story where a {person} finds a {thing}.",
]


def topic_key(slots: dict) -> str:
    """What makes two requests the same topic (held-out topics never appear in training)."""
    if slots["type"] == "character":
        return f"character:{slots['kind']}:{slots['name']}"
    if slots["type"] == "object":
        return f"object:{slots['colour']}:{slots['thing']}"
    return f"finds:{slots['person']}:{slots['thing']}"


def is_heldout(key: str, percent: float) -> bool:
    """A stable split by topic: the hash, not the order of sampling, decides."""
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return (h % 10000) < percent * 100


def topic_words(slots: dict) -> list[str]:
    """Words a reply must mention to count as on topic (any one of them)."""
    if slots["type"] == "character":
        return [slots["name"]]
    return [slots["thing"]]


def draw_topic(rng: random.Random) -> dict:
    """One random topic with its opening sentence and the user's request for it."""
    r = rng.random()
    place = rng.choice(PLACES)
    if r < 0.6:
        kind = rng.choice(ANIMALS + PEOPLE * 3)
        name = rng.choice(NAMES)
        Pro, pro = {"girl": ("She", "she"), "boy": ("He", "he")}.get(kind, rng.choice([("He", "he"), ("She", "she")]))
        slots = {"type": "character", "kind": kind, "name": name}
        opening = rng.choice(CHARACTER_OPENINGS).format(kind=kind, name=name, place=place, Pro=Pro, pro=pro)
        request = rng.choice(CHARACTER_REQUESTS).format(**slots)
    elif r < 0.85:
        person = rng.choice(PEOPLE)
        Pro, pro = ("She", "she") if person == "girl" else ("He", "he")
        slots = {"type": "object", "colour": rng.choice(COLOURS), "thing": rng.choice(OBJECTS)}
        opening = rng.choice(OBJECT_OPENINGS).format(name=rng.choice(NAMES), place=place, person=person,
                                                     Pro=Pro, pro=pro, **slots)
        request = rng.choice(OBJECT_REQUESTS).format(**slots)
    else:
        person = rng.choice(PEOPLE)
        Pro, pro = ("She", "she") if person == "girl" else ("He", "he")
        slots = {"type": "finds", "person": person, "thing": rng.choice(OBJECTS)}
        opening = rng.choice(FINDS_OPENINGS).format(name=rng.choice(NAMES), place=place, Pro=Pro, pro=pro,
                                                    **slots)
        request = rng.choice(FINDS_REQUESTS).format(**slots)
    return {"slots": slots, "opening": opening, "request": request}


def clean_story(text: str) -> str:
    return re.sub(r"[ \t]+", " ", text.replace("\r", "")).strip()


def keep_story(cfg: Config, slots: dict, continuation: str, stop_reason: str) -> bool:
    """Only stories that finished on their own, say something, and come back to the topic."""
    if stop_reason != "eos" and not (cfg.keep_unfinished and stop_reason == "length"):
        return False
    if len(continuation) < cfg.keep_min_chars or "\u2047" in continuation or "\ufffd" in continuation:
        return False
    if cfg.keep_unfinished:
        return True
    low = continuation.lower()
    return any(re.search(rf"\b{re.escape(w.lower())}\b", low) for w in topic_words(slots))


# --------------------------------------------------------------------------- data


def encode_pair(fmt, tok, request: str, story: str) -> tuple[list[int], int]:
    """Token ids of one chat exchange and where the assistant's reply starts.

    Built exactly as the app builds a prompt (the chat format's own code), so training and
    inference see the same tokens; the reply is the story then <|eot_id|>.
    """
    prompt = fmt.encode_dialog([{"role": "user", "content": request}], add_generation_prompt=True)
    reply = tok.encode(story.strip()) + [fmt.eot_id]
    return prompt + reply, len(prompt)


def encode_split(recs: list[dict], fmt, tok, seq_len: int) -> list[tuple[list[int], int]]:
    out = []
    for r in recs:
        ids, start = encode_pair(fmt, tok, r["request"], r["story"])
        # A story longer than the window is dropped, not cut: the model must see every
        # reply end on <|eot_id|> or it learns to run to the length limit.
        if len(ids) <= seq_len + 1:
            out.append((ids, start))
    return out


def make_batch(items: list[tuple[list[int], int]]) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Right-padded inputs and targets; targets are -100 except on the reply (+ <|eot_id|>)."""
    T = max(len(ids) for ids, _ in items) - 1
    x = torch.zeros(len(items), T, dtype=torch.long)
    y = torch.full((len(items), T), -100, dtype=torch.long)
    n = 0
    for i, (ids, start) in enumerate(items):
        t = torch.tensor(ids)
        L = len(ids) - 1
        x[i, :L] = t[:-1]
        # Position p predicts ids[p + 1]; learn only the predictions of reply tokens.
        y[i, start - 1:L] = t[start:]
        n += L
    return x, y, n


def batches_for_epoch(data, batch_size: int, rng: random.Random) -> list[list[int]]:
    """Index batches of similar length (little padding), in random order."""
    idx = list(range(len(data)))
    rng.shuffle(idx)
    chunk = batch_size * 32
    out = []
    for c in range(0, len(idx), chunk):
        part = sorted(idx[c:c + chunk], key=lambda i: len(data[i][0]))
        out += [part[b:b + batch_size] for b in range(0, len(part), batch_size)]
    rng.shuffle(out)
    return out
