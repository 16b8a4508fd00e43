//! The results table, the charts and the BENCHMARKS.md section.

use super::{Case, Measured, Settings, CONNECTIONS, THREADS};
use crate::chart::{self, Chart, Panel, Series};
use crate::paths::workspace_root;
use crate::Result;
use std::process::Command;

/// The table's header: case, req/s, p50, p99, then `ratio_columns`, then
/// non-2xx and the rounds.
pub fn table_header(ratio_columns: &[&str]) -> String {
    let mut names = String::from("| case | req/s | p50 ms | p99 ms |");
    let mut align = String::from("|---|---:|---:|---:|");
    for column in ratio_columns {
        names.push_str(&format!(" {column} |"));
        align.push_str("---:|");
    }
    format!("{names} non-2xx | rounds (req/s) |\n{align}---:|---|\n")
}

/// One row under [`table_header`]: `ratios` to two decimals, `last` in the
/// rounds column.
pub fn table_row(name: &str, m: &Measured, ratios: &[f64], last: &str) -> String {
    let mut row = format!(
        "| {} | {:.0} | {:.3} | {:.3} |",
        name, m.rps, m.p50_ms, m.p99_ms
    );
    for ratio in ratios {
        row.push_str(&format!(" {ratio:.2} |"));
    }
    row.push_str(&format!(" {} | {} |\n", m.non_2xx, last));
    row
}

/// "- <case>: <counters>" lines for the cases with any counter.
pub fn counters_list(cases: &[Case]) -> String {
    cases
        .iter()
        .map(|c| (c.name.as_str(), c.counters()))
        .filter(|(_, c)| !c.is_empty())
        .map(|(n, c)| format!("- {n}: {c}\n"))
        .collect()
}

/// Where the benchmarks write their charts (linked from BENCHMARKS.md).
pub const CHARTS_DIR: &str = "benches/charts";

/// One case of a load chart: its name, its best round, and the text after
/// its req/s (a ratio to the run's baseline).
pub struct ChartRow<'a> {
    pub name: &'a str,
    pub measured: &'a Measured,
    pub note: String,
}

/// A load benchmark as a chart: req/s per case (with its note, a ratio to
/// `baseline`), then p50 and p99.
pub fn load_chart(title: &str, subtitle: &str, baseline: &str, rows: &[ChartRow]) -> Chart {
    let rps = rows.iter().map(|r| Some(r.measured.rps)).collect();
    let rps_labels = rows
        .iter()
        .map(|r| {
            format!("{:.0} {}", r.measured.rps, r.note)
                .trim()
                .to_string()
        })
        .collect();
    let ms = |f: fn(&Measured) -> f64| rows.iter().map(|r| Some(f(r.measured))).collect();
    Chart {
        title: title.to_string(),
        subtitle: subtitle.to_string(),
        rows: rows.iter().map(|r| r.name.to_string()).collect(),
        panels: vec![
            Panel {
                title: format!("req/s, × {baseline} (higher is better)"),
                series: vec![Series::new("req/s", chart::BLUE, rps).labels(rps_labels)],
            },
            Panel {
                title: "latency, ms (lower is better)".into(),
                series: vec![
                    Series::new("p50", chart::GREEN, ms(|m| m.p50_ms)),
                    Series::new("p99", chart::VERMILLION, ms(|m| m.p99_ms)),
                ],
            },
        ],
    }
}

/// Write `chart` to `benches/charts/<file>` and say so on stderr; returns
/// the path relative to the workspace root, for a link in BENCHMARKS.md.
/// [`load_chart`] written to `file` (see [`write_chart`]), its subtitle `setup`
/// followed by wrk's load, the rounds and the load average before the run.
pub fn write_load_chart(
    file: &str,
    title: &str,
    setup: &str,
    settings: &Settings,
    load_before: &str,
    baseline: &str,
    rows: &[ChartRow],
) -> Result<String> {
    let Settings { seconds, rounds } = settings;
    let subtitle = format!(
        "{setup}, wrk -t{THREADS} -c{CONNECTIONS}, best of {rounds} rounds of {seconds} s, one 2-core machine, load average before: {load_before}"
    );
    write_chart(file, &load_chart(title, &subtitle, baseline, rows))
}

/// Seconds as the benchmark tables show them, in microseconds with 3
/// significant digits: `412 µs`, `3.5 µs`.
pub fn micros(seconds: f64) -> String {
    let us = seconds * 1e6;
    if us >= 100.0 {
        format!("{us:.0} µs")
    } else {
        format!("{us:.1} µs")
    }
}

pub fn write_chart(file: &str, chart: &Chart) -> Result<String> {
    let relative = format!("{CHARTS_DIR}/{file}");
    chart.write(&workspace_root().join(&relative))?;
    eprintln!("wrote {relative}");
    Ok(relative)
}

/// "AMD EPYC, 2 cores, 24 GiB": the CPU model, the cores and the memory of
/// this machine, for the text beside the results.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|l| l.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map(|kb| (kb / (1024.0 * 1024.0)).round())
        .unwrap_or(0.0);
    format!("{cpu}, {cores} cores, {gib:.0} GiB")
}

/// When and where the run happened: `date -u` and the CPU model.
pub fn run_stamp() -> String {
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "?".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{date}, {cores} cores ({cpu})")
}

/// The 1-minute load average, as text.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// The release of the Envoy the benchmark runs (`ENVOY_BIN` or `envoy`),
/// e.g. `1.40.0`.
pub fn envoy_version() -> String {
    crate::envoy::version().unwrap_or_else(|_| "?".into())
}

/// Replace the section of BENCHMARKS.md that starts with `heading` (or
/// append it), leaving other sections alone, and say so on stderr.
pub fn write_section(heading: &str, section: &str) -> Result<()> {
    let path = workspace_root().join("BENCHMARKS.md");
    let old = std::fs::read_to_string(&path).unwrap_or_else(|_| "# Benchmarks\n".into());
    std::fs::write(&path, replace_section(&old, heading, section))?;
    eprintln!("wrote the \"{heading}\" section of BENCHMARKS.md");
    Ok(())
}

/// `old` with the section starting at `heading` (up to the next "## ") replaced
/// by `section`, or with `section` appended. A blank line separates it from a
/// following section; the text ends with one newline.
fn replace_section(old: &str, heading: &str, section: &str) -> String {
    // The heading as a whole line: `## Workers` is not inside `### Workers`, nor a prefix
    // of `## Workers and more`.
    let start = old.match_indices(heading).map(|(at, _)| at).find(|&at| {
        let rest = &old[at + heading.len()..];
        (at == 0 || old[..at].ends_with('\n'))
            && (rest.is_empty() || rest.starts_with(['\n', '\r']))
    });
    match start {
        Some(start) => {
            let after = &old[start + 2..];
            match after.find("\n## ") {
                Some(i) => {
                    let end = start + 2 + i + 1;
                    format!("{}{}\n\n{}", &old[..start], section.trim_end(), &old[end..])
                }
                None => format!("{}{}\n", &old[..start], section.trim_end()),
            }
        }
        None => format!("{}\n\n{}\n", old.trim_end(), section.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: &str = "# Benchmarks\n\n## A\n\nold a\n\n## etcd store\n\nold etcd\n\n## Envoy load\n\nold envoy\n";

    #[test]
    fn a_section_followed_by_another_keeps_a_blank_line_before_it() {
        assert_eq!(
            replace_section(OLD, "## etcd store", "## etcd store\n\nnew etcd\n\n"),
            "# Benchmarks\n\n## A\n\nold a\n\n## etcd store\n\nnew etcd\n\n## Envoy load\n\nold envoy\n"
        );
    }

    #[test]
    fn the_last_section_ends_the_file_with_one_newline() {
        assert_eq!(
            replace_section(OLD, "## Envoy load", "## Envoy load\n\nnew envoy\n"),
            "# Benchmarks\n\n## A\n\nold a\n\n## etcd store\n\nold etcd\n\n## Envoy load\n\nnew envoy\n"
        );
    }

    #[test]
    fn a_heading_inside_a_deeper_heading_or_a_longer_one_is_not_the_section() {
        let old = "# B\n\n## Scaling\n\n### Workers\n\nhost-test\n\n## Workers and more\n\nx\n";
        assert_eq!(
            replace_section(old, "## Workers", "## Workers\n\nnew\n"),
            format!("{}\n\n## Workers\n\nnew\n", old.trim_end())
        );
        let with = format!("{old}\n## Workers\n\nold\n\n## Z\n\nz\n");
        assert!(replace_section(&with, "## Workers", "## Workers\n\nnew\n")
            .ends_with("### Workers\n\nhost-test\n\n## Workers and more\n\nx\n\n## Workers\n\nnew\n\n## Z\n\nz\n"));
    }

    #[test]
    fn a_missing_section_is_appended() {
        assert_eq!(
            replace_section("# Benchmarks\n", "## Envoy load", "## Envoy load\n\nx\n"),
            "# Benchmarks\n\n## Envoy load\n\nx\n"
        );
    }

    #[test]
    fn the_header_has_a_column_per_ratio() {
        assert_eq!(
            table_header(&["a", "b"]),
            "| case | req/s | p50 ms | p99 ms | a | b | non-2xx | rounds (req/s) |\n|---|---:|---:|---:|---:|---:|---:|---|\n"
        );
    }
}
