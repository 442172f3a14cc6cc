"""The acceptance model's features: names, values and hashed slots, whether a name was seen before or not."""

from __future__ import annotations

import math
from zlib import crc32

from gateway.routing import features
from gateway.routing.features import MASK, extract


def test_an_english_prompt_gives_its_words_and_bigrams_with_one_unit_of_weight() -> None:
    body = {"prompt": "Convert THIS to JSON, please", "temperature": 0.3, "tools": [{"type": "function"}]}
    x = extract(body, "json", 0.8)
    words = ["convert", "this", "to", "json", ",", "please"]
    bigrams = ["convert this", "this to", "to json", "json ,", ", please"]
    grams = words + bigrams
    assert x.names == (
        "kind=json",
        "p_structured",
        "temperature",
        "log_length",
        "tools",
        *("w=" + g for g in grams),
    )
    head = (1.0, 0.8 - 0.5, 0.3, (math.log1p(len(body["prompt"])) - 5.3) / 2.0, 1.0)
    assert x.values == head + (1.0 / math.sqrt(len(grams)),) * len(grams)
    assert x.slots == tuple(crc32(n.encode()) & MASK for n in x.names)
    assert x.kind == "json"


def test_slots_are_the_same_for_names_seen_before_and_new_ones() -> None:
    body = {"prompt": "zebra quokka narwhal"}
    first = extract(body, "qa", 0.1)  # new words: hashed
    again = extract(body, "qa", 0.1)  # now known
    assert first == again
    assert again.slots == tuple(crc32(n.encode()) & MASK for n in again.names)
    # once the cache is full, names outside it are hashed every time, beside cached ones
    full = dict.fromkeys((f"x{i}" for i in range(4096)), 1)
    saved = dict(features._FIXED)
    features._FIXED.clear()
    features._FIXED.update(full)
    features._FIXED["kind=qa"] = crc32(b"kind=qa") & MASK
    try:
        late = extract({"prompt": "an unseen okapi"}, "qa", 0.1)
        assert late.slots == tuple(crc32(n.encode()) & MASK for n in late.names)
        assert "w=okapi" not in features._FIXED
    finally:
        features._FIXED.clear()
        features._FIXED.update(saved)


def test_a_name_in_slot_zero_keeps_it() -> None:
    name = next(f"w=q{i}" for i in range(100_000) if crc32(f"w=q{i}".encode()) & MASK == 0)
    body = {"prompt": f"{name[2:]} is a word"}
    x = extract(body, "qa", 0.1)
    assert x.slots[x.names.index(name)] == 0
    assert extract(body, "qa", 0.1).slots == x.slots


def test_a_token_id_prompt_is_as_long_as_its_tokens() -> None:
    """No words to read, but its context's length (at about four characters a token) still tells: read as an
    empty prompt, a 3,000-token prompt was a very short one."""

    def log_length(prompt: object) -> float:
        x = extract({"prompt": prompt}, "qa", 0.5)
        return x.values[x.names.index("log_length")]

    ids = list(range(3000))
    assert log_length(ids) == (math.log1p(3000 * features.TOKEN_CHARS) - 5.3) / 2.0
    assert log_length([ids[:10], ids]) == (math.log1p(10 * features.TOKEN_CHARS) - 5.3) / 2.0  # the first
    assert log_length([ids[:10]]) > log_length([]) == log_length("")
    assert len(extract({"prompt": ids}, "qa", 0.5).names) == 4  # no word grams
