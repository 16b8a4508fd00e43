//! Running wrk against one case and reading its output.

use super::{BIG_BODY_BYTES, BODY, CONNECTIONS, THREADS};
use crate::process::spawn;
use crate::{fail, Result};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// One wrk run, as read from its output.
#[derive(Clone)]
pub struct Measured {
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub requests: u64,
    pub non_2xx: u64,
    /// wrk's "Socket errors: …" line, or empty.
    pub errors: String,
    /// Envoy's own CPU time per request in this round (every thread's run
    /// time from `/proc/<pid>/task/*/schedstat`, over wrk's request count):
    /// unlike 1/throughput, other work on the machine does not inflate it.
    pub cpu_us: Option<f64>,
}

pub(super) fn lua(script: &str) -> String {
    script
        .replace("BIG_BODY_BYTES", &BIG_BODY_BYTES.to_string())
        .replace("BODY", &format!("'{BODY}'"))
}

/// How wrk loads a case: its threads and connections, and the CPUs it is
/// pinned to (`taskset -c`), if any.
#[derive(Debug, Clone, Copy)]
pub struct Load {
    pub threads: u32,
    pub connections: u32,
    pub cpus: Option<&'static str>,
}

impl Load {
    /// `-t2 -c32`, not pinned: what the load tables use.
    pub const DEFAULT: Load = Load {
        threads: THREADS,
        connections: CONNECTIONS,
        cpus: None,
    };
}

pub(super) fn wrk(
    dir: &Path,
    url: &str,
    script: &Path,
    seconds: u64,
    tag: &str,
    load: Load,
) -> Result<String> {
    let out = dir.join(format!("wrk-{tag}.txt"));
    let mut cmd = match load.cpus {
        Some(cpus) => {
            let mut c = Command::new("taskset");
            c.arg("-c").arg(cpus).arg("wrk");
            c
        }
        None => Command::new("wrk"),
    };
    cmd.arg(format!("-t{}", load.threads))
        .arg(format!("-c{}", load.connections))
        .arg(format!("-d{seconds}s"))
        .arg("--timeout")
        .arg("5s")
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .arg("--")
        .arg(tag)
        .stdin(Stdio::null())
        .stdout(Stdio::from(std::fs::File::create(&out)?))
        .stderr(Stdio::inherit());
    let mut child = spawn(cmd)?;
    match child.wait_exit(Duration::from_secs(seconds + 30)) {
        Some(0) => Ok(std::fs::read_to_string(&out)?),
        Some(code) => fail!("wrk exited {code}: {}", std::fs::read_to_string(&out)?),
        None => fail!("wrk did not finish"),
    }
}

/// "1.23ms" / "850.00us" / "1.01s" in milliseconds.
fn duration_ms(text: &str) -> Option<f64> {
    let (num, unit) = text
        .find(|c: char| c.is_ascii_alphabetic())
        .map(|i| text.split_at(i))?;
    let v: f64 = num.parse().ok()?;
    Some(match unit {
        "us" => v / 1000.0,
        "ms" => v,
        "s" => v * 1000.0,
        "m" => v * 60_000.0,
        _ => return None,
    })
}

pub(super) fn parse_wrk(text: &str) -> Result<Measured> {
    let mut m = Measured {
        rps: 0.0,
        p50_ms: 0.0,
        p99_ms: 0.0,
        requests: 0,
        non_2xx: 0,
        errors: String::new(),
        cpu_us: None,
    };
    for line in text.lines() {
        let t = line.trim();
        let words: Vec<&str> = t.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", v] => m.rps = v.parse().unwrap_or(0.0),
            ["50%", v] => m.p50_ms = duration_ms(v).unwrap_or(0.0),
            ["99%", v] => m.p99_ms = duration_ms(v).unwrap_or(0.0),
            [n, "requests", "in", ..] => m.requests = n.parse().unwrap_or(0),
            ["Non-2xx", "or", "3xx", "responses:", n] => m.non_2xx = n.parse().unwrap_or(0),
            ["Socket", "errors:", ..] => m.errors = t.to_string(),
            _ => {}
        }
    }
    if m.rps <= 0.0 {
        fail!("could not read wrk's output:\n{text}");
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output_is_read() {
        let m = parse_wrk(
            "  Latency Distribution\n     50%    1.23ms\n     99%  850.00us\n  \
             1000 requests in 1.00s, 10 KB read\n  Socket errors: connect 0, read 1, write 0, timeout 0\n  \
             Non-2xx or 3xx responses: 2\nRequests/sec:   999.50\n",
        )
        .unwrap();
        assert_eq!(
            (m.rps, m.p50_ms, m.p99_ms, m.requests, m.non_2xx),
            (999.5, 1.23, 0.85, 1000, 2)
        );
        assert_eq!(
            m.errors,
            "Socket errors: connect 0, read 1, write 0, timeout 0"
        );
    }
}
