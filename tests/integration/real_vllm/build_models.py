"""Build the tiny local models the real-vLLM suite serves (run with the vLLM environment's Python).

Nothing can be downloaded, so the suite makes its own: a byte-level BPE tokenizer trained on generated
text and a 2-layer Llama with random weights (the target), plus three drafts whose acceptance against
the target is known in advance:

- ``draft-same``: the target's own weights, so greedy proposals are (almost) always accepted;
- ``draft-other``: another seed, so proposals are (almost) never accepted;
- ``draft-noisy``: the target's weights plus Gaussian noise, scaled so that the draft's greedy choice
  agrees with the target's on about 70 % of positions, for an acceptance in between.

Every step is seeded, so the same recipe gives the same folders; ``run.sh`` keys its cache on this file.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB_SIZE = 2048
SPECIALS = ["<pad>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TARGET_SEED, OTHER_SEED, NOISE_SEED = 1234, 98765, 4242
NOISY_TARGET_AGREEMENT = 0.7

_WORD_TEXT = (
    "the a an of to and in is it that for on with as was be by this are at from or have not but what all "
    "were when we there can more if no out so said up use time two way each which she do how their will "
    "other about many then them these some her would make like him into has look write go see number "
    "could people my than first water been call who oil its now find long down day did get come made may "
    "part over new sound take only little work know place year live me back give most very after thing "
    "our just name good sentence man think say great where help through much before line right too mean "
    "old any same tell boy follow came want show also around form three small set put end does another "
    "well large must big even such because turn here why ask went men read need land different home us "
    "move try kind hand picture again change off play spell air away animal house point page letter "
    "mother answer found study still learn should world high every near add food between own below "
    "country plant last school father keep tree never start city earth eye light thought head under story"
)
WORDS = _WORD_TEXT.split()
CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    'import json\ndata = json.loads(\'{"key": [1, 2, 3]}\')\nprint(data["key"])\n',
    "SELECT id, name FROM users WHERE age > 21 ORDER BY name;\n",
    "if (x > 0) {\n  return x;\n} else {\n  return -x;\n}\n",
]


def corpus(seed: int = 7, lines: int = 6000) -> list[str]:
    """Generated text: prose, counting, repeated lines, code and chat turns (deterministic)."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = i % 6
        if kind == 0:
            words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
            out.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ","]))
        elif kind == 1:
            start = rng.randint(0, 900)
            out.append(", ".join(str(n) for n in range(start, start + rng.randint(5, 20))))
        elif kind == 2:
            line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 7)))
            out.append("\n".join([line] * rng.randint(2, 5)))
        elif kind == 3:
            out.append(rng.choice(CODE))
        elif kind == 4:
            q = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 10)))
            a = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))
            out.append(f"<|user|>{q}?<|end|><|assistant|>{a}.<|end|>")
        else:
            out.append(json.dumps({rng.choice(WORDS): rng.randint(0, 999) for _ in range(3)}))
    return out


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=SPECIALS[3:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
    )
    fast.save_pretrained(out)
    return fast


def build_model(tok: PreTrainedTokenizerFast, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        # At this scale greedy output falls into loops on some prompts and wanders on others, so n-gram
        # speculation is accepted often but not always, while choices are not near-ties rounding could flip.
        initializer_range=0.04,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        # Zero output rows for the specials: their logit is then 0 while some of the other 2k is positive,
        # so greedy decoding never stops early on a random </s> and every request runs to max_tokens.
        model.lm_head.weight[: len(SPECIALS)] = 0.0
    return model


@torch.no_grad()
def agreement(target: LlamaForCausalLM, draft: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> float:
    """Share of positions on the target's greedy continuations where the draft picks the same token."""
    prompts = ["The meaning of life is", "1, 2, 3, 4, 5,", "def add(a, b):", "Tell me about the city"]
    hits = total = 0
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        seq = target.generate(ids, max_new_tokens=48, do_sample=False, pad_token_id=tok.pad_token_id)
        t_next = target(seq).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
        d_next = draft(seq).logits[0, ids.shape[1] - 1 : -1].argmax(-1)
        hits += int((t_next == d_next).sum())
        total += t_next.numel()
    return hits / total


def noisy_copy(target: LlamaForCausalLM, scale: float) -> LlamaForCausalLM:
    draft = LlamaForCausalLM(target.config).eval()
    draft.load_state_dict(target.state_dict())
    gen = torch.Generator().manual_seed(NOISE_SEED)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() > 1:
                p.add_(torch.randn(p.shape, generator=gen) * p.std() * scale)
        draft.lm_head.weight[: len(SPECIALS)] = 0.0
    return draft


def calibrate_noise(target: LlamaForCausalLM, tok: PreTrainedTokenizerFast) -> tuple[float, float]:
    """Bisect the noise scale (deterministically) until agreement is near the goal."""
    lo, hi = 0.0, 4.0
    best = (hi, agreement(target, noisy_copy(target, hi), tok))
    for _ in range(12):
        mid = (lo + hi) / 2
        a = agreement(target, noisy_copy(target, mid), tok)
        if abs(a - NOISY_TARGET_AGREEMENT) < abs(best[1] - NOISY_TARGET_AGREEMENT):
            best = (mid, a)
        if abs(a - NOISY_TARGET_AGREEMENT) < 0.05:
            break
        lo, hi = (mid, hi) if a > NOISY_TARGET_AGREEMENT else (lo, mid)
    return best


def save(model: LlamaForCausalLM, tok_dir: Path, out: Path) -> None:
    model.save_pretrained(out, safe_serialization=True)
    for f in tok_dir.iterdir():
        shutil.copy(f, out / f.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    out: Path = parser.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = out / "_tokenizer"
    tok = build_tokenizer(tok_dir)

    target = build_model(tok, TARGET_SEED)
    other = build_model(tok, OTHER_SEED)
    scale, noisy_agreement = calibrate_noise(target, tok)
    noisy = noisy_copy(target, scale)
    info = {
        "vocab_size": len(tok),
        "agreement": {
            "draft-same": agreement(target, target, tok),
            "draft-noisy": noisy_agreement,
            "draft-other": agreement(target, other, tok),
        },
        "noise_scale": scale,
    }
    for name, model in (
        ("target", target),
        ("draft-same", target),
        ("draft-other", other),
        ("draft-noisy", noisy),
    ):
        save(model, tok_dir, out / name)
    shutil.rmtree(tok_dir)
    (out / "models.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
