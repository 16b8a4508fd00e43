//! `make chaos`: the fault-injection soak with an at-most-once checker.
//! `chaos [--seconds N] [--seed N] [--clients N] [--shards N] [--broken release|hold|no-scope|no-ordering|per-region] [--defaults true] [--regions true]`
//! (defaults 60 s, seed from the clock, 24 clients, one etcd cluster, the correct
//! configuration; `--shards 2` shards the etcd store over two 3-member clusters;
//! `--defaults true` leaves every field that decides what runs and when at its default;
//! `--regions true` runs two simulated regions, each its etcd and its proxy, records
//! homed by a header, `--broken per-region` their stores without a home rule).
//! Exits 1 when the checker finds a violation, 2 when the run itself failed.

use dedup_envoy::chaos::{self, Broken, Options};

fn usage() -> ! {
    eprintln!(
        "usage: chaos [--seconds N] [--seed N] [--clients N] [--shards 1-{}] [--broken release|hold|no-scope|no-ordering|per-region] [--defaults true|false] [--regions true|false]",
        chaos::MAX_SHARDS
    );
    std::process::exit(2);
}

fn main() {
    let mut options = Options {
        seconds: 60,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() % 100_000)
            .unwrap_or(1),
        clients: 24,
        broken: None,
        shards: 1,
        defaults: false,
        regions: false,
    };
    let boolean = |value: &str| match value {
        "true" | "1" => true,
        "false" | "0" | "" => false,
        _ => usage(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().unwrap_or_else(|| usage());
        let number = || value.parse::<u64>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--seconds" => options.seconds = number(),
            "--seed" => options.seed = number(),
            "--clients" => options.clients = number() as usize,
            "--shards" => {
                options.shards = number() as usize;
                if chaos::Shards::new(options.shards).is_none() {
                    usage();
                }
            }
            "--defaults" => options.defaults = boolean(&value),
            "--regions" => options.regions = boolean(&value),
            "--broken" if value.is_empty() => {}
            "--broken" => options.broken = Some(Broken::parse(&value).unwrap_or_else(|| usage())),
            _ => usage(),
        }
    }
    eprintln!(
        "chaos: seed {}, {} s, {} clients{}; starting {} and the upstream…",
        options.seed,
        options.seconds,
        options.clients,
        options
            .broken
            .map(|b| format!(", broken configuration: {}", b.name()))
            .unwrap_or_default(),
        match (options.regions, options.shards) {
            (true, _) => format!(
                "two regions ({} ms apart one way), each a {}-member etcd and an Envoy",
                chaos::regions::ONE_WAY.as_millis(),
                chaos::regions::MEMBERS
            ),
            (false, 1) => "etcd (3 members), 3 Envoys".to_string(),
            (false, n) => format!("etcd ({n} shards of 3 members), 3 Envoys"),
        }
    );
    let report = match chaos::run(&options) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("chaos: the run failed: {e}");
            std::process::exit(2);
        }
    };
    println!("{}", report.text());
    if report.violations() > 0 || !report.nemesis_errors.is_empty() {
        println!("fault schedule:\n{}", report.fault_log());
    }
    if report.violations() > 0 {
        std::process::exit(1);
    }
    if !report.nemesis_errors.is_empty() {
        std::process::exit(2);
    }
}
