# ruff: noqa: RUF001 -- Chinese text uses full-width punctuation on purpose
"""SpecRoute's own training prompts: a seeded composition of the hand-written ``fragments``.

They strengthen what the public corpus has little of (repetition, numeric continuations, simple code,
templated reports, configuration files, data-to-text, extraction, summaries of a provided text, tool calls,
answer-from-context) and the open-ended counterparts (creative writing, role-play, open questions, advice,
chit-chat, long chats), in many phrasings, lengths and both completions and chat form. Deterministic:
``python -m classifiers.synth`` rewrites ``classifiers/data/specroute-prompts.jsonl`` identically.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from classifiers import fragments as F
from classifiers.data import OWN_FILE, OWN_SOURCE

SEED = 7
Body = dict[str, Any]
Maker = Callable[[random.Random], Body]


def _ch(r: random.Random, xs: list[Any] | tuple[Any, ...]) -> Any:
    return xs[r.randrange(len(xs))]


def _passage(r: random.Random, lo: int = 1, hi: int = 3) -> str:
    pool = F.PASSAGES
    k = r.randint(lo, hi)
    return "\n\n".join(r.sample(pool, min(k, len(pool))))


def _wrap(r: random.Random, text: str, system: str | None = None) -> Body:
    """Completions or chat form, sometimes with a system prompt and sampling fields."""
    roll = r.random()
    if roll < 0.45:
        body: Body = {"prompt": text}
    else:
        msgs = []
        if system or r.random() < 0.3:
            msgs.append({"role": "system", "content": system or _ch(r, SYSTEMS)})
        content: Any = text if r.random() < 0.85 else [{"type": "text", "text": text}]
        msgs.append({"role": "user", "content": content})
        body = {"messages": msgs}
    return body


SYSTEMS = [
    "You are a helpful assistant.",
    "You are a concise assistant. Answer briefly.",
    "Answer as accurately as possible.",
    "You work for Acme Corp customer support.",
    "Respond in English.",
]


def _num_word(r: random.Random) -> str:
    n = r.choice([2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 20, 25, 30, 50, 100])
    return (
        str(n)
        if r.random() < 0.6
        else {
            2: "two",
            3: "three",
            4: "four",
            5: "five",
            6: "six",
            7: "seven",
            8: "eight",
            10: "ten",
            12: "twelve",
            15: "fifteen",
            20: "twenty",
            25: "25",
            30: "thirty",
            50: "fifty",
            100: "a hundred",
        }[n]
    )


# ---------------------------------------------------------------- structured


def repeat_lines(r: random.Random) -> Body:
    line = _ch(r, F.LINES_TO_COPY)
    n = _num_word(r)
    k = r.randint(2, 12)
    block = "\n".join(r.sample(F.LINES_TO_COPY, min(k, len(F.LINES_TO_COPY))))
    forms = [
        f"Repeat the following sentence {n} times:\n{line}",
        f'Write "{line}" {n} times, each on its own line.',
        f"Please copy these lines exactly as they are:\n\n{block}",
        f"Copy the text below word for word, without changing anything.\n---\n{block}\n---",
        f"{line}\nRepeat that line {n} times. No commentary.",
        f"Output this line {n} times: {line}",
        f"Echo back the following lines verbatim:\n{block}",
        f"Say '{line}' over and over, {n} times in total.",
        f"Here are some lines:\n{block}\n\nNow write them out again, twice, in the same order.",
        f"Duplicate each line of the list below (so every line appears two times):\n{block}",
        f"I need {n} copies of this line for a test file: {line}",
        f"Reproduce the following block exactly, including punctuation:\n```\n{block}\n```",
        f"{block}\n\nrepeat the above",
        f"Print '{line}' {n} times",
        f"Retype the following text verbatim:\n{_passage(r, 1, 2)}",
    ]
    return _wrap(r, _ch(r, forms))


def copy_block(r: random.Random) -> Body:
    """Copy-these-lines requests composed from verbs, qualifiers, counts and pasted blocks."""
    block = _ch(r, F.COPY_BLOCKS)
    verb, qual, obj = _ch(r, F.COPY_VERBS), _ch(r, F.COPY_QUALIFIERS), _ch(r, F.COPY_OBJECTS)
    count, purpose = _ch(r, F.COPY_COUNTS), _ch(r, F.COPY_PURPOSES)
    ask = " ".join(w for w in (verb, obj, qual, count) if w) + purpose
    ask = _ch(
        r,
        [
            f"{ask[0].upper()}{ask[1:]}.",
            f"Please {ask}.",
            f"Could you {ask}?",
            f"Can you {ask}, please?",
            f"I need you to {ask}.",
            f"{ask[0].upper()}{ask[1:]}. No commentary.",
            f"Your task: {ask}.",
        ],
    )
    forms = [
        f"{ask}\n\n{block}",
        f"{block}\n\n{ask}",
        f"{ask} -> {block.splitlines()[0]}",
        f"{ask}\n---\n{block}\n---",
        f"Below is some text. {ask}\n{block}",
        f'"{block.splitlines()[0]}"\n{ask}',
    ]
    return _wrap(r, _ch(r, forms))


def numeric_sequence(r: random.Random) -> Body:
    start, step = r.randint(0, 50), r.choice([1, 2, 3, 5, 7, 10, 25, -1, -2, -3])
    k = r.randint(4, 9)
    seq = ", ".join(str(start + i * step) for i in range(k))
    end = r.choice([20, 30, 50, 100, 200, 500])
    fib = "1, 1, 2, 3, 5, 8, 13"
    forms = [
        f"Continue the sequence: {seq},",
        f"What are the next 10 numbers in this series? {seq}",
        f"{seq}, ...\nContinue this pattern up to {end}.",
        f"Count from 1 to {end}.",
        f"List all the numbers from {end} down to 1, separated by commas.",
        f"Write out the multiples of {abs(step) or 3} up to {end}, one per line.",
        f"Complete the Fibonacci sequence up to 20 terms: {fib},",
        f"Print the squares of the numbers 1 to {min(end, 40)}.",
        f"Give me the next five terms: {seq}",
        "Extend this list of numbers by 15 more entries following the same rule:\n" + seq.replace(", ", "\n"),
        f"Continue counting: {seq}",
        f"Generate the even numbers between {start} and {start + end}.",
        f"Fill in the missing values: {seq.replace(str(start + 2 * step), '__', 1)}",
        f"Number the lines 1 to {min(end, 60)} followed by a period, e.g. '1.', '2.', ...",
        f"Here is a series: {seq}. Write the next twenty numbers.",
    ]
    return _wrap(r, _ch(r, forms))


def simple_code(r: random.Random) -> Body:
    lang = _ch(r, F.LANGUAGES)
    task = _ch(r, F.CODE_TASKS)
    slang, snippet = _ch(r, F.CODE_SNIPPETS)
    cut = snippet[: max(20, len(snippet) * r.randint(4, 8) // 10)]
    forms = [
        f"Write a {lang} function that {task}.",
        f"In {lang}, implement a function which {task}. Include a short example call.",
        f"Can you give me {lang} code that {task}?",
        f"{lang}: function that {task}",
        f"Complete the following {slang} code:\n\n```{slang}\n{cut}",
        f"Finish this function:\n{cut}",
        f"Rewrite this {slang} code in {lang}:\n\n{snippet}",
        f"Add type hints and a docstring to this code:\n```\n{snippet}```",
        f"There is a bug in the code below. Fix it and return the corrected code only.\n\n{snippet}",
        f"Refactor the following to be more readable:\n{snippet}",
        f"Write unit tests for this function:\n\n```{slang}\n{snippet}```",
        f"Write an SQL query that returns {_ch(r, F.SQL_TASKS)}.",
        f"Given tables customers(id, name, country) and orders(id, customer_id, total, created_at), "
        f"write a query for {_ch(r, F.SQL_TASKS)}.",
        f"Give me a shell command to {_ch(r, F.SHELL_TASKS)}.",
        f"bash one-liner: {_ch(r, F.SHELL_TASKS)}",
        f"Write a regular expression that matches {_ch(r, F.REGEX_TASKS)}.",
        f"regex for {_ch(r, F.REGEX_TASKS)}?",
        f"Create a {lang} class representing a bank account with deposit and withdraw methods.",
        f"Write a loop in {lang} that prints the numbers 1 to 10.",
        "Convert this loop to a list comprehension:\n\nresult = []\nfor x in range(10):\n    "
        "result.append(x * x)",
        f"Write a for loop that {task}. Use {lang}.",
        f"Implement {task.replace('checks', 'a check').replace('returns', 'a function returning')} in "
        f"{lang}. "
        "Only output the code, no explanation.",
        f"{snippet}\n# TODO: add a function that {task}",
        f"Translate to {lang}:\n```{slang}\n{snippet}```",
        f"What does this code print?\n\n{snippet}",
    ]
    return _wrap(r, _ch(r, forms))


def _table(r: random.Random, rows: int) -> tuple[list[str], list[list[str]]]:
    header = ["name", "city", "age", "score"]
    data = [
        [_ch(r, F.NAMES), _ch(r, F.CITIES), str(r.randint(19, 70)), str(r.randint(40, 100))]
        for _ in range(rows)
    ]
    return header, data


def templated_report(r: random.Random) -> Body:
    header, data = _table(r, r.randint(3, 12))
    csv = "\n".join([",".join(header)] + [",".join(d) for d in data])
    week = r.randint(1, 52)
    template = r.choice(
        [
            "Name: {name}\nCity: {city}\nAge: {age}\nScore: {score}\n---",
            "## {name}\n- Location: {city}\n- Age: {age}\n- Result: {score}/100",
            "{name} ({age}) from {city} scored {score} points.",
            "| {name} | {city} | {age} | {score} |",
        ]
    )
    forms = [
        f"Fill in the template below for each person in the data.\n\nTemplate:\n{template}\n\nData:\n{csv}",
        f"Using this format:\n{template}\ngenerate an entry for every row of the following CSV.\n\n{csv}",
        f"Generate the weekly status report for week {week} using exactly this structure:\n"
        "Summary:\nCompleted tasks:\n- ...\nBlocked tasks:\n- ...\nNext steps:\n- ...\n\n"
        f"Notes from the team:\n{_passage(r, 1, 2)}",
        "Create an incident report with the fields Date, Severity, Affected systems, Root cause, "
        "Actions taken, "
        f"based on these notes:\n{_passage(r, 1, 1)}",
        f"Produce an invoice for {_ch(r, F.NAMES)} with one line per item: "
        f"{', '.join(r.sample(F.PRODUCTS, 3))}. "
        "Columns: item, quantity, unit price, total. End with the grand total.",
        f"Turn the following data into a markdown table:\n{csv}",
        f"Convert this CSV to JSON (a list of objects):\n\n{csv}",
        f"Write a report card for each student in the same format (Name / Grade / Comment):\n{csv}",
        "Make a daily standup summary in the format 'Yesterday: ... / Today: ... / Blockers: ...' for "
        "each of: "
        f"{', '.join(r.sample(F.NAMES, 4))}. Use placeholder text where unknown.",
        f"Fill out the form:\nFull name: ____\nDate of birth: ____\nCity: ____\nfor {_ch(r, F.NAMES)} "
        f"who was born on {r.randint(1, 28)}/{r.randint(1, 12)}/19{r.randint(50, 99)} in {_ch(r, F.CITIES)}.",
        f"Generate a changelog entry in Keep a Changelog format from these release notes:\n{F.PASSAGES[16]}",
        f"For each city in [{', '.join(r.sample(F.CITIES, 5))}], output a line: '<city>: population ?, "
        "country ?'.",
    ]
    return _wrap(r, _ch(r, forms))


def config_file(r: random.Random) -> Body:
    kind, what = _ch(r, F.CONFIG_TASKS + F.MORE_CONFIG_TASKS)
    forms = [
        f"Write a {kind} for {what}.",
        f"Create a {kind} for {what}. Output only the file.",
        f"I need a {kind} that sets up {what}.",
        f"{kind} for {what}, please",
        f"Generate a minimal {kind} ({what}).",
        "Convert this INI file to YAML:\n\n[server]\nhost = 0.0.0.0\nport = 8080\n\n[database]\nurl = "
        "postgres://db:5432/app\npool_size = 10",
        "Convert the following YAML to JSON:\n\nserver:\n  port: 8080\n  tls: true\nusers:\n  - alice\n "
        " - bob",
        "Add a healthcheck to this docker-compose service:\n\nservices:\n  api:\n    image: myapi:1.2\n"
        '    ports:\n      - "8000:8000"',
        f"Write a JSON configuration for a logger with level '{_ch(r, ['debug', 'info', 'warning'])}', "
        "a file handler and a console handler.",
        f"Give me an .env file template for {what}, with placeholder values.",
        f"Write the config file ({kind}) for {what}. Comment each setting.",
    ]
    return _wrap(r, _ch(r, forms))


def data_to_text(r: random.Random) -> Body:
    product = _ch(r, F.PRODUCTS)
    attrs = {
        "product": product,
        "price": f"{r.randint(19, 899)}.99 EUR",
        "weight": f"{r.randint(1, 40) / 4} kg",
        "colour": _ch(r, ["black", "white", "silver", "green", "navy"]),
        "warranty": f"{r.randint(1, 5)} years",
        "rating": f"{r.randint(30, 50) / 10} out of 5",
    }
    keys = r.sample(list(attrs), r.randint(3, 6))
    bullets = "\n".join(f"- {k}: {attrs[k]}" for k in keys)
    as_json = json.dumps({k: attrs[k] for k in keys})
    name, city = _ch(r, F.NAMES), _ch(r, F.CITIES)
    triples = f"({name} | born in | {city})\n({name} | occupation | architect)\n({city} | country | ?)"
    forms = [
        f"Write a one-paragraph product description using only these facts:\n{bullets}",
        f"Turn this JSON into a short sentence for a shop page: {as_json}",
        f"Describe the following record in plain English:\n{bullets}",
        f"Verbalise the triples below as one sentence.\n{triples}",
        f"Write a weather summary from this data: city={city}, max=2{r.randint(0, 9)}C, "
        f"min=1{r.randint(0, 9)}C, "
        f"rain={r.randint(0, 90)}%, wind={r.randint(5, 40)} km/h.",
        f"Generate a match report sentence: home=FC {city}, away=United, "
        f"score={r.randint(0, 4)}-{r.randint(0, 4)}, "
        f"scorer={name}, minute={r.randint(1, 90)}.",
        f"From this table, write one sentence per row.\n{chr(10).join(','.join(d) for d in _table(r, 4)[1])}",
        "Write an alt text for a chart with these values: "
        f"{', '.join(f'{c}: {r.randint(5, 95)}%' for c in r.sample(F.CITIES, 4))}.",
    ]
    return _wrap(r, _ch(r, forms))


def extraction(r: random.Random) -> Body:
    text = _passage(r, 1, 4)
    what = _ch(
        r, ["names of people", "dates", "numbers and amounts", "locations", "organisations", "key facts"]
    )
    forms = [
        f"Extract all {what} from the text below and return them as a JSON list.\n\n{text}",
        f"{text}\n\nList every {what[:-1] if what.endswith('s') else what} mentioned above, one per line.",
        f"From the following text, pull out the {what}. Answer in the format 'item: "
        f'context\'.\n"""\n{text}\n"""',
        f"Text:\n{text}\n\nReturn a JSON object with the keys 'who', 'what', 'when', 'where'.",
        f"Identify the {what} in this passage:\n{text}",
        f"{F.PASSAGES[5]}\n\nExtract the order details: product, size, dates, tracking number.",
        f"Find all numbers in the text and list them with what they refer to.\n\n{text}",
        f"Read the passage and output a bullet list of the {what}.\n\n{text}",
    ]
    return _wrap(r, _ch(r, forms))


def summarise(r: random.Random) -> Body:
    text = _passage(r, 1, 5)
    n = r.choice([1, 2, 3, 5])
    forms = [
        f"Summarize the following text in {n} sentences:\n\n{text}",
        f"{text}\n\nTL;DR",
        f"{text}\n\nSummarise the above in {n} bullet points.",
        f"Write a short summary of this article:\n{text}",
        f"Give me the key points of the text below.\n---\n{text}\n---",
        f"Rewrite the following paragraph in a more formal tone:\n\n{text}",
        f"Correct the grammar and spelling mistakes in this text:\n{text.replace('the', 'teh', 2)}",
        f"Paraphrase the following:\n{text}",
        f"Shorten this to under 50 words:\n{text}",
        f"Simplify the text below so that a 10-year-old can understand it.\n\n{text}",
        f"Condense this into one headline:\n{text}",
        f"Here is a document:\n\n{text}\n\nPlease write an executive summary of it.",
        f"Convert this paragraph into a bulleted list of facts:\n{text}",
        f"Proofread:\n{text}",
    ]
    return _wrap(r, _ch(r, forms))


def rag(r: random.Random) -> Body:
    docs = r.sample(F.PASSAGES, r.randint(2, 8))
    ctx = "\n\n".join(f"[{i + 1}] {d}" for i, d in enumerate(docs))
    q = _ch(
        r,
        [
            "When is the next meeting?",
            "How many trees were planted?",
            "What did the council decide?",
            "How long does the ferry crossing take?",
            "What changed in version 3.2?",
            "Who led the warehouse migration?",
            "How much did revenue grow?",
            "What is released as a by-product of photosynthesis?",
        ],
    )
    forms = [
        "Answer the question using only the context below. If the answer is not in the context, say "
        "'unknown'.\n\n"
        f"Context:\n{ctx}\n\nQuestion: {q}\nAnswer:",
        f"{ctx}\n\nBased on the documents above, {q[0].lower() + q[1:]} Cite the document number.",
        f"Use the following pieces of context to answer the question at the end.\n\n{ctx}\n\nQuestion: {q}",
        f"### Documents\n{ctx}\n\n### Question\n{q}\n\n### Answer (quote the relevant sentence)",
        f"Given these search results:\n{ctx}\n\nAnswer briefly: {q}",
    ]
    roll = r.random()
    if roll < 0.3:  # retrieved passages in the system prompt, the question alone in the last user turn
        rule = _ch(
            r,
            [
                "Answer the user's question using only the context below. If the answer is not there, "
                "say you don't know.",
                "You are a support bot. Use only the following retrieved documents to answer.",
                "Ground every answer in these passages and cite them as [n].",
                "Context information is below. Given the context and no prior knowledge, answer the query.",
            ],
        )
        msgs: list[dict[str, str]] = [{"role": "system", "content": f"{rule}\n\n{ctx}"}]
        if r.random() < 0.4:
            msgs += [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello! Ask me anything."},
            ]
        return {"messages": [*msgs, {"role": "user", "content": q}]}
    text = _ch(r, forms)
    if roll < 0.6:
        return {
            "messages": [
                {"role": "system", "content": "Answer strictly from the provided documents."},
                {"role": "user", "content": text},
            ]
        }
    return _wrap(r, text)


TOOL_SPECS = [
    {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
    {
        "name": "search_flights",
        "description": "Search flights between two airports on a date",
        "parameters": {
            "type": "object",
            "properties": {
                "origin": {"type": "string"},
                "destination": {"type": "string"},
                "date": {"type": "string"},
            },
        },
    },
    {
        "name": "create_event",
        "description": "Create a calendar event",
        "parameters": {
            "type": "object",
            "properties": {"title": {"type": "string"}, "start": {"type": "string"}},
        },
    },
    {
        "name": "lookup_order",
        "description": "Look up an order by its id",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    },
]


def tool_call(r: random.Random) -> Body:
    specs = r.sample(TOOL_SPECS, r.randint(1, 4))
    city, name = _ch(r, F.CITIES), _ch(r, F.NAMES)
    ask = _ch(
        r,
        [
            f"What's the weather in {city} right now?",
            f"Find me a flight from {city} to {_ch(r, F.CITIES)} next Friday.",
            f"Put a meeting with {name} in my calendar tomorrow at 10.",
            f"Where is my order A-{r.randint(1000, 9999)}?",
            f"Is it going to rain in {city}?",
        ],
    )
    spec_text = "\n".join(json.dumps(s) for s in specs)
    forms = [
        f"You have access to the following functions:\n{spec_text}\n\nTo call a function, respond with JSON "
        f'{{"name": ..., "arguments": {{...}}}}.\n\nUser: {ask}',
        f"Tools:\n{spec_text}\n\nRequest: {ask}\nRespond with the function call only.",
        "Available APIs:\n"
        + "\n".join(f"- {s['name']}: {s['description']}" for s in specs)
        + f"\n\nWhich API should be called for this request, with which arguments? Output JSON.\n{ask}",
    ]
    if r.random() < 0.5:
        return {
            "messages": [{"role": "user", "content": ask}],
            "tools": [{"type": "function", "function": s} for s in specs],
        }
    return _wrap(r, _ch(r, forms))


def json_output(r: random.Random) -> Body:
    forms = [
        f"Return a JSON object describing a {_ch(r, F.PRODUCTS)} with keys name, price and features.",
        "Give me 5 fake user records as JSON with fields id, name, email, city. Use cities like "
        f"{_ch(r, F.CITIES)}.",
        'Classify each review as positive or negative and output JSON: [{"id": 1, "label": ...}].\n'
        "1. Great product, works perfectly.\n2. Broke after two days.\n3. Okay for the price.",
        "Output a YAML list of the planets of the solar system with their order from the sun.",
        "Produce a CSV with the columns country,capital,continent for 10 European countries.",
        "Parse this address into JSON fields street, city, postcode: 12 Harbour Road, "
        f"{_ch(r, F.CITIES)} 4021",
        "Create an XML document with a root <library> and three <book> elements with title and author.",
    ]
    body = _wrap(r, _ch(r, forms))
    if r.random() < 0.3:
        body["response_format"] = {"type": "json_object"}
    return body


def cjk_structured(r: random.Random) -> Body:
    p = _ch(r, F.CJK_PASSAGES)
    forms = [
        *F.CJK_STRUCT,
        f"请总结下面这段文字的主要内容：\n{p}",
        f"{p}\n\n请用一句话概括上文。",
        f"从下面的文本中提取所有的数字和日期，以JSON格式输出：\n{p}",
        f"请根据以下内容回答问题：文中提到的时间是什么？\n\n{p}",
        f"请把下面这段话改写得更正式一些：\n{p}",
    ]
    return _wrap(r, _ch(r, forms))


def short_artefact(r: random.Random) -> Body:
    """Short imperative requests for a code, config or document artefact, in many wordings."""
    roll = r.random()
    if roll < 0.45:
        text = f"{_ch(r, F.ARTEFACT_VERBS)} {_ch(r, F.ARTEFACTS)} {_ch(r, F.ARTEFACT_PURPOSES)}".strip()
        text += _ch(r, [".", "", "?", ". Output only the file.", ", please.", ". Keep it minimal."])
    elif roll < 0.75:
        a, k = r.randint(0, 30), r.randint(2, 9)
        text = _ch(r, F.NUMERIC_ASKS).format(
            n=r.choice([5, 10, 12, 15, 20, 25, 30, 50]),
            a=a,
            b=a + r.choice([20, 50, 100, 200]),
            k=k,
            a2=a + k,
            a3=a + 2 * k,
            a4=a + 3 * k,
        )
    else:
        s1, s2, s3 = r.sample(F.TEMPLATE_SECTIONS, 3)
        text = _ch(r, F.TEMPLATE_ASKS).format(
            doc=_ch(r, F.TEMPLATE_DOCS), s1=s1, s2=s2, s3=s3, name=_ch(r, F.NAMES)
        )
    return _wrap(r, text)


# ---------------------------------------------------------------- open-ended


def creative(r: random.Random) -> Body:
    topic, poem = _ch(r, F.STORY_TOPICS), _ch(r, F.POEM_TOPICS)
    words = r.choice([100, 200, 300, 500, 800, 1000])
    forms = [
        f"Write a short story about {topic}.",
        f"Tell me a story about {topic}. Make it funny.",
        f"Write a poem about {poem}.",
        f"Compose a haiku about {poem}.",
        f"Write a {words}-word story about {topic}, told from the first person.",
        f"Can you write song lyrics about {poem}?",
        f"Write the opening chapter of a novel about {topic}.",
        f"I'd love a bedtime story for my daughter about {topic}.",
        f"Write a sonnet on {poem}.",
        f"Write a limerick about {topic}.",
        f"Imagine {topic}. Describe what happens next.",
        "Write a letter from the future to your younger self.",
        f"Write a blog post about {poem}, personal and reflective.",
        f"Here is my world: {_passage(r, 1, 2)}\n\nUsing this setting, write a dramatic short story "
        "with dialogue.",
        f"{_passage(r, 1, 3)}\n\nWrite a poem inspired by the text above.",
        f"Write an essay on why {poem} matters to people.",
        f"Invent a myth that explains {poem}.",
        f"Write a screenplay scene about {topic}.",
    ]
    return _wrap(r, _ch(r, forms))


def roleplay(r: random.Random) -> Body:
    who, where = _ch(r, F.PERSONAS)
    user = _ch(r, [*F.CHITCHAT, "Tell me about yourself.", "What brings you here?", "What's the plan?"])
    bio = _passage(r, 0, 2) if r.random() < 0.4 else ""
    system = (
        f"You are {who}, {where}. Stay in character at all times and never break the fourth wall. "
        f"Speak in the voice of the character, with their habits and mood. {bio}"
    ).strip()
    forms = [
        f"Pretend you are {who}, {where}. {user}",
        f"Role-play as {who}. I'll be a visitor. Start the scene.",
        f"Act as {who} {where} and greet me.",
        f"Let's play a game: you are {who} and I'm your old friend. {user}",
        f"Imagine you are {who}. How would you describe your day?",
    ]
    if r.random() < 0.5:
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
    return _wrap(r, _ch(r, forms))


def open_question(r: random.Random) -> Body:
    q = _ch(r, F.OPEN_QUESTIONS)
    forms = [
        q,
        f"{q} Explain in detail.",
        f"I've always wondered: {q[0].lower() + q[1:]}",
        f"{q} Give me your honest opinion.",
        f"Explain like I'm five: {q}",
        f"Write an essay discussing the question: {q}",
        f"{_passage(r, 1, 2)}\n\nWhat do you think about this? Share your opinion.",
        f"{_passage(r, 1, 3)}\n\nWhat does this make you think about the future?",
        f"{_ch(r, F.COPY_BLOCKS)}\n\nWhat do you make of this? Be honest.",
        f"Here is something I wrote:\n{_ch(r, F.COPY_BLOCKS)}\n\nHow does it make you feel?",
    ]
    return _wrap(r, _ch(r, forms))


def advice(r: random.Random) -> Body:
    a, b = _ch(r, F.ADVICE), _ch(r, F.BRAINSTORM)
    forms = [
        a,
        f"{a} Please be kind, I'm having a rough week.",
        f"Give me some ideas for {b}.",
        f"Brainstorm {b}.",
        f"Can you suggest {b}?",
        f"Help me come up with {b}.",
        f"Hi! {a}",
        f"{a}\n\nSome context: {_passage(r, 0, 1)}",
    ]
    return _wrap(r, _ch(r, forms))


def chitchat(r: random.Random) -> Body:
    return _wrap(r, _ch(r, F.CHITCHAT))


def long_chat(r: random.Random) -> Body:
    """Long histories (which may contain code or data) whose last user turn is conversational."""
    msgs: list[dict[str, str]] = []
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": _ch(r, SYSTEMS)})
    for _ in range(r.randint(1, 6)):
        u = _ch(r, F.ADVICE + F.OPEN_QUESTIONS + F.CHITCHAT)
        if r.random() < 0.3:
            u = f"Can you look at this?\n{_ch(r, F.CODE_SNIPPETS)[1]}"
        msgs.append({"role": "user", "content": u})
        msgs.append({"role": "assistant", "content": _passage(r, 1, 2)})
    last = _ch(
        r, F.CHITCHAT + F.ADVICE + F.OPEN_QUESTIONS + ["What do you think?", "Tell me more about that."]
    )
    msgs.append({"role": "user", "content": last})
    if r.random() < 0.35:  # the same history as one completions transcript
        transcript = "\n\n".join(
            f"{'Human' if m['role'] == 'user' else 'Assistant'}: {m['content']}" for m in msgs
        )
        return {"prompt": transcript + "\n\nAssistant:"}
    return {"messages": msgs}


def long_chat_structured(r: random.Random) -> Body:
    """Long chit-chat histories whose last user turn asks for code, a config or a copy."""
    msgs: list[dict[str, str]] = []
    for _ in range(r.randint(1, 5)):
        msgs.append({"role": "user", "content": _ch(r, F.CHITCHAT + F.OPEN_QUESTIONS)})
        msgs.append({"role": "assistant", "content": _passage(r, 1, 2)})
    last = _ch(r, [simple_code, config_file, repeat_lines, numeric_sequence, summarise])(r)
    text = last.get("prompt") or last["messages"][-1]["content"]
    msgs.append({"role": "user", "content": text if isinstance(text, str) else text[0]["text"]})
    return {"messages": msgs}


def cjk_open(r: random.Random) -> Body:
    p = _ch(r, F.CJK_PASSAGES)
    forms = [*F.CJK_OPEN, f"{p}\n\n读了这段话，你有什么感想？", f"{p}\n\n请以此为背景写一个小故事。"]
    return _wrap(r, _ch(r, forms))


FAMILIES: list[tuple[str, str, Maker, int]] = [
    ("repetition", "structured", repeat_lines, 260),
    ("copy-block", "structured", copy_block, 240),
    ("numeric-sequence", "structured", numeric_sequence, 200),
    ("simple-code", "structured", simple_code, 320),
    ("templated-report", "structured", templated_report, 200),
    ("config-file", "structured", config_file, 220),
    ("data-to-text", "structured", data_to_text, 160),
    ("extraction", "structured", extraction, 200),
    ("summarise-rewrite", "structured", summarise, 240),
    ("answer-from-context", "structured", rag, 200),
    ("tool-call", "structured", tool_call, 140),
    ("format-output", "structured", json_output, 120),
    ("long-chat-structured", "structured", long_chat_structured, 100),
    ("cjk-structured", "structured", cjk_structured, 120),
    ("short-artefact", "structured", short_artefact, 450),
    ("creative", "open-ended", creative, 420),
    ("role-play", "open-ended", roleplay, 260),
    ("open-question", "open-ended", open_question, 300),
    ("advice-brainstorm", "open-ended", advice, 280),
    ("chit-chat", "open-ended", chitchat, 140),
    ("long-chat", "open-ended", long_chat, 300),
    ("cjk-open", "open-ended", cjk_open, 120),
]


def generate(seed: int = SEED) -> list[dict[str, Any]]:
    r = random.Random(seed)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for family, label, make, n in FAMILIES:
        made = 0
        for _ in range(n * 6):
            body = make(r)
            key = json.dumps(body, sort_keys=True, ensure_ascii=False)
            if key in seen:
                continue
            seen.add(key)
            out.append(
                {
                    "id": f"{family}-{made:04d}",
                    "source": OWN_SOURCE,
                    "license": "Apache-2.0 (SpecRoute)",
                    "category": family,
                    "label": label,
                    "body": body,
                }
            )
            made += 1
            if made >= n:
                break
    return out


def main() -> None:
    rows = generate()
    OWN_FILE.parent.mkdir(parents=True, exist_ok=True)
    with OWN_FILE.open("w", encoding="utf-8") as fh:
        for d in rows:
            fh.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} prompts to {OWN_FILE}")


if __name__ == "__main__":
    main()
