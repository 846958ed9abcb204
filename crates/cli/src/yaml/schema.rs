//! The declared fields of each section of the pipeline file, and the JSON Schema made of them.
//!
//! Each section the walker reads (`source`, `source.retry`, the sink variants, `state`, …)
//! declares its keys once, in a table of [`Field`]s: the name, what it holds, whether it is
//! required or what its default is, and one line for the user. Both sides read these tables:
//!
//! 1. The walker (`fields`) opens every mapping with its section's table. It reads only
//!    declared keys, with the declared type and presence (debug assertions that every test of
//!    the config exercises), reports any other key as unknown, and suggests declared keys for
//!    a near miss.
//! 2. [`json_schema`] turns the same tables into a JSON Schema (draft 2020-12) for editors:
//!    `ddbpipe schema` prints it.
//!
//! So the schema cannot list a key the walker refuses, or miss one it accepts.
//!
//! # What the schema checks
//! Keys, types, enum values, required fields and defaults. The range and cross-field rules of
//! docs/config.md §1.3 stay with the loader (`check` reports them). A scalar that is not a free
//! string may also be written as a `${VAR}` reference, which interpolation replaces before the
//! type is checked (docs/config.md §1.1).

use serde_json::{Map, Value as Json, json};

use super::types::FromYaml;

/// One key of a section, as the walker reads it and the schema shows it.
#[derive(Debug)]
pub(crate) struct Field {
    /// The key in the file.
    pub(crate) name: &'static str,
    /// What the key holds.
    pub(crate) shape: Shape,
    /// Whether the key must be set, and what an absent one means.
    pub(crate) presence: Presence,
    /// One line for the user: the schema's `description`.
    pub(crate) description: &'static str,
}

/// What a key holds.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    /// A value read with [`FromYaml`]: its JSON Schema.
    Value(fn() -> Json),
    /// A mapping with these keys.
    Section(&'static [Field]),
    /// A mapping whose `tag` key (`type`) picks the variant, and so the other keys it has.
    Tagged {
        /// The key naming the variant; its values are the variants' tags.
        tag: &'static Field,
        /// Every variant, in documentation order.
        variants: &'static [Variant],
    },
    /// A mapping from names of the user's choice to values of this JSON Schema.
    Map(fn() -> Json),
    /// A list of mappings, each with these keys (`sink.columns`).
    List(&'static [Field]),
}

/// One variant of a [`Shape::Tagged`] mapping.
#[derive(Debug)]
pub(crate) struct Variant {
    /// The value of the tag key that selects it.
    pub(crate) tag: &'static str,
    /// One line for the user.
    pub(crate) description: &'static str,
    /// The keys it has besides the tag.
    pub(crate) fields: &'static [Field],
}

/// Whether a key must be set.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Presence {
    /// Absent or null is a "missing required field" error.
    Required,
    /// Absent or null means unset.
    Optional,
    /// Absent means this value, as JSON.
    Default(fn() -> Json),
    /// Required unless one of the other keys is set, which stand in for it
    /// (`source.table_name`, `source.tables`, `source.discover`: one of them); read as
    /// optional.
    Instead(&'static [&'static str]),
}

/// A required key.
pub(crate) const fn required(name: &'static str, shape: Shape, description: &'static str) -> Field {
    Field {
        name,
        shape,
        presence: Presence::Required,
        description,
    }
}

/// A key that other keys stand in for: one of them must be set.
pub(crate) const fn either(
    name: &'static str,
    others: &'static [&'static str],
    shape: Shape,
    description: &'static str,
) -> Field {
    Field {
        name,
        shape,
        presence: Presence::Instead(others),
        description,
    }
}

/// A key that may be unset.
pub(crate) const fn optional(name: &'static str, shape: Shape, description: &'static str) -> Field {
    Field {
        name,
        shape,
        presence: Presence::Optional,
        description,
    }
}

/// A key with a default.
pub(crate) const fn defaulted(
    name: &'static str,
    shape: Shape,
    default: fn() -> Json,
    description: &'static str,
) -> Field {
    Field {
        name,
        shape,
        presence: Presence::Default(default),
        description,
    }
}

/// The shape of a value of type `T`.
pub(crate) const fn of<T: FromYaml>() -> Shape {
    Shape::Value(T::schema)
}

/// A value of any kind (plain YAML).
pub(crate) fn any_value() -> Json {
    json!(true)
}

/// A mapping of any keys (attribute JSON).
pub(crate) fn any_mapping() -> Json {
    json!({"type": "object"})
}

/// The URI of the JSON Schema dialect [`json_schema`] writes.
const DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

/// The JSON Schema of the pipeline file (draft 2020-12), from its declared top-level
/// `fields`.
pub fn json_schema(top: &[Field]) -> Json {
    let mut schema = Map::new();
    schema.insert("$schema".into(), json!(DIALECT));
    schema.insert("title".into(), json!("ddbpipe pipeline file"));
    schema.insert(
        "description".into(),
        json!(format!(
            "One ddbpipe pipeline: what to read from DynamoDB, where to write it, where the \
             position is kept. Written by `ddbpipe schema` ({}).",
            env!("CARGO_PKG_VERSION")
        )),
    );
    if let Json::Object(section) = section_schema(top) {
        schema.extend(section);
    }
    Json::Object(schema)
}

/// A mapping with exactly `fields`.
fn section_schema(fields: &[Field]) -> Json {
    let properties: Map<String, Json> = fields
        .iter()
        .map(|field| (field.name.to_owned(), field_schema(field)))
        .collect();
    let required: Vec<&str> = fields
        .iter()
        .filter(|field| matches!(field.presence, Presence::Required))
        .map(|field| field.name)
        .collect();
    let mut schema = json!({
        "type": "object",
        "properties": properties,
        "additionalProperties": false,
    });
    if !required.is_empty() {
        schema["required"] = json!(required);
    }
    // One `anyOf` per group of keys that stand in for each other (each key of the group
    // names the others: the group is listed once).
    let mut groups: Vec<Vec<&str>> = Vec::new();
    for field in fields {
        if let Presence::Instead(others) = field.presence {
            let mut group: Vec<&str> = others.iter().copied().chain([field.name]).collect();
            group.sort_unstable();
            if !groups.contains(&group) {
                groups.push(group);
            }
        }
    }
    let either: Vec<Json> = groups
        .iter()
        .map(|group| {
            let alternatives: Vec<Json> = group
                .iter()
                .map(|name| json!({"required": [name]}))
                .collect();
            json!({"anyOf": alternatives})
        })
        .collect();
    if !either.is_empty() {
        schema["allOf"] = json!(either);
    }
    schema
}

/// The schema of one key, with its description and default.
fn field_schema(field: &Field) -> Json {
    let mut schema = match field.shape {
        Shape::Value(schema) => interpolable(schema()),
        Shape::Section(fields) => section_schema(fields),
        Shape::Tagged { tag, variants } => tagged_schema(tag, variants),
        Shape::Map(values) => json!({"type": "object", "additionalProperties": values()}),
        Shape::List(fields) => json!({"type": "array", "items": section_schema(fields)}),
    };
    schema["description"] = json!(field.description);
    if let Presence::Default(default) = field.presence {
        schema["default"] = default();
    }
    schema
}

/// A mapping whose `tag` selects one of `variants`: one branch per variant, each closed.
fn tagged_schema(tag: &Field, variants: &[Variant]) -> Json {
    let tags: Vec<&str> = variants.iter().map(|variant| variant.tag).collect();
    let branches: Vec<Json> = variants
        .iter()
        .map(|variant| {
            let mut branch = section_schema(variant.fields);
            branch["properties"][tag.name] = json!({"const": variant.tag});
            let mut required = vec![json!(tag.name)];
            if let Some(Json::Array(names)) = branch.get("required") {
                required.extend(names.iter().cloned());
            }
            branch["required"] = Json::Array(required);
            branch["description"] = json!(variant.description);
            branch
        })
        .collect();
    json!({
        "type": "object",
        "properties": {tag.name: {"enum": tags, "description": tag.description}},
        "required": [tag.name],
        "oneOf": branches,
    })
}

/// A scalar schema that also admits a `${VAR}` reference, unless any string passes already.
fn interpolable(schema: Json) -> Json {
    let free_string = schema.get("type") == Some(&json!("string")) && schema.get("enum").is_none();
    if free_string || schema == json!(true) {
        return schema;
    }
    json!({
        "anyOf": [
            schema,
            {
                "type": "string",
                "pattern": "\\$\\{",
                "description": "a ${VAR} reference, replaced before the type is checked",
            },
        ],
    })
}
