//! The markdown reference (`docs/src/reference/fields.md`, included by the book's
//! configuration page): one table per group, rows in the table's order, columns
//! field | default | meaning.

use super::{Applies, Field, Group, Type, FIELDS, UNCHECKED};

/// The groups in the order the reference lists them, with their headings. The prose
/// around the tables lives in the book (docs/src/reference/configuration.md includes
/// this file).
const GROUPS: [(Group, &str); 4] = [
    (Group::Configuration, "## Top-level fields"),
    (Group::Ordering, "## The ordering guard (`ordering`)"),
    (Group::Etcd, "## The etcd store (`store.kind: \"etcd\"`)"),
    (Group::Rules, "## Rules (`rules[]`)"),
];

fn row(out: &mut String, field: &str, default: &str, meaning: &str) {
    out.push_str(&format!("| {field} | {default} | {meaning} |\n"));
}

/// `` `rules[].a`, `.b`, `.c` ``
fn rule_names(fields: &[&Field]) -> String {
    fields
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if i == 0 {
                format!("`rules[].{}`", f.name)
            } else {
                format!("`.{}`", f.name)
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reference tables, generated from `FIELDS`.
pub fn reference_markdown() -> String {
    let mut out = String::from(
        "<!-- Generated from dedup-core's field table (filter/core/src/config/fields.rs) by \
         `dedupctl reference` (`make docs-ref`): edit the table, not this file. The JSON \
         Schema of the same fields: docs/config.schema.json (`dedupctl schema`). -->\n",
    );
    for (group, heading) in GROUPS {
        out.push_str(&format!("\n{heading}\n\n"));
        out.push_str("| field | default | meaning |\n|---|---|---|\n");
        for f in FIELDS.iter().filter(|f| f.group == group) {
            let name = format!("`{}`", f.name);
            row(&mut out, &name, &f.default_text(), &f.meaning_text());
        }
        if group == Group::Rules {
            rules_rows(&mut out);
        }
    }
    unchecked(&mut out);
    out
}

/// What only the filter checks: the rules the JSON Schema cannot say.
fn unchecked(out: &mut String) {
    out.push_str(
        "
## What only the filter checks

         `docs/config.schema.json` checks every field's type, bounds and syntax, and the          rules between fields of one object (one etcd cluster or shards, `detached` and its          cluster, one principal source, `json_pointers` or `ignore_json_pointers`, an          ordering's entity and version unless `enabled: false`, a bypassed rule's missing          policy fields, …). It takes `null` for a field wherever the filter does (as if          absent), and a whole number in any notation (`60`, `60.0`, `6e1`) as an integer,          as the filter does. A JSON Schema cannot compare one field's value with another's,          look across rules or shard maps, fold case, or count bytes, so these rules are the          filter's alone (`dedupctl check-config` checks them):

         | field | rule |\n|---|---|\n",
    );
    for (field, rule) in UNCHECKED {
        row2(out, field, rule);
    }
}

fn row2(out: &mut String, field: &str, rule: &str) {
    out.push_str(&format!("| `{field}` | {rule} |\n"));
}

/// The policy fields a rule may override, and what it cannot set.
fn rules_rows(out: &mut String) {
    let policy: Vec<&Field> = FIELDS
        .iter()
        .filter(|f| f.applies == Applies::Policy && !f.name.contains('.'))
        .collect();
    let (objects, values): (Vec<&Field>, Vec<&Field>) = policy
        .into_iter()
        .partition(|f| matches!(f.ty, Type::Object));
    row(
        out,
        &rule_names(&objects),
        "the top-level object",
        "an object given **replaces** the top-level one as a whole: its sub-fields left \
         out take their built-in defaults (the table above), not the top-level values.",
    );
    row(
        out,
        &rule_names(&values),
        "the top-level value",
        "the same field, with the same bounds, for this rule's requests. A \
         `wait_timeout_ms` given in a rule must fit the rule's `in_flight_timeout_seconds`; \
         one inherited is lowered to it.",
    );
    let top: Vec<String> = FIELDS
        .iter()
        .filter(|f| f.applies == Applies::TopLevel)
        .map(|f| format!("`{}`", f.name))
        .collect();
    out.push_str(&format!(
        "\nThe other fields ({}) are the filter's, not a route's, and cannot appear in a \
         rule: `max_waiters` is per worker for all rules together.\n",
        top.join(", ")
    ));
}
