#!/usr/bin/env python3
"""Checks the docs' internal links: every relative link to a file, and every
`#anchor`, in the book (docs/src) and the top-level markdown files resolves.

mdBook checks neither (it renders a broken link as it is), so `make test`
runs this after `mdbook build`. Anchors are heading slugs as GitHub and mdBook
make them (lower case; letters, digits, `_` and `-` kept, spaces to `-`, the
rest dropped; a repeated slug gets `-1`, `-2`, ...), plus explicit
`<a id="...">`. `{{#include file[:anchor]}}` directives must name an existing
file (and anchor); an included markdown file's headings and links count as the
including page's, as mdBook renders them. Links from book pages must stay
inside the book (a link out of docs/src is broken in the rendered book: name
the file as a path instead) and reach a page listed in SUMMARY.md.

When the built book is there (target/book, as `make docs-check` leaves it),
its HTML is checked too: each link in a page reaches a page and an id that
mdBook wrote.

Usage: .ci/check-docs.py [ROOT]   (exit 1 and one line per broken link)
"""
import os
import re
import sys
import unicodedata

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
BOOK = os.path.join(ROOT, "docs", "src")
TOP = ["README.md", "ARCHITECTURE.md", "host-test/README.md", "BENCHMARKS.md"]

FENCE = re.compile(r"^\s{0,3}(```+|~~~+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INCLUDE = re.compile(r"\{\{#include\s+([^}\s]+)\s*\}\}")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFDEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s.*)?$")
HTML_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
ANCHOR_LINE = re.compile(r"ANCHOR(?:_END)?:\s*[\w-]+")

errors = []


def err(path, line, msg):
    errors.append(f"{os.path.relpath(path, ROOT)}:{line}: {msg}")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def anchor_region(text, anchor):
    """The lines between `ANCHOR: name` and `ANCHOR_END: name`, as mdBook takes them."""
    out, inside, found = [], False, False
    for line in text.split("\n"):
        if re.search(r"ANCHOR_END:\s*" + re.escape(anchor) + r"\b", line):
            inside = False
            continue
        if re.search(r"ANCHOR:\s*" + re.escape(anchor) + r"\b", line):
            inside, found = True, True
            continue
        if inside and not ANCHOR_LINE.search(line):
            out.append(line)
    return "\n".join(out) if found else None


def expand(path, text, depth=0):
    """The page as mdBook renders it: includes replaced. Lines keep where they
    came from, for the messages: a list of (file, line number, text)."""
    lines = []
    for n, line in enumerate(text.split("\n"), 1):
        m = INCLUDE.search(line)
        if not m:
            lines.append((path, n, line))
            continue
        target, _, anchor = m.group(1).partition(":")
        file = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if not os.path.isfile(file):
            err(path, n, f"include of a missing file: {m.group(1)}")
            continue
        body = read(file)
        if anchor and not anchor.isdigit():
            region = anchor_region(body, anchor)
            if region is None:
                err(path, n, f"include of a missing anchor: {m.group(1)}")
                continue
            body = region
        if file.endswith(".md") and depth < 8:
            # An included markdown file is part of this page: its links are
            # read from here, its headings are this page's.
            sub = expand(file, body, depth + 1)
            lines.extend((path if f == file else f, n if f == file else k, t) for f, k, t in sub)
        else:
            lines.append((path, n, "")) # code: nothing to check
    return lines


def plain(heading):
    """A heading's text as rendered: code spans, links, emphasis unwrapped."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    h = re.sub(r"`+([^`]*)`+", r"\1", h)
    h = re.sub(r"<[^>]+>", "", h)
    h = re.sub(r"(\*\*|__|\*|(?<!\w)_|_(?!\w))", "", h)
    return h


def slug(text):
    out = []
    for ch in plain(text).strip().lower():
        cat = unicodedata.category(ch)
        if ch in "-_" or cat[0] in "LN" or cat == "Mn":
            out.append(ch)
        elif ch == " ":
            out.append("-")
    return "".join(out)


def walk(lines):
    """Yields (file, line, text, in_code) for the expanded lines."""
    fence = None
    for f, n, t in lines:
        m = FENCE.match(t)
        if m:
            mark = m.group(1)[0] * 3
            if fence is None:
                fence = mark
            elif mark == fence:
                fence = None
            yield f, n, t, True
            continue
        yield f, n, t, fence is not None


_anchors = {}


def anchors_of(path):
    if path not in _anchors:
        seen, found = {}, set()
        for _, _, t, code in walk(expand(path, read(path))):
            if code:
                continue
            for a in HTML_ID.findall(t):
                found.add(a)
            m = HEADING.match(t)
            if m:
                s = slug(m.group(2))
                k = seen.get(s, 0)
                seen[s] = k + 1
                found.add(s if k == 0 else f"{s}-{k}")
        _anchors[path] = found
    return _anchors[path]


def summary_pages():
    pages = set()
    for target in LINK.findall(read(os.path.join(BOOK, "SUMMARY.md"))):
        if target:
            pages.add(os.path.normpath(os.path.join(BOOK, target)))
    return pages


def check(path, pages):
    in_book = path.startswith(BOOK + os.sep)
    for f, n, t, code in walk(expand(path, read(path))):
        if code:
            continue
        t = re.sub(r"`+[^`]*`+", "", t)  # no links inside code spans
        targets = LINK.findall(t)
        m = REFDEF.match(t)
        if m:
            targets.append(m.group(1))
        for target in targets:
            if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                continue  # an absolute URL (https:, mailto:)
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(dest):
                err(f, n, f"link to a missing file: {target}")
                continue
            if in_book and file_part:
                if not dest.startswith(BOOK + os.sep):
                    err(f, n, f"link out of the book (broken when rendered; name the path instead): {target}")
                    continue
                if dest.endswith(".md") and dest not in pages:
                    err(f, n, f"link to a page not in SUMMARY.md: {target}")
                    continue
            if anchor:
                if os.path.isdir(dest) or not dest.endswith(".md"):
                    err(f, n, f"anchor on a file that has none: {target}")
                elif anchor not in anchors_of(dest):
                    err(f, n, f"link to a missing anchor: {target}")


def check_rendered(book_out):
    """The same, in the HTML mdBook wrote: every link in a page's <main>
    reaches a page and an id there (mdBook's own slugs, not ours)."""
    ids = {}
    def ids_of(f):
        if f not in ids:
            ids[f] = set(re.findall(r'\sid="([^"]+)"', read(f)))
        return ids[f]
    pages = 0
    for d, _, names in os.walk(book_out):
        for x in names:
            if not x.endswith(".html") or x in ("print.html", "404.html", "toc.html"):
                continue
            f = os.path.join(d, x)
            m = re.search(r"<main>(.*)</main>", read(f), re.S)
            if not m:
                continue
            pages += 1
            for href in re.findall(r'href="([^"]+)"', m.group(1)):
                if re.match(r"^([a-z][a-z0-9+.-]*:|//)", href, re.I):
                    continue
                file_part, _, anchor = href.partition("#")
                dest = f if not file_part else os.path.normpath(os.path.join(d, file_part))
                if not os.path.isfile(dest):
                    err(f, 0, f"rendered link to a missing file: {href}")
                elif anchor and anchor not in ids_of(dest):
                    err(f, 0, f"rendered link to a missing id: {href}")
    return pages


def main():
    pages = summary_pages()
    for p in sorted(pages):
        if not os.path.isfile(p):
            err(os.path.join(BOOK, "SUMMARY.md"), 0, f"SUMMARY.md lists a missing page: {os.path.relpath(p, BOOK)}")
    files = [os.path.join(ROOT, t) for t in TOP if os.path.isfile(os.path.join(ROOT, t))]
    for d, _, names in os.walk(BOOK):
        files += [os.path.join(d, x) for x in sorted(names) if x.endswith(".md")]
    for p in files:
        check(p, pages)
    checked = len(files)
    book_out = os.path.join(ROOT, "target", "book")
    if os.path.isdir(book_out):  # `make docs-check` builds it first
        checked += check_rendered(book_out)
    if errors:
        print("\n".join(errors))
        print(f"check-docs: {len(errors)} broken link(s) in {checked} files")
        return 1
    print(f"check-docs: {checked} files, every link and anchor resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
