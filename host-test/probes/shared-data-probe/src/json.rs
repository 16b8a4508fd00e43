//! A tiny JSON writer, so the probe needs no serde in the wasm module.

pub struct Json {
    out: String,
    first: bool,
    close: char,
}

impl Json {
    pub fn object() -> Self {
        Json {
            out: "{".into(),
            first: true,
            close: '}',
        }
    }

    pub fn array() -> Self {
        Json {
            out: "[".into(),
            first: true,
            close: ']',
        }
    }

    fn key(&mut self, key: &str) {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        if self.close == '}' {
            escape(&mut self.out, key);
            self.out.push(':');
        }
    }

    pub fn str(&mut self, key: &str, value: &str) {
        self.key(key);
        escape(&mut self.out, value);
    }

    pub fn num(&mut self, key: &str, value: u64) {
        self.key(key);
        self.out.push_str(&value.to_string());
    }

    pub fn null(&mut self, key: &str) {
        self.key(key);
        self.out.push_str("null");
    }

    /// A status code as its number and, in `<key>_name`, its ABI name.
    pub fn status(&mut self, key: &str, status: u32) {
        self.key(key);
        escape(&mut self.out, status_name(status));
        self.key(&format!("{key}_code"));
        self.out.push_str(&status.to_string());
    }

    pub fn raw(&mut self, key: &str, value: Json) {
        self.key(key);
        self.out.push_str(&value.finish());
    }

    pub fn raw_item(&mut self, value: Json) {
        self.key("");
        self.out.push_str(&value.finish());
    }

    pub fn finish(mut self) -> String {
        self.out.push(self.close);
        self.out
    }
}

fn escape(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

pub fn status_name(status: u32) -> &'static str {
    match status {
        0 => "Ok",
        1 => "NotFound",
        2 => "BadArgument",
        3 => "SerializationFailure",
        4 => "ParseFailure",
        5 => "BadExpression",
        6 => "InvalidMemoryAccess",
        7 => "Empty",
        8 => "CasMismatch",
        9 => "ResultMismatch",
        10 => "InternalFailure",
        11 => "BrokenConnection",
        12 => "Unimplemented",
        _ => "Unknown",
    }
}
