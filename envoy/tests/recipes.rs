//! The recipes as pasted. Every page of the book with a `## Try it` section names its
//! pair in a `<!-- inline: render TEMPLATE CONFIG -->` marker (the template and the
//! filter JSON it is rendered with); here `dedupctl render` renders that pair, a real
//! Envoy (2 workers) loads exactly what it printed, in front of the demo service, and
//! the page's own `$ curl …` lines are sent, in order, each answer checked against the
//! `# STATUS WHAT: …` line under it:
//! - `# 200 executed`: a fresh execution (the service ran it);
//! - `# 200 replayed`: `idempotent-replayed: true`, the body of the execution before;
//! - `# 4xx slug` / `# 5xx slug`: a problem+json of that type;
//! - `# NNN` alone: that status;
//! - `# no answer within N s` (with `curl -m N`): the client gives up and hangs up.
//!
//! `$ sleep N` waits. Ports and the module path are the test's own (`--set`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::client::{send_or_give_up, GiveUp, Leave};
use dedup_envoy::paths::{dedup_wasm, workspace_root};
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One step of a page's transcript.
#[derive(Debug, Clone)]
enum Step {
    Send {
        line: String,
        req: Box<Request>,
        /// `curl -m N`: the client's patience.
        patience: Option<Duration>,
        expect: Expect,
    },
    Sleep(Duration),
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Executed,
    Replayed,
    Problem(u16, String),
    Status(u16),
    NoAnswer,
}

/// Splits a shell line into words (single and double quotes, backslash escapes).
fn shell_words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut any) = (Vec::new(), String::new(), false);
    let mut chars = line.chars();
    let (mut single, mut double) = (false, false);
    while let Some(c) = chars.next() {
        match c {
            '\'' if !double => {
                single = !single;
                any = true;
            }
            '"' if !single => {
                double = !double;
                any = true;
            }
            '\\' if !single => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() && !single && !double => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// A `curl` command line as the request it sends (to any host: the test's Envoy).
fn curl(line: &str) -> (Request, Option<Duration>) {
    let words = shell_words(line);
    assert_eq!(words.first().map(String::as_str), Some("curl"), "{line}");
    let (mut method, mut path, mut headers, mut body, mut patience) =
        (None, None, Vec::new(), None, None);
    let mut it = words.iter().skip(1);
    while let Some(w) = it.next() {
        match w.as_str() {
            "-s" | "-i" | "-si" | "-is" | "-sS" => {}
            "-X" => method = it.next().cloned(),
            "-H" => {
                let h = it.next().unwrap();
                let (n, v) = h.split_once(':').unwrap_or_else(|| panic!("header {h}"));
                headers.push((n.trim().to_string(), v.trim().to_string()));
            }
            "-d" | "--data" | "--data-binary" => body = it.next().cloned(),
            "-m" | "--max-time" => {
                patience = Some(Duration::from_secs_f64(it.next().unwrap().parse().unwrap()))
            }
            url if !url.starts_with('-') => {
                let rest = url.split_once("://").map_or(url, |(_, r)| r);
                let at = rest.find('/').unwrap_or(rest.len());
                path = Some(if at == rest.len() {
                    "/".to_string()
                } else {
                    rest[at..].to_string()
                });
            }
            other => panic!("the test knows no curl option {other} ({line})"),
        }
    }
    let method = method.unwrap_or(if body.is_some() { "POST" } else { "GET" }.into());
    let mut req = Request::new(&method, &path.unwrap_or_else(|| panic!("no URL: {line}")))
        .timeout(Duration::from_secs(20));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/x-www-form-urlencoded")
            .body(b);
    }
    for (n, v) in headers {
        req = req.header(&n, &v);
    }
    (req, patience)
}

fn expectation(comment: &str, line: &str) -> Expect {
    let text = comment.trim_start_matches('#').trim();
    if text.starts_with("no answer") {
        return Expect::NoAnswer;
    }
    let head = text.split(':').next().unwrap_or("");
    let mut words = head.split_whitespace();
    let status: u16 = words
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("`{comment}` under `{line}` names no status"));
    match (status, words.next()) {
        (200, Some("executed")) => Expect::Executed,
        (200, Some("replayed")) => Expect::Replayed,
        (s, Some(slug)) if s >= 400 => Expect::Problem(s, slug.to_string()),
        (s, _) => Expect::Status(s),
    }
}

/// The `## Try it` section's transcript: its `$ curl` and `$ sleep` lines, each curl with
/// the `#` line under it (a command continued with `\` is joined).
fn transcript(page: &str) -> Vec<Step> {
    let at = page.find("\n## Try it").expect("a `## Try it` section");
    let section = &page[at..];
    let section = section[10..]
        .find("\n## ")
        .map_or(section, |e| &section[..e + 10]);
    let mut lines = section.lines().peekable();
    let mut steps = Vec::new();
    while let Some(l) = lines.next() {
        let Some(cmd) = l.strip_prefix("$ ") else {
            continue;
        };
        let mut cmd = cmd.to_string();
        while cmd.ends_with('\\') {
            cmd.pop();
            cmd.push_str(lines.next().unwrap_or(""));
        }
        if let Some(s) = cmd.strip_prefix("sleep ") {
            steps.push(Step::Sleep(Duration::from_secs_f64(
                s.trim().parse().unwrap(),
            )));
        } else if cmd.starts_with("curl ") {
            let comment = lines
                .next()
                .filter(|c| c.starts_with('#'))
                .unwrap_or_else(|| panic!("no `# answer` line under `{cmd}`"));
            let (req, patience) = curl(&cmd);
            steps.push(Step::Send {
                expect: expectation(comment, &cmd),
                line: cmd,
                req: Box::new(req),
                patience,
            });
        }
    }
    steps
}

/// A page's pair: the template and the filter JSON of its render marker.
fn pair(page_path: &Path, page: &str) -> (PathBuf, PathBuf) {
    let line = page
        .lines()
        .find_map(|l| l.trim().strip_prefix("<!-- inline: render "))
        .unwrap_or_else(|| panic!("{}: no `<!-- inline: render` marker", page_path.display()));
    let words: Vec<&str> = line.trim_end_matches("-->").split_whitespace().collect();
    let dir = page_path.parent().unwrap();
    (dir.join(words[0]), dir.join(words[1]))
}

/// `dedupctl render` of the page's pair for `config`'s ports and module: what it prints
/// (it must pass its own checks).
fn dedupctl_render(template: &Path, json: &Path, config: &EnvoyConfig) -> String {
    let args: Vec<String> = [
        "render".to_string(),
        template.display().to_string(),
        "--config".into(),
        json.display().to_string(),
        "--set".into(),
        format!("LISTEN_PORT={}", config.listen_port),
        "--set".into(),
        format!("ADMIN_PORT={}", config.admin_port),
        "--set".into(),
        format!("UPSTREAM_PORT={}", config.upstream_port),
        "--set".into(),
        format!("WASM_PATH={}", config.wasm_path.as_ref().unwrap().display()),
    ]
    .into();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = dedup_tools::ctl::run(&args, &mut out, &mut err);
    assert_eq!(
        code,
        0,
        "dedupctl render {}: {}",
        json.display(),
        String::from_utf8_lossy(&err)
    );
    String::from_utf8(out).unwrap()
}

fn check(step_line: &str, expect: &Expect, r: &Response, last: Option<&Response>) {
    let what = format!("`{step_line}`: expected {expect:?}, got {}", r.summary());
    match expect {
        Expect::Executed => {
            assert_eq!(r.status, 200, "{what}");
            assert!(!is_replayed(r), "{what}");
        }
        Expect::Replayed => {
            assert_eq!(r.status, 200, "{what}");
            assert!(is_replayed(r), "{what}");
            if let Some(first) = last {
                assert_eq!(r.body, first.body, "{what}: not the first execution's body");
            }
        }
        Expect::Problem(status, slug) => {
            assert_eq!(r.status, *status, "{what}");
            assert_problem(r, *status, slug);
        }
        Expect::Status(s) => assert_eq!(r.status, *s, "{what}"),
        Expect::NoAnswer => unreachable!(),
    }
}

/// Runs a page: its pair rendered and loaded, its transcript sent and checked. Returns
/// how many requests were checked.
fn run_page(rel: &str) -> usize {
    let page_path = workspace_root().join(rel);
    let page = std::fs::read_to_string(&page_path).unwrap();
    let (template, json) = pair(&page_path, &page);
    let steps = transcript(&page);
    assert!(
        steps.len() >= 2,
        "{rel}: a transcript of {} steps",
        steps.len()
    );
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();
    let filter_json = std::fs::read_to_string(&json).unwrap();
    let config =
        EnvoyConfig::from_template(&template, upstream.port(), &wasm, &filter_json).unwrap();
    // What Envoy loads is exactly what `dedupctl render` prints for these ports.
    assert_eq!(
        config.render().unwrap(),
        dedupctl_render(&template, &json, &config),
        "{rel}: the kit's rendering differs from dedupctl render's"
    );
    let name = Path::new(rel)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let envoy = EnvoyProcess::start(&format!("recipe-{name}"), config)
        .unwrap_or_else(|e| panic!("{rel}: {e}"));
    let mut executed: Vec<(Request, Response)> = Vec::new();
    let mut checked = 0;
    for step in steps {
        match step {
            Step::Sleep(d) => std::thread::sleep(d),
            Step::Send {
                line,
                req,
                patience,
                expect,
            } => {
                if expect == Expect::NoAnswer {
                    let p = patience.unwrap_or_else(|| panic!("`{line}`: no answer needs curl -m"));
                    let gone = send_or_give_up(envoy.addr(), &req, p, Leave::Close).unwrap();
                    assert!(
                        matches!(gone, GiveUp::GaveUp),
                        "`{line}` was answered: {gone:?}"
                    );
                    checked += 1;
                    continue;
                }
                let r = envoy
                    .send(&req)
                    .unwrap_or_else(|e| panic!("`{line}`: {e}\n{}", envoy.log()));
                let last = executed
                    .iter()
                    .rev()
                    .find(|(q, _)| q.headers == req.headers && q.path == req.path)
                    .map(|(_, r)| r);
                check(&line, &expect, &r, last);
                if expect == Expect::Executed {
                    executed.push((*req, r));
                }
                checked += 1;
            }
        }
    }
    checked
}

#[test]
fn the_transcript_reader_reads_curl_lines_and_answers() {
    let page = "x\n## Try it\n```console\n$ curl -si -m 1 localhost:10000/v1/a?b=1 -H 'idempotency-key: k 1' \\\n  -H \"x-q: it's\" -d '{\"a\": 1}'\n# no answer within 1 s\n$ sleep 0.5\n$ curl -s -X PATCH http://h/p\n# 409 in-flight: still\n$ curl -s h/p\n# 200 replayed\n```\n## Next\n$ curl x\n";
    let steps = transcript(page);
    assert_eq!(steps.len(), 4, "{steps:?}");
    let Step::Send {
        req,
        patience,
        expect,
        ..
    } = &steps[0]
    else {
        panic!()
    };
    assert_eq!(
        (req.method.as_str(), req.path.as_str()),
        ("POST", "/v1/a?b=1")
    );
    assert!(req
        .headers
        .contains(&("idempotency-key".into(), "k 1".into())));
    assert!(req.headers.contains(&("x-q".into(), "it's".into())));
    assert_eq!(
        (*patience, expect),
        (Some(Duration::from_secs(1)), &Expect::NoAnswer)
    );
    assert!(matches!(steps[1], Step::Sleep(d) if d == Duration::from_millis(500)));
    let Step::Send { req, expect, .. } = &steps[2] else {
        panic!()
    };
    assert_eq!(
        (req.method.as_str(), expect),
        ("PATCH", &Expect::Problem(409, "in-flight".into()))
    );
    let Step::Send { expect, .. } = &steps[3] else {
        panic!()
    };
    assert_eq!(expect, &Expect::Replayed);
}

/// The payments recipe as printed: a charge, its replay, a 422 for another amount and
/// for another caller, a 400 without a key, and a client that gives up while the
/// filter's detached call goes on: its retry gets 409 in-flight, then the replay.
#[test]
fn the_payments_recipe_works_as_pasted() {
    assert!(run_page("docs/src/recipes/payments.md") >= 8);
}
