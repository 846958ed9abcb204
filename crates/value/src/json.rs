//! Low-level JSON writing into a caller's buffer: strings, integers, base64.
//!
//! Both formats write through these, straight into the output `Vec<u8>`, without building a
//! `serde_json::Value` or a `String` per value. Writing to a `Vec` cannot fail, so none of them
//! returns a `Result`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;

/// Writes `text` as a JSON string, escaped byte for byte as `serde_json` escapes it: `"` and `\`
/// with a backslash, `\b \t \n \f \r` by name, other control characters as `\u00xx` (lower-case
/// hex), everything else (including non-ASCII and DEL) unchanged.
pub(crate) fn write_str(out: &mut Vec<u8>, text: &str) {
    out.reserve(text.len() + 2);
    out.push(b'"');
    let bytes = text.as_bytes();
    let mut run_start = 0;
    for (index, &byte) in bytes.iter().enumerate() {
        let escape = ESCAPE[usize::from(byte)];
        if escape == 0 {
            continue;
        }
        out.extend_from_slice(&bytes[run_start..index]);
        run_start = index + 1;
        if escape == b'u' {
            out.extend_from_slice(b"\\u00");
            out.push(HEX_DIGITS[usize::from(byte >> 4)]);
            out.push(HEX_DIGITS[usize::from(byte & 0xf)]);
        } else {
            out.extend_from_slice(&[b'\\', escape]);
        }
    }
    out.extend_from_slice(&bytes[run_start..]);
    out.push(b'"');
}

/// Writes bytes as a JSON string holding their base64: standard alphabet, padded.
pub(crate) fn write_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'"');
    let start = out.len();
    // Four characters per started group of three bytes. A slice holds at most isize::MAX
    // bytes, so this cannot overflow.
    let encoded_len = bytes.len().div_ceil(3) * 4;
    out.resize(start + encoded_len, 0);
    let written = STANDARD
        .encode_slice(bytes, &mut out[start..])
        .expect("the output was sized to the padded base64 length of the input");
    out.truncate(start + written);
    out.push(b'"');
}

/// Writes an unsigned integer.
pub(crate) fn write_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Writes a signed integer.
pub(crate) fn write_i64(out: &mut Vec<u8>, value: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

/// Writes `items` as a JSON array, each element by `write`.
pub(crate) fn write_array<T>(
    out: &mut Vec<u8>,
    items: &[T],
    mut write: impl FnMut(&mut Vec<u8>, &T),
) {
    out.push(b'[');
    for (index, item) in items.iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write(out, item);
    }
    out.push(b']');
}

/// Writes a JSON object from `(key, value)` pairs that are already in key order.
pub(crate) fn write_object<'a, T: 'a>(
    out: &mut Vec<u8>,
    entries: impl IntoIterator<Item = (&'a String, &'a T)>,
    mut write: impl FnMut(&mut Vec<u8>, &T),
) {
    out.push(b'{');
    for (index, (key, value)) in entries.into_iter().enumerate() {
        if index > 0 {
            out.push(b',');
        }
        write_str(out, key);
        out.push(b':');
        write(out, value);
    }
    out.push(b'}');
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

// The escape of each byte: 0 for none, `u` for `\u00xx`, else the letter after the backslash.
// The same table as serde_json's, so the bytes are the same.
const BB: u8 = b'b';
const TT: u8 = b't';
const NN: u8 = b'n';
const FF: u8 = b'f';
const RR: u8 = b'r';
const QU: u8 = b'"';
const BS: u8 = b'\\';
const UU: u8 = b'u';
const __: u8 = 0;

static ESCAPE: [u8; 256] = [
    //   1   2   3   4   5   6   7   8   9   A   B   C   D   E   F
    UU, UU, UU, UU, UU, UU, UU, UU, BB, TT, NN, UU, FF, RR, UU, UU, // 0
    UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, UU, // 1
    __, __, QU, __, __, __, __, __, __, __, __, __, __, __, __, __, // 2
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // 3
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // 4
    __, __, __, __, __, __, __, __, __, __, __, __, BS, __, __, __, // 5
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // 6
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // 7
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // 8
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // 9
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // A
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // B
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // C
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // D
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // E
    __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __, // F
];

#[cfg(test)]
mod tests {
    use super::*;

    fn string(text: &str) -> String {
        let mut out = Vec::new();
        write_str(&mut out, text);
        String::from_utf8(out).unwrap()
    }

    fn base64(bytes: &[u8]) -> String {
        let mut out = Vec::new();
        write_base64(&mut out, bytes);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn every_byte_below_0x80_is_escaped_as_serde_json_escapes_it() {
        for code in 0u8..0x80 {
            let text = format!("a{}b", char::from(code));
            assert_eq!(
                string(&text),
                serde_json::to_string(&text).unwrap(),
                "{code:#x}"
            );
        }
    }

    #[test]
    fn non_ascii_text_is_written_unchanged() {
        let text = "é😀\u{2028}\u{7f}";
        assert_eq!(string(text), format!("\"{text}\""));
        assert_eq!(string(text), serde_json::to_string(text).unwrap());
    }

    #[test]
    fn an_escape_at_either_end_of_the_text_is_written() {
        assert_eq!(string("\"x\\"), r#""\"x\\""#);
        assert_eq!(string(""), r#""""#);
        assert_eq!(string("\u{1}"), r#""\u0001""#);
    }

    #[test]
    fn binary_is_padded_standard_base64() {
        assert_eq!(base64(&[1, 2]), r#""AQI=""#);
        assert_eq!(base64(&[0xff]), r#""/w==""#);
        assert_eq!(base64(&[0xfb, 0xff, 0xbf]), r#""+/+/""#);
        assert_eq!(base64(&[]), r#""""#);
    }

    #[test]
    fn integers_are_written_in_decimal() {
        let mut out = Vec::new();
        write_u64(&mut out, u64::MAX);
        out.push(b' ');
        write_i64(&mut out, i64::MIN);
        assert_eq!(out, b"18446744073709551615 -9223372036854775808");
    }
}
