#!/usr/bin/env python3
"""No import circles (`make lint`): in every library and binary crate of the workspace,
the graph of which source file of production code names which has no loop (test code,
`#[cfg(test)]` modules and items, is left out: a test may reach anything).

A file names another when one of its paths (a `use` tree, or a `crate::`, `super::`,
`self::` or child-module path in the code) resolves to that file's module: the path
is walked segment by segment while a module file exists, and the deepest module found
is the one named. Siblings count, and so do `super::` paths: `config/fields.rs`
naming `super::rules::MAX_RULES` while `config/rules.rs` names `super::fields::X` is
a circle. Two edges do not count: a module naming one of its ancestors (a child
reaches its parent's items through `super::`), and a module declaring its own
children (`mod x;`). Comments and string literals are skipped.

Prints every circle found (its files, in order) and exits 1; exits 0 when there is
none. `--self-test` checks the resolver on a made-up crate first.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Crate source roots (the test crates under `tests/` are separate crates, one a file).
CRATES = [
    "filter/core/src",
    "filter/src",
    "host-test/src",
    "host-test/h2/src",
    "envoy/src",
    "envoy/tools/src",
    "benches/src",
]

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def strip(text):
    """The code without comments, string and char literals (kept as blanks)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:]) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.match(r'r(#*)"', text[i:])
            end = '"' + m.group(1)
            j = text.find(end, i + len(m.group(0)))
            i = n if j < 0 else j + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.|[^\\'])'", text[i:]):
            m = re.match(r"'(\\.|[^\\'])'", text[i:])
            i += len(m.group(0))
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def modules(src):
    """Module path (tuple of names, () for the crate root) -> file, for a crate at src."""
    mods = {}
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, src)[:-3].split(os.sep)
            if rel in (["lib"], ["main"]):
                mods[()] = path
            elif rel[:1] == ["bin"]:
                continue  # binaries are crates of their own (handled separately)
            elif rel[-1] == "mod":
                mods[tuple(rel[:-1])] = path
            else:
                mods[tuple(rel)] = path
    return mods


def expand_use(tree, prefix=()):
    """The paths of a use tree (`a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e)."""
    tree = tree.strip()
    if not tree:
        return []
    parts = []
    depth, start = 0, 0
    for i, ch in enumerate(tree):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(tree[start:i])
            start = i + 1
    parts.append(tree[start:])
    if len(parts) > 1:
        return [p for part in parts for p in expand_use(part, prefix)]
    t = tree
    m = re.match(r"^((?:" + IDENT + r"\s*::\s*)*)\{(.*)\}$", t, re.S)
    if m:
        head = tuple(s.strip() for s in m.group(1).split("::") if s.strip())
        return expand_use(m.group(2), prefix + head)
    t = re.sub(r"\s+as\s+" + IDENT + r"$", "", t).strip()
    segs = tuple(s.strip() for s in t.split("::") if s.strip())
    return [prefix + segs]


def resolve(path, here, mods):
    """The module a path written in module `here` names, or None (another crate)."""
    if not path:
        return None
    segs = list(path)
    if segs[0] == "crate":
        base, segs = (), segs[1:]
    elif segs[0] in ("self", "super"):
        base = here
        while segs and segs[0] in ("self", "super"):
            if segs[0] == "super":
                if not base:
                    return None
                base = base[:-1]
            segs = segs[1:]
    elif here + (segs[0],) in mods:
        base = here  # a child module, by its name
    elif (segs[0],) in mods and here == ():
        base = ()
    else:
        return None
    found = base
    for s in segs:
        if found + (s,) in mods:
            found = found + (s,)
        else:
            break
    return found


def references(code, here, mods):
    """Modules `here`'s code names."""
    names = set()
    for m in re.finditer(r"\buse\s+([^;]+);", code):
        for p in expand_use(m.group(1)):
            if p and p[-1] == "*":
                p = p[:-1]
            r = resolve(p, here, mods)
            if r is not None:
                names.add(r)
    for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:crate|super|self)(?:\s*::\s*" + IDENT + r")+)", code):
        p = tuple(s.strip() for s in m.group(1).split("::"))
        r = resolve(p, here, mods)
        if r is not None:
            names.add(r)
    for m in re.finditer(r"(?<![A-Za-z0-9_:])(" + IDENT + r")\s*::\s*" + IDENT, code):
        first = m.group(1)
        if here + (first,) in mods:
            names.add(here + (first,))
    return names


CFG_TEST = re.compile(r"#\[cfg\(test\)\]")


def without_tests(code, here, test_mods):
    """The code without its `#[cfg(test)]` items; the modules they declare (`mod x;`)
    are added to `test_mods`: test code is not part of the graph."""
    out, i = [], 0
    while True:
        m = CFG_TEST.search(code, i)
        if not m:
            out.append(code[i:])
            return "".join(out)
        out.append(code[i : m.start()])
        rest = code[m.end() :]
        decl = re.match(r"\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*;", rest)
        if decl:
            test_mods.add(here + (decl.group(1),))
            i = m.end() + decl.end()
            continue
        # An item: up to its `;` or its balanced `{ ... }`, whichever comes first.
        j, semi = code.find("{", m.end()), code.find(";", m.end())
        if j < 0 or (0 <= semi < j):
            i = (semi + 1) if semi >= 0 else len(code)
            continue
        depth, k = 0, j
        while k < len(code):
            if code[k] == "{":
                depth += 1
            elif code[k] == "}":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        i = k + 1


def graph(src):
    mods = modules(src)
    codes, test_mods = {}, set()
    for mod in sorted(mods, key=len):
        with open(mods[mod], encoding="utf-8") as f:
            codes[mod] = without_tests(strip(f.read()), mod, test_mods)
    is_test = lambda m: any(m[:n] in test_mods for n in range(1, len(m) + 1))
    edges = {}
    for mod in mods:
        if is_test(mod):
            continue
        out = set()
        for target in references(codes[mod], mod, mods):
            # A module naming itself or one of its ancestors does not count, nor test code.
            if target == mod or mod[: len(target)] == target or is_test(target):
                continue
            out.add(target)
        edges[mod] = out
    return mods, edges


def circles(edges):
    """Strongly connected components of more than one module, each as a cycle."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def self_test():
    import tempfile

    d = tempfile.mkdtemp()
    files = {
        "lib.rs": "mod a; mod b; mod c; mod e;\n",
        "a.rs": "use crate::b::X; // crate::c in a comment\nfn f() { let s = \"crate::c\"; }\n",
        "b.rs": "use super::{c::Y, a};\n",
        "c.rs": "mod d;\nuse super::a::Z;\n",
        "c/d.rs": "use super::super::c; use super::Q;\n",
        "e.rs": "#[cfg(test)]\nmod tests;\n#[cfg(test)]\nmod inline { use crate::a::X; }\n",
        "e/tests.rs": "use crate::a::Y;\n",
    }
    for name, text in files.items():
        p = os.path.join(d, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    mods, edges = graph(d)
    assert edges[("a",)] == {("b",)}, edges[("a",)]
    assert edges[("b",)] == {("a",), ("c",)}, edges[("b",)]
    assert edges[("c", "d")] == set(), edges[("c", "d")]  # its parent only
    assert circles(edges) == [[("a",), ("b",), ("c",)]], circles(edges)
    assert edges[("e",)] == set() and ("e", "tests") not in edges, edges.get(("e",))


def main():
    if "--self-test" in sys.argv:
        self_test()
    found = []
    crates = []
    for rel in CRATES:
        src = os.path.join(ROOT, rel)
        if not os.path.isdir(src):
            continue
        crates.append(src)
        # Each binary under src/bin is a crate of its own (a file, or a folder with main.rs).
        bins = os.path.join(src, "bin")
        if os.path.isdir(bins):
            for entry in sorted(os.listdir(bins)):
                p = os.path.join(bins, entry)
                if os.path.isdir(p):
                    crates.append(p)
    explain = "--explain" in sys.argv
    for src in crates:
        mods, edges = graph(src)
        for comp in circles(edges):
            files = [os.path.relpath(mods[m], ROOT) for m in comp]
            found.append(files)
            if explain:
                for m in comp:
                    for t in sorted(edges[m] & set(comp)):
                        print(f"  {os.path.relpath(mods[m], ROOT)} -> {os.path.relpath(mods[t], ROOT)}")
    if found:
        for files in found:
            print("check-circles: an import circle: " + " <-> ".join(files))
        print(f"check-circles: {len(found)} circle(s); move the names they share to the module that owns them")
        sys.exit(1)
    print(f"check-circles: {len(crates)} crates, no import circle")


if __name__ == "__main__":
    main()
