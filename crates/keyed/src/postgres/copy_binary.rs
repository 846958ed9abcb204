//! Rows of `COPY … FROM STDIN (FORMAT binary)` (docs/sinks.md §7.3), encoded straight into the
//! bytes sent: what the staging table of `bulk` is filled with.
//!
//! # Rules (PostgreSQL's binary `COPY` format)
//! 1. The data starts with the 11-byte signature `PGCOPY\n\377\r\n\0`, a 32-bit flags field
//!    (0: no OIDs) and a 32-bit header-extension length (0).
//! 2. Each row is a 16-bit field count, then each field as a 32-bit byte length and its
//!    bytes; a null field is the length -1 with no bytes.
//! 3. A `text` field is its UTF-8 bytes as they are, a `bytea` field its bytes, a `bigint`
//!    8 bytes and a `smallint` 2 bytes, big-endian.
//! 4. The data ends with the 16-bit field count -1.
//!
//! Integers are network order (big-endian) throughout.

use bytes::{BufMut as _, BytesMut};

/// The header (rule 1).
pub fn header(out: &mut BytesMut) {
    out.put_slice(b"PGCOPY\n\xff\r\n\0");
    out.put_i32(0);
    out.put_i32(0);
}

/// Starts a row of `fields` fields (rule 2).
pub fn row(out: &mut BytesMut, fields: u16) {
    out.put_u16(fields);
}

/// A `text` or `bytea` field (rule 3).
pub fn bytes(out: &mut BytesMut, value: &[u8]) {
    // Fields are key values and documents of DynamoDB items (at most 400 KB); a length past
    // i32 (which the format cannot say) would make the server refuse the COPY, not store it.
    out.put_i32(i32::try_from(value.len()).unwrap_or(i32::MAX));
    out.put_slice(value);
}

/// A `text` field, or null.
pub fn text_or_null(out: &mut BytesMut, value: Option<&str>) {
    match value {
        Some(value) => bytes(out, value.as_bytes()),
        None => null(out),
    }
}

/// A `bigint` field, or null.
pub fn int8(out: &mut BytesMut, value: Option<i64>) {
    match value {
        Some(value) => {
            out.put_i32(8);
            out.put_i64(value);
        }
        None => null(out),
    }
}

/// A `smallint` field.
pub fn int2(out: &mut BytesMut, value: i16) {
    out.put_i32(2);
    out.put_i16(value);
}

/// A null field (rule 2).
pub fn null(out: &mut BytesMut) {
    out.put_i32(-1);
}

/// The trailer (rule 4).
pub fn trailer(out: &mut BytesMut) {
    out.put_i16(-1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_is_its_field_count_then_each_field_length_first() {
        let mut out = BytesMut::new();
        header(&mut out);
        row(&mut out, 4);
        bytes(&mut out, b"ab");
        text_or_null(&mut out, None);
        int8(&mut out, Some(-2));
        int2(&mut out, 1);
        trailer(&mut out);
        let mut expected = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0".to_vec();
        expected.extend([0, 4]);
        expected.extend([0, 0, 0, 2, b'a', b'b']);
        expected.extend([0xff, 0xff, 0xff, 0xff]);
        expected.extend([0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe]);
        expected.extend([0, 0, 0, 2, 0, 1]);
        expected.extend([0xff, 0xff]);
        assert_eq!(&out[..], &expected[..]);
    }
}
