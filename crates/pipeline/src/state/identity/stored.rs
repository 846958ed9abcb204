//! The stored form of an [`Identity`] (`docs/state.md` §6.2): the JSON object state files,
//! keyed state tables and leader rows hold, encoded and decoded here only. Each field is
//! stored under its own name, an absent field is left out, and what this ddbpipe cannot read
//! is kept as stored (rule 6), so a stored identity reads back byte for byte.

use std::collections::BTreeMap;

use ddbpipe_source::config::{Mode, SnapshotEngine};
use ddbpipe_source::endpoint::mask_url;
use ddbpipe_value::{Value, ValueFormat, value_from_typed_json, value_to_typed_json};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serializer};
use serde_json::{Map, Value as Json};

use super::{FileCompression, Identity, SinkPath};

impl Identity {
    /// An identity read back from a state file or a leader row: its endpoint masked (rule
    /// 5), a field this ddbpipe does not know or whose value it cannot read kept as stored
    /// (rule 6). A value that is not an object holds no field.
    pub fn from_json(json: Json) -> Self {
        let Json::Object(fields) = json else {
            return Identity::default();
        };
        // Each field on its own: one that does not read is kept as it is.
        let (readable, unread): (Map<String, Json>, Map<String, Json>) =
            fields.into_iter().partition(|(key, value)| {
                let one = Map::from_iter([(key.clone(), value.clone())]);
                serde_json::from_value::<Identity>(Json::Object(one)).is_ok()
            });
        let mut identity: Identity =
            serde_json::from_value(Json::Object(readable)).unwrap_or_default();
        identity.unread = unread.into_iter().collect();
        if let Some(Some(url)) = &mut identity.endpoint_url {
            *url = mask_url(url);
        }
        identity
    }

    /// The identity a leader row's text holds; `None` when it is not a JSON object.
    pub fn parse(text: &str) -> Option<Self> {
        match serde_json::from_str(text) {
            Ok(json @ Json::Object(_)) => Some(Self::from_json(json)),
            _ => None,
        }
    }

    /// The identity as stored: a JSON object, its keys sorted.
    pub fn to_json(&self) -> Json {
        let mut json = serde_json::to_value(self)
            .expect("an identity serialises: its fields are strings, numbers and string maps");
        if let Json::Object(fields) = &mut json {
            fields.extend(self.unread.clone());
        }
        json
    }
}

/// An enum stored as its config spelling.
pub(super) trait Spelled: Copy + 'static {
    /// Every value with a spelling of its own.
    const ALL: &'static [Self];
    /// The spelling.
    fn spelling(self) -> &'static str;
}

impl Spelled for Mode {
    const ALL: &'static [Self] = &Mode::ALL;
    fn spelling(self) -> &'static str {
        self.as_str()
    }
}

impl Spelled for SnapshotEngine {
    const ALL: &'static [Self] = &SnapshotEngine::ALL;
    fn spelling(self) -> &'static str {
        self.as_str()
    }
}

impl Spelled for ValueFormat {
    // `PlainExact` is spelled `plain`: the identity holds `Plain` for it.
    const ALL: &'static [Self] = &[ValueFormat::Plain, ValueFormat::Typed];
    fn spelling(self) -> &'static str {
        self.as_str()
    }
}

/// A [`Spelled`] field.
pub(super) mod spelled {
    use super::*;

    pub fn serialize<S: Serializer, T: Spelled>(
        value: &Option<T>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_str(value.spelling()),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>, T: Spelled>(
        deserializer: D,
    ) -> Result<Option<T>, D::Error> {
        let text = String::deserialize(deserializer)?;
        match T::ALL.iter().find(|value| value.spelling() == text) {
            Some(value) => Ok(Some(*value)),
            None => Err(D::Error::custom(format!("unknown value '{text}'"))),
        }
    }
}

/// A field that may be null: `null` is `Some(None)`, absent (serde's default) `None`.
pub(super) fn held<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(deserializer).map(Some)
}

/// Expression values, stored as attribute JSON (docs/values.md §3.3); one whose attribute
/// JSON would not come back as stored does not read.
pub(super) mod typed_values {
    use super::*;

    pub fn serialize<S: Serializer>(
        values: &Option<BTreeMap<String, Value>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match values {
            Some(values) => serializer.collect_map(
                values
                    .iter()
                    .map(|(key, value)| (key, value_to_typed_json(value))),
            ),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Option<BTreeMap<String, Value>>, D::Error> {
        let stored = BTreeMap::<String, Json>::deserialize(deserializer)?;
        let mut values = BTreeMap::new();
        for (key, json) in stored {
            let value = value_from_typed_json(&json, &key).map_err(D::Error::custom)?;
            if value_to_typed_json(&value) != json {
                return Err(D::Error::custom(format!("{key} is not stored as written")));
            }
            values.insert(key, value);
        }
        Ok(Some(values))
    }
}

/// How a sink given in code is stored in `sink_path`: `custom <its name>` (a file's path is
/// absolute, so it never reads so).
const GIVEN: &str = "custom ";
/// How a Kafka topic is stored in `sink_path`: `kafka <topic>`.
const TOPIC: &str = "kafka ";

impl From<String> for SinkPath {
    fn from(path: String) -> Self {
        if path == "-" {
            SinkPath::Stdout
        } else if let Some(name) = path.strip_prefix(GIVEN) {
            SinkPath::Given(name.to_string())
        } else if let Some(topic) = path.strip_prefix(TOPIC) {
            SinkPath::Topic(topic.to_string())
        } else {
            SinkPath::File(path)
        }
    }
}

impl From<SinkPath> for String {
    fn from(path: SinkPath) -> Self {
        match path {
            SinkPath::Stdout => "-".to_string(),
            SinkPath::File(path) => path,
            SinkPath::Given(name) => format!("{GIVEN}{name}"),
            SinkPath::Topic(topic) => format!("{TOPIC}{topic}"),
        }
    }
}

impl From<bool> for FileCompression {
    fn from(gzip: bool) -> Self {
        if gzip {
            FileCompression::Gzip
        } else {
            FileCompression::None
        }
    }
}

impl From<FileCompression> for bool {
    fn from(compression: FileCompression) -> Self {
        compression == FileCompression::Gzip
    }
}
