//! Fields of `COPY`'s text format (docs/sinks.md §7.3): what a row written by
//! `COPY … FROM STDIN` (without `FORMAT binary`) looks like.
//!
//! # Rules
//! 1. Fields are separated by a tab, rows end with a newline, and `\N` is null.
//! 2. In a field, backslash, tab, newline and carriage return are escaped (`\\`, `\t`, `\n`,
//!    `\r`); every other byte goes as it is, so UTF-8 text passes unchanged.
//! 3. A `bytea` field is its hex form, `\x` and two digits a byte, with the backslash escaped
//!    by rule 2 (`\\x00ab`).

use bytes::{BufMut as _, BytesMut};

/// The null field (rule 1).
pub const NULL: &[u8] = b"\\N";

/// Appends `text` as a field (rule 2).
pub fn text(out: &mut BytesMut, text: &str) {
    let bytes = text.as_bytes();
    out.reserve(bytes.len());
    let mut start = 0;
    let mut at = 0;
    while at < bytes.len() {
        // Most fields hold no reserved byte at all: skip 16 bytes at a time (a fold the
        // compiler turns into vector compares) until a chunk holds one.
        if let Some(chunk) = bytes.get(at..at + 16)
            && !chunk.iter().fold(false, |any, &b| any | reserved(b))
        {
            at += 16;
            continue;
        }
        let escaped: &[u8] = match bytes[at] {
            b'\\' => b"\\\\",
            b'\t' => b"\\t",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            _ => {
                at += 1;
                continue;
            }
        };
        out.put_slice(&bytes[start..at]);
        out.put_slice(escaped);
        at += 1;
        start = at;
    }
    out.put_slice(&bytes[start..]);
}

/// A byte rule 2 escapes.
fn reserved(b: u8) -> bool {
    b == b'\\' || b == b'\t' || b == b'\n' || b == b'\r'
}

/// Appends `bytes` as a `bytea` field (rule 3).
pub fn bytea(out: &mut BytesMut, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(3 + 2 * bytes.len());
    out.put_slice(b"\\\\x");
    for &b in bytes {
        out.put_u8(HEX[usize::from(b >> 4)]);
        out.put_u8(HEX[usize::from(b & 0x0f)]);
    }
}

/// Appends an integer field, or null.
pub fn int(out: &mut BytesMut, value: Option<i64>) {
    match value {
        Some(value) => {
            let mut digits = [0; 20];
            out.put_slice(format_i64(&mut digits, value));
        }
        None => out.put_slice(NULL),
    }
}

/// Appends `value` as a text field (rule 2), or null.
pub fn text_or_null(out: &mut BytesMut, value: Option<&str>) {
    match value {
        Some(value) => text(out, value),
        None => out.put_slice(NULL),
    }
}

/// The decimal digits of `value` (with its sign) in `buffer`.
fn format_i64(buffer: &mut [u8; 20], value: i64) -> &[u8] {
    let mut at = buffer.len();
    let mut rest = value.unsigned_abs();
    loop {
        at -= 1;
        buffer[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if value < 0 {
        at -= 1;
        buffer[at] = b'-';
    }
    &buffer[at..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_escape_what_the_text_format_reserves() {
        let mut out = BytesMut::new();
        text(&mut out, "a\\b\tc\nd\re");
        out.put_u8(b'|');
        bytea(&mut out, &[0, 0xab, 0x1f]);
        out.put_u8(b'|');
        text_or_null(&mut out, None);
        assert_eq!(&out[..], b"a\\\\b\\tc\\nd\\re|\\\\x00ab1f|\\N");
        let mut plain = BytesMut::new();
        text(&mut plain, r#"{"pk":"user#1","é":"\"q\""}"#);
        assert_eq!(&plain[..], r#"{"pk":"user#1","é":"\\"q\\""}"#.as_bytes());
        // Reserved bytes at every place of and across the 16-byte chunks.
        for len in 0..40 {
            for at in 0..len {
                for reserved in ["\\", "\t", "\n", "\r"] {
                    let mut input: String = "x".repeat(len);
                    input.replace_range(at..=at, reserved);
                    let mut out = BytesMut::new();
                    text(&mut out, &input);
                    let want = input
                        .replace('\\', "\\\\")
                        .replace('\t', "\\t")
                        .replace('\n', "\\n")
                        .replace('\r', "\\r");
                    assert_eq!(&out[..], want.as_bytes(), "{input:?}");
                }
            }
        }
    }

    #[test]
    fn integers_are_their_decimal_digits() {
        for value in [0, 7, -7, 1_700_000_000_123, i64::MIN, i64::MAX] {
            let mut out = BytesMut::new();
            int(&mut out, Some(value));
            assert_eq!(&out[..], value.to_string().as_bytes());
        }
        let mut out = BytesMut::new();
        int(&mut out, None);
        assert_eq!(&out[..], b"\\N");
    }
}
