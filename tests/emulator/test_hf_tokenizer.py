"""The tokenizer directory written for load tools: files in the tokenizers format, a vocabulary that
covers every piece its own pattern cuts from lowercase ASCII text."""

from __future__ import annotations

import json
import re
from pathlib import Path

from gateway.emulator.hf_tokenizer import PATTERN, SPECIALS, vocabulary, write


def test_every_piece_of_ascii_text_is_in_the_vocabulary() -> None:
    vocab = vocabulary()
    text = "The quick brown fox, aged 12345, jumps over 7 lazy dogs!\n\t(twice) -- ok? #tags & {json}: [1]"
    pieces = re.findall(PATTERN, text.lower())
    assert "".join(pieces) == text.lower()
    assert all(p in vocab for p in pieces)


def test_ids_are_stable_unique_and_specials_first() -> None:
    vocab = vocabulary()
    assert vocab == vocabulary()
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert [vocab[s] for s in SPECIALS] == list(range(len(SPECIALS)))


def test_written_files(tmp_path: Path) -> None:
    out = write(tmp_path / "tok", max_model_len=2048)
    spec = json.loads((out / "tokenizer.json").read_text())
    assert spec["model"]["type"] == "WordLevel" and spec["model"]["unk_token"] == "<unk>"
    assert spec["pre_tokenizer"]["pattern"]["Regex"] == PATTERN
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["model_max_length"] == 2048 and config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((out / "special_tokens_map.json").read_text())["eos_token"] == "</s>"


def test_the_tokenizers_library_reads_and_applies_it(tmp_path: Path) -> None:
    """Load tools read the directory with Hugging Face's ``tokenizers``: the same pieces, known ids."""
    from tokenizers import Tokenizer

    out = write(tmp_path / "tok", max_model_len=2048)
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    text = "Write a JSON object with 3 keys: name, age (42) and tags!"
    encoding = tokenizer.encode(text)
    vocab = vocabulary()
    assert encoding.ids == [vocab[p] for p in re.findall(PATTERN, text.lower())]
    assert vocab["<unk>"] not in encoding.ids
    assert tokenizer.get_vocab_size() == len(vocab)
