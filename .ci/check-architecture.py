#!/usr/bin/env python3
"""The structural claims of ARCHITECTURE.md (`make lint`), each checked on the code:

1. A store is a folder: in `dedup-core`, no production module outside
   `stores/` (each store's folder, and `stores.rs`, the factory that builds the
   configured store) and `config/` (each store's settings, one variant each) names a
   store's module or one of its types; the glue (`filter/src`) names neither.
2. The glue is thin: `filter/src` holds at most GLUE_MAX_LINES lines of code.
3. No import circles: `.ci/check-circles.py` (run beside this one).

Test code (`#[cfg(test)]` items and modules) is left out: a test may reach anything.
Prints what breaks a claim and exits 1. `--self-test` first checks that a planted
store name outside the stores is caught.
"""
import importlib.util
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORE = os.path.join(ROOT, "filter/core/src")
GLUE = os.path.join(ROOT, "filter/src")
GLUE_MAX_LINES = 2000

# The stores' own types: the ones a store's folder defines that name its kind.
KIND_NAMES = re.compile(
    r"\b(SharedDataStore|SharedHeld|SharedEntities|SharedStore|Layout|EtcdStore|EtcdState|"
    r"EtcdHeld|EtcdCall|EtcdWorker|EtcdClaim|EtcdRecord|LeaseCache|LocalTier)\b"
)
# Where a kind may be named: the stores, the factory, and each store's settings.
ALLOWED = (("stores",), ("config",))

spec = importlib.util.spec_from_file_location(
    "check_circles", os.path.join(ROOT, ".ci/check-circles.py")
)
circles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(circles)


def production_code(src):
    """Module -> (file, its code without comments, strings and test items), for a
    crate at src; test modules left out."""
    mods = circles.modules(src)
    out, test_mods = {}, set()
    for mod in sorted(mods, key=len):
        with open(mods[mod], encoding="utf-8") as f:
            code = circles.without_tests(circles.strip(f.read()), mod, test_mods)
        if any(mod[:n] in test_mods for n in range(1, len(mod) + 1)):
            continue
        out[mod] = (mods[mod], code)
    return out, mods


def store_kinds_named(src):
    """Where production code outside the stores names a store: (file, what)."""
    found = []
    code, mods = production_code(src)
    for mod, (path, text) in sorted(code.items()):
        if any(mod[: len(a)] == a for a in ALLOWED):
            continue
        for target in circles.references(text, mod, mods):
            if target[:1] == ("stores",) and len(target) > 1:
                found.append((path, "::".join(("crate",) + target)))
        for m in sorted(set(KIND_NAMES.findall(text))):
            found.append((path, m))
    return found


def glue_problems():
    found = []
    code, _ = production_code(GLUE)
    lines = 0
    for _, (path, text) in sorted(code.items()):
        lines += sum(1 for line in text.splitlines() if line.strip())
        for m in sorted(set(re.findall(r"dedup_core::stores\b", text))):
            found.append((path, m))
        for m in sorted(set(KIND_NAMES.findall(text))):
            found.append((path, m))
    return found, lines


def self_test():
    import tempfile

    d = tempfile.mkdtemp()
    files = {
        "lib.rs": "mod stores; mod stream; mod config; mod worker;\n",
        "stores.rs": "pub mod etcd;\nuse crate::stream::Store;\n",
        "stores/etcd.rs": "pub struct EtcdStore;\n",
        "config.rs": "// EtcdStore in a comment\npub enum StoreConfig { Etcd }\n",
        "stream.rs": "pub trait Store {}\n#[cfg(test)]\nmod tests { use crate::stores::etcd::EtcdStore; }\n",
        "worker.rs": "fn f() { let s = \"EtcdStore\"; crate::stores::etcd::EtcdStore; }\n",
    }
    for name, text in files.items():
        p = os.path.join(d, name)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    found = store_kinds_named(d)
    names = sorted((os.path.basename(p), what) for p, what in found)
    assert names == [
        ("worker.rs", "EtcdStore"),
        ("worker.rs", "crate::stores::etcd"),
    ], names


def main():
    if "--self-test" in sys.argv:
        self_test()
    problems = []
    for path, what in store_kinds_named(CORE):
        problems.append(
            f"{os.path.relpath(path, ROOT)} names a store (`{what}`) outside `stores/`, "
            "the factory and `config/`: reach it through the store interface (`stream::Store`)"
        )
    glue, lines = glue_problems()
    for path, what in glue:
        problems.append(f"{os.path.relpath(path, ROOT)}: the glue names a store (`{what}`)")
    if lines > GLUE_MAX_LINES:
        problems.append(
            f"filter/src: {lines} lines of code, more than {GLUE_MAX_LINES}: the glue is thin "
            "(ARCHITECTURE.md, The glue); move logic to dedup-core"
        )
    for p in problems:
        print("check-architecture: " + p)
    if problems:
        sys.exit(1)
    print(f"check-architecture: no store named outside its folder; the glue is {lines} lines")


if __name__ == "__main__":
    main()
