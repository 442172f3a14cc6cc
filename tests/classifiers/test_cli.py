import json
import subprocess
import sys
from pathlib import Path

SPECROUTE = Path(sys.executable).parent / "specroute"


def _run(lines: list[str], *args: str) -> list[str]:
    out = subprocess.run(
        [str(SPECROUTE), "classify", *args],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return out.stdout.splitlines()


def test_classify_is_one_to_one_with_errors_in_place() -> None:
    lines = [
        json.dumps({"prompt": "Write a haiku about spring."}),
        "{not json",
        json.dumps({"messages": [{"role": "user", "content": "SELECT the top 5 rows? write the SQL"}]}),
        json.dumps([1, 2]),
        "",
        json.dumps({"model": "m", "prompt": ["a", "b"], "max_tokens": 5}),
        json.dumps({"temperature": 0.1}),
    ]
    out = [json.loads(line) for line in _run(lines)]
    assert len(out) == len(lines)
    for i in (1, 3, 4, 6):
        assert "error" in out[i]
    for i in (0, 2, 5):
        rec = out[i]
        assert rec["label"] in ("structured", "open-ended")
        assert 0.0 <= rec["p_structured"] <= 1.0
        assert rec["latency_us"] >= 0.0


def test_classify_explain() -> None:
    out = json.loads(_run([json.dumps({"prompt": "Count from 1 to 20."})], "--explain", "--top", "3")[0])
    assert len(out["explain"]) == 3
    assert all(isinstance(name, str) for name, _ in out["explain"])


FIXTURES = Path(__file__).parent / "fixtures"


def test_train_without_a_corpus_says_which_flag(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(SPECROUTE), "train", "--data", str(tmp_path), "--model", str(tmp_path / "m.json.gz")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "--data" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "m.json.gz").exists()


def test_train_writes_the_artefact_and_card(tmp_path: Path) -> None:
    model, card = tmp_path / "m.json.gz", tmp_path / "CARD.md"
    args = ["train", "--data", str(FIXTURES), "--model", str(model), "--card", str(card)]
    subprocess.run(
        [str(SPECROUTE), *args, "--no-bench"], capture_output=True, text=True, timeout=300, check=True
    )
    first = model.read_bytes()
    text = card.read_text()
    assert "acme/research-only" in text and "Leave-one-source-out" in text
    # the calibration table is described, and the hand-kept log of measured variants is carried over
    assert "isotonic regression" in text and "Variants measured and not shipped" in text
    # the body's character grams are extracted but left out by default, and the card says so
    assert "left out of the model" in text
    subprocess.run(
        [str(SPECROUTE), *args, "--no-bench", "--no-evaluate"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert model.read_bytes() == first  # deterministic
