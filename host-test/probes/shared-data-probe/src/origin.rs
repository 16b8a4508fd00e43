//! What a response says of where it came from, as Envoy's properties show it.

use crate::raw;

/// What the filter can learn of a response's origin: `response.code_details`,
/// `response.flags` (Envoy's legacy response-flag bitmask), `response.code`
/// and `upstream.address`, each as (host status, raw bytes).
pub struct Origin {
    props: Vec<(&'static str, u32, Option<Vec<u8>>)>,
}

/// Envoy's core response flags, bit i = `CoreResponseFlag` i (Envoy 1.40).
const FLAG_NAMES: [&str; 30] = [
    "LH", "UH", "UT", "LR", "UR", "UF", "UC", "UO", "NR", "DI", "FI", "RL", "UAEX", "RLSE", "DC",
    "URX", "SI", "IH", "DPE", "UMSDR", "RFCF", "NFCF", "DT", "UPE", "NC", "OM", "DF", "DO", "DR",
    "UDO",
];

impl Origin {
    pub fn read() -> Origin {
        let props = [
            "response.code_details",
            "response.flags",
            "response.code",
            "upstream.address",
        ]
        .into_iter()
        .map(|path| {
            let (status, value) = raw::get_property(path);
            (path, status, value)
        })
        .collect();
        Origin { props }
    }

    fn int(bytes: &[u8]) -> Option<i64> {
        let b: [u8; 8] = bytes.try_into().ok()?;
        Some(i64::from_le_bytes(b))
    }

    fn flag_names(flags: i64) -> String {
        let names: Vec<&str> = FLAG_NAMES
            .iter()
            .enumerate()
            .filter(|(i, _)| flags & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        if names.is_empty() {
            "-".into()
        } else {
            names.join(",")
        }
    }

    /// One property as text: `status=N` when the host refused it, the
    /// string for strings, `hex/int` for 8-byte integers.
    fn show(path: &str, status: u32, value: &Option<Vec<u8>>) -> String {
        match (status, value) {
            (0, Some(v)) if path == "response.flags" => match Origin::int(v) {
                Some(f) => format!("{f}:{}:hex{}", Origin::flag_names(f), hex(v)),
                None => format!("len{}:hex{}", v.len(), hex(v)),
            },
            (0, Some(v)) if path == "response.code" => match Origin::int(v) {
                Some(c) => format!("{c}:hex{}", hex(v)),
                None => format!("len{}:hex{}", v.len(), hex(v)),
            },
            (0, Some(v)) => String::from_utf8_lossy(v).into_owned(),
            (0, None) => "null".into(),
            (s, _) => format!("status{s}"),
        }
    }

    pub fn line(&self) -> String {
        let parts: Vec<String> = self
            .props
            .iter()
            .map(|(p, s, v)| format!("{p}={}", Origin::show(p, *s, v)))
            .collect();
        parts.join(" ")
    }

    pub fn headers(&self) -> Vec<(&'static str, String)> {
        self.props
            .iter()
            .map(|(p, s, v)| {
                let name = match *p {
                    "response.code_details" => "x-probe-code-details",
                    "response.flags" => "x-probe-flags",
                    "response.code" => "x-probe-code",
                    _ => "x-probe-upstream-address",
                };
                (name, Origin::show(p, *s, v))
            })
            .collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
