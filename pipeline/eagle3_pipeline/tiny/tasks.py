"""The structured requests of the tiny verifier's corpus: each answer is a function of its request.

Every task draws its parameters and a phrasing from a `random.Random` and returns a `Turn`: the request, the
answer and the short step list a reasoning variant thinks through. A few parameter combinations are held out
of every generated conversation (`is_held_out`), so tests can ask the verifier questions it never saw.
"""

from __future__ import annotations

import dataclasses
import random
import string
from collections.abc import Callable
from dataclasses import dataclass

WORDS = [
    "red",
    "blue",
    "green",
    "cat",
    "dog",
    "sun",
    "moon",
    "tree",
    "book",
    "fish",
    "bird",
    "star",
    "rain",
    "milk",
    "cake",
    "ball",
    "door",
    "lamp",
    "rock",
    "ship",
    "hat",
    "cup",
    "box",
    "pen",
    "car",
    "bus",
    "egg",
    "map",
    "key",
    "bell",
    "leaf",
    "snow",
]
COLORS = (
    ("the sky", "blue"),
    ("grass", "green"),
    ("snow", "white"),
    ("a banana", "yellow"),
    ("coal", "black"),
    ("a tomato", "red"),
    ("a lemon", "yellow"),
    ("milk", "white"),
    ("a frog", "green"),
    ("a cherry", "red"),
)
LEGS = (("cat", 4), ("dog", 4), ("bird", 2), ("spider", 8), ("ant", 6), ("horse", 4), ("duck", 2), ("bee", 6))
SOUNDS = (
    ("cat", "meow"),
    ("dog", "woof"),
    ("cow", "moo"),
    ("duck", "quack"),
    ("sheep", "baa"),
    ("pig", "oink"),
    ("owl", "hoot"),
    ("lion", "roar"),
)
OPPOSITES = (
    ("hot", "cold"),
    ("big", "small"),
    ("up", "down"),
    ("fast", "slow"),
    ("day", "night"),
    ("happy", "sad"),
    ("old", "new"),
    ("full", "empty"),
)
COUNT_TEMPLATES = (
    "Count from {a} to {b}.",
    "Please count from {a} to {b}.",
    "Can you count from {a} to {b}?",
    "List the numbers from {a} to {b}.",
)
COUNT_DOWN_TEMPLATES = ("Count down from {a} to {b}.", "Please count down from {a} to {b}.")
ADD_TEMPLATES = (
    "Add {a} and {b}.",
    "What is {a} plus {b}?",
    "Please add {a} and {b}.",
    "What do you get when you add {a} and {b}?",
)
AGAIN = "again"  # the kind of a follow-up asking for the previous answer again
COUNT_MAX_START, COUNT_MAX_SPAN = 30, 8
ADD_MAX = 9


@dataclass(frozen=True)
class Turn:
    """One request and its answer; `steps` is what a reasoning variant thinks before answering; `kind` is
    the task's name (`count`, `add`, ...: the example dataset's categories), `again` for a follow-up."""

    request: str
    answer: str
    steps: tuple[str, ...]
    kind: str = ""

    @property
    def reasoning(self) -> str:
        return "\n".join(f"{i}. {step}" for i, step in enumerate(self.steps, start=1))


def is_held_out(kind: str, template: int, a: int, b: int) -> bool:
    """Combinations no generated conversation contains: counts by range, sums by phrasing and pair."""
    if kind == "count":
        return (a * 7 + b * 3) % 13 == 0
    if kind == "add":
        return (a * 5 + b * 3 + template) % 13 == 0
    return False


def count_turn(a: int, b: int, template: int) -> Turn:
    request = COUNT_TEMPLATES[template].format(a=a, b=b)
    steps = (f"Start at {a}.", "Add one each time.", f"Stop at {b}.")
    return Turn(request, " ".join(str(n) for n in range(a, b + 1)), steps)


def add_turn(a: int, b: int, template: int) -> Turn:
    request = ADD_TEMPLATES[template].format(a=a, b=b)
    steps = (f"Start with {a}.", f"Add {b} to it.", f"The sum is {a + b}.")
    return Turn(request, f"{a} plus {b} is {a + b}.", steps)


def _count(rng: random.Random) -> Turn:
    while True:
        a = rng.randrange(COUNT_MAX_START)
        b = a + rng.randint(2, COUNT_MAX_SPAN)
        if not is_held_out("count", 0, a, b):
            return count_turn(a, b, rng.randrange(len(COUNT_TEMPLATES)))


def _count_down(rng: random.Random) -> Turn:
    b = rng.randrange(COUNT_MAX_START)
    a = b + rng.randint(2, COUNT_MAX_SPAN)
    request = rng.choice(COUNT_DOWN_TEMPLATES).format(a=a, b=b)
    steps = (f"Start at {a}.", "Subtract one each time.", f"Stop at {b}.")
    return Turn(request, " ".join(str(n) for n in range(a, b - 1, -1)), steps)


def _add(rng: random.Random) -> Turn:
    while True:
        a, b, template = rng.randint(1, ADD_MAX), rng.randint(1, ADD_MAX), rng.randrange(len(ADD_TEMPLATES))
        if not is_held_out("add", template, a, b):
            return add_turn(a, b, template)


def _reverse(rng: random.Random) -> Turn:
    words = rng.sample(WORDS, 3)
    request = rng.choice(("Reverse the words: {w}", "Please reverse the words: {w}")).format(
        w=" ".join(words)
    )
    steps = (f"The words are {', '.join(words)}.", "Read them from last to first.")
    return Turn(request, " ".join(reversed(words)), steps)


def _spell(rng: random.Random) -> Turn:
    word = rng.choice(WORDS)
    request = rng.choice(("Spell {w}.", "How do you spell {w}?", "Please spell {w}.")).format(w=word)
    steps = (f"The word is {word}.", f"It has {len(word)} letters.", "Write each letter with a space.")
    return Turn(request, " ".join(word), steps)


def _repeat(rng: random.Random) -> Turn:
    word, times = rng.choice(WORDS), rng.randint(2, 5)
    request = rng.choice(("Repeat {w} {n} times.", "Please say {w} {n} times.")).format(w=word, n=times)
    steps = (f"The word is {word}.", f"Write it {times} times.")
    return Turn(request, " ".join([word] * times), steps)


def _letters(rng: random.Random) -> Turn:
    start = rng.randrange(20)
    end = start + rng.randint(2, 6)
    a, b = string.ascii_lowercase[start], string.ascii_lowercase[end]
    request = rng.choice(("List the letters from {a} to {b}.", "Please list the letters from {a} to {b}."))
    steps = (f"Start at {a}.", "Go through the alphabet.", f"Stop at {b}.")
    return Turn(request.format(a=a, b=b), " ".join(string.ascii_lowercase[start : end + 1]), steps)


def _fact(rng: random.Random) -> Turn:
    kind = rng.randrange(4)
    if kind == 0:
        thing, color = rng.choice(COLORS)
        request, answer = f"What color is {thing}?", f"{thing[0].upper()}{thing[1:]} is {color}."
    elif kind == 1:
        animal, legs = rng.choice(LEGS)
        request, answer = f"How many legs does a {animal} have?", f"A {animal} has {legs} legs."
    elif kind == 2:
        animal, sound = rng.choice(SOUNDS)
        request, answer = f"What sound does a {animal} make?", f"A {animal} says {sound}."
    else:
        word, opposite = rng.choice(OPPOSITES)
        if rng.random() < 0.5:
            word, opposite = opposite, word
        request, answer = f"What is the opposite of {word}?", f"The opposite of {word} is {opposite}."
    return Turn(request, answer, ("Recall the fact.", "Answer in one sentence."))


def _social(rng: random.Random) -> Turn:
    request, answer = rng.choice(
        (
            ("Hello!", "Hello! How can I help you today?"),
            ("Hi there.", "Hello! How can I help you today?"),
            ("How are you?", "I am doing well, thank you. How can I help you today?"),
            ("Thank you!", "You are welcome!"),
            ("Goodbye!", "Goodbye! Have a nice day."),
        )
    )
    return Turn(request, answer, ("The user is being friendly.", "Reply politely."))


TASKS: tuple[tuple[Callable[[random.Random], Turn], int], ...] = (
    (_count, 5),
    (_count_down, 2),
    (_add, 5),
    (_reverse, 3),
    (_spell, 3),
    (_repeat, 3),
    (_letters, 2),
    (_fact, 4),
    (_social, 1),
)


def random_turn(rng: random.Random) -> Turn:
    """One request of a task drawn by weight."""
    tasks, weights = zip(*TASKS, strict=True)
    task: Callable[[random.Random], Turn] = rng.choices(tasks, weights=weights)[0]
    return dataclasses.replace(task(rng), kind=task_kind(task))


def task_kind(task: Callable[[random.Random], Turn]) -> str:
    """A task's kind: its function's name without the underscore (`_count_down`: `count_down`)."""
    return task.__name__.lstrip("_")


def again(previous: Turn) -> Turn:
    """A follow-up asking for the previous answer once more."""
    steps = ("The user wants the same answer.", "Repeat it.")
    return Turn("Say that again.", previous.answer, steps, AGAIN)


def held_out_turns(kind: str) -> list[Turn]:
    """Every held-out `count` or `add` request (none of them occurs in a generated conversation)."""
    if kind == "count":
        return [
            count_turn(a, a + span, (a + span) % len(COUNT_TEMPLATES))
            for a in range(COUNT_MAX_START)
            for span in range(2, COUNT_MAX_SPAN + 1)
            if is_held_out("count", 0, a, a + span)
        ]
    if kind == "add":
        return [
            add_turn(a, b, template)
            for template in range(len(ADD_TEMPLATES))
            for a in range(1, ADD_MAX + 1)
            for b in range(1, ADD_MAX + 1)
            if is_held_out("add", template, a, b)
        ]
    raise ValueError(f"no held-out turns of kind {kind!r}")
