//! A table's key schema: its key attributes, hash first, then range, each with its declared
//! type, and the check that an item's key has them (an export's items, which did not come from
//! DynamoDB's API, are held to it).

/// The type of a key attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyType {
    /// String.
    S,
    /// Number.
    N,
    /// Binary.
    B,
}

impl KeyType {
    /// `"S"`, `"N"` or `"B"`.
    pub fn tag(self) -> &'static str {
        match self {
            KeyType::S => "S",
            KeyType::N => "N",
            KeyType::B => "B",
        }
    }
}

/// One key attribute: hash first, then range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyAttribute {
    /// Attribute name.
    pub name: String,
    /// Declared type.
    pub key_type: KeyType,
}

/// The key attributes `type_of` finds (their type tags) match `key_schema`: each one is there,
/// of the schema's type; the problem names the first that is not.
pub(crate) fn check_key<'a>(
    key_schema: &[KeyAttribute],
    type_of: impl Fn(&str) -> Option<&'a str>,
) -> Result<(), String> {
    for key in key_schema {
        match type_of(&key.name) {
            None => return Err(format!("the item has no key attribute '{}'", key.name)),
            Some(found) if found != key.key_type.tag() => {
                return Err(format!(
                    "key attribute '{}' is of type {found}, but the table's key schema says {}",
                    key.name,
                    key.key_type.tag()
                ));
            }
            Some(_) => {}
        }
    }
    Ok(())
}
