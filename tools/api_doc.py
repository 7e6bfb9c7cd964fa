#!/usr/bin/env python3
"""Generate docs/api.md, the API reference, from the headers' `///` comments and declarations.

Usage:
    python3 tools/api_doc.py [SOURCE_DIR]            # write SOURCE_DIR/docs/api.md
    python3 tools/api_doc.py [SOURCE_DIR] --check    # exit 1 if docs/api.md is not what it makes
    python3 tools/api_doc.py [SOURCE_DIR] --out PATH # write elsewhere

The page is docs/api-preface.md (the conventions every header follows) followed by one section per
public header, in the order of SECTIONS below. A section is made of:
  * the header's `/// \\file` comment: its first line (after the path) is the section's title, the
    rest its introduction;
  * every public declaration, verbatim, in a ```cpp block that names the header (so
    tools/check_api_doc.py can check it against the header), followed by the `///` comment written
    right above it. Public means: outside any namespace called `detail`, and inside a class only
    where the class's access is public. Function bodies are left out; enums, concepts, aliases and
    initialisers are shown whole. A `///` paragraph that a blank line separates from the next
    declaration is shown where it stands (a class's `/// ---- name ----` line becomes a heading);
  * a header that declares nothing (an umbrella) shows its kvpolicy includes.
Preprocessor branches after the first of an #if chain are not read (the #if branch is the
declaration the page shows). Python 3 standard library only.

It also refuses, naming each, a class, struct, concept or alias at namespace scope of a listed
header with no `///` comment: the reference documents every public name it lists.
"""

import argparse
import os
import re
import sys

# The page's order: a header, or a folder whose headers (sorted) each get a section.
SECTIONS = [
    "kvpolicy/cache.hpp",
    "kvpolicy/cpu.hpp",
    "kvpolicy/trimkv.hpp",
    "kvpolicy/dbtrimkv.hpp",
    "kvpolicy/wgkv.hpp",
    "kvpolicy/epikv.hpp",
    "kvpolicy/baselines.hpp",
    "kvpolicy/policies.hpp",
    "kvpolicy/core/by_name.hpp",
    "kvpolicy/policies/",
    "kvpolicy/policies/common/",
    "kvpolicy/registry.hpp",
    "kvpolicy/registry/",
    "kvpolicy/open.hpp",
    "kvpolicy/any_cache.hpp",
    "kvpolicy/open_sharded.hpp",
    "kvpolicy/runs_on.hpp",
    "kvpolicy/core/concepts.hpp",
    "kvpolicy/core/entry.hpp",
    "kvpolicy/core/record.hpp",
    "kvpolicy/core/error.hpp",
    "kvpolicy/core/view.hpp",
    "kvpolicy/core/shape.hpp",
    "kvpolicy/core/dtype.hpp",
    "kvpolicy/core/engine_keys.hpp",
    "kvpolicy/core/mask.hpp",
    "kvpolicy/core/rule.hpp",
    "kvpolicy/parts/",
    "kvpolicy/memory/",
    "kvpolicy/cpu/backend.hpp",
    "kvpolicy/cpu/decode_kernels.hpp",
    "kvpolicy/gate/",
    "kvpolicy/inputs/",
    "kvpolicy/dist/",
    "kvpolicy/cuda.cuh",
    "kvpolicy/cuda/backend.cuh",
    "kvpolicy/cuda/memory/views.cuh",
    "kvpolicy/cuda/kernels/",
]

IDENT_CHAR = re.compile(r"[A-Za-z0-9_]")
SEPARATOR = re.compile(r"^-{2,}\s*(.*?)\s*-{2,}$")


class Text:
    """A header's text with the preprocessor's later branches blanked (so braces balance)."""

    def __init__(self, raw):
        lines, keep, depth_skip = [], [], 0
        # keep[i]: whether line i is read; an #else/#elif branch is blanked up to its #endif
        stack = []  # one entry per open #if: True while its first branch is being read
        for line in raw.split("\n"):
            d = line.strip()
            directive = re.match(r"#\s*(\w+)", d)
            name = directive.group(1) if directive else ""
            if name in ("if", "ifdef", "ifndef"):
                stack.append(True)
                lines.append("")
                continue
            if name in ("else", "elif") and stack:
                stack[-1] = False
                lines.append("")
                continue
            if name == "endif" and stack:
                stack.pop()
                lines.append("")
                continue
            lines.append(line if all(stack) else "")
        del keep, depth_skip
        self.s = "\n".join(lines)


def skip_string(s, i):
    """Index after the string or char literal that starts at s[i]."""
    q = s[i]
    i += 1
    while i < len(s) and s[i] != q:
        i += 2 if s[i] == "\\" else 1
    return i + 1


def skip_comment(s, i):
    """Index after the comment that starts at s[i] (// to the end of the line, or /* */)."""
    if s.startswith("//", i):
        j = s.find("\n", i)
        return len(s) if j < 0 else j
    j = s.find("*/", i + 2)
    return len(s) if j < 0 else j + 2


def at_code(s, i):
    """If s[i] starts a comment or literal, the index after it; else None."""
    if s.startswith("//", i) or s.startswith("/*", i):
        return skip_comment(s, i)
    if s[i] == '"' or (s[i] == "'" and not (i > 0 and s[i - 1].isalnum())):
        return skip_string(s, i)
    return None


def scan_to(s, i, stops):
    """The index of the first character of `stops` outside ( ) [ ] { } from i, comments and literals
    skipped; a closing bracket in `stops` is found where it would close a bracket opened before i."""
    depth = 0
    while i < len(s):
        j = at_code(s, i)
        if j is not None:
            i = j
            continue
        c = s[i]
        if depth == 0 and c in stops:
            return i
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1
    raise ValueError("a declaration never ends")


def match_brace(s, i):
    """Index after the } matching the { at s[i]."""
    return scan_to(s, i + 1, "}") + 1


def strip_template_heads(head):
    """The declaration without its leading `template <...>` lists and their requires clause."""
    h = head.strip()
    while h.startswith("template"):
        i = h.find("<")
        depth, paren = 0, 0
        while i < len(h):
            c = h[i]
            if c == "(":
                paren += 1
            elif c == ")":
                paren -= 1
            elif paren == 0 and c == "<":
                depth += 1
            elif paren == 0 and c == ">":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        h = h[i + 1:].lstrip()
        if h.startswith("requires"):
            # a requires clause: up to the next line (they are written on their own line here)
            nl = h.find("\n")
            h = h[nl + 1:].lstrip() if nl >= 0 else ""
    return h


def code_only(text):
    """The text with comments and literals blanked, for classifying a declaration."""
    out, i = [], 0
    while i < len(text):
        j = at_code(text, i)
        if j is not None:
            out.append(" " * (j - i))
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def depth0_index(code, chars):
    """The first index in code of one of chars outside ( ) [ ] { }, or -1."""
    depth = 0
    for k, c in enumerate(code):
        if depth == 0 and c in chars:
            return k
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
    return -1


def assignment_index(code):
    """The first `=` at depth 0 that assigns (not in ==, <=, >=, != or an operator's name)."""
    depth = 0
    for k, c in enumerate(code):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c == "=":
            prev = code[k - 1] if k else ""
            nxt = code[k + 1] if k + 1 < len(code) else ""
            if prev in "=<>!" or nxt == "=" or re.search(r"\boperator\s*[-+*/%^&|<>!~]*$", code[:k]):
                continue
            return k
    return -1


class Header:
    """The items of one header, in order: ("prose", text), ("heading", text),
    ("decl", code, doc, class_depth, start, end), ("class", code, doc, depth, name), ("end", depth)."""

    def __init__(self, path, raw):
        self.path = path
        self.s = Text(raw).s
        self.items = []
        self.file_doc = []
        self.includes = re.findall(r'^\s*#\s*include\s+"(kvpolicy/[^"]+)"', raw, re.M)
        self.undocumented = []
        self.i = 0
        self.parse_scope(kind="namespace", public=True, depth=0, ns=[])

    # -- lexing at a scope: doc comments, other comments, preprocessor lines, blank lines --
    def take_doc(self):
        """Skips whitespace and comments; returns the `///` lines met, a list of paragraphs
        (a blank line closes one), the last being the one right above what comes next."""
        s, paragraphs, current = self.s, [], []
        while self.i < len(s):
            c = s[self.i]
            if c == "\n":
                # a blank line closes a doc paragraph
                j = self.i + 1
                while j < len(s) and s[j] in " \t":
                    j += 1
                if j < len(s) and s[j] == "\n" and current:
                    paragraphs.append(current)
                    current = []
                self.i += 1
            elif c in " \t\r":
                self.i += 1
            elif s.startswith("///", self.i) and not s.startswith("////", self.i):
                end = s.find("\n", self.i)
                end = len(s) if end < 0 else end
                line = s[self.i + 3:end]
                current.append(line[1:] if line.startswith(" ") else line)
                self.i = end
            elif s.startswith("//", self.i) or s.startswith("/*", self.i):
                self.i = skip_comment(s, self.i)
            elif c == "#":
                while True:
                    end = s.find("\n", self.i)
                    end = len(s) if end < 0 else end
                    if s[self.i:end].rstrip().endswith("\\"):
                        self.i = end + 1
                        continue
                    self.i = end
                    break
            else:
                break
        return paragraphs, current

    # -- a scope: a namespace's or a class's body, up to its closing brace --
    def parse_scope(self, kind, public, depth, ns, visible=True):
        """A scope's declarations; with visible False (the body of a class the page does not show)
        they are read past and nothing of them is shown."""
        s = self.s
        while True:
            closed, doc = self.take_doc()
            for p in closed:
                if visible:
                    self.add_prose(p, depth)
            if self.i >= len(s):
                if doc and visible:
                    self.add_prose(doc, depth)
                return
            if s[self.i] == "}":
                if doc and visible:
                    self.add_prose(doc, depth)
                self.i += 1
                return
            if s[self.i] == ";":
                self.i += 1
                continue
            m = re.match(r"(public|private|protected)\s*:(?!:)", s[self.i:])
            if m and kind == "class":
                public = m.group(1) == "public"
                self.i += m.end()
                if doc and visible:
                    self.add_prose(doc, depth)
                continue
            m = re.match(r"(?:inline\s+)?namespace\s+([\w:]*)\s*\{", s[self.i:])
            if m:
                names = [n for n in m.group(1).split("::") if n]
                self.i += m.end()
                hidden = not names or "detail" in names or not public
                if hidden:
                    self.i = match_brace(s, self.i - 1)
                else:
                    self.parse_scope("namespace", True, depth, ns + names)
                continue
            self.declaration(doc, kind, public and visible, depth, ns)

    def add_prose(self, lines, depth):
        if lines and lines[0].startswith("\\file"):
            self.file_doc = lines[1:]
            return
        lines = self.take_separator(lines, depth)
        if lines:
            self.items.append(("prose", lines, depth))

    def take_separator(self, lines, depth):
        """A `---- name ----` first line is a heading of its own; the rest is returned."""
        if lines and SEPARATOR.match(lines[0].strip()):
            self.items.append(("heading", SEPARATOR.match(lines[0].strip()).group(1), depth))
            return lines[1:]
        return lines

    def declaration(self, doc, kind, public, depth, ns):
        s, start = self.s, self.i
        head_end, term = self.scan_head(start)
        head = s[start:head_end]
        code = code_only(head)
        bare = strip_template_heads(code)
        first = re.match(r"\s*(\w+)", bare)
        keyword = first.group(1) if first else ""
        forward = term == ";" and re.match(r"(struct|class|union)\s+\w+\s*$", bare.strip())
        shown = public and keyword not in ("static_assert", "friend") and not forward
        if doc and doc[0].startswith("\\file"):
            self.file_doc = doc[1:]
            doc = []
        doc = self.take_separator(doc, depth)
        if term == ";":
            self.i = self.trailing_comment(head_end + 1)
            if shown:
                self.add_decl(s[start:self.i], doc, depth, ns, keyword, bare, start)
            return
        # term == "{": what the brace opens decides what is shown
        if keyword in ("struct", "class", "union") and assignment_index(bare) < 0:
            name = re.match(r"(?:struct|class|union)\s+(?:(?:\[\[[^\]]*\]\]|alignas\s*\([^)]*\))\s*)*(\w+)", bare)
            if shown:
                self.items.append(("class", head.rstrip(), doc, depth, "::".join(ns + [name.group(1)]), start))
                if depth == 0 and not doc:
                    self.undocumented.append(name.group(1))
            self.i = head_end + 1
            self.parse_scope("class", keyword != "class", depth + 1, ns + [name.group(1)], visible=shown)
            # declarators after the closing brace, up to the semicolon
            end, _ = self.scan_head(self.i)
            self.i = end + 1
            if shown:
                self.items.append(("end", depth))
            return
        paren = depth0_index(bare, "(")
        assign = assignment_index(bare)
        whole = keyword in ("enum", "concept") or bare.lstrip().startswith("concept") or (
            assign >= 0 and (paren < 0 or assign < paren)) or paren < 0
        if whole:
            end = self.scan_to_semicolon(head_end)
            self.i = self.trailing_comment(end + 1)
            if shown:
                self.add_decl(s[start:self.i], doc, depth, ns, keyword, bare, start)
            return
        # a function: its head is shown (without a constructor's init list), its body skipped
        self.i = match_brace(s, head_end)
        if shown:
            init = re.search(r"\)\s*(?:noexcept\s*)?(:)(?!:)", code)
            shown_head = head[:init.start(1)] if init else head
            self.add_decl(shown_head.rstrip(), doc, depth, ns, keyword, bare, start)

    def trailing_comment(self, i):
        """i, or past the `//` comment that ends the line a declaration ends on (`///< what`)."""
        m = re.match(r"[ \t]*//[^\n]*", self.s[i:])
        return i + m.end() if m else i

    def add_decl(self, text, doc, depth, ns, keyword, bare, start):
        if depth == 0 and not doc and (keyword in ("using", "concept") or bare.lstrip().startswith("concept")):
            m = re.match(r"(?:using|concept)\s+(\w+)", bare.strip())
            if m and not m.group(0).startswith("using namespace"):
                self.undocumented.append(m.group(1))
        self.items.append(("decl", text, doc, depth, start, start + len(text)))

    def scan_head(self, i):
        """From i, the index of the first `;` or the `{` that ends a declaration's head, and which.
        A `{` that opens a requires-expression or a member's brace initialiser in a constructor's
        init list belongs to the head."""
        s, depth, start = self.s, 0, i
        while i < len(s):
            j = at_code(s, i)
            if j is not None:
                i = j
                continue
            c = s[i]
            if c in "([":
                depth += 1
            elif c in ")]":
                depth -= 1
            elif depth == 0 and c == ";":
                return i, ";"
            elif depth == 0 and c == "{":
                before = code_only(s[start:i]).rstrip()
                if self.opens_requires(before) or self.member_init(before):
                    i = match_brace(s, i)
                    continue
                return i, "{"
            elif c == "{":
                i = match_brace(s, i)
                continue
            i += 1
        raise ValueError("a declaration never ends")

    @staticmethod
    def opens_requires(before):
        if re.search(r"\brequires$", before):
            return True
        if not before.endswith(")"):
            return False
        depth = 0
        for k in range(len(before) - 1, -1, -1):
            if before[k] == ")":
                depth += 1
            elif before[k] == "(":
                depth -= 1
                if depth == 0:
                    return bool(re.search(r"\brequires\s*$", before[:k]))
        return False

    @staticmethod
    def member_init(before):
        # `: x_{a}, y_{b} {`: a brace right after a name, inside a constructor's init list
        return bool(before) and (IDENT_CHAR.match(before[-1]) is not None) and re.search(
            r"\)\s*(?:noexcept\s*)?:(?!:)", before) is not None and not re.search(r"\bconcept\b", before)

    def scan_to_semicolon(self, i):
        return scan_to(self.s, i, ";")


# ---- markdown ------------------------------------------------------------------------------------

def dedent(text, column):
    out = []
    for k, line in enumerate(text.split("\n")):
        if k == 0:
            out.append(line.strip())
        else:
            cut = min(column, len(line) - len(line.lstrip(" ")))
            out.append(line[cut:].rstrip())
    return "\n".join(out)


def prose(lines):
    """Doc-comment lines as markdown: indented lines become a plain code block, `<` outside
    backticks is escaped so a template name is not read as an HTML tag."""
    out, block = [], []

    def flush():
        if block:
            out.append("```")
            out.extend(block)
            out.append("```")
            block.clear()

    for line in lines:
        if line.startswith("  ") and line.strip():
            block.append(line.rstrip())
            continue
        flush()
        parts = line.split("`")
        for k in range(0, len(parts), 2):
            parts[k] = parts[k].replace("<", "\\<")
        out.append("`".join(parts).rstrip())
    flush()
    return "\n".join(out).strip("\n")


def line_column(s, at):
    """The column of index `at` in s."""
    return at - (s.rfind("\n", 0, at) + 1)


def title_lines(file_doc):
    """The \\file comment's first paragraph, without the header's own path in front."""
    lines = []
    for line in file_doc:
        if not line.strip() or (lines and line.startswith("  ")):
            break
        lines.append(line)
    if lines:
        lines[0] = re.sub(r"^kvpolicy/\S+\s*(—|-)?\s*", "", lines[0])
    return lines


def render_header(h):
    title, intro = "", []
    if h.file_doc:
        head = title_lines(h.file_doc)
        title = " ".join(line.strip() for line in head)
        intro = h.file_doc[len(head):]
    heading = f"## `{h.path}`"
    out = [heading, ""]
    if title:
        out += [prose([title]), ""]
    if intro:
        out += [prose(intro), ""]
    fence = f"```cpp\n// {h.path}\n"
    decls = [it for it in h.items if it[0] in ("decl", "class")]
    if not decls:
        if h.includes:
            body = "\n\n".join(f'#include "{inc}"' for inc in h.includes)
            out += [fence + body + "\n```", ""]
        return "\n".join(out)
    pending = []  # undocumented declarations, shown together in one block

    def flush():
        if pending:
            out.extend([fence + "".join(pending) + "\n```", ""])
            pending.clear()

    last_end = [-1]

    for it in h.items:
        kind = it[0]
        if kind == "decl":
            _, text, doc, _depth, start, end = it
            code = dedent(text, line_column(h.s, start))
            if doc:
                flush()
                out += [fence + code + "\n```", "", prose(doc), ""]
            else:
                # lines next to each other in the header stay together (one declaration for
                # tools/check_api_doc.py); a blank line between them in the header stays too
                if pending:
                    between = h.s[last_end[0]:start]
                    pending.append("\n" if between.count("\n") == 1 and not between.strip() else "\n\n")
                pending.append(code)
            last_end[0] = end
        elif kind == "class":
            flush()
            _, text, doc, depth, name, start = it
            out += [f"{'###' if depth == 0 else '####'} `{name}`", ""]
            out += [fence + dedent(text, line_column(h.s, start)) + "\n```", ""]
            if doc:
                out += [prose(doc), ""]
        elif kind == "end":
            flush()
        elif kind == "heading":
            flush()
            out += [f"**{it[1]}**", ""]
        elif kind == "prose":
            flush()
            out += [prose(it[1]), ""]
    flush()
    return "\n".join(out)


def section_headers(root):
    include = os.path.join(root, "include")
    seen, order = set(), []
    for entry in SECTIONS:
        if entry.endswith("/"):
            # every header below the folder, sorted by path (subfolders included, hidden files not)
            paths = []
            for folder, dirs, files in os.walk(os.path.join(include, entry)):
                dirs[:] = [d for d in dirs if not d.startswith(".")]
                rel = os.path.relpath(folder, include).replace(os.sep, "/")
                paths += [f"{rel}/{n}" for n in files if n.endswith((".hpp", ".cuh")) and not n.startswith(".")]
            paths.sort()
            if not paths:
                raise SystemExit(f"api_doc: SECTIONS names {entry}, which holds no header")
        else:
            paths = [entry]
        for p in paths:
            if p not in seen:
                seen.add(p)
                order.append(p)
    return order


def generate(root):
    preface_path = os.path.join(root, "docs", "api-preface.md")
    with open(preface_path, encoding="utf-8") as f:
        page = [f.read().rstrip("\n"), ""]
    problems, contents, sections = [], ["## The headers", ""], []
    for path in section_headers(root):
        full = os.path.join(root, "include", path)
        if not os.path.exists(full):
            problems.append(f"{path}: listed in tools/api_doc.py SECTIONS, not a header under include/")
            continue
        with open(full, encoding="utf-8") as f:
            try:
                h = Header(path, f.read())
            except ValueError as e:
                problems.append(f"{path}: {e}")
                continue
        if not h.file_doc:
            problems.append(f"{path}: no `/// \\file` comment")
        for name in h.undocumented:
            problems.append(f"{path}: `{name}` is public and has no /// comment")
        sections.append(render_header(h))
        title = first_sentence(h)
        contents.append(f"- [`{path}`](#{anchor(path)})" + (f": {title}" if title else ""))
    page += contents + [""] + sections
    return "\n".join(page).rstrip("\n") + "\n", problems


def anchor(path):
    """GitHub's anchor of the heading `## \`path\``."""
    return re.sub(r"[^a-z0-9 _-]", "", path.lower()).replace(" ", "-")


def first_sentence(h):
    """The header's title up to its first colon or sentence end, for the contents."""
    if not h.file_doc:
        return ""
    title = " ".join(line.strip() for line in title_lines(h.file_doc))
    depth = 0
    for k, c in enumerate(title):
        depth += (c == "(") - (c == ")")
        if depth == 0 and c in ".:;" and (k + 1 == len(title) or title[k + 1] == " "):
            title = title[:k]
            break
    return prose([title if len(title) <= 140 else title[:139].rsplit(" ", 1)[0] + " …"])


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source_dir", nargs="?", default=os.path.dirname(here))
    parser.add_argument("--check", action="store_true", help="compare with docs/api.md; write nothing")
    parser.add_argument("--out", help="where to write (default: SOURCE_DIR/docs/api.md)")
    args = parser.parse_args(argv)
    root = os.path.abspath(args.source_dir)
    page, problems = generate(root)
    if problems:
        for p in problems:
            print(p)
        print(f"api_doc: {len(problems)} problem(s); docs/api.md not written")
        return 1
    target = args.out or os.path.join(root, "docs", "api.md")
    if args.check:
        try:
            with open(target, encoding="utf-8") as f:
                current = f.read()
        except OSError as e:
            print(f"api_doc: cannot read {target}: {e.strerror}")
            return 1
        if current != page:
            a, b = current.split("\n"), page.split("\n")
            k = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
            print(f"api_doc: {target} is not what the headers make (first difference at line {k + 1}:"
                  f" {a[k][:100] if k < len(a) else '<end>'!r} against {b[k][:100] if k < len(b) else '<end>'!r});"
                  f" run python3 tools/api_doc.py")
            return 1
        print(f"api_doc: {target} is what the headers make ({page.count(chr(10))} lines)")
        return 0
    with open(target, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"api_doc: wrote {target} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
