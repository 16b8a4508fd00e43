//! The exact canonical form of a JSON body for the payload check, read straight from the
//! bytes by a hand-written parser (no `serde_json::Value`: it rounds numbers to f64 and
//! keeps the last of two members with one name, so different payloads compared equal).
//!
//! The form is a function of the JSON value:
//! - numbers by exact decimal value (`1` = `1.0` = `10e-1`, `-0` = `0`; digits beyond
//!   f64's precision count), written as sign, significant digits and the decimal point's
//!   place (see `number`);
//! - strings by code point, in one escaping (serde_json's); a `\u` escape that is no code
//!   point (a lone surrogate) is kept, spelled `\udxxx`;
//! - objects with their members sorted by name (decoded), no whitespace; an object naming
//!   a member twice is `Ambiguous`, never merged.
//!
//! For integers, strings, `true`/`false`/`null`, arrays and objects these are the bytes
//! serde_json wrote for the sorted `Value` before, so their digests did not change.
//!
//! Memory (measured in the tests): the output, at most the body's size except for
//! integers written with an exponent (`1e19`, 4 bytes, is 20 digits); a 12-byte index
//! entry per member of the objects still open; and, to sort an object whose members came
//! unsorted, one copy of that object. About 1x the body for arrays and sorted objects,
//! 2.4x for a 4.5 MB object of 100 000 unsorted members, 8x at worst for an array of
//! `1e19`s. With `json_pointers`, only the open objects' member names and the selected
//! values are kept. No recursion: nesting is an explicit stack of at most `MAX_DEPTH`
//! frames.

use super::JsonSelection;

/// The most arrays and objects a canonicalised body may nest (serde_json's limit, which
/// the payload check had before). A deeper body is compared as sent.
pub const MAX_DEPTH: usize = 128;

/// The largest exponent (`e…`) of a number we canonicalise; beyond it the body is compared
/// as sent. Keeps the decimal point's place in an i64 with room to spare.
const MAX_EXPONENT: i64 = 1_000_000_000_000_000;

/// The most pointers a selection may name (one bit each; the config allows 32).
const MAX_POINTERS: usize = 64;

/// The canonical form of a body's selected part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Canonical {
    Json(Vec<u8>),
    /// Not JSON we canonicalise (malformed, nested deeper than `MAX_DEPTH`, an exponent
    /// beyond `MAX_EXPONENT`): the raw body counts, which is exact too.
    Raw,
    /// An object names a member twice (after decoding escapes): which one the upstream
    /// reads is not clear. The detail says which name.
    Ambiguous(String),
}

enum Stop {
    NotCanonical,
    Ambiguous(String),
}

/// The canonical form of `selection` of `raw` (`Raw` for the raw selection).
pub fn canonical(selection: &JsonSelection, raw: &[u8]) -> Canonical {
    let (only, pointers) = match selection {
        JsonSelection::Raw => return Canonical::Raw,
        JsonSelection::Only(p) => (true, p),
        JsonSelection::Ignore(p) => (false, p),
    };
    // Offsets in the output are u32: a body whose output could pass 4 GiB (up to 5x the
    // body, see `number`) is compared raw.
    if pointers.len() > MAX_POINTERS
        || raw.len() > (u32::MAX / 8) as usize
        || std::str::from_utf8(raw).is_err()
    {
        return Canonical::Raw;
    }
    let mut c = Canon {
        src: raw,
        pos: 0,
        // The whole document is kept without `only`: typically a little under the body.
        out: Vec::with_capacity(if only { 0 } else { raw.len() }),
        scratch: Vec::new(),
        members: Vec::new(),
        frames: Vec::new(),
        pointers: pointers.iter().map(|p| Pointer::parse(p)).collect(),
        only,
        selected: vec![None; pointers.len()],
    };
    match c.document() {
        Ok(()) => {}
        Err(Stop::NotCanonical) => return Canonical::Raw,
        Err(Stop::Ambiguous(d)) => return Canonical::Ambiguous(d),
    }
    if !only {
        return Canonical::Json(c.out);
    }
    // As before: an array with, per pointer, `[value]` or `null` (absent differs from null).
    let mut out = Vec::new();
    out.push(b'[');
    for (i, v) in c.selected.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        match v {
            Some(v) => {
                out.push(b'[');
                out.extend_from_slice(v);
                out.push(b']');
            }
            None => out.extend_from_slice(b"null"),
        }
    }
    out.push(b']');
    Canonical::Json(out)
}

/// An RFC 6901 pointer's tokens, unescaped, with their array index where they are one
/// ("0" or digits without a leading zero; no sign).
struct Pointer {
    tokens: Vec<(String, Option<usize>)>,
}

impl Pointer {
    fn parse(p: &str) -> Pointer {
        let tokens = p
            .split('/')
            .skip(1)
            .map(|t| {
                let t = t.replace("~1", "/").replace("~0", "~");
                let digits = !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
                let index = (digits && (t == "0" || !t.starts_with('0')))
                    .then(|| t.parse::<usize>().ok())
                    .flatten();
                (t, index)
            })
            .collect();
        Pointer { tokens }
    }
}

/// Where a value goes in the output, and which pointers lead to it.
#[derive(Clone, Copy)]
struct Slot {
    /// Where the member or element starts in `out`, with its comma.
    start: usize,
    /// Members: where the name starts (after the comma) and ends (after its quote).
    name_start: usize,
    name_end: usize,
    /// Where the value's bytes start.
    value_start: usize,
    /// How many pointer tokens the path to this value has used.
    depth: usize,
    /// Pointers whose first `depth` tokens are this value's path (bit per pointer).
    live: u64,
    /// `only`: this value or one it is inside is selected, so what it holds is kept.
    keep: bool,
}

/// An open array or object.
struct Frame {
    object: bool,
    /// Its own place in its parent.
    slot: Slot,
    /// Objects: its first entry in `members`.
    first_member: usize,
    /// Arrays: the next element's index.
    next_index: usize,
    /// Elements or members written so far (ignored elements are not).
    kept: usize,
    /// Objects: a member was ignored, so the members are rewritten at the end.
    rewrite: bool,
}

/// A member written to `out`: `"name":value` from `name_start` to `end` (offsets in
/// u32: 12 bytes a member in the index, bodies are far below 4 GiB).
#[derive(Clone, Copy)]
struct Member {
    name_start: u32,
    name_end: u32,
    end: u32,
    /// Ignored: only its name is left, for the duplicate check.
    ignored: bool,
}

struct Canon<'a> {
    src: &'a [u8],
    pos: usize,
    out: Vec<u8>,
    /// Reused to reorder an object's members.
    scratch: Vec<u8>,
    /// The members of every open object, innermost last.
    members: Vec<Member>,
    frames: Vec<Frame>,
    pointers: Vec<Pointer>,
    only: bool,
    /// `only`: each pointer's value, canonical, once found.
    selected: Vec<Option<Vec<u8>>>,
}

impl Canon<'_> {
    fn peek(&self) -> Option<u8> {
        self.src.get(self.pos).copied()
    }

    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), Stop> {
        self.ws();
        if self.peek() == Some(b) {
            self.pos += 1;
            Ok(())
        } else {
            Err(Stop::NotCanonical)
        }
    }

    /// The pointers of `live` that end at `depth` tokens.
    fn ends_here(&self, live: u64, depth: usize) -> u64 {
        self.bits(live)
            .filter(|&i| self.pointers.get(i).map(|p| p.tokens.len()) == Some(depth))
            .fold(0, |m, i| m | (1 << i))
    }

    fn bits(&self, mask: u64) -> impl Iterator<Item = usize> {
        (0..self.pointers.len().min(64)).filter(move |i| mask & (1 << i) != 0)
    }

    /// The whole body: one value, then only whitespace. A loop over an explicit stack.
    fn document(&mut self) -> Result<(), Stop> {
        let mut slot = Slot {
            start: 0,
            name_start: 0,
            name_end: 0,
            value_start: 0,
            depth: 0,
            live: if self.pointers.len() >= 64 {
                u64::MAX
            } else {
                (1u64 << self.pointers.len()) - 1
            },
            keep: false,
        };
        'value: loop {
            self.ws();
            match self.peek() {
                Some(open @ (b'{' | b'[')) => {
                    if self.frames.len() >= MAX_DEPTH {
                        return Err(Stop::NotCanonical);
                    }
                    self.pos += 1;
                    self.out.push(open);
                    self.frames.push(Frame {
                        object: open == b'{',
                        slot,
                        first_member: self.members.len(),
                        next_index: 0,
                        kept: 0,
                        rewrite: false,
                    });
                    self.ws();
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.peek() != Some(close) {
                        slot = self.next_slot()?;
                        continue 'value;
                    }
                    // Empty: closed below.
                }
                Some(b'"') => {
                    self.string()?;
                    self.finish(slot)?;
                }
                Some(b'-' | b'0'..=b'9') => {
                    self.number()?;
                    self.finish(slot)?;
                }
                _ => {
                    self.literal()?;
                    self.finish(slot)?;
                }
            }
            // A value is complete: close what ends here, until a comma opens the next.
            loop {
                self.ws();
                let Some(frame) = self.frames.last() else {
                    return if self.pos == self.src.len() {
                        Ok(())
                    } else {
                        Err(Stop::NotCanonical)
                    };
                };
                let object = frame.object;
                match (self.peek(), object) {
                    (Some(b','), _) => {
                        self.pos += 1;
                        slot = self.next_slot()?;
                        continue 'value;
                    }
                    (Some(b'}'), true) => {
                        self.pos += 1;
                        self.close_object()?;
                    }
                    (Some(b']'), false) => {
                        self.pos += 1;
                        self.close_array()?;
                    }
                    _ => return Err(Stop::NotCanonical),
                }
            }
        }
    }

    /// Reads a member's name (or counts an element) of the innermost container and
    /// says where its value goes.
    fn next_slot(&mut self) -> Result<Slot, Stop> {
        let Some(frame) = self.frames.last() else {
            return Err(Stop::NotCanonical);
        };
        let (object, kept, index, parent) =
            (frame.object, frame.kept, frame.next_index, frame.slot);
        let depth = parent.depth + 1;
        let start = self.out.len();
        if kept > 0 {
            self.out.push(b',');
        }
        let name_start = self.out.len();
        let mut live = 0u64;
        if object {
            self.ws();
            if self.peek() != Some(b'"') {
                return Err(Stop::NotCanonical);
            }
            self.string()?;
            let name = self
                .out
                .get(name_start + 1..self.out.len().saturating_sub(1))
                .unwrap_or_default();
            for i in self.bits(parent.live) {
                let token = self.pointers.get(i).and_then(|p| p.tokens.get(depth - 1));
                if token.is_some_and(|(t, _)| Decoded::new(name).eq(t.bytes())) {
                    live |= 1 << i;
                }
            }
            self.expect(b':')?;
            self.out.push(b':');
        } else {
            for i in self.bits(parent.live) {
                let token = self.pointers.get(i).and_then(|p| p.tokens.get(depth - 1));
                if token.is_some_and(|(_, idx)| *idx == Some(index)) {
                    live |= 1 << i;
                }
            }
            if let Some(f) = self.frames.last_mut() {
                f.next_index = index.saturating_add(1);
            }
        }
        let name_end = if object {
            self.out.len().saturating_sub(1)
        } else {
            name_start
        };
        let keep = parent.keep || (self.only && self.ends_here(live, depth) != 0);
        Ok(Slot {
            start,
            name_start,
            name_end,
            value_start: self.out.len(),
            depth,
            live,
            keep,
        })
    }

    /// A value of `slot` is complete in `out`: drop it if ignored, keep a selected copy,
    /// and enter it in its container.
    fn finish(&mut self, slot: Slot) -> Result<(), Stop> {
        let targets = self.ends_here(slot.live, slot.depth);
        let ignored = !self.only && targets != 0;
        if self.only {
            for i in self.bits(targets) {
                let value = self
                    .out
                    .get(slot.value_start..)
                    .unwrap_or_default()
                    .to_vec();
                if let Some(s) = self.selected.get_mut(i) {
                    *s = Some(value);
                }
            }
            // Only selected values are output: a value's bytes stay while a value around
            // it is selected (member names stay for the duplicate check).
            if !self.frames.last().is_some_and(|f| f.slot.keep) {
                self.out.truncate(slot.value_start);
            }
        } else if ignored {
            // Ignored: an element goes with its comma; a member's name stays until its
            // object closes, for the duplicate check.
            self.out.truncate(slot.value_start);
        }
        let end = u32::try_from(self.out.len()).map_err(|_| Stop::NotCanonical)?;
        let Some(f) = self.frames.last_mut() else {
            return Ok(());
        };
        if !f.object {
            if ignored {
                self.out.truncate(slot.start);
            } else {
                f.kept += 1;
            }
            return Ok(());
        }
        f.kept += 1;
        f.rewrite |= ignored;
        let offset = |o: usize| u32::try_from(o).map_err(|_| Stop::NotCanonical);
        self.members.push(Member {
            name_start: offset(slot.name_start)?,
            name_end: offset(slot.name_end)?,
            end,
            ignored,
        });
        Ok(())
    }

    fn close_array(&mut self) -> Result<(), Stop> {
        let Some(frame) = self.frames.pop() else {
            return Err(Stop::NotCanonical);
        };
        self.out.push(b']');
        self.finish(frame.slot)
    }

    /// Sorts the innermost object's members by name, refusing a name given twice.
    fn close_object(&mut self) -> Result<(), Stop> {
        let Some(frame) = self.frames.pop() else {
            return Err(Stop::NotCanonical);
        };
        let out = &self.out;
        let list = self
            .members
            .get_mut(frame.first_member..)
            .unwrap_or_default();
        let ordered = !frame.rewrite
            && list
                .windows(2)
                .all(|w| matches!(w, [a, b] if cmp_names(out, a, b).is_lt()));
        if !ordered {
            list.sort_unstable_by(|a, b| cmp_names(out, a, b));
            if let Some(w) = list
                .windows(2)
                .find(|w| matches!(w, [a, b] if cmp_names(out, a, b).is_eq()))
            {
                let name = w.first().map(|m| name_of(out, m)).unwrap_or_default();
                let shown: String = String::from_utf8_lossy(name).chars().take(64).collect();
                return Err(Stop::Ambiguous(format!(
                    "the JSON body names member \"{shown}\" twice in one object; which one counts is not clear"
                )));
            }
            // Rewrite the members in order, with their commas, without the ignored ones.
            let body = frame.slot.value_start + 1;
            self.scratch.clear();
            // Exactly the object's size: growing by doubling could take twice that.
            self.scratch
                .reserve_exact(self.out.len().saturating_sub(body));
            for m in list.iter().filter(|m| !m.ignored) {
                if !self.scratch.is_empty() {
                    self.scratch.push(b',');
                }
                let (from, to) = (m.name_start as usize, m.end as usize);
                self.scratch
                    .extend_from_slice(out.get(from..to).unwrap_or_default());
            }
            self.out.truncate(body);
            self.out.extend_from_slice(&self.scratch);
        }
        self.members.truncate(frame.first_member);
        self.out.push(b'}');
        self.finish(frame.slot)
    }

    fn literal(&mut self) -> Result<(), Stop> {
        for word in [&b"true"[..], b"false", b"null"] {
            if self.src.get(self.pos..self.pos + word.len()) == Some(word) {
                self.pos += word.len();
                self.out.extend_from_slice(word);
                return Ok(());
            }
        }
        Err(Stop::NotCanonical)
    }

    /// A string at `pos` (its opening quote), written canonically: escapes decoded, then
    /// `"`, `\` and control characters escaped as serde_json does, lone surrogates kept.
    fn string(&mut self) -> Result<(), Stop> {
        self.pos += 1;
        self.out.push(b'"');
        loop {
            // A run of plain bytes (the body is valid UTF-8: copied as they are).
            let rest = self.src.get(self.pos..).unwrap_or_default();
            let run = rest
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                .ok_or(Stop::NotCanonical)?;
            self.out
                .extend_from_slice(rest.get(..run).unwrap_or_default());
            self.pos += run;
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    self.out.push(b'"');
                    return Ok(());
                }
                Some(b'\\') => self.escape()?,
                _ => return Err(Stop::NotCanonical),
            }
        }
    }

    fn escape(&mut self) -> Result<(), Stop> {
        let e = self.src.get(self.pos + 1).copied();
        self.pos += 2;
        let c = match e {
            Some(b'"') => 0x22,
            Some(b'\\') => 0x5c,
            Some(b'/') => 0x2f,
            Some(b'b') => 0x08,
            Some(b'f') => 0x0c,
            Some(b'n') => 0x0a,
            Some(b'r') => 0x0d,
            Some(b't') => 0x09,
            Some(b'u') => {
                let unit = self.hex4()?;
                if (0xd800..0xdc00).contains(&unit)
                    && self.src.get(self.pos..self.pos + 2) == Some(b"\\u")
                {
                    // A pair, when a low surrogate follows.
                    let save = self.pos;
                    self.pos += 2;
                    let low = self.hex4()?;
                    if (0xdc00..0xe000).contains(&low) {
                        0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
                    } else {
                        self.pos = save;
                        unit
                    }
                } else {
                    unit
                }
            }
            _ => return Err(Stop::NotCanonical),
        };
        emit_char(&mut self.out, c);
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, Stop> {
        let digits = self
            .src
            .get(self.pos..self.pos + 4)
            .ok_or(Stop::NotCanonical)?;
        let mut v = 0u32;
        for &d in digits {
            let x = char::from(d).to_digit(16).ok_or(Stop::NotCanonical)?;
            v = v * 16 + x;
        }
        self.pos += 4;
        Ok(v)
    }

    /// A number at `pos`, written by its exact value: with `D` its significant digits
    /// (no leading or trailing zeros) and `k` the decimal point's place (the value is
    /// 0.D × 10^k), zero is `0`; an integer below 10^20 is plain digits (`1200`);
    /// a point inside the digits gives `12.5`; -5 < k <= 0 gives `0.000125`; anything
    /// else `1.25e-7` / `1e+21` (exponent `k - 1`). The same spellings as serde_json's
    /// (ryu) where both are exact. A `-` only on non-zero values.
    fn number(&mut self) -> Result<(), Stop> {
        let neg = self.peek() == Some(b'-');
        if neg {
            self.pos += 1;
        }
        let int_start = self.pos;
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.skip_digits(),
            _ => return Err(Stop::NotCanonical),
        }
        let int = self.src.get(int_start..self.pos).unwrap_or_default();
        let mut frac: &[u8] = &[];
        if self.peek() == Some(b'.') {
            self.pos += 1;
            let s = self.pos;
            self.skip_digits();
            if self.pos == s {
                return Err(Stop::NotCanonical);
            }
            frac = self.src.get(s..self.pos).unwrap_or_default();
        }
        let mut exp: i64 = 0;
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            let exp_neg = match self.peek() {
                Some(b'-') => {
                    self.pos += 1;
                    true
                }
                Some(b'+') => {
                    self.pos += 1;
                    false
                }
                _ => false,
            };
            let s = self.pos;
            self.skip_digits();
            if self.pos == s {
                return Err(Stop::NotCanonical);
            }
            for &d in self.src.get(s..self.pos).unwrap_or_default() {
                exp = exp * 10 + i64::from(d - b'0');
                if exp > MAX_EXPONENT {
                    return Err(Stop::NotCanonical);
                }
            }
            if exp_neg {
                exp = -exp;
            }
        }
        let total = int.len() + frac.len();
        let digits = || int.iter().chain(frac.iter()).copied();
        let lead = digits().take_while(|&d| d == b'0').count();
        if lead == total {
            self.out.push(b'0');
            return Ok(());
        }
        let trail = frac
            .iter()
            .rev()
            .chain(int.iter().rev())
            .take_while(|&&d| d == b'0')
            .count();
        let n = total - lead - trail;
        let k = i64::try_from(int.len())
            .ok()
            .and_then(|i| i.checked_sub(i64::try_from(lead).ok()?))
            .and_then(|i| i.checked_add(exp))
            .ok_or(Stop::NotCanonical)?;
        let n_i = i64::try_from(n).map_err(|_| Stop::NotCanonical)?;
        let sig = digits().skip(lead).take(n);
        let out = &mut self.out;
        if neg {
            out.push(b'-');
        }
        if k >= n_i && k <= 20 {
            out.extend(sig);
            out.extend(std::iter::repeat_n(b'0', (k - n_i) as usize));
        } else if k > 0 && k < n_i {
            for (i, d) in sig.enumerate() {
                if i as i64 == k {
                    out.push(b'.');
                }
                out.push(d);
            }
        } else if k > -5 && k <= 0 {
            out.extend_from_slice(b"0.");
            out.extend(std::iter::repeat_n(b'0', k.unsigned_abs() as usize));
            out.extend(sig);
        } else {
            for (i, d) in sig.enumerate() {
                if i == 1 {
                    out.push(b'.');
                }
                out.push(d);
            }
            // serde_json's spelling: `e+21`, `e-7`.
            out.push(b'e');
            if k > 1 {
                out.push(b'+');
            }
            push_i64(out, k - 1);
        }
        Ok(())
    }

    fn skip_digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }
}

/// Writes one code point (or lone surrogate) in the canonical escaping.
fn emit_char(out: &mut Vec<u8>, c: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let short = match c {
        0x22 => Some(b'"'),
        0x5c => Some(b'\\'),
        0x08 => Some(b'b'),
        0x0c => Some(b'f'),
        0x0a => Some(b'n'),
        0x0d => Some(b'r'),
        0x09 => Some(b't'),
        _ => None,
    };
    if let Some(s) = short {
        out.extend_from_slice(&[b'\\', s]);
    } else if let Some(ch) = char::from_u32(c).filter(|_| c >= 0x20) {
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
    } else {
        // A control character or a lone surrogate (below 0x10000 either way).
        out.extend_from_slice(b"\\u");
        for shift in [12, 8, 4, 0] {
            out.push(
                HEX.get(((c >> shift) & 0xf) as usize)
                    .copied()
                    .unwrap_or(b'0'),
            );
        }
    }
}

fn push_i64(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    let mut digits = [0u8; 20];
    let mut n = v.unsigned_abs();
    let mut i = digits.len();
    loop {
        i -= 1;
        if let Some(d) = digits.get_mut(i) {
            *d = b'0' + (n % 10) as u8;
        }
        n /= 10;
        if n == 0 || i == 0 {
            break;
        }
    }
    out.extend_from_slice(digits.get(i..).unwrap_or_default());
}

/// A member's canonical name, without its quotes.
fn name_of<'o>(out: &'o [u8], m: &Member) -> &'o [u8] {
    let (from, to) = (m.name_start as usize + 1, m.name_end as usize);
    out.get(from..to.saturating_sub(1)).unwrap_or_default()
}

/// Names compare by their decoded bytes (UTF-8, lone surrogates as WTF-8), which is
/// code point order: the order of serde_json's map.
fn cmp_names(out: &[u8], a: &Member, b: &Member) -> std::cmp::Ordering {
    Decoded::new(name_of(out, a)).cmp(Decoded::new(name_of(out, b)))
}

/// The bytes a canonical string (without quotes) stands for: its escapes decoded, a lone
/// surrogate as the three bytes UTF-8 would give it.
struct Decoded<'a> {
    rest: &'a [u8],
    pending: [u8; 3],
    npending: usize,
}

impl<'a> Decoded<'a> {
    fn new(s: &'a [u8]) -> Self {
        Decoded {
            rest: s,
            pending: [0; 3],
            npending: 0,
        }
    }
}

impl Iterator for Decoded<'_> {
    type Item = u8;

    fn next(&mut self) -> Option<u8> {
        if self.npending > 0 {
            let b = self.pending.get(3 - self.npending).copied();
            self.npending -= 1;
            return b;
        }
        let (&b, rest) = self.rest.split_first()?;
        self.rest = rest;
        if b != b'\\' {
            return Some(b);
        }
        let (&e, rest) = self.rest.split_first()?;
        self.rest = rest;
        Some(match e {
            b'b' => 0x08,
            b'f' => 0x0c,
            b'n' => 0x0a,
            b'r' => 0x0d,
            b't' => 0x09,
            b'u' => {
                let hex = self.rest.get(..4).unwrap_or_default();
                self.rest = self.rest.get(4..).unwrap_or_default();
                let unit = hex
                    .iter()
                    .filter_map(|&d| char::from(d).to_digit(16))
                    .fold(0u32, |v, x| v * 16 + x);
                if unit < 0x80 {
                    unit as u8
                } else {
                    self.pending = [
                        0xe0 | (unit >> 12) as u8,
                        0x80 | ((unit >> 6) & 0x3f) as u8,
                        0x80 | (unit & 0x3f) as u8,
                    ];
                    self.npending = 2;
                    0xe0 | (unit >> 12) as u8
                }
            }
            other => other,
        })
    }
}

#[cfg(test)]
mod tests;
