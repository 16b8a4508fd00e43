//! Tests of the outcome classifier: every Envoy response flag on its own.

use super::flags::*;
use super::*;

#[test]
fn envoy_cases_are_classified() {
    let cases: &[(&str, u64, Outcome)] = &[
        ("via_upstream", 0, Outcome::Upstream),
        // A 5xx from the upstream after a retry still came from the upstream.
        ("via_upstream", URX, Outcome::Upstream),
        ("no_healthy_upstream", UH, Outcome::NotExecuted),
        (
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            UF,
            Outcome::NotExecuted,
        ),
        (
            "upstream_reset_before_response_started{connection_failure}",
            0,
            Outcome::NotExecuted,
        ),
        (
            "upstream_reset_before_response_started{remote_refused_stream_reset}",
            0,
            Outcome::NotExecuted,
        ),
        (
            "upstream_reset_before_response_started{overflow}",
            UO,
            Outcome::NotExecuted,
        ),
        (
            "upstream_reset_before_response_started{connection_termination}",
            UC,
            Outcome::Unknown,
        ),
        (
            "upstream_reset_before_response_started{remote_reset}",
            UR,
            Outcome::Unknown,
        ),
        // The flags are missing: the reason alone decides.
        (
            "upstream_reset_before_response_started{remote_reset}",
            0,
            Outcome::Unknown,
        ),
        // Retries: the last attempt failed to connect, an earlier one may have run.
        (
            "upstream_reset_before_response_started{remote_connection_failure}",
            UF | URX,
            Outcome::Unknown,
        ),
        // As Envoy 1.40 reports them (host-test/PROBES.md, "Response origin").
        ("response_timeout", UT, Outcome::Unknown),
        ("upstream_reset_after_response_started{protocol_error}", UPE, Outcome::Unknown),
        (
            "upstream_reset_before_response_started{remote_connection_failure|delayed_connect_error:_Connection_refused}",
            UF | URX,
            Outcome::Unknown,
        ),
        ("via_upstream", URX, Outcome::Upstream),
        ("upstream_response_timeout", UT, Outcome::Unknown),
        ("upstream_per_try_timeout", UT, Outcome::Unknown),
        ("downstream_remote_disconnect", DC, Outcome::Unknown),
        ("stream_idle_timeout", SI, Outcome::Unknown),
        ("", DC, Outcome::Unknown),
        ("", 0, Outcome::Unknown),
        ("request_rate_limited", RL, Outcome::NotExecuted),
        ("local_rate_limited", RL, Outcome::NotExecuted),
        ("ext_authz_denied", UAEX, Outcome::NotExecuted),
        ("rbac_access_denied_matched_policy[none]", 0, Outcome::NotExecuted),
        ("direct_response", 0, Outcome::NotExecuted),
        ("route_not_found", NR, Outcome::NotExecuted),
        ("cluster_not_found", NC, Outcome::NotExecuted),
        ("fault_filter_abort", FI, Outcome::NotExecuted),
        // Unknown details without flags that mention a response: held.
        ("response_payload_too_large", 0, Outcome::Unknown),
        ("upstream_max_stream_duration_reached", UMSDR, Outcome::Unknown),
    ];
    for (details, flag_bits, want) in cases {
        assert_eq!(
            classify(details, *flag_bits),
            *want,
            "details {details:?}, flags {flag_bits:#x}"
        );
    }
}

#[test]
fn each_flag_alone_decides_as_the_contract_table_says() {
    use crate::outcome::{classify, flags as f, Outcome as O};
    let unknown = [
        f::UT,
        f::LR,
        f::UR,
        f::UC,
        f::DC,
        f::URX,
        f::SI,
        f::DPE,
        f::UMSDR,
        f::DT,
        f::UPE,
        f::DR,
    ];
    let not_sent = [
        f::LH,
        f::UH,
        f::UF,
        f::UO,
        f::NR,
        f::FI,
        f::RL,
        f::UAEX,
        f::RLSE,
        f::IH,
        f::NFCF,
        f::NC,
        f::OM,
        f::DF,
        f::DO,
        f::UDO,
    ];
    for bit in unknown {
        // A flag that leaves the execution open wins over details that alone would
        // say "a filter answered", and over a flag that says "never sent".
        assert_eq!(classify("some_filter_reply", bit), O::Unknown, "{bit:#x}");
        assert_eq!(
            classify("some_filter_reply", bit | f::UH),
            O::Unknown,
            "{bit:#x}"
        );
        assert_eq!(classify("via_upstream", bit), O::Upstream, "{bit:#x}");
    }
    for bit in not_sent {
        // A flag that proves the request was never sent wins over details that alone
        // would leave it open.
        assert_eq!(
            classify("upstream_something", bit),
            O::NotExecuted,
            "{bit:#x}"
        );
        assert_eq!(classify("", bit), O::NotExecuted, "{bit:#x}");
    }
    // Flags Envoy sets that prove nothing either way: the details decide.
    for bit in [f::DI, f::RFCF] {
        assert_eq!(
            classify("some_filter_reply", bit),
            O::NotExecuted,
            "{bit:#x}"
        );
        assert_eq!(classify("upstream_something", bit), O::Unknown, "{bit:#x}");
    }
    // Each word that points at a possible execution, alone in the details.
    for word in UNKNOWN_WORDS {
        assert_eq!(classify(&format!("x_{word}_y"), 0), O::Unknown, "{word}");
    }
    for reason in [
        "connection_failure",
        "connection_timeout",
        "overflow",
        "refused_stream",
    ] {
        let d = format!("upstream_reset_before_response_started{{{reason}}}");
        assert_eq!(classify(&d, 0), O::NotExecuted, "{reason}");
    }
}

#[test]
fn response_flags_are_envoys_bits() {
    use crate::outcome::flags::*;
    // `StreamInfo::CoreResponseFlag`, in order: the filter reads Envoy's bits as they are.
    let order = [
        LH, UH, UT, LR, UR, UF, UC, UO, NR, DI, FI, RL, UAEX, RLSE, DC, URX, SI, IH, DPE, UMSDR,
        RFCF, NFCF, DT, UPE, NC, OM, DF, DO, DR, UDO,
    ];
    for (i, bit) in order.iter().enumerate() {
        assert_eq!(*bit, 1u64 << i, "flag {i}");
    }
}
