//! The plain SDK baselines' conversion of attribute values to JSON, for both SDKs.
//!
//! `aws-sdk-dynamodb` and `aws-sdk-dynamodbstreams` each have their own `AttributeValue` type
//! with the same variants; [`attribute_json!`] writes the one conversion for either, so the scan
//! and streams baselines convert exactly alike.

/// Defines `item_to_json` and `value_to_json` for an `AttributeValue` type: S → string, N → a
/// number if it parses as `f64` (else its text), B → base64, sets → arrays, M and L
/// recursively.
macro_rules! attribute_json {
    ($attribute:ty) => {
        /// An item (or image) as a JSON object.
        pub fn item_to_json(
            item: std::collections::HashMap<String, $attribute>,
        ) -> anyhow::Result<serde_json::Value> {
            let map = item
                .into_iter()
                .map(|(name, value)| Ok((name, value_to_json(value)?)))
                .collect::<anyhow::Result<serde_json::Map<String, serde_json::Value>>>()?;
            Ok(serde_json::Value::Object(map))
        }

        /// One value.
        fn value_to_json(value: $attribute) -> anyhow::Result<serde_json::Value> {
            use base64::Engine as _;
            use serde_json::Value as Json;
            type Attribute = $attribute;
            let encode = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
            Ok(match value {
                Attribute::S(s) => Json::String(s),
                Attribute::N(n) => $crate::attribute_json::number(n),
                Attribute::B(b) => Json::String(encode(b.as_ref())),
                Attribute::Bool(b) => Json::Bool(b),
                Attribute::Null(_) => Json::Null,
                Attribute::M(m) => item_to_json(m)?,
                Attribute::L(l) => Json::Array(
                    l.into_iter()
                        .map(value_to_json)
                        .collect::<anyhow::Result<_>>()?,
                ),
                Attribute::Ss(ss) => Json::Array(ss.into_iter().map(Json::String).collect()),
                Attribute::Ns(ns) => {
                    Json::Array(ns.into_iter().map($crate::attribute_json::number).collect())
                }
                Attribute::Bs(bs) => Json::Array(
                    bs.into_iter()
                        .map(|b| Json::String(encode(b.as_ref())))
                        .collect(),
                ),
                other => anyhow::bail!("unknown attribute value {other:?}"),
            })
        }
    };
}

pub(crate) use attribute_json;

/// A number's text as a JSON number when it parses as `f64`, else as a string.
pub fn number(text: String) -> serde_json::Value {
    match text
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
    {
        Some(number) => serde_json::Value::Number(number),
        None => serde_json::Value::String(text),
    }
}
