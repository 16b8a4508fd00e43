//! Did the upstream execute the request? Decided from Envoy's own account of where the
//! response came from (`response.code_details`, `response.flags`), never guessed: a claim
//! is released only when it is certain the upstream did not run the request.

/// What Envoy's facts say about a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The upstream itself answered (`via_upstream`): its status decides.
    Upstream,
    /// The request never reached an upstream: no healthy host, connection failure,
    /// overflow, no route, or a filter after this one answered instead (rate limit,
    /// ext_authz, RBAC, direct response, fault abort).
    NotExecuted,
    /// The upstream may have run it: client gone, route or idle timeout, reset after the
    /// request was sent, retries exhausted, or nothing Envoy says proves otherwise.
    Unknown,
}

/// Envoy's legacy response flags (`response.flags`, one bit each, in the order of
/// `StreamInfo::CoreResponseFlag`).
pub mod flags {
    pub const LH: u64 = 1 << 0; // failed local health check
    pub const UH: u64 = 1 << 1; // no healthy upstream
    pub const UT: u64 = 1 << 2; // upstream request timeout
    pub const LR: u64 = 1 << 3; // local reset
    pub const UR: u64 = 1 << 4; // upstream remote reset
    pub const UF: u64 = 1 << 5; // upstream connection failure
    pub const UC: u64 = 1 << 6; // upstream connection termination
    pub const UO: u64 = 1 << 7; // upstream overflow (circuit breaker)
    pub const NR: u64 = 1 << 8; // no route
    pub const DI: u64 = 1 << 9; // delay injected
    pub const FI: u64 = 1 << 10; // fault injected (abort)
    pub const RL: u64 = 1 << 11; // rate limited
    pub const UAEX: u64 = 1 << 12; // unauthorized by an external service
    pub const RLSE: u64 = 1 << 13; // rate limit service error
    pub const DC: u64 = 1 << 14; // downstream connection termination
    pub const URX: u64 = 1 << 15; // upstream retry limit exceeded
    pub const SI: u64 = 1 << 16; // stream idle timeout
    pub const IH: u64 = 1 << 17; // invalid Envoy request headers
    pub const DPE: u64 = 1 << 18; // downstream protocol error
    pub const UMSDR: u64 = 1 << 19; // upstream max stream duration reached
    pub const RFCF: u64 = 1 << 20; // response from cache filter
    pub const NFCF: u64 = 1 << 21; // no filter config found
    pub const DT: u64 = 1 << 22; // duration timeout
    pub const UPE: u64 = 1 << 23; // upstream protocol error
    pub const NC: u64 = 1 << 24; // no cluster found
    pub const OM: u64 = 1 << 25; // overload manager
    pub const DF: u64 = 1 << 26; // DNS resolution failed
    pub const DO: u64 = 1 << 27; // drop overload
    pub const DR: u64 = 1 << 28; // downstream remote reset
    pub const UDO: u64 = 1 << 29; // unconditional drop overload
}

/// The union of a list of flags.
const fn any_of(list: &[u64]) -> u64 {
    let mut bits = 0;
    let mut i = 0;
    while i < list.len() {
        bits |= list[i];
        i += 1;
    }
    bits
}

/// Flags that leave the upstream's execution open: any of them wins over the rest.
const UNKNOWN_FLAGS: u64 = any_of(&[
    flags::UT,
    flags::LR,
    flags::UR,
    flags::UC,
    flags::DC,
    flags::URX,
    flags::SI,
    flags::DPE,
    flags::UMSDR,
    flags::DT,
    flags::UPE,
    flags::DR,
]);

/// Flags that say the request was never handed to an upstream.
const NOT_SENT_FLAGS: u64 = any_of(&[
    flags::LH,
    flags::UH,
    flags::UF,
    flags::UO,
    flags::NR,
    flags::FI,
    flags::RL,
    flags::UAEX,
    flags::RLSE,
    flags::IH,
    flags::NFCF,
    flags::NC,
    flags::OM,
    flags::DF,
    flags::DO,
    flags::UDO,
]);

/// Reset reasons (in `upstream_reset_before_response_started{…}`) that mean the request
/// was never written: the connection was never made, the circuit breaker refused it, or
/// the HTTP/2 peer refused the stream (which guarantees it did not process it).
const NOT_SENT_RESETS: [&str; 4] = [
    "connection_failure",
    "connection_timeout",
    "overflow",
    "refused_stream",
];

/// Words in response code details that point at an upstream, a downstream, or a
/// timeout: such a local reply may come after the request was sent.
const UNKNOWN_WORDS: [&str; 9] = [
    "upstream",
    "downstream",
    "timeout",
    "reset",
    "disconnect",
    "response_",
    "codec",
    "protocol",
    "duration",
];

/// Classifies a forwarded request by Envoy's `response.code_details` (empty when Envoy
/// has none, e.g. the stream ended before any response) and `response.flags`.
pub fn classify(details: &str, flag_bits: u64) -> Outcome {
    if details == "via_upstream" {
        return Outcome::Upstream;
    }
    if flag_bits & UNKNOWN_FLAGS != 0 {
        return Outcome::Unknown;
    }
    if flag_bits & NOT_SENT_FLAGS != 0 {
        return Outcome::NotExecuted;
    }
    if let Some(reason) = details.strip_prefix("upstream_reset_before_response_started{") {
        return if NOT_SENT_RESETS.iter().any(|r| reason.contains(r)) {
            Outcome::NotExecuted
        } else {
            Outcome::Unknown
        };
    }
    if details.is_empty() || UNKNOWN_WORDS.iter().any(|w| details.contains(w)) {
        return Outcome::Unknown;
    }
    // A local reply of a filter after this one (ext_authz, RBAC, direct response, …):
    // it answered instead of the upstream.
    Outcome::NotExecuted
}

#[cfg(test)]
mod tests;
