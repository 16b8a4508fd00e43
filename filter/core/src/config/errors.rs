//! `errors`: the body of the filter's own error answers (problem+json, Stripe's shape, or
//! a template), top level and per rule. Its types are config's own: parsed and checked
//! here, and a template filled in here too (its load-time check renders it); which
//! values a reply gives it, and Stripe's shape, are `reply.rs`'s.

use super::fields::{MAX_CONTENT_TYPE_BYTES, MAX_ERROR_TEMPLATE_BYTES};
use super::raw::{RawErrorFormat, RawErrors};
use super::{err, ConfigError};

/// Default `errors.content_type` of `"problem+json"` (RFC 9457).
pub const PROBLEM_JSON_CONTENT_TYPE: &str = "application/problem+json";
/// Default `errors.content_type` of `"stripe"` and `"template"`.
pub const JSON_CONTENT_TYPE: &str = "application/json";

/// How a policy's error answers are written: the body and its content type. Statuses
/// and headers (`retry-after`, `idempotency-expires`, …) are the filter's in every
/// format, but for Stripe's idempotency errors (see `reply::Problem::stripe`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorFormat {
    pub body: ErrorBody,
    /// The `content-type` of the answer (`errors.content_type`).
    pub content_type: String,
}

/// `errors.format`, with the template of `"template"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorBody {
    /// RFC 9457: `{"type": "urn:proxy-dedup:problem:<slug>", "title", "status", "detail"}`.
    ProblemJson,
    /// Stripe's: `{"error": {"type", "code", "message"}}`, what Stripe's SDKs read.
    Stripe,
    /// The operator's template (`errors.body`).
    Template(Template),
}

impl Default for ErrorFormat {
    fn default() -> Self {
        ErrorFormat {
            body: ErrorBody::ProblemJson,
            content_type: PROBLEM_JSON_CONTENT_TYPE.to_string(),
        }
    }
}

impl ErrorFormat {
    /// Whether answers are sent as the filter builds them (problem+json, its own
    /// content type): nothing to rewrite.
    pub fn is_default(&self) -> bool {
        *self == ErrorFormat::default()
    }
}

/// `errors` (at `prefix`: `""` or `rules[2].`): given, it replaces the inherited
/// format as a whole, its missing fields at their defaults (like `key`, `scope`).
pub(super) fn parse_errors(prefix: &str, raw: RawErrors) -> Result<ErrorFormat, ConfigError> {
    let f = |name: &str| format!("{prefix}errors.{name}");
    let format = raw.format.unwrap_or(RawErrorFormat::ProblemJson);
    let content_type = match raw.content_type {
        Some(c) => content_type(&f("content_type"), c)?,
        None if format == RawErrorFormat::ProblemJson => PROBLEM_JSON_CONTENT_TYPE.to_string(),
        None => JSON_CONTENT_TYPE.to_string(),
    };
    let body = match (format, raw.body) {
        (RawErrorFormat::Template, Some(text)) => {
            let field = f("body");
            let template = Template::parse(&text).map_err(|why| err(&field, why))?;
            if is_json(&content_type) {
                template
                    .check_json()
                    .map_err(|why| err(&field, format!("with content type `{content_type}`: {why}")))?;
            }
            ErrorBody::Template(template)
        }
        (RawErrorFormat::Template, None) => {
            return Err(err(
                &f("body"),
                "required with `format: \"template\"`: the body to send, with {{status}}, {{type}}, \
                 {{title}}, {{detail}} and {{retry_after}} (or their `_json` forms) where the values go",
            ))
        }
        (_, Some(_)) => {
            return Err(err(
                &f("body"),
                "applies only with `format: \"template\"`",
            ))
        }
        (RawErrorFormat::ProblemJson, None) => ErrorBody::ProblemJson,
        (RawErrorFormat::Stripe, None) => ErrorBody::Stripe,
    };
    Ok(ErrorFormat { body, content_type })
}

/// A header value of 1 to `MAX_CONTENT_TYPE_BYTES` visible ASCII characters and spaces,
/// not starting or ending with a space.
fn content_type(field: &str, c: String) -> Result<String, ConfigError> {
    let ok = !c.is_empty()
        && c.len() <= MAX_CONTENT_TYPE_BYTES
        && c.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
        && !c.starts_with(' ')
        && !c.ends_with(' ');
    if !ok {
        return Err(err(
            field,
            format!(
                "`{c}` is not a content type (1 to {MAX_CONTENT_TYPE_BYTES} visible ASCII characters, \
                 e.g. \"application/json\")"
            ),
        ));
    }
    Ok(c)
}

/// Whether a content type is JSON's: `application/json` or a `+json` type, any
/// parameters (`; charset=utf-8`) aside.
pub fn is_json(content_type: &str) -> bool {
    let media = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// A value a template names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Var {
    /// The answer's status (`409`).
    Status,
    /// The problem type's slug (`in-flight`).
    Type,
    /// The problem type's title.
    Title,
    /// The detail: what happened and what to do, for the application to show.
    Detail,
    /// The answer's `retry-after` seconds, when it has one.
    RetryAfter,
}

impl Var {
    const ALL: [(Var, &'static str); 5] = [
        (Var::Status, "status"),
        (Var::Type, "type"),
        (Var::Title, "title"),
        (Var::Detail, "detail"),
        (Var::RetryAfter, "retry_after"),
    ];

    fn named(name: &str) -> Option<Var> {
        Var::ALL.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
    }
}

/// How a variable is written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `{{detail}}`: the text escaped as the inside of a JSON string (for between quotes;
    /// a slug, a status and a `retry-after` need no escaping, so they read as written).
    Text,
    /// `{{detail_json}}`: a JSON value: a string with its quotes, a number for
    /// `status` and `retry_after`, `null` for a `retry_after` the answer lacks.
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Var(Var, Form),
}

/// `errors.body` of `"template"`: text with `{{name}}` and `{{name_json}}` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    pieces: Vec<Piece>,
}

/// The values a template is filled with.
#[derive(Debug, Clone, Copy)]
pub struct TemplateValues<'a> {
    pub status: u16,
    pub slug: &'a str,
    pub title: &'a str,
    pub detail: &'a str,
    /// The answer's `retry-after` value, if it has one.
    pub retry_after: Option<&'a str>,
}

impl Template {
    /// Parses a template: every `{{` opens a variable, which must be one of the names
    /// (`status`, `type`, `title`, `detail`, `retry_after`), alone or with `_json`, then `}}`.
    pub fn parse(text: &str) -> Result<Template, String> {
        if text.is_empty() || text.len() > MAX_ERROR_TEMPLATE_BYTES {
            return Err(format!("must be 1 to {MAX_ERROR_TEMPLATE_BYTES} bytes"));
        }
        let names = || {
            Var::ALL
                .iter()
                .map(|(_, n)| format!("{{{{{n}}}}}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut pieces = Vec::new();
        let mut rest = text;
        let mut at = 0;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let inner = &rest[open + 2..];
            let Some(close) = inner.find("}}") else {
                return Err(format!(
                    "`{{{{` at byte {} is not closed by `}}}}`",
                    at + open
                ));
            };
            let name = &inner[..close];
            let (base, form) = match name.strip_suffix("_json") {
                Some(b) => (b, Form::Json),
                None => (name, Form::Text),
            };
            let Some(var) = Var::named(base) else {
                return Err(format!(
                    "unknown variable `{{{{{name}}}}}` at byte {}: the variables are {} (each also \
                     as `_json`, a JSON value)",
                    at + open,
                    names()
                ));
            };
            pieces.push(Piece::Var(var, form));
            let used = open + 2 + close + 2;
            at += used;
            rest = &rest[used..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_string()));
        }
        Ok(Template { pieces })
    }

    /// The body for `v`.
    pub fn render(&self, v: &TemplateValues<'_>) -> Vec<u8> {
        let mut out = String::new();
        for piece in &self.pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Var(var, form) => write_var(&mut out, *var, *form, v),
            }
        }
        out.into_bytes()
    }

    /// Whether every answer renders as JSON: filled with values that need escaping (a
    /// quote, a backslash, a line break, a non-ASCII character), with and without a
    /// `retry-after`, the body must parse. Catches a `{{detail}}` outside quotes or a
    /// `{{detail_json}}` inside them.
    fn check_json(&self) -> Result<(), String> {
        let awkward = "a \"quoted\" \\ back\nslash, \u{e9}t\u{e9} </end>";
        for retry_after in [Some("5"), None] {
            let v = TemplateValues {
                status: 409,
                slug: "in-flight",
                title: awkward,
                detail: awkward,
                retry_after,
            };
            let body = self.render(&v);
            if let Err(e) = serde_json::from_slice::<serde_json::Value>(&body) {
                let when = match retry_after {
                    Some(_) => "an answer with a `retry-after`",
                    None => "an answer without `retry-after`",
                };
                return Err(format!(
                    "does not render as JSON for {when} ({e}): write {{{{name}}}} inside a JSON string's \
                     quotes and {{{{name_json}}}} where a whole JSON value goes (`null` for a missing \
                     retry_after); the body for that answer was {}",
                    String::from_utf8_lossy(&body)
                ));
            }
        }
        Ok(())
    }
}

fn write_var(out: &mut String, var: Var, form: Form, v: &TemplateValues<'_>) {
    let text: std::borrow::Cow<'_, str> = match var {
        Var::Status => v.status.to_string().into(),
        Var::Type => v.slug.into(),
        Var::Title => v.title.into(),
        Var::Detail => v.detail.into(),
        Var::RetryAfter => v.retry_after.unwrap_or("").into(),
    };
    let number = match var {
        Var::Status => Some(u64::from(v.status)),
        Var::RetryAfter => v.retry_after.and_then(|r| r.trim().parse::<u64>().ok()),
        _ => None,
    };
    match form {
        Form::Text => {
            let quoted = serde_json::Value::from(text.as_ref()).to_string();
            // The inside of the JSON string: its quotes cut off.
            let inside = quoted.strip_prefix('"').and_then(|s| s.strip_suffix('"'));
            out.push_str(inside.unwrap_or(&quoted));
        }
        Form::Json => match (var, number) {
            (_, Some(n)) => out.push_str(&n.to_string()),
            (Var::Status | Var::RetryAfter, None) => out.push_str("null"),
            _ => out.push_str(&serde_json::Value::from(text.as_ref()).to_string()),
        },
    }
}

#[cfg(test)]
mod tests;
