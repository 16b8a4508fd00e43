//! The recipes as pasted. Every page of the book with a `## Try it` section renders its
//! proxies with `$ dedupctl render TEMPLATE --config FILE …` lines (one per proxy; the
//! proxy's `--set LISTEN_PORT`, 10000 by default, is the port its `curl` lines name);
//! here each line is rendered as written, with the test's own ports, module and etcd
//! members in place of the page's (`--set`, `--members`), a real Envoy (2 workers) loads
//! exactly what `dedupctl render` printed, in front of the demo service (and of one real
//! etcd cluster per `--members` cluster, as many members as the page lists), and the
//! page's own `$ curl …` lines are sent, in order, each to the proxy of its port, each
//! answer checked against the `# STATUS WHAT: …` line under it:
//! - `# 200 executed`: a fresh execution (the service ran it, once);
//! - `# 200 replayed`: `idempotent-replayed: true`, the body of the execution before;
//! - `# NNN stale`: that status with `idempotent-stale: true` (the ordering guard's
//!   acknowledgement of an outdated version);
//! - `# 4xx slug` / `# 5xx slug`: a problem+json of that type;
//! - `# NNN` alone: that status (the service may or may not have run it);
//!
//! Every other answer is the filter's own: the service ran nothing meanwhile.
//! - `# no answer within N s` (with `curl -m N`): the client gives up and hangs up.
//!
//! `$ sleep N` waits. Ports and the module path are the test's own (`--set`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use dedup_envoy::client::{send_or_give_up, GiveUp, Leave};
use dedup_envoy::etcd::{wait_cluster_hosts_healthy, EtcdCluster};
use dedup_envoy::paths::{dedup_wasm, workspace_root};
use dedup_envoy::{DemoUpstream, EnvoyConfig, EnvoyProcess, Request, Response};
use dedup_tools::members::Members;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One step of a page's transcript.
#[derive(Debug, Clone)]
enum Step {
    Send {
        line: String,
        /// The port the page sends it to: which proxy.
        port: u16,
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
    Stale(u16),
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

/// A `curl` URL's port (80 without one) and its path with the query (`/` without one):
/// `localhost:10001/x?y`, `http://h:10000`.
fn url_parts(url: &str) -> (u16, String) {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let at = rest.find('/').unwrap_or(rest.len());
    let port = rest[..at].rsplit_once(':').map_or(80, |(_, p)| {
        p.parse().unwrap_or_else(|_| panic!("port of {url}"))
    });
    let path = if at == rest.len() { "/" } else { &rest[at..] };
    (port, path.to_string())
}

/// A `curl` command line as the request it sends and the port it sends it to.
fn curl(line: &str) -> (Request, Option<Duration>, u16) {
    let words = shell_words(line);
    assert_eq!(words.first().map(String::as_str), Some("curl"), "{line}");
    let (mut method, mut path, mut headers, mut body, mut patience, mut port) =
        (None, None, Vec::new(), None, None, 80);
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
                let (p, target) = url_parts(url);
                port = p;
                path = Some(target);
            }
            other => panic!("the test knows no curl option {other} ({line})"),
        }
    }
    let method = method.unwrap_or(if body.is_some() { "POST" } else { "GET" }.into());
    let mut req = Request::new(&method, &path.unwrap_or_else(|| panic!("no URL: {line}")))
        .timeout(Duration::from_secs(20));
    if let Some(b) = body {
        // curl's default type for `-d`, unless a `-H` names one.
        if !headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("content-type", "application/x-www-form-urlencoded");
        }
        req = req.body(b);
    }
    for (n, v) in headers {
        // curl sends `-H 'host: …'` in place of the URL's host.
        req = if n.eq_ignore_ascii_case("host") {
            req.host(&v)
        } else {
            req.header(&n, &v)
        };
    }
    (req, patience, port)
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
        (s, Some("stale")) => Expect::Stale(s),
        (s, Some(slug)) if s >= 400 => Expect::Problem(s, slug.to_string()),
        (s, _) => Expect::Status(s),
    }
}

/// The `## Try it` section's transcript: its `$ curl` and `$ sleep` lines, each curl with
/// the `#` line under it (a command continued with `\` is joined).
fn transcript(page: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for (cmd, next) in commands(try_it(page)) {
        if let Some(s) = cmd.strip_prefix("sleep ") {
            steps.push(Step::Sleep(Duration::from_secs_f64(
                s.trim().parse().unwrap(),
            )));
        } else if cmd.starts_with("curl ") {
            let comment = next
                .filter(|c| c.starts_with('#'))
                .unwrap_or_else(|| panic!("no `# answer` line under `{cmd}`"));
            let (req, patience, port) = curl(&cmd);
            steps.push(Step::Send {
                expect: expectation(comment, &cmd),
                port,
                line: cmd,
                req: Box::new(req),
                patience,
            });
        }
    }
    steps
}

/// The section's `$ …` commands (a command continued with `\` joined), each with the
/// line that follows it.
fn commands(section: &str) -> Vec<(String, Option<&str>)> {
    let mut out = Vec::new();
    let mut lines = section.lines().peekable();
    while let Some(l) = lines.next() {
        let Some(cmd) = l.strip_prefix("$ ") else {
            continue;
        };
        let mut cmd = cmd.to_string();
        while cmd.ends_with('\\') {
            cmd.pop();
            cmd.push_str(lines.next().unwrap_or(""));
        }
        out.push((cmd, lines.peek().copied()));
    }
    out
}

/// The `## Try it` section of a page.
fn try_it(page: &str) -> &str {
    let at = page.find("\n## Try it").expect("a `## Try it` section");
    let section = &page[at..];
    section[10..]
        .find("\n## ")
        .map_or(section, |e| &section[..e + 10])
}

/// The section's `$ dedupctl render …` commands (continued lines joined), as the words
/// after `dedupctl`: one per proxy.
fn render_lines(section: &str) -> Vec<Vec<String>> {
    commands(section)
        .into_iter()
        .filter_map(|(cmd, _)| {
            let args = cmd.strip_prefix("dedupctl render ")?;
            let mut words = vec!["render".to_string()];
            words.extend(shell_words(args));
            Some(words)
        })
        .collect()
}

/// One proxy of a page, as its render line names it.
struct ProxyLine {
    template: PathBuf,
    config: PathBuf,
    /// The page's `--set LISTEN_PORT` (10000 by default): what its curl lines name.
    page_port: u16,
    /// `--members` clusters with the number of members the page lists.
    members: Vec<(String, usize)>,
    /// Other `--set NAME=VALUE`s (not ports, not the module).
    set: Vec<(String, String)>,
}

fn proxy_line(words: &[String]) -> ProxyLine {
    let root = workspace_root();
    let (mut template, mut config, mut page_port) = (None, None, 10000);
    let (mut members, mut set) = (Vec::new(), Vec::new());
    let mut it = words.iter().skip(1);
    while let Some(w) = it.next() {
        match w.as_str() {
            "--config" => config = Some(root.join(it.next().unwrap())),
            "--out" | "-o" => {
                it.next();
            }
            "--members" => {
                let (name, hosts) = it.next().unwrap().split_once('=').unwrap();
                members.push((name.to_string(), hosts.split(',').count()));
            }
            "--set" => {
                let (n, v) = it.next().unwrap().split_once('=').unwrap();
                match n {
                    "LISTEN_PORT" => page_port = v.parse().unwrap(),
                    "ADMIN_PORT" | "UPSTREAM_PORT" | "WASM_PATH" => {}
                    _ => set.push((n.to_string(), v.to_string())),
                }
            }
            other if !other.starts_with('-') && template.is_none() => {
                template = Some(root.join(other))
            }
            other => panic!("the test knows no render argument {other}"),
        }
    }
    ProxyLine {
        template: template.expect("a template"),
        config: config.expect("--config"),
        page_port,
        members,
        set,
    }
}

/// `dedupctl render` of a page's proxy for `config`'s ports and module and the test's
/// etcd members: what it prints (it must pass its own checks).
fn dedupctl_render(line: &ProxyLine, members: &[Members], config: &EnvoyConfig) -> String {
    let mut args: Vec<String> = vec![
        "render".to_string(),
        line.template.display().to_string(),
        "--config".into(),
        line.config.display().to_string(),
    ];
    let mut set = vec![
        ("LISTEN_PORT".to_string(), config.listen_port.to_string()),
        ("ADMIN_PORT".into(), config.admin_port.to_string()),
        ("UPSTREAM_PORT".into(), config.upstream_port.to_string()),
        (
            "WASM_PATH".into(),
            config.wasm_path.as_ref().unwrap().display().to_string(),
        ),
    ];
    set.extend(line.set.iter().cloned());
    for (n, v) in set {
        args.extend(["--set".into(), format!("{n}={v}")]);
    }
    for m in members {
        let hosts: Vec<String> = m.hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        args.extend([
            "--members".into(),
            format!("{}={}", m.cluster, hosts.join(",")),
        ]);
    }
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = dedup_tools::ctl::run(&args, &mut out, &mut err);
    assert_eq!(
        code,
        0,
        "dedupctl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&err)
    );
    String::from_utf8(out).unwrap()
}

/// `ran`: how many times the demo service executed a request while this one was sent.
fn check(step_line: &str, expect: &Expect, r: &Response, last: Option<&Response>, ran: u64) {
    let what = format!(
        "`{step_line}`: expected {expect:?}, got {} (the service ran {ran} request(s) meanwhile)",
        r.summary()
    );
    // Only an execution reaches the service; an answer of the filter's never does.
    match expect {
        Expect::Executed => assert_eq!(ran, 1, "{what}"),
        Expect::Status(_) => {}
        _ => assert_eq!(ran, 0, "{what}"),
    }
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
        Expect::Stale(s) => {
            assert_eq!(r.status, *s, "{what}");
            assert_eq!(r.header("idempotent-stale"), Some("true"), "{what}");
            assert!(!is_replayed(r), "{what}");
        }
        Expect::Status(s) => assert_eq!(r.status, *s, "{what}"),
        Expect::NoAnswer => unreachable!(),
    }
}

/// Runs a page: its proxies rendered and loaded, its transcript sent and checked.
/// Returns how many requests were checked.
fn run_page(rel: &str) -> usize {
    let page_path = workspace_root().join(rel);
    let page = std::fs::read_to_string(&page_path).unwrap();
    let lines: Vec<ProxyLine> = render_lines(try_it(&page))
        .iter()
        .map(|w| proxy_line(w))
        .collect();
    assert!(
        !lines.is_empty(),
        "{rel}: no `$ dedupctl render` line under Try it"
    );
    let steps = transcript(&page);
    assert!(
        steps.len() >= 2,
        "{rel}: a transcript of {} steps",
        steps.len()
    );
    let name = Path::new(rel)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let wasm = dedup_wasm().unwrap_or_else(|e| panic!("{e}"));
    let upstream = DemoUpstream::start(0, false).unwrap();
    // One etcd cluster per `--members` cluster, shared by the proxies naming it.
    let mut etcds: Vec<(String, EtcdCluster)> = Vec::new();
    for (cluster, size) in lines.iter().flat_map(|l| l.members.iter()) {
        if !etcds.iter().any(|(c, _)| c == cluster) {
            let etcd = EtcdCluster::start(&format!("recipe-{name}-{cluster}"), *size).unwrap();
            etcds.push((cluster.clone(), etcd));
        }
    }
    let mut proxies: Vec<(u16, EnvoyProcess)> = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let members: Vec<Members> = line
            .members
            .iter()
            .map(|(cluster, _)| {
                let etcd = &etcds.iter().find(|(c, _)| c == cluster).unwrap().1;
                Members {
                    cluster: cluster.clone(),
                    hosts: etcd
                        .proxy_ports()
                        .into_iter()
                        .map(|p| ("127.0.0.1".to_string(), p))
                        .collect(),
                }
            })
            .collect();
        // The kit's config: the template with the test's members, its placeholders
        // filled by the kit; it must be exactly what dedupctl prints.
        let template = std::fs::read_to_string(&line.template).unwrap();
        let template = dedup_tools::members::apply(&template, &members).unwrap();
        let dir = std::env::temp_dir().join(format!("recipe-{name}-{}-{i}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let template_path = dir.join(line.template.file_name().unwrap());
        std::fs::write(&template_path, template).unwrap();
        let filter_json = std::fs::read_to_string(&line.config).unwrap();
        let mut config =
            EnvoyConfig::from_template(&template_path, upstream.port(), &wasm, &filter_json)
                .unwrap();
        for (n, v) in &line.set {
            config = config.with_var(n, v);
        }
        assert_eq!(
            config.render().unwrap(),
            dedupctl_render(line, &members, &config),
            "{rel}: the kit's rendering differs from dedupctl render's"
        );
        let envoy = EnvoyProcess::start(&format!("recipe-{name}-{i}"), config)
            .unwrap_or_else(|e| panic!("{rel}: {e}"));
        for m in &members {
            wait_cluster_hosts_healthy(&envoy, &m.cluster, m.hosts.len(), Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("{rel}: {e}"));
        }
        proxies.push((line.page_port, envoy));
    }
    let proxy = |port: u16, line: &str| -> &EnvoyProcess {
        &proxies
            .iter()
            .find(|(p, _)| *p == port)
            .unwrap_or_else(|| panic!("`{line}`: no proxy of the page listens on {port}"))
            .1
    };
    let mut executed: Vec<(Request, Response)> = Vec::new();
    let mut checked = 0;
    for step in steps {
        match step {
            Step::Sleep(d) => std::thread::sleep(d),
            Step::Send {
                line,
                port,
                req,
                patience,
                expect,
            } => {
                let envoy = proxy(port, &line);
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
                let before = upstream.total_executions();
                let r = envoy
                    .send(&req)
                    .unwrap_or_else(|e| panic!("`{line}`: {e}\n{}", envoy.log()));
                let ran = upstream.total_executions() - before;
                let last = executed
                    .iter()
                    .rev()
                    .find(|(q, _)| q.headers == req.headers && q.path == req.path)
                    .map(|(_, r)| r);
                check(&line, &expect, &r, last, ran);
                if expect == Expect::Executed {
                    executed.push((*req, r));
                }
                checked += 1;
            }
        }
    }
    // With shards, each holds records: the page's keys are placed on all of them.
    if etcds.len() > 1 {
        for (cluster, etcd) in &etcds {
            let n = etcd.count_keys("proxy-dedup/").unwrap();
            assert!(n > 0, "{rel}: no record in the shard of cluster {cluster}");
            eprintln!("{rel}: {n} keys in the shard of cluster {cluster}");
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

/// The push recipe as printed: a redelivery with another attempt counter is replayed,
/// another message under a reused id gets 422, no id 400, and a failed handling (not
/// 2xx, so not stored) lets its redelivery run.
#[test]
fn the_push_recipe_works_as_pasted() {
    assert!(run_page("docs/src/recipes/push.md") >= 7);
}

/// The rules recipe as printed: each rule's own policy (a required key, a body key,
/// bypass) and the top-level fields for a path no rule matches; tenants apart.
#[test]
fn the_rules_recipe_works_as_pasted() {
    assert!(run_page("docs/src/recipes/rules.md") >= 11);
}

/// The ordering recipe's webhook receiver as printed: an older event about an object
/// is acknowledged as stale, never applied; another object orders apart; a failed
/// event is released and its redelivery applied.
#[test]
fn the_ordering_recipe_works_as_pasted() {
    assert!(run_page("docs/src/recipes/ordering.md") >= 7);
}

/// The JWT recipe as printed: the caller is the token's subject and the scope its
/// tenant claim: a refreshed token is replayed, another subject gets 422, another
/// tenant's key is another record, a client's own x-tenant counts for nothing, and
/// tokens without a tenant claim or no token never reach the filter.
#[test]
fn the_jwt_tenants_recipe_works_as_pasted() {
    assert!(run_page("docs/src/recipes/jwt-tenants.md") >= 8);
}

/// The etcd page as printed: two proxies rendered with `--members`, one etcd; a retry
/// on the other proxy is replayed from etcd, another payload gets 422 there.
#[test]
fn the_etcd_recipe_works_as_pasted() {
    assert!(run_page("docs/src/deployment/etcd.md") >= 6);
}

/// The sharding page as printed: two etcd clusters as shards, their Envoy clusters
/// written by `dedupctl render --members`; keys spread over both are executed once
/// and replayed.
#[test]
fn the_shards_recipe_works_as_pasted() {
    assert!(run_page("docs/src/deployment/sharding.md") >= 8);
}
