#!/usr/bin/env python3
"""Check that docs/api.md quotes the headers exactly, so the reference cannot drift from the code.

Usage:
    python3 tools/check_api_doc.py [SOURCE_DIR] [--doc PATH]

SOURCE_DIR is the repository root (default: the parent of this script's folder); --doc checks
another copy of the reference (default: SOURCE_DIR/docs/api.md). Python 3 standard library only.

Rules:
  * Every ```cpp fenced block of the document starts with a line comment naming the header it
    quotes, `// kvpolicy/<path>.hpp` (or .cuh), and that header must exist under include/.
  * A block is split into declarations at blank lines; lines starting with `//` are comments and
    are skipped (they neither end a declaration nor take part in the comparison).
  * Each declaration, normalized, must occur in the normalized text of the header its block names:
      - full-line comments (lines starting with `//`) are dropped on both sides;
      - every run of whitespace becomes one space, and spaces next to ( ) < > [ ] { } , & * : ; =
        are removed, on both sides alike;
      - the occurrence must start at an identifier boundary (no `append(` inside `xappend(`),
        and a declaration ending in `)` or in an identifier must not be followed by an identifier
        (a dropped `const`, `noexcept` or a truncated name is a mismatch);
      - ( ) [ ] { } must balance inside each declaration (outside its trailing comments), so a
        parameter list cut short is a mismatch even where its prefix occurs in the header.
  * Every header directly under include/kvpolicy/ (the presets, cache.hpp, cuda.cuh) must be the
    subject of at least one block.

On failure prints each problem (for a missing declaration: the header and the declaration's first
120 characters) and exits 1; on success prints
"api.md: N declarations from M headers match the headers" and exits 0.
"""

import argparse
import os
import re
import sys

FENCE_OPEN = re.compile(r"^\s*```\s*cpp\s*$")
FENCE_CLOSE = re.compile(r"^\s*```\s*$")
HEADER_COMMENT = re.compile(r"^//\s*(kvpolicy/[A-Za-z0-9_./-]+\.(?:hpp|cuh))\b")
PUNCT = r"()<>\[\]{},&*:;="
SPACE_AROUND_PUNCT = re.compile(r" ?([" + PUNCT + r"]) ?")
IDENT = re.compile(r"[A-Za-z0-9_]")


def drop_full_line_comments(lines):
    """The lines that are not comments (a line whose first non-blank characters are //)."""
    return [line for line in lines if not line.lstrip().startswith("//")]


def normalize(text):
    """Collapse whitespace and remove the spaces next to punctuation (the same on both sides)."""
    text = re.sub(r"\s+", " ", text).strip()
    # applied twice: "a , b" -> "a, b" -> "a,b" when one space sits on each side
    text = SPACE_AROUND_PUNCT.sub(r"\1", text)
    return SPACE_AROUND_PUNCT.sub(r"\1", text)


def strip_trailing_comments(line):
    """The code of a line without a trailing // comment (string literals are respected)."""
    out, i, quote = [], 0, None
    while i < len(line):
        c = line[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(line):
                out.append(line[i + 1])
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
            out.append(c)
        elif line.startswith("//", i):
            break
        else:
            out.append(c)
        i += 1
    return "".join(out)


def balanced(lines):
    """Whether ( ) [ ] { } balance in the code of these lines (comments and strings ignored)."""
    code = "".join(re.sub(r'"(?:\\.|[^"\\])*"', '""', strip_trailing_comments(line)) for line in lines)
    pairs = {")": "(", "]": "[", "}": "{"}
    stack = []
    for c in code:
        if c in "([{":
            stack.append(c)
        elif c in pairs:
            if not stack or stack.pop() != pairs[c]:
                return False
    return not stack


def read_blocks(doc_lines):
    """Yields (line number of the opening fence, [lines of the block]) for every ```cpp block."""
    i = 0
    while i < len(doc_lines):
        if FENCE_OPEN.match(doc_lines[i]):
            start, body = i + 1, []
            i += 1
            while i < len(doc_lines) and not FENCE_CLOSE.match(doc_lines[i]):
                body.append(doc_lines[i])
                i += 1
            if i == len(doc_lines):
                raise ValueError(f"line {start}: ```cpp block is never closed")
            yield start, body
        i += 1


def split_declarations(body):
    """The block's declarations: runs of non-blank lines, comment lines skipped."""
    decls, current = [], []
    for line in body:
        if not line.strip():
            if current:
                decls.append(current)
            current = []
        elif line.lstrip().startswith("//"):
            continue
        else:
            current.append(line)
    if current:
        decls.append(current)
    return decls


def occurs(decl_norm, header_norm, ends_open):
    """Whether decl_norm occurs in header_norm at an identifier boundary (see the module doc)."""
    start = header_norm.find(decl_norm)
    while start >= 0:
        end = start + len(decl_norm)
        before_ok = start == 0 or not IDENT.match(header_norm[start - 1])
        after_ok = not ends_open or end == len(header_norm) or not IDENT.match(header_norm[end])
        if before_ok and after_ok:
            return True
        start = header_norm.find(decl_norm, start + 1)
    return False


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source_dir", nargs="?", default=os.path.dirname(here),
                        help="repository root (default: the parent of tools/)")
    parser.add_argument("--doc", help="the reference to check (default: SOURCE_DIR/docs/api.md)")
    args = parser.parse_args(argv)

    root = os.path.abspath(args.source_dir)
    include = os.path.join(root, "include")
    doc_path = args.doc or os.path.join(root, "docs", "api.md")
    doc_name = os.path.basename(doc_path)
    try:
        with open(doc_path, encoding="utf-8") as f:
            doc_lines = f.read().splitlines()
    except OSError as e:
        print(f"{doc_name}: cannot read {doc_path}: {e.strerror}")
        return 1

    headers = {}  # "kvpolicy/x.hpp" -> normalized text
    for dirpath, _, files in os.walk(os.path.join(include, "kvpolicy")):
        for name in sorted(files):
            if name.endswith((".hpp", ".cuh")):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    text = "\n".join(drop_full_line_comments(f.read().splitlines()))
                headers[os.path.relpath(path, include).replace(os.sep, "/")] = normalize(text)
    if not headers:
        print(f"{doc_name}: no headers under {include}/kvpolicy")
        return 1
    top_level = sorted(h for h in headers if h.count("/") == 1)

    problems, checked, subjects = [], 0, set()
    try:
        blocks = list(read_blocks(doc_lines))
    except ValueError as e:
        print(f"{doc_name}: {e}")
        return 1
    for line_no, body in blocks:
        first = body[0].strip() if body else ""
        m = HEADER_COMMENT.match(first)
        if not m:
            problems.append(f"{doc_name}:{line_no}: a ```cpp block must start with `// kvpolicy/<header>`, "
                            f"found {first[:80]!r}")
            continue
        header = m.group(1)
        if header not in headers:
            problems.append(f"{doc_name}:{line_no}: the block names {header}, which is not a header under include/")
            continue
        subjects.add(header)
        decls = split_declarations(body[1:])
        if not decls:
            problems.append(f"{doc_name}:{line_no}: the block for {header} quotes no declaration")
        for decl in decls:
            checked += 1
            one_line = " ".join(" ".join(decl).split())
            if not balanced(decl):
                problems.append(f"{header}: unbalanced brackets (a declaration cut short?): {one_line[:120]}")
                continue
            norm = normalize("\n".join(decl))
            code_end = normalize(strip_trailing_comments(decl[-1]))
            ends_open = code_end == "" or code_end[-1] == ")" or bool(IDENT.match(code_end[-1]))
            if not occurs(norm, headers[header], ends_open):
                problems.append(f"{header}: not in the header: {one_line[:120]}")

    for header in top_level:
        if header not in subjects:
            problems.append(f"{doc_name}: no ```cpp block quotes {header} (every header directly under "
                            f"include/kvpolicy/ needs one)")

    if problems:
        for p in problems:
            print(p)
        print(f"{doc_name}: {len(problems)} problem(s); {checked} declarations checked")
        return 1
    print(f"{doc_name}: {checked} declarations from {len(subjects)} headers match the headers")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
