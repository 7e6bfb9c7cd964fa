"""Training and held-out text from Debian packages, as plain English.

- Training: The Debian Administrator's Handbook, English (`debian-handbook`, GPL-2+ or CC-BY-SA-3.0:
  use and modification allowed): long-form prose, 8 MB of HTML in /usr/share/doc/debian-handbook/html/en-US.
- Held out (a second evaluation text of a different kind): the Python 3.11 tutorial's chapter on
  classes (`python3.11-doc`, PSF license): technical prose with code, never trained on.
- Never trained on: Debian's license texts in /usr/share/common-licenses, which the quality table
  evaluates on. `check_disjoint` refuses a corpus that shares a 12-word span with an evaluation text.
"""
import glob
import html
import html.parser
import os
import re

HANDBOOK = "/usr/share/doc/debian-handbook/html/en-US"
PYTHON_TUTORIAL_CLASSES = "/usr/share/doc/python3.11/html/tutorial/classes.html"
EVALUATION_TEXTS = ["/usr/share/common-licenses/GPL-3"]


class _Text(html.parser.HTMLParser):
    """The visible text of an HTML page, blocks on new lines; scripts, styles and navigation (nav
    elements, role="navigation", Sphinx's sidebar and footer) dropped with everything inside them."""

    SKIP = {"script", "style", "head", "nav"}
    SKIP_CLASSES = {"sphinxsidebar", "footer", "related"}
    BLOCKS = {"p", "div", "pre", "li", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "br", "dt", "dd", "table"}
    VOID = {"br", "img", "meta", "link", "input", "hr", "col", "area", "base", "wbr", "source"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.open = [], []  # open: per open element, whether it starts a skipped subtree

    def _skipping(self):
        return any(self.open)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        skip = (tag in self.SKIP or a.get("role") == "navigation" or
                bool(self.SKIP_CLASSES & set((a.get("class") or "").split())))
        if tag not in self.VOID:
            self.open.append(skip)
        if tag in self.BLOCKS and not self._skipping():
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self.open:
            self.open.pop()
        if tag in self.BLOCKS and not self._skipping():
            self.parts.append("\n")

    def handle_data(self, data):
        if not self._skipping():
            self.parts.append(data)


def html_text(path):
    p = _Text()
    with open(path, encoding="utf-8", errors="replace") as f:
        p.feed(f.read())
    text = html.unescape("".join(p.parts))
    lines = [re.sub(r"[ \t]+", " ", line).strip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def handbook_text():
    """The handbook's chapters in file order, without the legal notice and the index pages."""
    if not os.path.isdir(HANDBOOK):
        raise SystemExit(f"corpus: {HANDBOOK} is missing: install the Debian package debian-handbook")
    pages = [p for p in sorted(glob.glob(os.path.join(HANDBOOK, "*.html")))
             if not re.search(r"(legalnotice|index|ix01|pr01)", os.path.basename(p))]
    return "\n".join(html_text(p) for p in pages)


def heldout_python_text():
    if not os.path.isfile(PYTHON_TUTORIAL_CLASSES):
        raise SystemExit(f"corpus: {PYTHON_TUTORIAL_CLASSES} is missing: install the Debian package python3.11-doc")
    return html_text(PYTHON_TUTORIAL_CLASSES)


def _spans(text, n=12):
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}


def check_disjoint(corpus, evaluation_texts=EVALUATION_TEXTS, extra=()):
    """Refuses a training corpus that shares any 12-word span with an evaluation text."""
    spans = _spans(corpus)
    for path in list(evaluation_texts):
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                shared = spans & _spans(f.read())
            if shared:
                raise SystemExit(f"corpus: shares {len(shared)} 12-word spans with the evaluation text {path}, "
                                 f"e.g. '{next(iter(shared))}'")
    for name, text in extra:
        shared = spans & _spans(text)
        if shared:
            raise SystemExit(f"corpus: shares {len(shared)} 12-word spans with {name}, e.g. '{next(iter(shared))}'")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="Writes the held-out Python tutorial text (the second evaluation text).")
    ap.add_argument("out")
    a = ap.parse_args()
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(heldout_python_text())
    print(a.out)
