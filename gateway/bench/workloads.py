"""Prompt sets to benchmark with: built-in ``structured`` / ``open-ended`` / ``mixed``, or a JSONL file.

Speculative decoding pays off when the draft can guess the continuation (copying, counting, code,
JSON, extraction) and does not when the text is free (stories, poems, advice). Each prompt carries
that ``label`` so results can be reported per class — the number users need to decide with.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

Api = Literal["completions", "chat"]
STRUCTURED = "structured"
OPEN_ENDED = "open-ended"
BUILTIN = ("structured", "open-ended", "mixed", "mixed-formats")
#: what ``mixed-formats`` appends to every other structured prompt: a task that reads as structured, an
#: answer that is verse (the ``output-format`` acceptance profile gives it prose's acceptance)
VERSE_ANSWER = "\nAnswer as a haiku."


@dataclass(frozen=True)
class Prompt:
    """One request to send: a prompt text, or a whole request ``body`` taken as given."""

    label: str
    text: str = ""
    body: dict[str, Any] | None = None
    api: Api | None = None  # None: decided by the run's ``--api``


@dataclass
class Workload:
    name: str
    prompts: list[Prompt] = field(default_factory=list)

    def labels(self) -> list[str]:
        return sorted({p.label for p in self.prompts})


_STRUCTURED_PROMPTS = [
    "Repeat the following line exactly 20 times, one per line: the quick brown fox jumps over the lazy dog",
    "Copy this list verbatim, keeping the numbering:\n1. apples\n2. pears\n3. plums\n4. cherries\n5. figs",
    "Continue the sequence up to 200, comma separated: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "Continue counting by sevens until 350: 7, 14, 21, 28, 35, 42,",
    "List the even numbers from 2 to 120, one per line.",
    "Write the multiplication table of 12 from 12 x 1 to 12 x 20, one line each, as `12 x n = result`.",
    "Convert this CSV to a JSON array of objects with keys name, age, city:\n"
    "name,age,city\nAda,36,London\nAlan,41,Manchester\nGrace,85,Arlington\nLinus,54,Portland",
    'Return a JSON object describing a user with fields "id", "email", "roles" (a list), "created_at" '
    '(ISO 8601) and a nested "address" with street, city and zip. Output only JSON.',
    "Write a Kubernetes Deployment YAML for an nginx container named web with 3 replicas, port 80, "
    "resource requests of 100m CPU and 128Mi memory, and a readiness probe on /healthz.",
    "Write a docker-compose.yml with services postgres (16, volume pgdata), redis (7) and an app built "
    "from . that depends on both and exposes port 8080.",
    "Write an nginx server block that proxies /api to http://127.0.0.1:9000 and serves static files "
    "from /var/www/html with gzip enabled.",
    "Write a Python function `def fibonacci(n: int) -> list[int]` that returns the first n Fibonacci "
    "numbers, with a docstring and type hints.",
    "Complete this Python class so every method is implemented:\n\nclass Stack:\n    def __init__(self):\n"
    "        self._items = []\n\n    def push(self, item):\n\n    def pop(self):\n\n    def peek(self):\n\n"
    "    def __len__(self):",
    "Write a SQL query that returns, for each customer, the total order amount in 2023, from tables "
    "customers(id, name) and orders(id, customer_id, amount, created_at), sorted by total descending.",
    "Translate this JavaScript to TypeScript with explicit types:\n\nfunction sum(items) {\n"
    "  return items.reduce((acc, x) => acc + x.price * x.qty, 0);\n}",
    'Write a Go HTTP handler that returns {"status": "ok"} as JSON with a 200 status code.',
    "Extract every email address from this text, one per line:\nContact alice@example.com for billing, "
    "bob.smith@corp.io for support, and ops-team@infra.example.net for outages. CC carol@example.org.",
    "Extract the dates from these log lines as YYYY-MM-DD, one per line:\n"
    "[2024-03-01 10:22:01] start\n[2024-03-02 11:00:13] retry\n[2024-03-05 09:41:55] done",
    "Fill in this form as key: value lines using the passport data below.\nName:\nNationality:\nDate of "
    "birth:\nExpiry:\n\nPassport: SMITH, JOHN; British; born 1984-07-19; valid until 2031-02-01.",
    "Reformat the following as a Markdown table with columns Country, Capital, Population:\n"
    "France Paris 68M; Germany Berlin 84M; Italy Rome 59M; Spain Madrid 48M; Poland Warsaw 37M",
    "Write the YAML for a GitHub Actions workflow that runs `pytest` on Python 3.11 and 3.12 on every "
    "push and pull request.",
    "Sort these words alphabetically and print them one per line: pear, apple, zebra, mango, kiwi, "
    "banana, cherry, grape, lemon, orange, apricot, date",
    "Write a regular expression that matches IPv4 addresses, then list five example strings it matches.",
    "Output the HTML for a table of the first ten square numbers, with a header row n | n squared.",
]

_OPEN_ENDED_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Write a poem about the first snow of winter in a city at night.",
    "What advice would you give someone starting their first job as a nurse?",
    "Why do people enjoy sad music? Share your thoughts.",
    "Describe an imaginary planet where the oceans are made of glass.",
    "Write a letter from a grandmother to her grandson who is leaving for university.",
    "If you could redesign the way cities handle traffic, what would you change and why?",
    "Tell me a bedtime story about a dragon who is afraid of the dark.",
    "What makes a friendship last for decades?",
    "Write a haiku sequence about autumn in the mountains.",
    "Imagine you are a tree that has lived for five hundred years. What have you seen?",
    "How should I think about choosing between two job offers with very different cultures?",
    "Write a monologue for a villain who believes they are the hero.",
    "What would a perfect Sunday look like for you? Describe it in detail.",
    "Invent a new holiday and explain its traditions.",
    "Write a song chorus about leaving home for the first time.",
    "What are the pros and cons of living in a small village versus a big city?",
    "Describe the smell of rain to someone who has never experienced it.",
    "Write a mystery opening paragraph set on a night train across Europe.",
    "Give me some encouragement: I failed an important exam today.",
    "Tell the story of how the moon and the sea first met, as a myth.",
    "What questions should humanity be asking about the next hundred years?",
    "Write a dialogue between a cat and a robot vacuum.",
    "Describe your ideal bookshop and the people who work there.",
]


def builtin(name: str) -> Workload:
    """The built-in sets; ``mixed`` interleaves both classes evenly; ``mixed-formats`` is ``mixed`` with every
    other structured prompt asking for its answer as a haiku (:data:`VERSE_ANSWER`)."""
    structured = [Prompt(STRUCTURED, text) for text in _STRUCTURED_PROMPTS]
    open_ended = [Prompt(OPEN_ENDED, text) for text in _OPEN_ENDED_PROMPTS]
    if name == "structured":
        return Workload(name, structured)
    if name == "open-ended":
        return Workload(name, open_ended)
    if name == "mixed-formats":
        structured = [
            Prompt(STRUCTURED, p.text + VERSE_ANSWER) if i % 2 == 0 else p for i, p in enumerate(structured)
        ]
    if name in ("mixed", "mixed-formats"):
        mixed = [p for pair in zip(structured, open_ended, strict=False) for p in pair]
        return Workload(name, mixed)
    raise ValueError(f"unknown workload {name!r}; built-in: {', '.join(BUILTIN)}")


def load_file(path: Path) -> Workload:
    """Read JSONL: each line a string prompt, ``{"prompt": ...}``, ``{"messages": ...}`` or a full body.

    A ``label`` field marks the class (removed before sending); lines without one count as ``unlabelled``.
    """
    prompts: list[Prompt] = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e})") from None
        if isinstance(obj, str):
            prompts.append(Prompt("unlabelled", obj))
            continue
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{n}: expected a string or an object")
        body = dict(obj)
        label = str(body.pop("label", "unlabelled"))
        if set(body) == {"prompt"} and isinstance(body["prompt"], str):
            prompts.append(Prompt(label, body["prompt"]))
        elif "messages" in body:
            prompts.append(Prompt(label, body=body, api="chat"))
        elif "prompt" in body:
            prompts.append(Prompt(label, body=body, api="completions"))
        else:
            raise ValueError(f"{path}:{n}: needs 'prompt' or 'messages'")
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return Workload(path.stem, prompts)


def resolve(name_or_path: str | None, path: Path | None) -> Workload:
    return load_file(path) if path is not None else builtin(name_or_path or "mixed")


@dataclass(frozen=True)
class RequestSpec:
    """What the load generator sends: path and body bytes, prepared once per prompt."""

    label: str
    api: Api
    path: str
    body: bytes
    stream: bool


def prepare(
    workload: Workload,
    *,
    api: Api = "completions",
    model: str = "demo-model",
    max_tokens: int = 128,
    temperature: float = 0.0,
    stream: bool = True,
) -> list[RequestSpec]:
    """Serialise every prompt once, so the hot loop only writes bytes.

    Fields given in a file's request body win over the command-line defaults, except ``stream``, which
    the run decides (and which asks for ``usage`` so that TPOT uses the server's own token count).
    """
    specs: list[RequestSpec] = []
    for p in workload.prompts:
        kind: Api = p.api or api
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": temperature}
        if p.body is not None:
            body.update(p.body)
        elif kind == "chat":
            body["messages"] = [{"role": "user", "content": p.text}]
        else:
            body["prompt"] = p.text
        body["stream"] = stream
        if stream:
            body["stream_options"] = {**body.get("stream_options", {}), "include_usage": True}
        else:
            body.pop("stream_options", None)
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        specs.append(RequestSpec(p.label, kind, path, orjson.dumps(body), stream))
    return specs


def order(specs: list[RequestSpec], seed: int) -> list[RequestSpec]:
    """A seeded shuffle: the same run twice sends the same prompts in the same order."""
    out = list(specs)
    random.Random(seed).shuffle(out)
    return out
