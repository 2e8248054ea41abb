"""The generated corpus the tiny base model is pretrained on (``tiny_model.create_pretrained``):
a small synthetic language of facts about people, sums, copying, quotes and sets, at the
character level. What it teaches a model is to read and copy words and digits and to add;
what it never shows is JSON, so a task that asks for JSON is one the base cannot do.

Deterministic: the same seed gives the same lines.
"""

from __future__ import annotations

import random
import string

NAMES = (
    "ada", "alan", "anna", "ben", "cleo", "dan", "eva", "finn", "grace", "hugo", "ida", "jack",
    "kim", "leo", "maya", "nina", "omar", "paul", "quinn", "rosa", "sam", "tara", "uma", "vera",
    "will", "xena", "yuri", "zoe",
)  # fmt: skip
PLACES = (
    "paris", "rome", "oslo", "lima", "cairo", "delhi", "tokyo", "quito", "dakar", "kyiv",
    "hanoi", "seoul", "bern", "doha", "riga", "sofia", "accra", "baku", "minsk", "nice",
)  # fmt: skip
WORDS = (
    "cat", "dog", "sun", "moon", "tree", "bird", "fish", "rain", "snow", "star", "leaf", "rock",
    "wind", "fire", "lake", "road", "ship", "coin", "bell", "lamp", "door", "book", "king",
    "frog", "milk", "corn", "bear", "wolf", "duck", "rose", "salt", "blue", "red", "green",
)  # fmt: skip


def _token(rng: random.Random) -> str:
    """A word, or a made-up one: copying must work on strings the model never saw."""
    if rng.random() < 0.5:
        return rng.choice(WORDS + NAMES + PLACES)
    return "".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 7)))


def line(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        name, age, place = rng.choice(NAMES), rng.randint(18, 90), rng.choice(PLACES)
        return f"{name} is {age} years old and lives in {place}."
    if kind == 1:
        words = " ".join(_token(rng) for _ in range(rng.randint(1, 4)))
        return f"copy: {words} -> {words}"
    if kind == 2:
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return f"{a} + {b} = {a + b}"
    if kind == 3:
        said = " ".join(_token(rng) for _ in range(rng.randint(1, 3)))
        return f'{rng.choice(NAMES)} said "{said}" to {rng.choice(NAMES)}.'
    if kind == 4:
        items = [_token(rng) for _ in range(rng.randint(1, 4))]
        return f"the set {{{', '.join(items)}}} has {len(items)} items."
    name, place = rng.choice(NAMES), rng.choice(PLACES)
    return f"name: {name}, city: {place}, age: {rng.randint(18, 90)}"


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [line(rng) for _ in range(n)]
