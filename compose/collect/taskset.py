"""A generated reasoning task set with known answers, for trying ``tokentrail collect`` end to end.

Guarantees:

* ``generate(seed, n)`` is deterministic: the same seed and size give the same rows, byte for byte
  once written by ``dumps`` (sorted keys, one row a line), in every process. Only ``random.Random(seed)``
  draws the numbers; the shipped ``data/reasoning.jsonl`` (``SHIPPED``) is ``generate()``'s output,
  and a test keeps it so: regenerating is the only way to change it
  (``python -m compose.collect.taskset --out compose/collect/data/reasoning.jsonl``).
* Every row is in the task file format of ``compose.collect.tasks`` and every answer is computed,
  not typed: arithmetic word problems (numeric), unit conversions answered with their unit
  (numeric, tolerance 0.01 for the rounding), four-option multiple choice (choice), string answers
  (exact) and tasks whose data lies in the rollout's working directory (``files``).
* Every prompt ends with "Give your final answer as <answer>...</answer>.", the marker the verifier
  reads first.
"""

from __future__ import annotations

import argparse
import json
import string
import sys
from collections.abc import Callable
from pathlib import Path
from random import Random
from typing import Any

__all__ = ["generate", "dumps", "main", "SHIPPED", "CATEGORIES"]

SHIPPED = Path(__file__).parent / "data" / "reasoning.jsonl"
_ASK = " Give your final answer as <answer>...</answer>."
# Category, share of the set (per 50 tasks).
CATEGORIES = (("arith", 14), ("units", 10), ("choice", 10), ("word", 8), ("file", 8))
_WORDS = ("planet", "garden", "silver", "bridge", "window", "forest", "candle", "rocket", "island", "pepper",
          "marble", "stone", "bread", "lantern", "harbor", "meadow", "violet", "anchor")
_NAMES = ("Ada", "Ben", "Chen", "Dara", "Eli", "Femi", "Gia", "Hugo", "Ines", "Jon")
# (from, to, unit shown in the answer, conversion)
_UNITS: tuple[tuple[str, str, str, Callable[[float], float]], ...] = (
    ("kilometres", "miles", "miles", lambda x: x * 0.621371192),
    ("miles", "kilometres", "km", lambda x: x * 1.609344),
    ("kilograms", "pounds", "lb", lambda x: x * 2.2046226218),
    ("pounds", "kilograms", "kg", lambda x: x * 0.45359237),
    ("inches", "centimetres", "cm", lambda x: x * 2.54),
    ("feet", "metres", "m", lambda x: x * 0.3048),
    ("litres", "US gallons", "gallons", lambda x: x / 3.785411784),
    ("metres per second", "kilometres per hour", "km/h", lambda x: x * 3.6),
    ("degrees Celsius", "degrees Fahrenheit", "°F", lambda x: x * 9 / 5 + 32),
    ("ounces", "grams", "g", lambda x: x * 28.349523125),
    ("square metres", "square feet", "sq ft", lambda x: x / 0.09290304),
    ("hours", "seconds", "s", lambda x: x * 3600),
)
# Facts with one uncontroversial answer: (question, answer, three wrong options).
_FACTS = (
    ("What is the capital of France?", "Paris", ("Rome", "Madrid", "Berlin")),
    ("Which planet is the largest in the Solar System?", "Jupiter", ("Saturn", "Earth", "Mars")),
    ("What is the chemical symbol for gold?", "Au", ("Ag", "Gd", "Go")),
    ("How many sides does a hexagon have?", "6", ("5", "7", "8")),
    ("Which gas do plants take from the air for photosynthesis?", "Carbon dioxide", ("Oxygen", "Nitrogen", "Helium")),
    ("Which ocean is the largest?", "Pacific", ("Atlantic", "Indian", "Arctic")),
    ("Which of these animals is a mammal?", "Dolphin", ("Shark", "Trout", "Octopus")),
    ("Which word is an anagram of 'listen'?", "silent", ("stolen", "lentil", "listed")),
)


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _arith(rng: Random, i: int) -> tuple[str, int]:
    kind = i % 8
    if kind == 0:
        a, d = rng.randint(12, 60), rng.randint(2, 9)
        s = rng.randint(1, a * d - 1)
        return f"A baker makes {a} loaves a day for {d} days and sells {s} of them. How many loaves are left?", \
            a * d - s
    if kind == 1:
        b, c = rng.randint(2, 9), rng.randint(2, 8)
        a = b * c + rng.randint(1, 40)
        return f"Maya has {a} marbles. She gives {b} to each of her {c} friends. How many marbles does she keep?", \
            a - b * c
    if kind == 2:
        v, h = rng.randrange(40, 125, 5), rng.randint(2, 7)
        return f"A train travels at {v} km/h for {h} hours. How many kilometres does it cover?", v * h
    if kind == 3:
        k = rng.randint(5, 200)
        return f"Three consecutive integers add up to {3 * k + 3}. What is the largest of them?", k + 2
    if kind == 4:
        w, length, p = rng.randint(3, 30), rng.randint(3, 40), rng.randint(2, 9)
        return (f"A garden is {w} m wide and {length} m long. Fencing costs {p} dollars per metre. "
                f"How many dollars does it cost to fence the whole perimeter?"), 2 * (w + length) * p
    if kind == 5:
        n, t = rng.randint(20, 99), rng.randint(3, 9)
        return f"{n} students form teams of {t}. How many students are left without a full team?", n % t
    if kind == 6:
        p, k = rng.choice((10, 20, 25, 50, 75)), rng.randint(2, 40)
        return f"A jacket costs {20 * k} dollars and is {p}% off. What is the sale price in dollars?", \
            20 * k * (100 - p) // 100
    a, b, c = rng.randint(11, 99), rng.randint(3, 19), rng.randint(1, 200)
    return f"A crate holds {a} boxes of {b} apples, and {c} apples are bruised. How many good apples are there?", \
        a * b - c


def _units(rng: Random, i: int, order: list[int]) -> tuple[str, Any, dict]:
    src, dst, unit, convert = _UNITS[order[i % len(order)]]
    x = rng.randint(-40, 100) if src == "degrees Celsius" else rng.randint(2, 250)
    prompt = (f"Convert {x} {src} to {dst}, rounded to 2 decimal places. "
              f"Write the number followed by its unit, e.g. 12.34 {unit}.")
    return prompt, round(convert(x), 2), {"unit": unit}


def _choice(rng: Random, i: int, facts: list[int]) -> tuple[str, list[str], str]:
    kind = i % 4
    if kind == 0:
        prime = rng.choice([p for p in range(11, 98) if all(p % d for d in range(2, 10) if d < p)])
        composites = rng.sample([c for c in range(10, 99) if any(c % d == 0 for d in (2, 3, 5, 7))], 3)
        question, right, wrong = "Which of these numbers is prime?", str(prime), [str(c) for c in composites]
    elif kind == 1:
        a, b = rng.randint(6, 29), rng.randint(6, 29)
        right, wrong = str(a * b), [str(a * b + d) for d in rng.sample((-10, -2, -1, 1, 2, 10, a, -a), 3)]
        question = f"What is {a} × {b}?"
        if len(set(wrong) | {right}) < 4:
            wrong = [str(a * b + d) for d in (1, 2, 3)]
    elif kind == 2:
        k = rng.randint(3, 13)
        right = str(7 * k)
        wrong = [str(7 * k + d) for d in rng.sample((1, 2, 3, 4, 5, 6), 3)]
        question = "Which of these numbers is divisible by 7?"
    else:
        question, right, wrong_facts = _FACTS[facts[(i // 4) % len(facts)]]
        wrong = list(wrong_facts)
    options = [right, *wrong]
    rng.shuffle(options)
    body = "\n".join(f"{chr(ord('A') + j)}) {o}" for j, o in enumerate(options))
    prompt = f"{question}\n{body}\nAnswer with the letter of the correct option."
    return prompt, options, chr(ord("A") + options.index(right))


def _word(rng: Random, i: int) -> tuple[str, str]:
    word = rng.choice(_WORDS)
    kind = i % 6
    if kind == 0:
        return f"Reverse the word '{word}' (write its letters in the opposite order).", word[::-1]
    if kind == 1:
        letter = rng.choice(string.ascii_lowercase[:-1])
        return f"Which letter of the English alphabet comes right after '{letter}'?", chr(ord(letter) + 1)
    if kind == 2:
        k = rng.randint(2, len(word))
        return f"What is the {_ordinal(k)} letter of the word '{word}'?", word[k - 1]
    if kind == 3:
        return f"Sort the letters of '{word}' into alphabetical order and write them as one word.", \
            "".join(sorted(word))
    if kind == 4:
        picks = rng.sample(_WORDS, 4)
        return f"Which of these words comes first in alphabetical order: {', '.join(picks)}?", min(picks)
    return f"Remove every vowel (a, e, i, o, u) from the word '{word}'. What is left?", \
        "".join(c for c in word if c not in "aeiou")


def _file(rng: Random, i: int) -> tuple[str, Any, dict[str, str], dict]:
    kind = i % 8
    if kind in (0, 1):
        numbers = [rng.randint(-50, 500) for _ in range(rng.randint(8, 15))]
        text = "\n".join(map(str, numbers)) + "\n"
        if kind == 0:
            return "Read numbers.txt in your working directory and add up all the numbers in it (one per line).", \
                sum(numbers), {"numbers.txt": text}, {}
        return "Read values.txt in your working directory. What is the largest number in it?", \
            max(numbers), {"values.txt": text}, {}
    if kind == 2:
        lines = [f"2024-05-{d:02d} {rng.choice(('INFO', 'INFO', 'WARN', 'ERROR'))} request {rng.randint(100, 999)}"
                 for d in range(1, rng.randint(12, 28))]
        return "Read server.log in your working directory. How many lines are ERROR lines?", \
            sum(" ERROR " in line for line in lines), {"server.log": "\n".join(lines) + "\n"}, {}
    if kind in (3, 4):
        names = rng.sample(_NAMES, 6)
        scores = rng.sample(range(40, 100), 6)  # distinct, so the best is one person
        csv = "name,score\n" + "".join(f"{n},{s}\n" for n, s in zip(names, scores))
        if kind == 3:
            return "Read scores.csv in your working directory. Who has the highest score? Give the name.", \
                names[scores.index(max(scores))], {"scores.csv": csv}, {}
        return "Read scores.csv in your working directory. What is the average score, rounded to 2 decimal places?", \
            round(sum(scores) / len(scores), 2), {"scores.csv": csv}, {"tolerance": 0.01}
    if kind == 5:
        words = rng.sample([w for w in _WORDS if len(w) <= 6], 7) + [rng.choice(("lighthouse", "watermelon"))]
        rng.shuffle(words)
        return "Read words.txt in your working directory. Which word in it is the longest?", \
            max(words, key=len), {"words.txt": "\n".join(words) + "\n"}, {}
    if kind == 6:
        port = rng.randint(1024, 65000)
        config = json.dumps({"name": "shop", "port": port, "debug": False, "workers": rng.randint(2, 16)}, indent=2)
        return "Read config.json in your working directory. Which port does it set?", port, \
            {"config.json": config + "\n"}, {}
    items = [(rng.choice(_WORDS), rng.randint(1, 20), rng.randint(1, 30)) for _ in range(5)]
    csv = "item,quantity,unit_price\n" + "".join(f"{n},{q},{p}\n" for n, q, p in items)
    return "Read inventory.csv in your working directory. What is the total value of the stock " \
        "(quantity times unit price, summed over all rows)?", sum(q * p for _, q, p in items), \
        {"inventory.csv": csv}, {}


def _counts(n: int) -> list[int]:
    """Tasks per category for a set of ``n``: the shares, rounded by largest remainder."""
    total = sum(share for _, share in CATEGORIES)
    exact = [n * share / total for _, share in CATEGORIES]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda j: (-(exact[j] - counts[j]), j))
    for j in by_remainder[:n - sum(counts)]:
        counts[j] += 1
    return counts


def generate(seed: int = 0, n: int = 50) -> list[dict]:
    """``n`` task rows (``n`` >= 1) drawn from ``seed``, ids ``<category>-<NNN>``, in category order."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    rng = Random(seed)
    unit_order = rng.sample(range(len(_UNITS)), len(_UNITS))
    fact_order = rng.sample(range(len(_FACTS)), len(_FACTS))
    rows: list[dict] = []
    for (category, _), count in zip(CATEGORIES, _counts(n)):
        for i in range(count):
            row: dict[str, Any] = {"id": f"{category}-{i + 1:03d}", "metadata": {"category": category, "seed": seed}}
            if category == "arith":
                row["prompt"], row["answer"] = _arith(rng, i)
                row["verifier"] = "numeric"
            elif category == "units":
                row["prompt"], row["answer"], extra = _units(rng, i, unit_order)
                row["verifier"] = {"kind": "numeric", "tolerance": 0.01}
                row["metadata"].update(extra)
            elif category == "choice":
                row["prompt"], row["choices"], row["answer"] = _choice(rng, i, fact_order)
                row["verifier"] = "choice"
            elif category == "word":
                row["prompt"], row["answer"] = _word(rng, i)
                row["verifier"] = "exact"
            else:
                row["prompt"], row["answer"], row["files"], tolerance = _file(rng, i)
                kind = "exact" if isinstance(row["answer"], str) else "numeric"
                row["verifier"] = {"kind": kind, **tolerance} if tolerance else kind
            row["prompt"] += _ASK
            rows.append(row)
    return rows


def dumps(rows: list[dict]) -> str:
    """The rows as JSONL: sorted keys, one row a line, each line ending in a newline."""
    return "".join(json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n" for row in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m compose.collect.taskset", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--n", type=int, default=50, help="number of tasks (default 50)")
    parser.add_argument("--out", default="-", help="JSONL file to write (default: stdout)")
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n must be at least 1, got {args.n}")
    text = dumps(generate(args.seed, args.n))
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8", newline="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
