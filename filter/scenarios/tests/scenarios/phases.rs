//! The phase-timed build (`dist/dedup_filter_phases.wasm`, built with `--features
//! phase-timing` by `make wasm`): it reports every phase a request passes through as
//! counters, so the build `make bench-envoy` measures cannot rot; the shipped module
//! defines none of them.

use super::*;
use dedup_core::phases::Phase;
use dedup_core::worker::PHASE_REPORT_EVERY;

fn run_requests(e: &mut SimEnvoy) -> R {
    // First executions and their replays, enough for the workers to report.
    for i in 0..PHASE_REPORT_EVERY {
        let body = format!(r#"{{"item": {i}}}"#);
        let first = e.request(0, keyed("/orders", &format!("k{i}"), &body))?;
        assert_eq!(first.status, 200);
        let again = e.request(0, keyed("/orders", &format!("k{i}"), &body))?;
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
    }
    Ok(())
}

#[test]
fn the_phase_timed_build_counts_every_phase_a_request_passes() -> R {
    let up = Upstream::default();
    let mut e = SimEnvoy::builder(host_test::dist("dedup_filter_phases.wasm"))
        .workers(1)
        .vm_id("proxy_dedup")
        .plugin_config("{}")
        .allow_on_headers_stop_iteration(true)
        .upstream(up.handler())
        .build()?;
    run_requests(&mut e)?;
    // A keyed POST passes these (a local reply: the replays; no JSON key, no ordering).
    let passed = [
        Phase::HeadRead,
        Phase::RuleSelect,
        Phase::Key,
        Phase::RecordDigest,
        Phase::BodyHash,
        Phase::PayloadDigest,
        Phase::Principal,
        Phase::ScopeTag,
        Phase::SharedRead,
        Phase::BucketDecode,
        Phase::BucketEncode,
        Phase::SharedWrite,
        Phase::BodyRead,
        Phase::Capture,
        Phase::Complete,
        Phase::LocalReply,
        Phase::LogProperties,
    ];
    for phase in passed {
        let name = phase.name();
        let count = e.counter(&format!("proxy_dedup_phase_{name}_count"));
        assert!(count.unwrap_or(0) > 0, "phase {name}: count {count:?}");
        // The virtual clock stands still within a request: its time is defined, 0 here.
        assert!(
            e.counter(&format!("proxy_dedup_phase_{name}_ns")).is_some(),
            "phase {name}: no time counter"
        );
    }
    // Each of the 32 requests reads its head once.
    assert_eq!(
        e.counter("proxy_dedup_phase_head_read_count"),
        Some(u64::from(2 * PHASE_REPORT_EVERY))
    );
    assert_eq!(e.counter("proxy_dedup_phase_entity_count"), Some(0));
    Ok(())
}

#[test]
fn the_shipped_module_times_no_phase() -> R {
    let (mut e, _up) = started("{}", 1)?;
    run_requests(&mut e)?;
    for phase in Phase::ALL {
        let name = phase.name();
        assert_eq!(e.counter(&format!("proxy_dedup_phase_{name}_count")), None);
    }
    Ok(())
}
