//! `errors`: the formats parsed, inherited by rules, a template filled in with every
//! value escaped, and refusals that name the field.

use super::*;
use crate::config::Config;
use serde_json::{json, Value};

fn parse(doc: Value) -> Result<Config, ConfigError> {
    Config::parse(doc.to_string().as_bytes())
}

fn refused(doc: Value) -> ConfigError {
    match parse(doc.clone()) {
        Ok(_) => panic!("{doc} should be refused"),
        Err(e) => e,
    }
}

fn template(body: &str) -> Template {
    Template::parse(body).unwrap()
}

/// Awkward text: quotes, a backslash, control characters, non-ASCII, `</`.
const AWKWARD: &str = "say \"no\" \\ then\n\ttab \u{1} caf\u{e9} \u{1f600} </script>";

fn values(retry_after: Option<&str>) -> TemplateValues<'_> {
    TemplateValues {
        status: 409,
        slug: "in-flight",
        title: "A \"title\"",
        detail: AWKWARD,
        retry_after,
    }
}

#[test]
fn the_default_is_problem_json_and_each_format_has_its_content_type() {
    let c = parse(json!({})).unwrap();
    assert_eq!(c.policy.errors, ErrorFormat::default());
    assert!(c.policy.errors.is_default());
    assert_eq!(c.policy.errors.content_type, "application/problem+json");
    let stripe = parse(json!({"errors": {"format": "stripe"}})).unwrap();
    assert_eq!(stripe.policy.errors.body, ErrorBody::Stripe);
    assert_eq!(stripe.policy.errors.content_type, "application/json");
    let t =
        parse(json!({"errors": {"format": "template", "body": "{\"c\": \"{{type}}\"}"}})).unwrap();
    assert_eq!(t.policy.errors.content_type, "application/json");
    assert!(matches!(t.policy.errors.body, ErrorBody::Template(_)));
    // problem+json under another content type: not the default any more.
    let pj = parse(json!({"errors": {"content_type": "application/json"}})).unwrap();
    assert_eq!(pj.policy.errors.body, ErrorBody::ProblemJson);
    assert!(!pj.policy.errors.is_default());
}

#[test]
fn a_rule_inherits_the_top_levels_errors_or_replaces_them_as_a_whole() {
    let c = parse(json!({
    "errors": {"format": "template", "content_type": "text/plain", "body": "{{type}}: {{detail}}"},
    "rules": [
        {"name": "same", "match": {"path_prefix": "/a"}},
        {"name": "stripe", "match": {"path_prefix": "/b"}, "errors": {"format": "stripe"}},
        {"name": "plain", "match": {"path_prefix": "/c"}, "errors": {}}
    ]}))
    .unwrap();
    assert_eq!(c.rules[0].policy.errors, c.policy.errors);
    assert_eq!(c.rules[1].policy.errors.body, ErrorBody::Stripe);
    assert_eq!(
        c.rules[1].policy.errors.content_type, "application/json",
        "the top level's content type is not inherited into a rule's own `errors`"
    );
    assert_eq!(c.rules[2].policy.errors, ErrorFormat::default());
    // Which format an answer gets: by the stream's rule; none from the operator API.
    assert_eq!(c.error_format(None), Some(&c.policy.errors));
    assert_eq!(
        c.error_format(Some("stripe")),
        Some(&c.rules[1].policy.errors)
    );
    let admin = parse(json!({"role": "admin", "errors": {"format": "stripe"}})).unwrap();
    assert_eq!(
        admin.error_format(None),
        None,
        "the operator API stays problem+json"
    );
}

#[test]
fn a_template_writes_every_variable_escaped_inside_a_json_string() {
    let t = template(
        r#"{"status": "{{status}}", "type": "{{type}}", "title": "{{title}}", "detail": "{{detail}}", "retry": "{{retry_after}}"}"#,
    );
    let body: Value = serde_json::from_slice(&t.render(&values(Some("7")))).unwrap();
    assert_eq!(
        body,
        json!({"status": "409", "type": "in-flight", "title": "A \"title\"", "detail": AWKWARD, "retry": "7"})
    );
    let body: Value = serde_json::from_slice(&t.render(&values(None))).unwrap();
    assert_eq!(body["retry"], "", "no retry-after: empty text");
}

#[test]
fn the_json_forms_write_whole_values_numbers_and_null() {
    let t = template(
        r#"{"s": {{status_json}}, "t": {{type_json}}, "ti": {{title_json}}, "d": {{detail_json}}, "r": {{retry_after_json}}}"#,
    );
    let body: Value = serde_json::from_slice(&t.render(&values(Some("3")))).unwrap();
    assert_eq!(
        body,
        json!({"s": 409, "t": "in-flight", "ti": "A \"title\"", "d": AWKWARD, "r": 3})
    );
    let body: Value = serde_json::from_slice(&t.render(&values(None))).unwrap();
    assert_eq!(body["r"], Value::Null);
    // Text around and between the variables is kept byte for byte.
    let t = template("{{type}}|{{status}}|{{retry_after}}|x{}y");
    assert_eq!(t.render(&values(Some("2"))), b"in-flight|409|2|x{}y");
}

#[test]
fn a_template_is_checked_at_load_naming_the_field() {
    for (doc, field, says) in [
        (
            json!({"errors": {"format": "template", "body": "{\"c\": \"{{code}}\"}"}}),
            "errors.body",
            "unknown variable `{{code}}`",
        ),
        (
            json!({"errors": {"format": "template", "body": "{\"c\": \"{{type\"}"}}),
            "errors.body",
            "is not closed",
        ),
        (
            json!({"errors": {"format": "template", "body": "{\"m\": {{detail}}}"}}),
            "errors.body",
            "does not render as JSON",
        ),
        (
            json!({"errors": {"format": "template", "body": "{\"m\": \"{{detail_json}}\"}"}}),
            "errors.body",
            "does not render as JSON",
        ),
        (
            json!({"errors": {"format": "template", "body": "{\"r\": {{retry_after}}}"}}),
            "errors.body",
            "without `retry-after`",
        ),
        (
            json!({"errors": {"format": "template"}}),
            "errors.body",
            "required",
        ),
        (
            json!({"errors": {"format": "stripe", "body": "{}"}}),
            "errors.body",
            "only with",
        ),
        (
            json!({"errors": {"body": "{}"}}),
            "errors.body",
            "only with",
        ),
        (
            json!({"errors": {"content_type": "text/plain\n"}}),
            "errors.content_type",
            "not a content type",
        ),
        (
            json!({"errors": {"content_type": " application/json"}}),
            "errors.content_type",
            "not a content type",
        ),
        (
            json!({"errors": {"format": "xml"}}),
            "errors.format",
            "unknown variant",
        ),
        (
            json!({"errors": {"format": "stripe", "shape": 1}}),
            "errors.shape",
            "unknown field",
        ),
        (
            json!({"rules": [{"name": "r", "match": {"path_prefix": "/r"},
                "errors": {"format": "template", "body": "{{nope}}"}}]}),
            "rules[0].errors.body",
            "unknown variable `{{nope}}`",
        ),
        (
            json!({"rules": [{"name": "r", "match": {"path_prefix": "/r"}, "bypass": true,
                "errors": {"format": "stripe"}}]}),
            "rules[0].bypass",
            "`errors` is set",
        ),
    ] {
        let e = refused(doc.clone());
        assert_eq!(e.field, field, "{doc}: {e}");
        assert!(e.reason.contains(says), "{doc}: {e}");
    }
}

#[test]
fn any_text_goes_under_a_content_type_that_is_not_json() {
    let c = parse(
        json!({"errors": {"format": "template", "content_type": "text/plain; charset=utf-8",
        "body": "error {{type}} ({{status}}): {{detail}}"}}),
    )
    .unwrap();
    let ErrorBody::Template(t) = &c.policy.errors.body else {
        panic!("{:?}", c.policy.errors)
    };
    assert_eq!(
        t.render(&values(None)),
        br#"error in-flight (409): say \"no\" \\ then\n\ttab \u0001 caf"#
            .iter()
            .copied()
            .chain("\u{e9} \u{1f600} </script>".bytes())
            .collect::<Vec<u8>>()
    );
    // `+json` types and parameters count as JSON.
    assert!(is_json("application/vnd.api+json; charset=utf-8"));
    assert!(is_json("Application/JSON"));
    assert!(!is_json("text/plain"));
    assert!(!is_json("application/jsonl"));
    let e = refused(json!({"errors": {"format": "template",
        "content_type": "application/vnd.api+json", "body": "{{detail}}"}}));
    assert_eq!(e.field, "errors.body", "{e}");
}
