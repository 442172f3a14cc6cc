"""A small Hugging Face tokenizer directory for the emulated model, for load tools that need one offline.

Load generators such as guidellm count and cut prompts with the served model's tokenizer, which they
fetch by the model's name; ``demo-model`` names nothing on the Hub, and without a network nothing can be
fetched. This writes a ``tokenizer.json`` (the ``tokenizers`` library's format: a word-level model
over the pieces the emulator's own tokenizer cuts text into, at most three letters or digits with
their leading space, or one symbol) plus ``tokenizer_config.json`` and ``special_tokens_map.json``,
which ``transformers.AutoTokenizer.from_pretrained(<dir>)`` reads. Pass the directory as guidellm's
``--processor``. Text is lowercased; letters outside a-z become ``<unk>``. Counts come out close to the
emulator's (about three to four characters a token), which is what load tools need them for.
"""

from __future__ import annotations

import itertools
import json
import string
from pathlib import Path
from typing import Any

SPECIALS = ("<unk>", "<s>", "</s>")
PATTERN = r" ?[a-z]{1,3}| ?[0-9]{1,3}| ?[^a-z0-9\s]|\s"


def vocabulary() -> dict[str, int]:
    """Every piece the pattern can cut from lowercase ASCII text, with stable ids."""
    pieces: list[str] = list(SPECIALS)
    letters = string.ascii_lowercase
    for n in (1, 2, 3):
        words = ["".join(p) for p in itertools.product(letters, repeat=n)]
        pieces += words + [" " + w for w in words]
    numbers = (
        [str(i) for i in range(1000)] + [f"{i:02d}" for i in range(100)] + [f"{i:03d}" for i in range(100)]
    )
    numbers = list(dict.fromkeys(numbers))
    pieces += numbers + [" " + n for n in numbers]
    symbols = list(string.punctuation)
    pieces += symbols + [" " + c for c in symbols] + [" ", "\n", "\t", "\r"]
    return {p: i for i, p in enumerate(dict.fromkeys(pieces))}


def tokenizer_json(max_model_len: int) -> dict[str, Any]:
    special = [
        {
            "id": i,
            "content": tok,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, tok in enumerate(SPECIALS)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {
            "type": "Split",
            "pattern": {"Regex": PATTERN},
            "behavior": "Isolated",
            "invert": False,
        },
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocabulary(), "unk_token": "<unk>"},
    }


def write(directory: Path, max_model_len: int = 1024) -> Path:
    """Write the tokenizer files into ``directory`` (created if need be); returns it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json(max_model_len), ensure_ascii=False))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": "<unk>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "model_max_length": max_model_len,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    specials = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    (directory / "special_tokens_map.json").write_text(json.dumps(specials, indent=2))
    return directory
