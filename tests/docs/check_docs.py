#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Keeps the docs true to themselves:

  1. docs/results.md states the present in under 600 lines (its history lives in docs/runs.md);
  2. every measured figure in README.md (a number with x, %, ms, us, s, it/s, req/s, W or MHz
     after it, outside code blocks) is found in docs/results.md, so the two cannot disagree;
  3. every relative Markdown link in README.md and docs/ (and the other Markdown files below the
     root) names a file that exists, and its #anchor a heading of that file;
  4. every section a text names as `docs/NAME.md, "Heading"` (or `NAME.md, Fig. N`) is a heading of
     that file, in the docs, the man page, bench/ and the test scripts.

    python3 tests/docs/check_docs.py [ROOT]

Prints one line per problem and exits 1 if there is any, else says what it checked and exits 0.
"""
import functools
import glob
import os
import re
import sys

RESULTS_MAX_LINES = 600
# The sources whose section references are checked (C++ comments are not: their references were
# mended by hand when the notebook moved to docs/runs.md).
REF_SOURCES = ("README.md", "docs/*.md", "docs/figures/data/README.md", "man/nvtaskset.1", "bench/*.py",
               "bench/*.sh", "tests/**/*.py", "tests/**/*.sh", "tests/**/*.md")
NOT_YET = ()
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?)(x|%| ms| us| s| it/s| req/s| requests/s| W| MHz)\b")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
SECTION_REF = re.compile(r"`?(?:docs/)?(\w+)\.md`?(?:'s)?,\s+(?:\"([^\"]+)\"|(Figs?\.\s+\d+[ab]?))")


def prose_lines(path):
    """The file's lines outside fenced code blocks, with their numbers."""
    fenced = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            if not fenced:
                yield n, line


def slug(heading):
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


@functools.lru_cache(maxsize=None)
def headings(path):
    """(texts without Markdown markup, anchors) of a file's headings; a repeated anchor gets -1, -2."""
    texts, anchors, seen = [], set(), {}
    for _, line in prose_lines(path):
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = m.group(1)
        texts.append(text.replace("`", ""))
        a = slug(text)
        anchors.add(a if a not in seen else f"{a}-{seen[a]}")
        seen[a] = seen.get(a, 0) + 1
    return texts, anchors


def check_results_length(root, problems):
    with open(os.path.join(root, "docs/results.md"), encoding="utf-8") as f:
        n = sum(1 for _ in f)
    if n >= RESULTS_MAX_LINES:
        problems.append(f"docs/results.md: {n} lines; it states the present in under {RESULTS_MAX_LINES} "
                        "(history goes to docs/runs.md)")


def check_readme_figures(root, problems):
    with open(os.path.join(root, "docs/results.md"), encoding="utf-8") as f:
        results = " ".join(f.read().split())
    count = 0
    for n, line in prose_lines(os.path.join(root, "README.md")):
        for m in FIGURE.finditer(line):
            count += 1
            if m.group(0) not in results:
                problems.append(f"README.md:{n}: '{m.group(0)}' is not in docs/results.md")
    return count


def check_links(root, problems):
    files = sorted(set(glob.glob(os.path.join(root, "*.md")) + glob.glob(os.path.join(root, "docs", "**", "*.md"),
                                                                           recursive=True)
                       + glob.glob(os.path.join(root, "tests", "**", "*.md"), recursive=True)))
    count = 0
    for path in files:
        for n, line in prose_lines(path):
            for m in LINK.finditer(line):
                target = m.group(1)
                if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                    continue
                count += 1
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                where = f"{os.path.relpath(path, root)}:{n}"
                if not os.path.exists(dest):
                    problems.append(f"{where}: link to {target}: no such file")
                elif anchor and (not dest.endswith(".md") or anchor not in headings(dest)[1]):
                    problems.append(f"{where}: link to {target}: no such heading")
    return count


def check_section_refs(root, problems):
    count = 0
    for pattern in REF_SOURCES:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            if os.path.relpath(path, root) in NOT_YET:
                continue
            # A reference may break over lines (and comment markers): read the file as one line.
            lines = [re.sub(r"^\s*(#+|//|\*|\.\\\")?\s*", "", line) for _, line in prose_lines(path)]
            text = " ".join(" ".join(lines).split()).replace("\\fI", "").replace("\\fR", "")
            for m in SECTION_REF.finditer(text):
                name, quoted, fig = m.groups()
                doc = os.path.join(root, "docs", name + ".md")
                if not os.path.exists(doc):
                    continue  # README.md's sections and files outside docs/ are not named this way
                count += 1
                wanted = (quoted or fig).replace("`", "")
                texts = headings(doc)[0]
                if not any(wanted in t for t in texts):
                    problems.append(f"{os.path.relpath(path, root)}: docs/{name}.md has no section \"{wanted}\"")
    return count


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    problems = []
    check_results_length(root, problems)
    figures = check_readme_figures(root, problems)
    links = check_links(root, problems)
    refs = check_section_refs(root, problems)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"check_docs: results.md under {RESULTS_MAX_LINES} lines; {figures} README figures found in results.md; "
          f"{links} links and {refs} section references resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
