# ruff: noqa: RUF001 -- instructions in other languages use their own letters and punctuation on purpose
"""Prompts the project writes itself, to teach what the corpus lacks: the instruction decides, not the text.

The corpus holds almost no requests to copy, pick, repeat, reorder or reformat the lines of a given text
(the reference deployment's own benchmark prompts are of that kind), so the model learned to read pasted
material as the sign of a class. Each generated row wraps material cut from a real corpus row (its lines or
sentences, sometimes numbered or bulleted) in an instruction written here, before or after the material:

- *structured*: the answer is the material itself, picked, reordered or reformatted (copy lines 3 and 5,
  repeat word for word, the lines that contain a word, sort, number, as a JSON array or a table);
- *open-ended*: the same material, where it is prose, with an instruction whose answer it only inspires
  (a story, a poem, an opinion, advice) -- so that prose pasted into a request separates nothing and only
  the instruction does. Code, data and tables are left to the structured side: nobody pastes a JSON
  schema to ask for a poem, and in real traffic their form is rightly a sign of structured output.

Instructions are written in several languages, and the material is taken from rows of the same language
where the corpus has enough of them. Generated rows form a source of their own (:data:`SOURCE`) and keep
the source of their material in ``origin``: an evaluation that holds a source out drops the generated rows
made from it, and never tests on generated rows (see :func:`classifiers.evaluate.leave_one_source_out`).
They are reported apart from the real rows in the model card.
"""

from __future__ import annotations

import random
import re
from collections.abc import Collection, Sequence

from classifiers.data import Row

SOURCE = "specroute/generated"
LICENSE = "written for this project (Apache-2.0); material from the row named in origin"
SEED = 20261124

# {sel}: which lines (a phrase of the language, built by ``_selection``), {word}: a word of the material
STRUCTURED: dict[str, tuple[str, ...]] = {
    "en": (
        "Copy {sel} from the list below, exactly as written.",
        "Copy {sel} of the following text. Do not change anything.",
        "Return {sel} of this text verbatim, nothing else.",
        "Pick {sel} from the lines below and output them unchanged.",
        "Repeat the following text word for word.",
        "Repeat the text below exactly, keeping its line breaks.",
        'Output only the lines that contain the word "{word}", unchanged.',
        'Extract every line that mentions "{word}" from the text below.',
        "Sort the following lines alphabetically and print them.",
        "Reverse the order of these lines.",
        "Number each line of the following text, starting at 1.",
        "Remove the numbering from the lines below and return the rest unchanged.",
        "Convert the following lines into a JSON array of strings.",
        "Turn the lines below into a bulleted Markdown list.",
        "Rewrite the text below in upper case.",
        "Put the lines below into a two-column Markdown table: line number and text.",
        "Print the text below again, but without its last line.",
        "Which line comes {ord}? Answer with the line itself, copied exactly.",
        'From the passage below, copy the sentence that contains "{word}".',
        "List the first word of every line below, one per line.",
    ),
    "es": (
        "Copia {sel} de la lista siguiente, tal como están escritas.",
        "Repite el siguiente texto palabra por palabra.",
        'Extrae todas las líneas que contienen la palabra "{word}".',
        "Ordena alfabéticamente las siguientes líneas.",
        "Convierte las siguientes líneas en un arreglo JSON de cadenas.",
    ),
    "fr": (
        "Copie {sel} de la liste ci-dessous, sans rien changer.",
        "Répète le texte suivant mot pour mot.",
        "Extrais toutes les lignes qui contiennent le mot « {word} ».",
        "Trie les lignes suivantes par ordre alphabétique.",
        "Convertis les lignes suivantes en un tableau JSON de chaînes.",
    ),
    "de": (
        "Kopiere {sel} aus der folgenden Liste, genau wie sie dastehen.",
        "Wiederhole den folgenden Text Wort für Wort.",
        "Gib nur die Zeilen aus, die das Wort „{word}“ enthalten.",
        "Sortiere die folgenden Zeilen alphabetisch.",
        "Wandle die folgenden Zeilen in ein JSON-Array von Strings um.",
    ),
    "it": (
        "Copia {sel} dall'elenco seguente, esattamente come sono scritte.",
        "Ripeti il testo seguente parola per parola.",
        'Estrai tutte le righe che contengono la parola "{word}".',
        "Ordina alfabeticamente le righe seguenti.",
    ),
    "pt": (
        "Copie {sel} da lista abaixo, exatamente como estão escritas.",
        "Repita o texto a seguir palavra por palavra.",
        'Extraia todas as linhas que contêm a palavra "{word}".',
        "Ordene as linhas abaixo em ordem alfabética.",
    ),
    "ru": (
        "Скопируй {sel} из списка ниже без изменений.",
        "Повтори следующий текст слово в слово.",
        "Выведи только строки, в которых есть слово «{word}».",
        "Отсортируй следующие строки по алфавиту.",
        "Преобразуй следующие строки в JSON-массив строк.",
    ),
    "zh": (
        "请原样复制下面列表中的{sel}。",
        "请逐字重复下面的文字。",
        "找出下面文本中包含“{word}”的所有行，原样输出。",
        "把下面的各行按顺序编号后输出。",
        "把下面的各行转换成一个 JSON 字符串数组。",
    ),
    "ja": (
        "次のリストから{sel}をそのままコピーしてください。",
        "次の文章を一字一句そのまま繰り返してください。",
        "「{word}」を含む行だけをそのまま出力してください。",
        "次の各行に番号を付けて出力してください。",
        "次の行を JSON の文字列配列に変換してください。",
    ),
    "vi": (
        "Hãy sao chép {sel} từ danh sách dưới đây, giữ nguyên văn.",
        "Lặp lại nguyên văn đoạn văn sau.",
        'Trích ra tất cả các dòng có chứa từ "{word}".',
        "Sắp xếp các dòng sau theo thứ tự bảng chữ cái.",
    ),
    "cs": (
        "Zkopíruj {sel} z následujícího seznamu, přesně jak jsou napsané.",
        "Zopakuj následující text slovo od slova.",
        "Vypiš jen řádky, které obsahují slovo „{word}“.",
    ),
    "tr": (
        "Aşağıdaki listeden {sel} aynen kopyala.",
        "Aşağıdaki metni kelimesi kelimesine tekrarla.",
        'İçinde "{word}" kelimesi geçen satırları olduğu gibi yaz.',
    ),
}

OPEN: dict[str, tuple[str, ...]] = {
    "en": (
        "Write a short story inspired by the text below.",
        "Write a poem about the mood of the following lines.",
        "What do you think of the ideas in this text? Give your honest opinion.",
        "Imagine you are the person who wrote the lines below. How did you feel that day? "
        "Write a diary entry.",
        "Which of the things below would you find most interesting, and why? Share your thoughts.",
        "Write a heartfelt letter to a friend about what the following text makes you think of.",
        "Invent a fictional character who could have said the lines below, and tell their story.",
        "Give me some advice: how could the situation described below make someone happier?",
        "Write an imaginative dialogue between two strangers, loosely based on the text below.",
        "Do you agree with the text below? Argue your own point of view.",
    ),
    "es": (
        "Escribe un cuento corto inspirado en el siguiente texto.",
        "Escribe un poema sobre lo que te hacen sentir estas líneas.",
        "¿Qué opinas de las ideas de este texto? Da tu opinión sincera.",
    ),
    "fr": (
        "Écris une courte histoire inspirée du texte ci-dessous.",
        "Écris un poème sur l'atmosphère de ces lignes.",
        "Que penses-tu des idées de ce texte ? Donne ton avis personnel.",
    ),
    "de": (
        "Schreibe eine kurze Geschichte, die von dem folgenden Text inspiriert ist.",
        "Schreibe ein Gedicht über die Stimmung dieser Zeilen.",
        "Was hältst du von den Gedanken in diesem Text? Sag mir deine ehrliche Meinung.",
    ),
    "it": (
        "Scrivi un breve racconto ispirato al testo seguente.",
        "Che cosa ne pensi delle idee di questo testo? Dammi la tua opinione.",
    ),
    "pt": (
        "Escreva um conto curto inspirado no texto abaixo.",
        "O que você acha das ideias deste texto? Dê sua opinião sincera.",
    ),
    "ru": (
        "Напиши короткий рассказ, вдохновлённый текстом ниже.",
        "Напиши стихотворение о настроении этих строк.",
        "Что ты думаешь об идеях этого текста? Поделись своим мнением.",
    ),
    "zh": (
        "以下面的文字为灵感，写一个短篇故事。",
        "根据下面几行文字的意境，写一首诗。",
        "你怎么看这段文字里的观点？谈谈你自己的看法。",
    ),
    "ja": (
        "次の文章から着想を得て、短い物語を書いてください。",
        "この文章の考え方について、あなたの意見を自由に聞かせてください。",
    ),
    "vi": (
        "Hãy viết một truyện ngắn lấy cảm hứng từ đoạn văn dưới đây.",
        "Bạn nghĩ gì về những ý tưởng trong đoạn văn này? Hãy chia sẻ quan điểm của bạn.",
    ),
    "cs": (
        "Napiš krátkou povídku inspirovanou následujícím textem.",
        "Co si myslíš o myšlenkách tohoto textu? Napiš svůj názor.",
    ),
    "tr": (
        "Aşağıdaki metinden esinlenerek kısa bir öykü yaz.",
        "Bu metindeki fikirler hakkında ne düşünüyorsun? Görüşünü paylaş.",
    ),
}

_ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth")
_LINES = {
    "en": ("line {a}", "lines {a} and {b}", "the {oa} and {ob} lines", "the {oa} line", "lines {a} to {b}"),
    "es": ("la línea {a}", "las líneas {a} y {b}"),
    "fr": ("la ligne {a}", "les lignes {a} et {b}"),
    "de": ("Zeile {a}", "die Zeilen {a} und {b}"),
    "it": ("la riga {a}", "le righe {a} e {b}"),
    "pt": ("a linha {a}", "as linhas {a} e {b}"),
    "ru": ("строку {a}", "строки {a} и {b}"),
    "zh": ("第{a}行", "第{a}行和第{b}行"),
    "ja": ("{a}行目", "{a}行目と{b}行目"),
    "vi": ("dòng {a}", "các dòng {a} và {b}"),
    "cs": ("řádek {a}", "řádky {a} a {b}"),
    "tr": ("{a}. satırı", "{a}. ve {b}. satırları"),
}
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s*")
_WORD = re.compile(r"\w{4,}")


def _pieces(text: str, rng: random.Random) -> list[str]:
    """The material's lines: its own lines when it has several, else its sentences.

    The first and last of them are left out when there are enough: that is where the row's own
    instruction usually sits, and the material should hold none.
    """
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if len(lines) < 3:
        lines = [s.strip() for s in _SENTENCE_END.split(text) if len(s.strip()) > 1]
    if len(lines) >= 5:
        lines = lines[1:-1]
    lines = [ln[:300] for ln in lines]
    if len(lines) > 3:
        start = rng.randrange(0, max(1, len(lines) - 3))
        lines = lines[start : start + rng.randint(3, 16)]
    return lines


def _prose(lines: Sequence[str]) -> bool:
    """Material that reads as text (letters and spaces), not code, data or a table."""
    text = " ".join(lines)
    plain = sum(1 for ch in text if ch.isalpha() or ch.isspace() or ch in ".,;:!?'\"-()")
    return plain >= 0.95 * len(text)


def _dress(lines: Sequence[str], rng: random.Random) -> str:
    """The lines as pasted: plain, numbered or bulleted, sometimes fenced or quoted."""
    style = rng.random()
    if style < 0.25:
        body = "\n".join(f"{i}. {ln}" for i, ln in enumerate(lines, 1))
    elif style < 0.4:
        body = "\n".join(f"- {ln}" for ln in lines)
    elif style < 0.55:
        body = " ".join(lines)
    else:
        body = "\n".join(lines)
    fence = rng.random()
    if fence < 0.1:
        return f'"""\n{body}\n"""'
    if fence < 0.18:
        return f"```\n{body}\n```"
    return body


def _selection(lang: str, n: int, rng: random.Random) -> tuple[str, int]:
    a = rng.randint(1, max(1, n - 1))
    b = rng.randint(a + 1, max(a + 1, n))
    phrase = rng.choice(_LINES.get(lang, _LINES["en"]))
    oa, ob = _ORDINALS[min(a, 10) - 1], _ORDINALS[min(b, 10) - 1]
    return phrase.format(a=a, b=b, oa=oa, ob=ob), a


def _instruction(template: str, lang: str, lines: Sequence[str], rng: random.Random) -> str:
    sel, a = _selection(lang, len(lines), rng)
    words = _WORD.findall(" ".join(lines))
    word = rng.choice(words) if words else "the"
    return template.format(sel=sel, word=word, ord=_ORDINALS[min(a, 10) - 1])


def _place(instruction: str, material: str, rng: random.Random) -> str:
    """The instruction before the material (most often), after it, or around it."""
    where = rng.random()
    if where < 0.5:
        return instruction + rng.choice(("\n\n", "\n", ":\n", "\n\n---\n")) + material
    if where < 0.85:
        return material + rng.choice(("\n\n", "\n", "\n\n---\n")) + instruction
    return (
        f"{instruction}\n\n{material}\n\n{rng.choice(('Thanks.', 'Keep the original wording.', ''))}".strip()
    )


def generate(
    rows: Sequence[Row],
    per_class: int = 500,
    seed: int = SEED,
    labels: Collection[str] = ("structured", "open-ended"),
) -> list[Row]:
    """``per_class`` structured rows, and an open-ended one beside each whose material is prose.

    The open-ended rows reuse the structured rows' material, so that prose pasted into a request cannot
    tell the classes apart; the material of a language comes from rows in that language where there are
    at least 20, else from English rows. ``labels`` keeps the rows of the classes named.
    """
    rng = random.Random(seed)
    by_lang: dict[str, list[Row]] = {}
    for r in rows:
        text = r.body.get("prompt")
        if isinstance(text, str) and len(text) >= 300 and r.label != "ambiguous":
            by_lang.setdefault(r.language, []).append(r)
    english = by_lang.get("en", [])
    if not english:
        return []
    langs = sorted(set(STRUCTURED) & set(OPEN))
    out: list[Row] = []
    for i in range(per_class):
        lang = "en" if rng.random() < 0.55 else rng.choice(langs)
        pool = by_lang.get(lang, [])
        material_rows = pool if len(pool) >= 20 else english
        origin = rng.choice(material_rows)
        lines = _pieces(str(origin.body["prompt"]), rng)
        if len(lines) < 2:
            continue
        for label, templates in (("structured", STRUCTURED), ("open-ended", OPEN)):
            if label == "open-ended" and not _prose(lines):
                continue  # nobody asks for a poem about a JSON schema: code and data stay structured
            template = rng.choice(templates[lang])
            prompt = _place(_instruction(template, lang, lines, rng), _dress(lines, rng), rng)
            out.append(
                Row(
                    id=f"gen-{i}-{label}",
                    source=SOURCE,
                    license=LICENSE,
                    category="copy-transform" if label == "structured" else "inspired-writing",
                    label=label,
                    body={"prompt": prompt},
                    language=lang,
                    origin=origin.source,
                )
            )
    # filtered at the end: the rows kept are the same whichever classes are asked for
    return [r for r in out if r.label in labels]


def is_generated(row: Row) -> bool:
    return row.source == SOURCE
