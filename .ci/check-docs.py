#!/usr/bin/env python3
r"""Checks the docs' pointers: links and anchors, section references, and
configuration fields named in prose.

1. Links. Every relative link to a file, and every `#anchor`, in the book
(docs/src) and the top-level markdown files resolves (a link's text may wrap:
its `](target)` is what is read). mdBook checks neither
(it renders a broken link as it is), so `make test` runs this after `mdbook
build`. Anchors are heading slugs as GitHub and mdBook make them (lower case;
letters, digits, `_` and `-` kept, spaces to `-`, the rest dropped; a repeated
slug gets `-1`, `-2`, ...), plus explicit `<a id="...">`. `{{#include
file[:anchor]}}` directives must name an existing file (and anchor); an
included markdown file's headings and links count as the including page's, as
mdBook renders them, but a link from another file must not rely on a heading
that only an include brings (GitHub shows the page without it): link a heading
of the page itself. Links from book pages must stay inside the book (a link
out of docs/src is broken in the rendered book: name the file as a path
instead) and reach a page listed in SUMMARY.md. When the built book is there
(target/book, as `make docs-check` leaves it), its HTML is checked too: each
link in a page reaches a page and an id that mdBook wrote.

2. Section references: a section named in quotes after the file it is in must
be a heading of that file (compared without markup, case and spacing). Read
in README.md, ARCHITECTURE.md, BENCHMARKS.md, host-test/README.md,
docs/src/**/*.md, envoy/**/*.yaml, the Makefile and the .rs files under
filter/, envoy/, host-test/ and benches/, with comment markers (`#`, `//`,
`///`, `//!`), Rust string continuations (`\` at a line's end, `\"`) and
line breaks taken out, so a reference may wrap. The forms (the ones the
repository uses):
    README "Configuration"            README, "How we test"
    README's "Tenants" section        README "A" and "B"
    the README's sizing formula ("Memory: the byte budget")
    (docs/src/getting-started.md, "Building the module")
    `BENCHMARKS.md`, "etcd store"     (a path, then a comma, then the name)
    the "Scaling (host-test)" section of BENCHMARKS.md (or of [BENCHMARKS.md](...);
                                      a leading `## ` in the name is dropped)
`README` is the top-level README.md; a path is from the repository's root (or
else from the referring file's directory). In markdown, fenced code is not
read. `README:` followed by a quote (a quotation of its text) is not a
section reference, nor a name with a `{placeholder}` (a format string's).

3. Configuration fields named in prose, in README.md and docs/src/**/*.md
(not docs/src/reference/fields.md, which is generated): the known fields are
docs/config.schema.json's tree (`store.shards[].name`, `rules[].match.path_prefix`)
and the first column of docs/src/reference/fields.md (both generated from the
parser's field table). Inline code spans are read outside fenced code; fenced
`json` blocks are filter/core/tests/doc_blocks.rs's (they go through the
parser itself). A problem is:
  - a dotted span, `a.b` or `a.b.c` (lower_snake segments, `[]`, `[i]` or
    `[0]` after one allowed; optionally followed by `: value` or `= value`),
    whose first segment is a top-level object of the configuration (`key`,
    `scope`, `store`, `rules`, ...), that is not a known field:
    `store.no_such_field` (a file name such as `store.rs` is not read as one);
  - a bare name that exists only nested (`max_store_bytes`, which is
    `store.max_store_bytes`) presented as a top-level field: right after
    "top-level"/"top level" (or followed by "at the top level"); or as a
    `name: value` span written next to a top-level field's `name: value`
    span, joined only by a comma, "and", "or" or "+" (`capacity: 16000` and
    `max_store_bytes: 134217728`: a configuration written out inline); or
    as a key of an inline JSON object span that is a configuration (one of its
    keys is a top-level field, or "top-level" precedes it). Such a JSON span is
    read through: every key must be a field at its place. Other bare names
    (`on_stale`, `name`) are common in prose about their object, and are not
    checked; nor are JSON spans that are not configurations (`{"none": true}`,
    an API answer) or not JSON (`{"shards": OLD}`).
A page that names fields on purpose that the parser does not know (a sketch of
fields not built yet, a misspelt name in an example of an error) says so with
`<!-- not-fields: a.b c.d -->` on a line of its own: those paths, and what is
under them, may be named on that page.

4. Inline copies. No book page uses mdBook's `{{#include}}` (GitHub shows it as a
bare line): a page shows a file between `<!-- inline: PATH -->` and
`<!-- inline end -->`, written by `make docs-ref` (dedup-tools' sync-inline), and
a copy that differs from its source (a file, a README anchor, a template rendered
with a recipe's JSON, an Istio file's filter JSON) is a problem: this runs
`sync-inline --check` (cargo builds it first).

PENDING lists stale section references in files this check does not own, to
be fixed there: they are printed, not failed, and an entry that no longer
matches anything is a failure (remove it).

Usage: .ci/check-docs.py [ROOT]   (exit 1 and one line per problem)
"""
import json
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
# A link's end, `](target)`: its text may have started on an earlier line.
LINK_END = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
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
    came from, for the messages: a list of (file, line number, text, origin),
    where an included markdown file's lines are the including line's (as
    mdBook renders them) and `origin` is the file a line really is in."""
    lines = []
    for n, line in enumerate(text.split("\n"), 1):
        m = INCLUDE.search(line)
        if not m:
            lines.append((path, n, line, path))
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
            lines.extend((path if f == file else f, n if f == file else k, t, o) for f, k, t, o in sub)
        else:
            lines.append((path, n, "", path))  # code: nothing to check
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
    for f, n, t, _ in lines:
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


def anchor_sources(path):
    """The page's anchors, each with the files its heading (or id) comes from:
    the page itself, or a markdown file it includes."""
    if path not in _anchors:
        seen, found = {}, {}
        lines = expand(path, read(path))
        for (_, _, _, f), (_, _, t, code) in zip(lines, walk(lines)):
            if code:
                continue
            for a in HTML_ID.findall(t):
                found.setdefault(a, set()).add(f)
            m = HEADING.match(t)
            if m:
                s = slug(m.group(2))
                k = seen.get(s, 0)
                seen[s] = k + 1
                found.setdefault(s if k == 0 else f"{s}-{k}", set()).add(f)
        _anchors[path] = found
    return _anchors[path]


def anchors_of(path):
    return set(anchor_sources(path))


_headings = {}


def norm_title(text):
    return " ".join(plain(text).replace("`", "").split()).casefold()


def headings_of(path):
    """The page's headings, as rendered (includes expanded), normalised."""
    if path not in _headings:
        found = set()
        for _, _, t, code in walk(expand(path, read(path))):
            m = None if code else HEADING.match(t)
            if m:
                found.add(norm_title(m.group(2)))
        _headings[path] = found
    return _headings[path]


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
        targets = LINK_END.findall(t)
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
                elif dest not in anchor_sources(dest)[anchor] and f not in anchor_sources(dest)[anchor]:
                    src = ", ".join(sorted(os.path.relpath(x, ROOT) for x in anchor_sources(dest)[anchor]))
                    err(f, n, f"link to an anchor that only an include brings ({src}; not there on GitHub): "
                        f"{target}: link a heading of the page itself")


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


# ---- 2. Section references -------------------------------------------------

# Stale references in files this check does not own (code under change
# elsewhere): (file, quoted name, where it should point). Printed, not failed;
# remove an entry once its file is fixed (a stale entry fails).
PENDING = []

QUOTED = r'"([^"]{1,120})"'
# README "A" / README, "A" / README's "A" section / README "A" and "B"
README_REF = re.compile(r"\bREADME(?:\.md)?(?:'s)?,?\s+" + QUOTED + r"((?:\s*(?:,\s*and|,|and|or)\s+" + QUOTED + r")*)")
# the README's sizing formula ("A")
README_REF_WORDS = re.compile(r"\bREADME's\s+(?:[a-z]+\s+){1,3}\(" + QUOTED + r"\)")
# (docs/src/x.md, "A") / `BENCHMARKS.md`, "A"
PATH_REF = re.compile(r"(?<![\w/.-])`?((?:[\w.-]+/)*[\w.-]+\.md)`?,\s+" + QUOTED)
# the "A" section of BENCHMARKS.md / of [BENCHMARKS.md](../BENCHMARKS.md)
SECTION_OF = re.compile(r'"(?:#{1,6}\s+)?([^"]{1,120})"\s+section\s+of\s+\[?`?((?:[\w.-]+/)*[\w.-]+\.md)')
COMMENT_LEAD = re.compile(r"^\s*(?://[/!]?|#+(?=\s|$)|\*)?\s?")
SOURCE_DIRS = ["filter", "envoy", "host-test", "benches"]


def flatten(path, text):
    """The file's text as one line, comment markers and line breaks taken out,
    and a function from an offset in it to a line number."""
    md = path.endswith(".md")
    parts, starts = [], []
    fence = None
    pos = 0
    for n, line in enumerate(text.split("\n"), 1):
        if md:
            m = FENCE.match(line)
            if m or fence:
                if m:
                    mark = m.group(1)[0] * 3
                    fence = mark if fence is None else (None if mark == fence else fence)
                line = ""
        else:
            line = COMMENT_LEAD.sub("", line, count=1)
            if path.endswith(".rs"):
                line = line.replace('\\"', '"')
                if line.endswith("\\"):
                    line = line[:-1]
        line = line.strip()
        starts.append((pos, n))
        parts.append(line)
        pos += len(line) + 1
    flat = " ".join(parts)

    def line_of(off):
        lo, hi = 0, len(starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if starts[mid][0] <= off:
                lo = mid
            else:
                hi = mid - 1
        return starts[lo][1]

    return flat, line_of


def ref_files():
    files = [os.path.join(ROOT, t) for t in TOP if os.path.isfile(os.path.join(ROOT, t))]
    files.append(os.path.join(ROOT, "Makefile"))
    for d, _, names in os.walk(BOOK):
        files += [os.path.join(d, x) for x in sorted(names) if x.endswith(".md")]
    for top in SOURCE_DIRS:
        for d, subdirs, names in os.walk(os.path.join(ROOT, top)):
            subdirs[:] = sorted(s for s in subdirs if s != "target" and not s.startswith("."))
            for x in sorted(names):
                if x.endswith(".rs") or (top == "envoy" and x.endswith((".yaml", ".yml"))):
                    files.append(os.path.join(d, x))
    return [f for f in files if os.path.isfile(f)]


def section_refs(path):
    """(line, referenced file or None, name, as written) for each reference."""
    flat, line_of = flatten(path, read(path))
    readme = os.path.join(ROOT, "README.md")
    for m in README_REF.finditer(flat):
        line = line_of(m.start())
        yield line, readme, m.group(1), m.group(0)
        for extra in re.findall(QUOTED, m.group(2) or ""):
            yield line, readme, extra, m.group(0)
    for m in README_REF_WORDS.finditer(flat):
        yield line_of(m.start()), readme, m.group(1), m.group(0)
    for m, target, name in [(m, m.group(1), m.group(2)) for m in PATH_REF.finditer(flat)] + \
            [(m, m.group(2), m.group(1)) for m in SECTION_OF.finditer(flat)]:
        cands = [os.path.normpath(os.path.join(ROOT, target)),
                 os.path.normpath(os.path.join(os.path.dirname(path), target))]
        dest = next((c for c in cands if os.path.isfile(c)), None)
        yield line_of(m.start()), dest, name, m.group(0)


def check_section_refs():
    pending_seen = set()
    notes = []
    count = 0
    for path in ref_files():
        rel = os.path.relpath(path, ROOT)
        for line, dest, name, written in section_refs(path):
            count += 1
            if re.search(r"\{[^{}]*\}", name):
                continue  # a format string's placeholder ("{heading}"), filled in at run time
            if dest is None:
                err(path, line, f"section reference to a missing file: {written}")
                continue
            if norm_title(name) in headings_of(dest):
                continue
            pend = [p for p in PENDING if p[0] == rel and norm_title(p[1]) == norm_title(name)]
            if pend:
                pending_seen.add(pend[0])
                notes.append(f"{rel}:{line}: pending (PENDING): {os.path.relpath(dest, ROOT)} has no section "
                             f"\"{name}\"; point it to {pend[0][2]}")
                continue
            err(path, line, f"{os.path.relpath(dest, ROOT)} has no section \"{name}\" (referred to as: {written})")
    for p in PENDING:
        if p not in pending_seen:
            err(os.path.join(ROOT, p[0]), 0, f"PENDING entry no longer found (fixed? remove it from .ci/check-docs.py): \"{p[1]}\"")
    return count, notes


# ---- 3. Configuration fields named in prose --------------------------------

SCHEMA = os.path.join(ROOT, "docs", "config.schema.json")
FIELDS_MD = os.path.join(BOOK, "reference", "fields.md")
SEG = r"[a-z][a-z0-9_]*(?:\[(?:i|\d+)?\])?"
VALUE = r"(?:\s*:\s+|\s*=\s*)\S.*"  # `: value` (`header:x-id` is a payload part, not a setting)
DOTTED = re.compile(r'^"?(' + SEG + r"(?:\." + SEG + r')+)"?(?:' + VALUE + r")?$")
BARE = re.compile(r'^"?([a-z][a-z0-9_]*)"?(' + VALUE + r")?$")
FILE_EXT = {"rs", "md", "yaml", "yml", "json", "toml", "py", "wasm", "sh", "txt", "html", "lock"}
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
NOT_FIELDS = re.compile(r"^\s*<!--\s*not-fields:\s*([^>]*?)\s*-->\s*$", re.M)
TOP_BEFORE = re.compile(r"\btop[- ]level(?:\s+(?:field|fields|key|keys|name))?\s*[,:]?\s*$", re.I)
TOP_AFTER = re.compile(r"^\s*(?:\([^)]*\)\s*)?(?:at|on|in)\s+the\s+top\s+level\b", re.I)


def norm_path(p):
    return re.sub(r"\[(?:i|\d+)?\]", "[]", p)


def known_fields():
    """Every field path of the configuration: the schema's tree, and the
    generated reference's first column."""
    paths = set()

    def walk_schema(node, path):
        if not isinstance(node, dict):
            return
        for k in ("oneOf", "anyOf", "allOf"):
            for sub in node.get(k, []):
                walk_schema(sub, path)
        for name, sub in node.get("properties", {}).items():
            p = f"{path}.{name}" if path else name
            paths.add(p)
            walk_schema(sub, p)
        if isinstance(node.get("items"), dict):
            walk_schema(node["items"], path + "[]")

    if os.path.isfile(SCHEMA):
        with open(SCHEMA, encoding="utf-8") as f:
            walk_schema(json.load(f), "")
    if os.path.isfile(FIELDS_MD):
        for line in read(FIELDS_MD).split("\n"):
            m = re.match(r"^\|\s*((?:`[^`]+`(?:,\s*)?)+)\s*\|", line)
            if not m:
                continue
            names = re.findall(r"`([^`]+)`", m.group(1))
            base = None
            for name in names:
                name = norm_path(name)
                if name.startswith(".") and base:
                    name = base + name
                else:
                    base = name.rsplit(".", 1)[0] if "." in name else None
                if re.fullmatch(r"[a-z0-9_.\[\]]+", name):
                    paths.add(name)
    # rules[].<object>.<field>: a rule's object has the top-level object's fields.
    for p in list(paths):
        head = p.split(".", 1)[0]
        if "." in p and f"rules[].{head}" in paths:
            paths.add("rules[]." + p)
    return paths


def json_problems(obj, prefix, known):
    """Keys of a configuration object (at `prefix`) that are not fields there."""
    out = []
    for k, v in obj.items():
        p = f"{prefix}.{k}" if prefix else k
        if p not in known:
            out.append(p)
            continue
        if isinstance(v, dict):
            out += json_problems(v, p, known)
        elif isinstance(v, list):
            for item in v:
                if isinstance(item, dict):
                    out += json_problems(item, p + "[]", known)
    return out


def check_fields():
    known = known_fields()
    if not known:
        err(SCHEMA, 0, "no configuration fields found (docs/config.schema.json, docs/src/reference/fields.md)")
        return 0
    top = {p for p in known if "." not in p and "[" not in p}
    objects = {p.split(".", 1)[0].split("[", 1)[0] for p in known if "." in p}
    nested = {}
    for p in known:
        if "." in p:
            leaf = p.rsplit(".", 1)[1]
            if leaf not in top:
                nested.setdefault(leaf, set()).add(p)

    def where(leaf):
        return " or ".join(f"`{x}`" for x in sorted(nested[leaf]) if not x.startswith("rules[]."))  \
            or " or ".join(f"`{x}`" for x in sorted(nested[leaf]))

    files = [os.path.join(ROOT, "README.md")]
    for d, _, names in os.walk(BOOK):
        files += [os.path.join(d, x) for x in sorted(names) if x.endswith(".md")]
    count = 0
    for path in files:
        if os.path.normpath(path) == os.path.normpath(FIELDS_MD) or not os.path.isfile(path):
            continue
        text = read(path)
        exempt = set()
        for m in NOT_FIELDS.finditer(text):
            for x in re.split(r"[\s,]+", m.group(1)):
                if re.fullmatch(SEG + r"(?:\." + SEG + r")*", x):
                    exempt.add(norm_path(x))
                elif x:
                    err(path, text[:m.start()].count("\n") + 1, f"not-fields marker: `{x}` is not a field path")
        flat, line_of = flatten(path, re.sub(r"<!--.*?-->", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S))

        def is_exempt(p):
            return any(p == q or p.startswith(q + ".") or p.startswith(q + "[]") for q in exempt)

        spans = [(m.start(), m.end(), " ".join(m.group(2).split())) for m in CODE_SPAN.finditer(flat)]

        def setting(k):
            """The name of span k if it is a bare `name: value`, else None."""
            if 0 <= k < len(spans):
                m = BARE.match(spans[k][2])
                if m and m.group(2):
                    return m.group(1)
            return None

        def listed_with(k):
            """The top-level `name: value` spans written next to span k, joined
            only by a comma, `and`, `or` or `+`."""
            out = []
            for j in (k - 1, k + 1):
                name = setting(j)
                if name in top:
                    gap = flat[spans[min(j, k)][1]:spans[max(j, k)][0]]
                    if re.fullmatch(r"\s*(?:,|,?\s*and|,?\s*or|\+)?\s*", gap):
                        out.append(name)
            return out

        for k, (s, e, span) in enumerate(spans):
            line = line_of(s)
            before, after = flat[max(0, s - 48):s], flat[e:e + 40]
            at_top = bool(TOP_BEFORE.search(before) or TOP_AFTER.match(after))
            m = DOTTED.match(span)
            if m and m.group(1).split(".", 1)[0].split("[", 1)[0] in objects \
                    and m.group(1).rsplit(".", 1)[1] not in FILE_EXT:  # `store.rs` is a file
                count += 1
                p = norm_path(m.group(1))
                if p not in known and not is_exempt(p):
                    err(path, line, f"`{span}` is not a field of the configuration "
                        f"(docs/src/reference/fields.md)")
                continue
            m = BARE.match(span)
            if m and m.group(1) in nested:
                name = m.group(1)
                count += 1
                if is_exempt(name):
                    continue
                if at_top:
                    err(path, line, f"`{name}` named as a top-level field: the configuration has it only as {where(name)}")
                elif m.group(2) and listed_with(k):
                    err(path, line, f"`{span}` listed with top-level fields (`{'`, `'.join(listed_with(k))}`): "
                        f"the configuration has `{name}` only as {where(name)}")
                continue
            if span.startswith("{") or span.startswith('"'):
                obj = None
                for cand in (span, "{" + span + "}"):
                    try:
                        obj = json.loads(cand)
                        break
                    except ValueError:
                        pass
                if not isinstance(obj, dict) or not obj:
                    continue
                if not at_top and not any(key in top for key in obj):
                    continue  # a fragment of an object, or not a configuration
                count += 1
                for p in json_problems(obj, "", known):
                    if is_exempt(p):
                        continue
                    leaf = p.rsplit(".", 1)[-1]
                    if "." not in p and leaf in nested:
                        err(path, line, f"`{span}`: `{leaf}` as a top-level field: the configuration has it only as {where(leaf)}")
                    else:
                        err(path, line, f"`{span}`: `{p}` is not a field of the configuration")
    return count


def check_inline(files):
    """No bare include in a book page; every inline copy is its source's text."""
    for p in files:
        if not p.startswith(BOOK + os.sep):
            continue
        for n, line in enumerate(read(p).split("\n"), 1):
            if INCLUDE.search(line):
                err(p, n, "an mdBook include (GitHub shows the bare line): write "
                    "`<!-- inline: PATH -->` and `<!-- inline end -->` instead, then `make docs-ref`")
    import subprocess
    cmd = ["cargo", "run", "--locked", "-q", "-p", "dedup-tools", "--bin", "sync-inline", "--", "--check", ROOT]
    try:
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    except OSError as e:
        err(os.path.join(ROOT, "Makefile"), 0, f"cannot run sync-inline ({e}): the inline copies are unchecked")
        return 0
    for line in r.stdout.splitlines():
        path, _, rest = line.partition(":")
        num, _, msg = rest.partition(":")
        errors.append(f"{path}:{num}:{msg}")
    if r.returncode not in (0, 1) or (r.returncode == 1 and not r.stdout.strip()):
        err(os.path.join(ROOT, "Makefile"), 0, f"sync-inline --check failed: {r.stderr.strip()[-2000:]}")
    return len(r.stdout.splitlines())


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
    refs, notes = check_section_refs()
    fields = check_fields()
    inline = check_inline(files)
    for n in notes:
        print(n)
    if errors:
        print("\n".join(errors))
        print(f"check-docs: {len(errors)} problem(s); read {checked} files' links, {refs} section references, "
              f"{fields} configuration fields named in prose")
        return 1
    print(f"check-docs: {checked} files, every link and anchor resolves; {refs} section references read, each "
          f"names a heading; {fields} configuration fields named in prose, each exists"
          + (f"; {len(notes)} pending (PENDING)" if notes else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
