"""Documents that reward long-range memory: real prose with facts inserted at random depths and
questions at the end whose answers need them (in the spirit of TRIM-KV's SynthLong, appendix B).

Everything a document is made of comes in two disjoint parts, `train` and `heldout`:
- **Haystacks.** train: The Debian Administrator's Handbook (`debian-handbook`) and the Debian
  Reference (`debian-reference-en`, GPL-2+), long-form prose about one operating system. heldout:
  the Python 3.11 tutorial and HOWTOs (`python3.11-doc`), technical prose of another kind, which the
  retrieval suite and the second perplexity text use. Never either: `/usr/share/common-licenses`
  (the perplexity table's text).
- **Templates.** Each fact form has its phrasings (statement, question, answer prefix); the
  held-out phrasings are the retrieval suite's, RULER's and today's pass key among them.
- **Entities.** Every list (names, cities, things, words, ...) is split by position: every fourth
  entry is held out.

`train_document(rng, tokens, tokenizer)` makes one training document; `heldout_task(task, rng,
tokens)` one retrieval instance. The trainer only ever calls the first; `check_train_document`
refuses a training document that holds a held-out template or entity (the trainer runs it on
every document it makes).
"""
import glob
import os
import re
import random

from kvpolicy_tools.data import corpus

HAYSTACK_PAGES = {
    "train": ["/usr/share/doc/debian-handbook/html/en-US/*.html", "/usr/share/debian-reference/*.en.html"],
    "heldout": ["/usr/share/doc/python3.11/html/tutorial/*.html", "/usr/share/doc/python3.11/html/howto/*.html"],
}
PACKAGES = {"train": "debian-handbook debian-reference-en", "heldout": "python3.11-doc"}
CHARS_PER_TOKEN = 4.0  # SmolLM2's tokenizer on English prose, about; the length is checked after tokenizing


def _split(items, split):
    """Every fourth entry held out, the rest for training."""
    return [x for i, x in enumerate(items) if (i % 4 == 3) == (split == "heldout")]


FIRST_NAMES = ("Alice Bruno Chloe Dmitri Elena Farid Greta Hiro Ines Jonas Keiko Luca Mira Nadia Oscar Priya "
               "Quentin Rosa Samir Tara Umar Vera Wendell Ximena Yusuf Zora Anders Beatriz Cyrus Dalia Emeka "
               "Fiona Gustav Hana Ivo Jamila Kofi Lena Marek Noor Otto Paloma Rafael Sofia Tobias Ulla Viktor "
               "Wanda Yara Zeno").split()
CITIES = ("Lisbon Oslo Nairobi Lima Kyoto Dublin Quito Tallinn Accra Hanoi Porto Bergen Cusco Leeds Perth "
          "Rabat Sapporo Tunis Utrecht Valencia Windhoek Zagreb Aarhus Bilbao Cork Dakar Esbjerg Florence "
          "Geneva Hobart Izmir Jaipur Krakow Lyon Malmo Nantes Odessa Padua Riga Salzburg").split()
THINGS = ["access code", "room number", "locker combination", "pass key", "ticket number", "serial number",
          "vault code", "badge number", "order number", "parcel code", "gate code", "door code",
          "account number", "seat number", "permit number", "voucher code", "member number", "case number",
          "invoice number", "tracking number"]
WORDS = ("amber falcon copper lantern willow harbor meadow quartz thistle ember juniper orchid pebble "
         "saffron tundra velvet walnut zephyr anchor bramble cinder dune fjord glacier hazel indigo jasper "
         "kestrel lagoon marble nectar obsidian prairie quill raven sable tamarind umber vortex").split()
COLORS = "red blue green yellow purple orange black white silver golden brown grey pink teal".split()
ITEMS = ("apples bread candles dates eggs flour garlic honey ink jam kale lemons milk nails oats paper "
         "rice salt tea umbrellas vinegar wool yeast zucchini batteries cheese soap pepper beans string").split()
ROLES = ["treasurer", "captain", "director", "librarian", "editor", "coach", "chairperson", "curator"]
GROUPS = ["chess club", "rowing team", "garden society", "film circle", "choir", "hiking group",
          "book club", "robotics team", "photography club", "astronomy society", "debate team", "orchestra"]
MONTHS = "January February March April May June July August September October November December".split()
VARIABLES = "alpha beta gamma delta kappa sigma omega theta lambda zeta rho tau".split()

# Per fact form, its phrasings: (statement, question, answer prefix); every fourth is held out, and
# the held-out ones are the retrieval suite's (kvpolicy-retrieval).
FORMS = {
    "number": [
        ("The {thing} is {value}.", "What is the {thing}?", "The {thing} is"),
        ("Note that the {thing} is {value}.", "Which {thing} was given?", "The {thing} given was"),
        ("Write this down: the {thing} is {value}.", "What was the {thing}?", "It was"),
        ("The pass key is {value}. Remember it: {value} is the pass key.", "What is the pass key?", "The pass key is"),
        ("For the record, the {thing} reads {value}.", "What does the {thing} read?", "The {thing} reads"),
        ("Keep in mind: {value} is the {thing}.", "Tell me the {thing}.", "The {thing} is"),
        ("The {thing} was set to {value} today.", "What was the {thing} set to?", "The {thing} was set to"),
        ("One special magic number is hidden here: {value}.", "What is the special magic number?",
         "The special magic number is"),
    ],
    "keyvalue": [
        ("The code for {key} is {value}.", "What is the code for {key}?", "The code for {key} is"),
        ("Entry {key} maps to {value}.", "What does entry {key} map to?", "Entry {key} maps to"),
        ("Under the label {key} we stored {value}.", "What was stored under the label {key}?", "Under {key} we stored"),
        ("One of the special magic numbers for {key} is {value}.", "What is the special magic number for {key}?",
         "The special magic number for {key} is"),
    ],
    "multivalue": [
        ("One number filed under {key} is {value}.", "List every number filed under {key}.",
         "The numbers filed under {key} are"),
        ("{key} also has the number {value}.", "Which numbers does {key} have?", "{key} has the numbers"),
        ("Another value recorded for {key}: {value}.", "What values were recorded for {key}?", "The values are"),
        ("One of the special magic numbers for {key} is {value}.",
         "What are all the special magic numbers for {key}?", "The special magic numbers for {key} are"),
    ],
    "name": [
        ("The {role} of the {group} is {name}.", "Who is the {role} of the {group}?", "The {role} of the {group} is"),
        ("{name} was elected {role} of the {group}.", "Who was elected {role} of the {group}?", "It was"),
        ("The {group} chose {name} as its {role}.", "Whom did the {group} choose as {role}?", "The {group} chose"),
        ("Everyone agrees that {name} serves as {role} of the {group}.", "Who serves as {role} of the {group}?",
         "The {role} of the {group} is"),
    ],
    "date": [
        ("{name} was born on {date}.", "When was {name} born?", "{name} was born on"),
        ("The meeting with {name} is on {date}.", "When is the meeting with {name}?", "The meeting is on"),
        ("{name} arrived on {date}.", "On which day did {name} arrive?", "{name} arrived on"),
        ("{name}'s contract ends on {date}.", "When does {name}'s contract end?", "It ends on"),
    ],
    "place": [
        ("{name} lives in {city}.", "Where does {name} live?", "{name} lives in"),
        ("{name} moved to {city} last year.", "Where did {name} move to?", "{name} moved to"),
        ("The parcel for {name} went to {city}.", "Where did the parcel for {name} go?", "It went to"),
        ("{name} is working in {city} these days.", "In which city is {name} working?", "{name} is working in"),
    ],
    "list": [
        ("{name} needs to buy {items}.", "What does {name} need to buy?", "{name} needs to buy"),
        ("{name}'s bag holds {items}.", "What does {name}'s bag hold?", "It holds"),
        ("On {name}'s list: {items}.", "What is on {name}'s list?", "The list has"),
        ("{name} packed {items} for the trip.", "What did {name} pack for the trip?", "{name} packed"),
    ],
    # multi-hop: the first statement links a person to a box, the second the box to a number
    "chain": [
        ("{name} has the {color} box.|The {color} box holds the number {value}.",
         "What number is in the box {name} has?", "The number in {name}'s box is"),
        ("{name} took the {color} key.|The {color} key opens locker {value}.",
         "Which locker does {name}'s key open?", "It opens locker"),
        ("{name} sits at the {color} table.|The {color} table is table number {value}.",
         "What is the number of the table where {name} sits?", "{name} sits at table number"),
        ("{name} owns the {color} folder.|The {color} folder contains file {value}.",
         "Which file is in the folder owned by {name}?", "The folder owned by {name} contains file"),
    ],
    # assigned, then reassigned one or more times; the question asks for the last value
    "variable": [
        ("Set {var} to {value}.|Now set {var} to {value}.", "What is {var} now?", "{var} is now"),
        ("The counter {var} starts at {value}.|The counter {var} was changed to {value}.",
         "What is the counter {var} at the end?", "The counter {var} is"),
        ("Let {var} be {value}.|Update: {var} becomes {value}.", "What is the latest value of {var}?",
         "The latest value of {var} is"),
        ("VAR {var} = {value}.|VAR {var} = {value}.", "What is the final value of VAR {var}?",
         "The final value: VAR {var} ="),
    ],
}


def forms(kind, split):
    return _split(FORMS[kind], split)


def entities(split):
    return {"name": _split(FIRST_NAMES, split), "city": _split(CITIES, split), "thing": _split(THINGS, split),
            "key": _split(WORDS, split), "color": _split(COLORS, split), "item": _split(ITEMS, split),
            "role": _split(ROLES, split), "group": _split(GROUPS, split), "var": _split(VARIABLES, split)}


_haystacks = {}


def has_haystack(split):
    return any(glob.glob(pattern) for pattern in HAYSTACK_PAGES[split])


def haystack(split):
    """The split's prose, one string, blank lines collapsed (cached)."""
    if split not in _haystacks:
        pages = sorted(p for pattern in HAYSTACK_PAGES[split] for p in glob.glob(pattern))
        pages = [p for p in pages if not re.search(r"(legalnotice|index|ix01|pr01|genindex|search)", os.path.basename(p))]
        if not pages:
            raise SystemExit(f"longrange: no {split} haystack: install the Debian packages {PACKAGES[split]}")
        text = "\n".join(corpus.html_text(p) for p in pages)
        _haystacks[split] = re.sub(r"\n{2,}", "\n", text)
    return _haystacks[split]


def _number(rng, digits=None):
    d = digits or rng.choice((4, 5, 5, 6))
    return str(rng.randrange(10 ** (d - 1), 10 ** d))


def _date(rng):
    return f"{rng.choice(MONTHS)} {rng.randrange(1, 29)}, {rng.randrange(1950, 2030)}"


def _items(rng, pool, n):
    xs = rng.sample(pool, n)
    return ", ".join(xs[:-1]) + " and " + xs[-1], xs


class Fact:
    """Statements to insert (in order), the question, the answer prefix, and the answer: `answer` is
    the text that follows the prefix; `needed` the strings a right answer holds (all of them)."""

    def __init__(self, statements, question, prefix, answer, needed):
        self.statements, self.question, self.prefix, self.answer, self.needed = statements, question, prefix, answer, needed


def make_fact(kind, rng, split, fill=None, form=None, restated=False):
    """One fact of `kind` from the split's phrasings and entities; `fill` fixes some slots
    (distractors of the same form share the form and differ in the key). restated: half the
    training variables are reassigned in their first statement's own words (below)."""
    e = entities(split)
    statement, question, prefix = form or rng.choice(forms(kind, split))
    slots = {"thing": rng.choice(e["thing"]), "key": rng.choice(e["key"]), "name": rng.choice(e["name"]),
             "city": rng.choice(e["city"]), "role": rng.choice(e["role"]), "group": rng.choice(e["group"]),
             "color": rng.choice(e["color"]), "var": rng.choice(e["var"]), "date": _date(rng), "value": _number(rng)}
    slots.update(fill or {})
    if kind == "list":
        slots["items"], needed = _items(rng, e["item"], rng.randrange(2, 5))
        answer = slots["items"]
    elif kind == "variable":
        first, *updates = statement.split("|")
        values = [slots["value"]] + [_number(rng) for _ in range(rng.randrange(1, 3))]
        if restated and split == "train" and int(values[0]) % 2:
            # a fact restated with a new value is the newest fact, not a repeat (a gate that saw only
            # updates worded apart keeps the first value of such a variable more often than the last);
            # the half is the first value's parity, so no document draws anything more
            updates = [first]
        stmts = [first.format(**{**slots, "value": values[0]})]
        stmts += [updates[0].format(**{**slots, "value": v}) for v in values[1:]]
        return Fact(stmts, question.format(**slots), prefix.format(**slots), values[-1], [values[-1]])
    else:
        answer = {"name": slots["name"], "date": slots["date"], "place": slots["city"]}.get(kind, slots["value"])
        needed = [answer]
    stmts = [s.format(**slots) for s in statement.split("|")]
    return Fact(stmts, question.format(**slots), prefix.format(**slots), answer, needed)


def multivalue_fact(rng, split, n_values=3, form=None, key=None):
    """One key, several values stated apart; the answer lists them all."""
    e = entities(split)
    statement, question, prefix = form or rng.choice(forms("multivalue", split))
    key = key or rng.choice(e["key"])
    values = [_number(rng) for _ in range(n_values)]
    stmts = [statement.format(key=key, value=v) for v in values]
    return Fact(stmts, question.format(key=key), prefix.format(key=key), ", ".join(values), values)


def _insert(rng, body, statements, lo=0.0, hi=0.9):
    """body with each statement on its own line at a random line boundary in [lo, hi) of its length,
    the statements kept in their order (a reassignment after its assignment)."""
    lines = body.split("\n")
    n = len(lines)
    cuts = sorted(rng.randrange(int(lo * n), max(int(lo * n) + 1, int(hi * n))) for _ in statements)
    out, k = [], 0
    for i, line in enumerate(lines):
        while k < len(statements) and cuts[k] == i:
            out.append(statements[k])
            k += 1
        out.append(line)
    out.extend(statements[k:])
    return "\n".join(out)


def _merge(rng, sequences):
    """The statements of several facts in one random interleaving that keeps each fact's own order."""
    queues = [list(q) for q in sequences if q]
    out = []
    while queues:
        q = rng.choice([q for q in queues for _ in q])  # weighted by what is left, so no fact bunches at the end
        out.append(q.pop(0))
        queues = [q for q in queues if q]
    return out


def _prose(rng, split, chars, text=None):
    text = text or haystack(split)
    start = rng.randrange(0, max(1, len(text) - chars))
    body = text[start:start + chars]
    nl = body.find("\n")
    return body[nl + 1:] if 0 <= nl < len(body) // 4 else body


KINDS = ("number", "keyvalue", "multivalue", "name", "date", "place", "list", "chain", "variable")


def numeral_line(rng):
    """A line of numbers that states nothing: a long integer, a fraction of two, a long decimal or a
    list, as listings, tables and worked arithmetic print them. Their digits are prose to the gate:
    neither a fact nor asked about."""
    digits = lambda lo, hi: str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in range(rng.randrange(lo, hi) - 1))
    form = rng.randrange(4)
    if form == 0:
        return digits(8, 21)
    if form == 1:
        return f"{digits(8, 18)}/{digits(8, 18)}"
    if form == 2:
        return "0." + "".join(str(rng.randrange(10)) for _ in range(rng.randrange(10, 25)))
    return ", ".join(digits(2, 7) for _ in range(rng.randrange(3, 7)))


def train_document(rng, tokens, prose_only=False, haystack_text=None, numerals=0.0):
    """train_document_probed's document without its probe."""
    return train_document_probed(rng, tokens, prose_only, haystack_text, numerals)[:4]


def probe(facts):
    """Every fact asked, with its answer, in the form the documents' own questions take: what a
    later reader could ask of the document (the probe a target pass appends, kvpolicy-gate-targets
    --probe), so every stated fact, asked in the document or not, is read by a later query."""
    return "".join(f"\nQuestion: {f.question}\nAnswer: {f.prefix} {f.answer}." for f in facts)


def train_document_probed(rng, tokens, prose_only=False, haystack_text=None, numerals=0.0, restated=False):
    """(text, answer spans, fact spans, the inserted lines, probe) of about `tokens` tokens: prose from the
    train haystack, 1-4 facts (and same-form distractors) at random depths, then 1-3 questions with
    their answers. Spans are character ranges: the answers after the questions, and every fact
    statement in the prose (asked or not: a gate cannot know which will be). prose_only: plain
    prose, no spans. haystack_text: another training haystack (tests). numerals: the chance that a
    document with facts also holds 2-6 numeral lines (numeral_line) at random depths, numbers a gate
    must not take for facts; 0 draws nothing, so documents are those of a run without them. restated:
    half the variables reassigned in their first statement's words (make_fact); documents without
    a variable are those of a run without it. The
    probe (`probe`: every fact, distractors included, asked after the document) draws nothing from
    rng, so the document is the one train_document makes; plain prose has an empty one."""
    split = "train"
    if prose_only:
        return _prose(rng, split, int(tokens * CHARS_PER_TOKEN), haystack_text), [], [], [], ""
    facts = []
    for _ in range(rng.randrange(1, 5)):
        kind = rng.choice(KINDS)
        f = multivalue_fact(rng, split, rng.randrange(2, 4)) if kind == "multivalue" else make_fact(kind, rng, split, restated=restated)
        facts.append(f)
        if kind in ("number", "keyvalue") and rng.random() < 0.5:  # a distractor of the same form
            facts.append(make_fact(kind, rng, split))
    asked = rng.sample(facts, min(len(facts), rng.randrange(1, 4)))
    tail = probe(asked)  # the questions the document ends with, sized before the prose is cut
    noise = [numeral_line(rng) for _ in range(rng.randrange(2, 7))] if numerals and rng.random() < numerals else []
    fact_chars = sum(len(s) + 1 for f in facts for s in f.statements) + len(tail) + sum(len(x) + 1 for x in noise)
    body = _prose(rng, split, max(200, int(tokens * CHARS_PER_TOKEN) - fact_chars), haystack_text)
    if noise:
        body = _insert(rng, body, noise, 0.0, 1.0)
    statements = _merge(rng, [f.statements for f in facts])
    text = _insert(rng, body, statements) + "\n"
    fact_spans, at = [], 0
    for st in statements:  # each on its own line, in this order
        at = text.index(st + "\n", at)
        fact_spans.append((at, at + len(st)))
        at += len(st)
    spans, inserted = [], list(statements) + noise
    for f in asked:
        text += f"\nQuestion: {f.question}\nAnswer: {f.prefix}"
        spans.append((len(text), len(text) + len(f.answer) + 2))  # " answer."
        text += f" {f.answer}."
        inserted += [f.question, f"{f.prefix} {f.answer}."]
    return text, spans, fact_spans, inserted, probe(facts)


TASKS = ("multikey", "multivalue", "variable", "multihop")  # the single key is kvpolicy-retrieval's pass key


def heldout_task(task, rng, tokens, haystack_text=None):
    """(prompt, needed strings, tokens to generate) of one retrieval instance of about `tokens`
    tokens, entirely from held-out material: prose from the held-out haystack, the held-out
    phrasings and entities. The fact sits after 5-50% of the prose; the question ends the prompt
    with its answer prefix, and the model continues. haystack_text: another held-out prose (tests)."""
    return heldout_instance(task, rng, tokens, haystack_text)[:3]


def heldout_instance(task, rng, tokens, haystack_text=None):
    """heldout_task's instance and, fourth, the statements of the fact it asks about (the lines that
    state the answer; tests check the answer is in them, not merely somewhere in the prose)."""
    split = "heldout"
    f_forms = {k: forms(k, split) for k in FORMS}
    if task == "multikey":  # four keys of the same form; one is asked
        form = f_forms["keyvalue"][0]
        keys = rng.sample(entities(split)["key"], 4)
        facts = [make_fact("keyvalue", rng, split, form=form, fill={"key": k, "value": _number(rng, 5)}) for k in keys]
        fact = rng.choice(facts)
    elif task == "multivalue":  # one key, three values, and a distractor key with its own
        form = f_forms["multivalue"][0]
        keys = rng.sample(entities(split)["key"], 2)
        fact = multivalue_fact(rng, split, 3, form=form, key=keys[0])
        facts = [fact, multivalue_fact(rng, split, 1, form=form, key=keys[1])]
    elif task == "variable":  # assigned, then reassigned once; a second variable, assigned once, beside it
        form = f_forms["variable"][0]
        names = rng.sample(entities(split)["var"], 2)
        fact = make_fact("variable", rng, split, form=form, fill={"var": names[0]})
        while len(fact.statements) != 2:
            fact = make_fact("variable", rng, split, form=form, fill={"var": names[0]})
        other = make_fact("variable", rng, split, form=form, fill={"var": names[1]})
        facts = [fact, Fact(other.statements[:1], "", "", "", [])]
    elif task == "multihop":  # a person to a folder, the folder to a file number; another pair as a distractor
        form = f_forms["chain"][0]
        colors = rng.sample(entities(split)["color"], 2)
        names = rng.sample(entities(split)["name"], 2)
        fact = make_fact("chain", rng, split, form=form,
                         fill={"name": names[0], "color": colors[0], "value": _number(rng, 4)})
        facts = [fact, make_fact("chain", rng, split, form=form,
                                 fill={"name": names[1], "color": colors[1], "value": _number(rng, 4)})]
    else:
        raise SystemExit(f"longrange: task '{task}': one of {', '.join(TASKS)}")
    statements = _merge(rng, [f.statements for f in facts])
    ask = f"\n\n{fact.question} {fact.prefix}"
    fact_chars = sum(len(s) + 1 for s in statements) + len(ask)
    body = _prose(rng, split, max(200, int(tokens * CHARS_PER_TOKEN) - fact_chars), haystack_text)
    intro = "There is important information hidden in the text below. Remember it.\n\n"
    prompt = intro + _insert(rng, body, statements, 0.05, 0.5) + ask
    generate = 24 if task == "multivalue" else 12
    return prompt, fact.needed, generate, fact.statements


def answered(answer, needed):
    """A generated answer is right when it holds every needed string (numbers by their digits, as
    their own number: 4821 is not in 48213)."""
    for want in needed:
        if want.isdigit():
            if want not in re.findall(r"\d+", answer.replace(",", " ")):
                return False
        elif want.lower() not in answer.lower():
            return False
    return True


def heldout_strings():
    """What a training document must never hold: the held-out entities and the held-out phrasings'
    fixed words (each phrasing's longest run of words between slots)."""
    e = entities("heldout")
    out = {v for values in e.values() for v in values}
    for kind in FORMS:
        for statement, question, _ in forms(kind, "heldout"):
            for text in statement.split("|") + [question]:
                runs = [r.strip(" .:?") for r in re.split(r"\{\w+\}", text)]
                longest = max(runs, key=len)
                if len(longest.split()) >= 3:
                    out.add(longest)
    return out


_HELDOUT_PATTERN = None


def check_train_document(inserted):
    """Refuses a training document whose inserted lines (facts, questions, answers) hold a held-out
    entity or phrasing; its prose is the train haystack's (corpus.check_disjoint checks that)."""
    global _HELDOUT_PATTERN
    if _HELDOUT_PATTERN is None:
        words = sorted(heldout_strings(), key=len, reverse=True)
        _HELDOUT_PATTERN = re.compile(r"\b(" + "|".join(re.escape(w) for w in words) + r")\b")
    for line in inserted:
        m = _HELDOUT_PATTERN.search(line)
        if m:
            raise SystemExit(f"longrange: a training document holds held-out material: '{m.group(0)}' in '{line}'")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Prints examples: training documents or held-out retrieval instances.")
    ap.add_argument("--task", default="train", choices=("train",) + TASKS)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-n", type=int, default=1)
    ap.add_argument("--write-haystack", metavar="FILE",
                    help="write the train haystack to FILE (kvpolicy-train-gates --data longrange --text FILE on a machine "
                         "without the Debian packages, e.g. a lent GPU) and exit")
    a = ap.parse_args()
    if a.write_haystack:
        with open(a.write_haystack, "w", encoding="utf-8") as f:
            f.write(haystack("train"))
        raise SystemExit(0)
    r = random.Random(a.seed)
    for _ in range(a.n):
        if a.task == "train":
            doc, spans, _, inserted = train_document(r, a.tokens)
            check_train_document(inserted)
            print(doc, "\n-- answers:", [doc[s:e] for s, e in spans], "\n")
        else:
            p, need, gen = heldout_task(a.task, r, a.tokens)
            print(p, "\n-- needed:", need, "generate", gen, "\n")
