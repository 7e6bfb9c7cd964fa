"""The long-range training documents and the held-out retrieval instances (kvpolicy_tools.data.longrange),
without torch:
  - the train and held-out parts share no entity and no phrasing;
  - the check the trainer runs on every document refuses held-out entities and phrasings;
  - 500 training documents pass it; each answer span holds what a fact span (an inserted statement
    before the questions) states, word for word, and the facts sit inside the prose, not after the
    questions;
  - with numerals, every document with facts holds 2-6 lines of numbers (no letters) at random depths
    before its questions, outside every fact span; without, the documents are those of a run before them;
  - with restated variables, training variables are reassigned in their first statement's words in
    some documents and in an update's words in others, the answer the last value either way; without,
    always in an update's, with the same draws;
  - every held-out retrieval instance states what its answer needs in the asked fact's own
    statements, whole lines of the prompt before the question, which ends it;
  - answers are graded by whole numbers (4821 is not in 48213) and every needed string.
usage: PYTHONPATH=python/tools python3 -m pytest -q -p no:cacheprovider tests/train/test_longrange.py
       (any python3 with pytest; the prose comes from docs/, so no Debian text package is needed)
"""
import os
import random
import re

from kvpolicy_tools.data import longrange

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
    prose_a = f.read()
with open(os.path.join(root, "docs", "api.md"), encoding="utf-8") as f:
    prose_b = f.read()
train, held = longrange.entities("train"), longrange.entities("heldout")


def fail_with(failures):
    assert not failures, "\n".join("FAIL: " + f for f in failures)


def test_parts_share_no_entity_and_no_phrasing():
    failures = []
    for kind in train:
        shared = set(train[kind]) & set(held[kind])
        if shared or not held[kind] or not train[kind]:
            failures.append(f"entities '{kind}': shared {sorted(shared)}, {len(train[kind])} train, {len(held[kind])} held out")
    for kind in longrange.FORMS:
        if set(longrange.forms(kind, "train")) & set(longrange.forms(kind, "heldout")) or not longrange.forms(kind, "heldout"):
            failures.append(f"forms '{kind}': the parts overlap or none is held out")
    fail_with(failures)


def test_train_check_refuses_heldout_material():
    failures = []
    for line in ("The pass key is 31337. Remember it: 31337 is the pass key.", f"{held['name'][0]} lives in {train['city'][0]}.",
                 f"The code for {held['key'][0]} is 4821."):
        try:
            longrange.check_train_document([line])
            failures.append(f"check_train_document accepted held-out material: '{line}'")
        except SystemExit as e:
            if "held-out" not in str(e):
                failures.append(f"check_train_document's refusal does not say why: {e}")
    fail_with(failures)


def test_training_documents_answer_from_facts_before_the_questions():
    failures = []
    rng = random.Random(0)
    kinds_asked = 0
    for n in range(500):
        text, spans, facts, inserted = longrange.train_document(rng, 400, prose_only=n % 5 == 0, haystack_text=prose_a)
        longrange.check_train_document(inserted)  # a refusal (SystemExit) fails the test
        if n % 5 == 0:
            if spans or inserted:
                failures.append(f"document {n}: plain prose with spans or facts")
            continue
        if not spans:
            failures.append(f"document {n}: no question")
        first_question = text.find("\nQuestion: ")
        stated = [text[s:e] for s, e in facts]
        if not facts or any(e > first_question for _, e in facts) or any(x not in inserted for x in stated):
            failures.append(f"document {n}: fact spans {facts} are not the inserted statements before the questions")
        for s, e in spans:
            answer = text[s:e].strip().rstrip(".")
            numbers = re.findall(r"\d+", answer)
            words = [w for w in re.findall(r"[A-Za-z]+", answer) if w not in ("and",)]
            # in the fact statements themselves, not anywhere in the prose before the questions
            stated = "\n".join(text[s:e] for s, e in facts)
            if not all(re.search(rf"\b{re.escape(x)}\b", stated) for x in numbers + words):
                failures.append(f"document {n}: the answer '{answer}' is not in a fact stated before the questions")
            kinds_asked += 1
        for line in inserted:
            if not line.startswith(("What", "Who", "Where", "When", "Which", "On ", "In ", "List", "Tell", "Whom")) \
                    and text.find(line) > first_question and not text[text.find(line) - 8:].startswith("Answer: "):
                if "\nAnswer: " + line not in text:
                    failures.append(f"document {n}: the fact '{line}' sits after the questions")
    if kinds_asked < 500:
        failures.append(f"only {kinds_asked} answers in 400 documents with facts")
    print(f"longrange: {kinds_asked} answers in 400 training documents")
    fail_with(failures)


def test_numeral_lines_sit_before_the_questions_outside_the_facts():
    failures = []
    for n in range(200):
        text, spans, facts, inserted = longrange.train_document(random.Random(n), 400, haystack_text=prose_a, numerals=1.0)
        longrange.check_train_document(inserted)  # a refusal (SystemExit) fails the test
        if not facts:
            continue
        first_question = text.find("\nQuestion: ")
        noise = [line for line in inserted if not re.search(r"[A-Za-z]", line)]
        where = [("\n" + text).find("\n" + line + "\n") for line in noise]  # where each line begins in text
        if not 2 <= len(noise) <= 6 or any(w < 0 or w > first_question for w in where):
            failures.append(f"numerals, document {n}: numeral lines {noise} at {where}, the first question at {first_question}")
        if any(s < w + len(line) and w < e for line, w in zip(noise, where) for s, e in facts):
            failures.append(f"numerals, document {n}: a numeral line inside a fact span")
        if longrange.train_document(random.Random(n), 400, haystack_text=prose_a) != \
                longrange.train_document(random.Random(n), 400, haystack_text=prose_a, numerals=0.0):
            failures.append(f"numerals 0, document {n}: not the document of a run without numerals")
        if n == 0 and longrange.train_document(random.Random(n), 400, haystack_text=prose_a)[0] == text:
            failures.append("numerals 1: the document is the one without numerals")
    fail_with(failures)


def test_the_probe_asks_every_fact_and_leaves_the_document_alone():
    failures = []
    for n in range(300):
        doc = longrange.train_document(random.Random(n), 400, prose_only=n % 5 == 0, haystack_text=prose_a)
        text, spans, facts, inserted, probe = longrange.train_document_probed(
            random.Random(n), 400, prose_only=n % 5 == 0, haystack_text=prose_a)
        if (text, spans, facts, inserted) != doc:
            failures.append(f"document {n}: the probed document is not train_document's")
        longrange.check_train_document(probe.split("\n"))  # a refusal (SystemExit) fails the test
        if n % 5 == 0:
            if probe:
                failures.append(f"document {n}: plain prose with a probe")
            continue
        questions = re.findall(r"\nQuestion: ([^\n]*)\nAnswer: ([^\n]*)", probe)
        if "".join(f"\nQuestion: {q}\nAnswer: {a}" for q, a in questions) != probe:
            failures.append(f"document {n}: the probe is not question and answer lines: {probe!r}")
        # every fact is asked: each stated fact's values are in an answer (a reassigned variable's last
        # value only, so the statements' values are checked as a set against the answers')
        stated = "\n".join(text[s:e] for s, e in facts)
        answers = " ".join(a for _, a in questions)
        asked = set(re.findall(r"\d+", text[text.find("\nQuestion: "):]))
        if not set(re.findall(r"\d+", answers)) >= asked & set(re.findall(r"\d+", stated)):
            failures.append(f"document {n}: a fact the document asks is not in the probe")
        if len(questions) < text.count("\nQuestion: "):
            failures.append(f"document {n}: the probe asks {len(questions)}, the document {text.count(chr(10) + 'Question: ')}")
        # and each stated line names something (a number, an entity) the probe asks or answers
        names = {v for values in longrange.entities("train").values() for v in values}
        for s, e in facts:
            line = text[s:e]
            named = set(re.findall(r"\d+", line)) | {v for v in names if re.search(rf"\b{re.escape(v)}\b", line)}
            if not any(re.search(rf"\b{re.escape(v)}\b", probe) for v in named):
                failures.append(f"document {n}: the stated '{line}' is not asked by the probe")
        for a in re.findall(r"\d+", answers):
            if not re.search(rf"\b{a}\b", stated):
                failures.append(f"document {n}: the probe's answer {a} is stated nowhere")
    fail_with(failures)


def test_training_variables_are_restated_in_both_wordings():
    rng = random.Random(7)
    own = apart = 0
    failures = []
    for _ in range(400):
        form = rng.choice(longrange.forms("variable", "train"))
        first, update = form[0].split("|")
        f = longrange.make_fact("variable", rng, "train", form=form, restated=True)
        worded = lambda wording, s: re.fullmatch(re.escape(wording).replace(r"\{var\}", r"\S+").replace(r"\{value\}", r"\d+"), s)
        later = f.statements[1:]
        if all(worded(first, s) for s in later):
            own += 1
        elif all(worded(update, s) for s in later):
            apart += 1
        else:
            failures.append(f"reassignments {later} in neither wording of {form[0]}")
        if f.answer not in f.statements[-1] or f.needed != [f.answer]:
            failures.append(f"the answer {f.answer} is not the last statement's value: {f.statements}")
    if not (100 < own < 300 and 100 < apart < 300):
        failures.append(f"{own} variables restated in their own words and {apart} in an update's, of 400")
    # without restated: every update in an update's words, and the same draws (the documents of a run before it)
    a, b = random.Random(3), random.Random(3)
    for _ in range(200):
        form = a.choice(longrange.forms("variable", "train"))
        b.choice(longrange.forms("variable", "train"))
        plain, restated = longrange.make_fact("variable", a, "train", form=form), longrange.make_fact("variable", b, "train", form=form, restated=True)
        update = form[0].split("|")[1]
        if not all(worded(update, s) for s in plain.statements[1:]) or plain.answer != restated.answer \
                or plain.statements[0] != restated.statements[0]:
            failures.append(f"without restated: {plain.statements}; with: {restated.statements}")
            break
    fail_with(failures)


def test_heldout_instances_state_their_answer_before_the_question():
    failures = []
    for task in longrange.TASKS:
        rng = random.Random(task)
        for _ in range(50):
            prompt, needed, generate, stated = longrange.heldout_instance(task, rng, 1024, haystack_text=prose_b)
            head, _, ask = prompt.rpartition("\n\n")
            # in the asked fact's own statements, each a whole line of the prompt before the question
            lines = head.split("\n")
            statements = "\n".join(stated)
            if not needed or not stated or any(x not in lines for x in stated) \
                    or not all(re.search(rf"\b{re.escape(x)}\b", statements) for x in needed) \
                    or not ask.endswith(tuple("abcdefghijklmnopqrstuvwxyz=")) or generate < 8:
                failures.append(f"{task}: an instance whose answer {needed} is not stated before '{ask}'")
                break
            if any(name in prompt for name in train["name"] + train["key"] if re.search(rf"\b{name}\b", ask)):
                failures.append(f"{task}: the question uses a training entity: '{ask}'")
                break
    print(f"longrange: {50 * len(longrange.TASKS)} held-out instances")
    fail_with(failures)


def test_answers_graded_by_whole_numbers_and_every_needed_string():
    failures = []
    for answer, needed, want in (("48213.", ["4821"], False), ("4821.", ["4821"], True), ("12, 4821 and 7", ["4821", "7"], True),
                                 ("12 and 4821", ["4821", "7"], False), ("in Lisbon today", ["Lisbon"], True)):
        if longrange.answered(answer, needed) != want:
            failures.append(f"answered('{answer}', {needed}) is not {want}")
    fail_with(failures)
