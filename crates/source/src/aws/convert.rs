//! SDK attribute values ⇄ ours. Values are moved, not copied: strings and blobs change hands.

use std::collections::HashMap;

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodbstreams::types::AttributeValue as StreamsAttributeValue;
use ddbpipe_value::{Item, Number, Value};

/// An attribute type this version does not know.
#[derive(Debug)]
pub struct UnknownType(pub String);

/// Converts one SDK item, taking its strings and blobs.
pub fn item_from_sdk(item: HashMap<String, AttributeValue>) -> Result<Item, UnknownType> {
    item.into_iter()
        .map(|(name, value)| Ok((name, value_from_sdk(value)?)))
        .collect()
}

fn value_from_sdk(value: AttributeValue) -> Result<Value, UnknownType> {
    Ok(match value {
        AttributeValue::S(s) => Value::S(s),
        AttributeValue::N(n) => Value::N(Number::new(n)),
        AttributeValue::B(b) => Value::B(b.into_inner()),
        AttributeValue::Bool(b) => Value::Bool(b),
        AttributeValue::Null(_) => Value::Null,
        AttributeValue::M(m) => Value::M(item_from_sdk(m)?),
        AttributeValue::L(l) => Value::L(
            l.into_iter()
                .map(value_from_sdk)
                .collect::<Result<_, _>>()?,
        ),
        AttributeValue::Ss(ss) => Value::Ss(ss),
        AttributeValue::Ns(ns) => Value::Ns(ns.into_iter().map(Number::new).collect()),
        AttributeValue::Bs(bs) => Value::Bs(bs.into_iter().map(Blob::into_inner).collect()),
        other => return Err(UnknownType(format!("{other:?}"))),
    })
}

/// Converts one stream record's `Keys`, `NewImage` or `OldImage`, taking its strings and blobs.
/// The Streams SDK has its own `AttributeValue`, of the same shape as DynamoDB's.
pub fn item_from_streams(
    item: HashMap<String, StreamsAttributeValue>,
) -> Result<Item, UnknownType> {
    item.into_iter()
        .map(|(name, value)| Ok((name, value_from_streams(value)?)))
        .collect()
}

fn value_from_streams(value: StreamsAttributeValue) -> Result<Value, UnknownType> {
    type V = StreamsAttributeValue;
    Ok(match value {
        V::S(s) => Value::S(s),
        V::N(n) => Value::N(Number::new(n)),
        V::B(b) => Value::B(b.into_inner()),
        V::Bool(b) => Value::Bool(b),
        V::Null(_) => Value::Null,
        V::M(m) => Value::M(item_from_streams(m)?),
        V::L(l) => Value::L(
            l.into_iter()
                .map(value_from_streams)
                .collect::<Result<_, _>>()?,
        ),
        V::Ss(ss) => Value::Ss(ss),
        V::Ns(ns) => Value::Ns(ns.into_iter().map(Number::new).collect()),
        V::Bs(bs) => Value::Bs(bs.into_iter().map(Blob::into_inner).collect()),
        other => return Err(UnknownType(format!("{other:?}"))),
    })
}

/// Converts one of our items for a request (`ExclusiveStartKey`).
pub fn item_to_sdk(item: &Item) -> HashMap<String, AttributeValue> {
    item.iter()
        .map(|(name, value)| (name.clone(), value_to_sdk(value)))
        .collect()
}

/// Converts one of our values for a request.
pub fn value_to_sdk(value: &Value) -> AttributeValue {
    match value {
        Value::S(s) => AttributeValue::S(s.clone()),
        Value::N(n) => AttributeValue::N(n.as_str().to_string()),
        Value::B(b) => AttributeValue::B(Blob::new(b.clone())),
        Value::Bool(b) => AttributeValue::Bool(*b),
        Value::Null => AttributeValue::Null(true),
        Value::M(m) => AttributeValue::M(item_to_sdk(m)),
        Value::L(l) => AttributeValue::L(l.iter().map(value_to_sdk).collect()),
        Value::Ss(ss) => AttributeValue::Ss(ss.clone()),
        Value::Ns(ns) => AttributeValue::Ns(ns.iter().map(|n| n.as_str().to_string()).collect()),
        Value::Bs(bs) => AttributeValue::Bs(bs.iter().map(|b| Blob::new(b.clone())).collect()),
    }
}
