//! The JSON Schema and the walker agree key for key, and every pipeline file the project shows
//! or writes matches the schema.

use std::path::Path;

use serde_json::{Value as Json, json};

use super::json_schema;
use super::{TOP, parse};
use crate::args::{AwsArgs, DEFAULT_SAMPLE, InitArgs, InitColumns, InitMode, InitSink};
use crate::sinks::keyed::Dialect;
use crate::yaml::schema::{Field, Presence, Shape};

fn validator() -> jsonschema::Validator {
    let schema = json_schema();
    jsonschema::meta::validate(&schema).expect("the schema is a valid draft 2020-12 schema");
    jsonschema::draft202012::new(&schema).expect("the schema compiles")
}

fn schema_errors(validator: &jsonschema::Validator, document: &Json) -> Vec<String> {
    validator
        .iter_errors(document)
        .map(|error| format!("{}: {error}", error.instance_path()))
        .collect()
}

/// The walker's errors for `document`, one line each.
fn walker_errors(document: &Json) -> Vec<String> {
    // JSON is YAML.
    let text = serde_json::to_string(document).expect("JSON");
    match parse(&text, Path::new("/etc/ddbpipe"), &|_| Some("x".to_string())) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.0.iter().map(ToString::to_string).collect(),
    }
}

// --- The schema and the walker agree ----------------------------------------------------------

/// A value the declared shape accepts.
fn sample(field: &Field) -> Json {
    match field.shape {
        Shape::Value(schema) => value_sample(&schema()),
        Shape::Section(fields) => filled(fields),
        Shape::Tagged { tag, variants } => variant_sample(tag, &variants[0]),
        Shape::Map(_) => json!({}),
        Shape::List(fields) => json!([filled(fields)]),
    }
}

/// A value `schema` accepts (of its first alternative, when it has several).
fn value_sample(schema: &Json) -> Json {
    if let Some(first) = schema.get("anyOf").and_then(|schemas| schemas.get(0)) {
        return value_sample(first);
    }
    if let Some(first) = schema.get("enum").and_then(|names| names.get(0)) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("string") => json!("x"),
        Some("integer") => json!(1),
        Some("number") => json!(0.5),
        Some("boolean") => json!(true),
        Some("array") => json!([value_sample(&schema["items"])]),
        _ => json!({}),
    }
}

/// A mapping with every required field of `fields` set.
fn filled(fields: &[Field]) -> Json {
    let mut mapping = json!({});
    for field in fields {
        // Of two keys that stand in for each other, the first declared.
        let instead_of_one_set = match field.presence {
            Presence::Instead(others) => others.iter().all(|other| mapping.get(other).is_none()),
            _ => false,
        };
        if matches!(field.presence, Presence::Required) || instead_of_one_set {
            mapping[field.name] = sample(field);
        }
    }
    mapping
}

fn variant_sample(tag: &Field, variant: &crate::yaml::schema::Variant) -> Json {
    let mut mapping = filled(variant.fields);
    mapping[tag.name] = json!(variant.tag);
    mapping
}

/// A mapping of the file: how to reach it from the top (each key with the value that opens it
/// there), and the keys declared in it.
struct Site {
    steps: Vec<(&'static str, Json)>,
    declared: Vec<&'static Field>,
    /// For a variant of a tagged mapping, the keys of the other variants it does not have.
    others: Vec<&'static Field>,
}

impl Site {
    fn path(&self, key: &str) -> String {
        let mut parts: Vec<String> = self
            .steps
            .iter()
            .map(|(step, opening)| match opening {
                // A list's site is its first element.
                Json::Array(_) => format!("{step}[0]"),
                _ => step.to_string(),
            })
            .collect();
        parts.push(key.to_string());
        parts.join(".")
    }

    /// A valid file with `key: value` added in this mapping.
    fn document(&self, key: &str, value: Json) -> Json {
        let mut document = filled(TOP);
        let mut at = &mut document;
        for (step, opening) in &self.steps {
            let same_variant =
                at[*step].is_object() && at[*step].get("type") == opening.get("type");
            if !same_variant {
                at[*step] = opening.clone();
            }
            at = &mut at[*step];
            if at.is_array() {
                at = &mut at[0];
            }
        }
        at[key] = value;
        document
    }
}

/// Every mapping declared under `steps`, this one (`declared`) last.
fn sites(
    steps: Vec<(&'static str, Json)>,
    declared: Vec<&'static Field>,
    others: Vec<&'static Field>,
    out: &mut Vec<Site>,
) {
    for field in &declared {
        let mut inner = steps.clone();
        match field.shape {
            Shape::Section(fields) => {
                inner.push((field.name, filled(fields)));
                sites(inner, fields.iter().collect(), Vec::new(), out);
            }
            Shape::Tagged { tag, variants } => {
                for variant in variants {
                    let mut inner = steps.clone();
                    inner.push((field.name, variant_sample(tag, variant)));
                    let declared: Vec<&Field> = variant.fields.iter().collect();
                    let others = variants
                        .iter()
                        .flat_map(|other| other.fields.iter())
                        .filter(|other| declared.iter().all(|own| own.name != other.name))
                        .collect();
                    let mut with_tag = vec![tag];
                    with_tag.extend(declared);
                    sites(inner, with_tag, others, out);
                }
            }
            Shape::List(fields) => {
                inner.push((field.name, json!([filled(fields)])));
                sites(inner, fields.iter().collect(), Vec::new(), out);
            }
            Shape::Value(_) | Shape::Map(_) => {}
        }
    }
    out.push(Site {
        steps,
        declared,
        others,
    });
}

fn every_site() -> Vec<Site> {
    let mut out = Vec::new();
    sites(Vec::new(), TOP.iter().collect(), Vec::new(), &mut out);
    out
}

/// Issue 11: every key the schema declares, the walker reads, and a key the schema does not
/// declare there, the walker refuses. Both directions are derived from the declarations.
#[test]
fn the_schema_and_the_walker_accept_and_refuse_the_same_keys() {
    let validator = validator();
    let sites = every_site();
    assert!(sites.len() >= 10, "{} mappings", sites.len());
    for site in &sites {
        for field in &site.declared {
            // The tag is set by the site's opening value.
            if field.name == "type"
                && site
                    .steps
                    .last()
                    .is_some_and(|(_, v)| v.get("type").is_some())
            {
                continue;
            }
            let path = site.path(field.name);
            let document = site.document(field.name, sample(field));
            let unknown: Vec<String> = walker_errors(&document)
                .into_iter()
                .filter(|line| line.contains("unknown field"))
                .collect();
            assert!(unknown.is_empty(), "the walker refuses {path}: {unknown:?}");
            let errors = schema_errors(&validator, &document);
            assert!(
                errors.is_empty(),
                "the schema refuses {path}: {errors:?}\n{document}"
            );
        }
        let path = site.path("not_a_field");
        let document = site.document("not_a_field", json!(1));
        let line = format!("config error: {path}: unknown field");
        let errors = walker_errors(&document);
        assert!(errors.contains(&line), "{path}: {errors:?}");
        assert!(
            validator.validate(&document).is_err(),
            "the schema accepts {path}"
        );
        for other in &site.others {
            let path = site.path(other.name);
            let document = site.document(other.name, sample(other));
            let at = format!("config error: {path}: ");
            let errors = walker_errors(&document);
            assert!(
                errors.iter().any(|line| line.starts_with(&at)),
                "the walker accepts {path}: {errors:?}"
            );
            assert!(
                validator.validate(&document).is_err(),
                "the schema accepts {path}"
            );
        }
    }
}

/// Every key has a description for the editor to show.
#[test]
fn every_declared_key_has_a_description() {
    for site in every_site() {
        for field in &site.declared {
            let path = site.path(field.name);
            assert!(
                field.description.ends_with('.') && field.description.len() > 10,
                "{path}: {:?}",
                field.description
            );
        }
    }
}

// --- Every pipeline file shown or written matches the schema ----------------------------------

/// The pipeline examples of the README and the docs: full files, and sections (`sink: …`)
/// completed with a minimal name and source.
fn documented_examples() -> Vec<(String, Json)> {
    let root = ddbpipe_testkit::repository();
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("a docs entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    let mut examples = Vec::new();
    for page in pages {
        let text = std::fs::read_to_string(&page).expect("a page");
        for (index, block) in text.split("```yaml\n").skip(1).enumerate() {
            let Some((yaml, _)) = block.split_once("```") else {
                continue;
            };
            // A block of several documents (a Kubernetes example) holds no pipeline at its top.
            if yaml.lines().any(|line| line.trim_end() == "---") {
                continue;
            }
            let mut document: Json = yaml_serde::from_str(yaml).expect("the example is YAML");
            let top_keys = TOP
                .iter()
                .filter(|f| document.get(f.name).is_some())
                .count();
            if top_keys == 0 {
                continue;
            }
            for (key, value) in [
                ("name", json!("example")),
                ("source", json!({"table_name": "orders"})),
                ("sink", json!({"type": "jsonl"})),
            ] {
                if document.get(key).is_none() {
                    document[key] = value;
                }
            }
            examples.push((format!("{} block {}", page.display(), index + 1), document));
        }
    }
    examples
}

/// What `ddbpipe init` writes for every mode and sink.
fn init_outputs() -> Vec<(String, Json)> {
    init_texts()
        .into_iter()
        .map(|(what, text)| {
            let document = yaml_serde::from_str(&text).expect("init writes YAML");
            (what, document)
        })
        .collect()
}

/// `init`'s file for every mode and sink, as text.
fn init_texts() -> Vec<(String, String)> {
    use ddbpipe_source::api::{KeyAttribute, KeyType, TableDescription};
    let table = TableDescription {
        name: "orders".into(),
        arn: None,
        status: Some("ACTIVE".into()),
        item_count: Some(10),
        size_bytes: Some(3 << 30),
        billing_mode: Some("PAY_PER_REQUEST".into()),
        key_schema: vec![KeyAttribute {
            name: "pk".into(),
            key_type: KeyType::S,
        }],
        read_capacity_units: None,
        max_read_request_units: None,
        indexes: Vec::new(),
        stream: None,
    };
    let mut outputs = Vec::new();
    for mode in [InitMode::Scan, InitMode::Streams, InitMode::Mirror] {
        for sink in [
            InitSink::Jsonl,
            InitSink::Sqlite,
            InitSink::Postgres,
            InitSink::Parquet,
            InitSink::Iceberg,
        ] {
            let args = InitArgs {
                table: "orders".into(),
                mode,
                sink,
                aws: AwsArgs {
                    region: Some("eu-west-1".into()),
                    endpoint_url: Some("http://localhost:8000".parse().unwrap()),
                    profile: Some("analytics".into()),
                },
                output: None,
                columns: None,
                sample: DEFAULT_SAMPLE,
            };
            let text = crate::init::pipeline(&args, &table, None);
            outputs.push((format!("init --mode {mode:?} --sink {sink:?}"), text));
            if sink == InitSink::Jsonl {
                continue;
            }
            // `--columns auto`, from a sample of every kind of attribute.
            let dialect = match sink {
                InitSink::Postgres => Dialect::Postgres,
                InitSink::Parquet | InitSink::Iceberg => Dialect::Lake,
                _ => Dialect::Sqlite,
            };
            let inference = crate::init::infer(&sampled_items(), &["pk".to_string()], dialect);
            let args = InitArgs {
                columns: Some(InitColumns::Auto),
                ..args
            };
            let text = crate::init::pipeline(&args, &table, Some(&inference));
            assert!(text.contains("  columns:"), "{text}");
            outputs.push((
                format!("init --mode {mode:?} --sink {sink:?} --columns auto"),
                text,
            ));
        }
    }
    outputs
}

/// Items with an attribute of every kind, and names a path or YAML must quote.
fn sampled_items() -> Vec<ddbpipe_value::Item> {
    use ddbpipe_value::{Item, Number, Value};
    let n = |text: &str| Value::N(Number::new(text));
    let s = |text: &str| Value::S(text.to_string());
    let first: Item = [
        ("pk", s("k1")),
        ("status", s("paid")),
        ("total", n("12.5")),
        ("qty", n("3")),
        ("paid", Value::Bool(true)),
        ("created_at", s("2024-05-01T12:30:00Z")),
        ("tags", Value::Ss(vec!["a".into()])),
        ("address", Value::M(Item::new())),
        ("a.b", s("dotted")),
        ("yes", n("1")),
        ("mixed", s("x")),
        ("blob", Value::B(vec![1, 2, 3])),
        ("document", s("named like the document column")),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect();
    let mut second = first.clone();
    second.insert("mixed".into(), n("1"));
    second.insert("pk".into(), s("k2"));
    vec![first, second]
}

/// Issue 11: the README's and the docs' examples, `init`'s files and the demo's files are
/// valid against the schema (an editor using it shows no false error on them).
#[test]
fn every_example_and_written_pipeline_matches_the_schema() {
    let validator = validator();
    let mut files = documented_examples();
    assert!(files.len() >= 8, "found {} examples", files.len());
    files.extend(init_outputs());
    #[cfg(feature = "demo")]
    for (name, text) in crate::demo::pipeline_files() {
        let document = yaml_serde::from_str(&text).expect("the demo writes YAML");
        files.push((format!("demo {name}"), document));
    }
    for (what, document) in &files {
        let errors = schema_errors(&validator, document);
        assert!(errors.is_empty(), "{what}: {errors:?}\n{document:#}");
    }
}

/// The schema catches what an editor should flag: a mistyped key, a wrong type, an unknown
/// choice, a sink key of another sink, a missing required field. A `${VAR}` stands for any
/// scalar.
#[test]
fn the_schema_flags_mistakes_and_admits_interpolation() {
    let validator = validator();
    let base = || json!({"name": "t", "source": {"table_name": "o"}, "sink": {"type": "jsonl"}});
    let mistakes = [
        ("/source/segmnets", json!(4)),
        ("/source/segments", json!("4")),
        ("/source/mode", json!("scna")),
        ("/sink/url", json!("postgres://h/db")),
    ];
    for (pointer, value) in mistakes {
        let mut document = base();
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        document.pointer_mut(parent).expect("the parent")[key] = value;
        assert!(!validator.is_valid(&document), "{pointer}: {document}");
    }
    let mut missing = base();
    missing["source"] = json!({"mode": "scan"});
    assert!(!validator.is_valid(&missing));
    let mut interpolated = base();
    interpolated["source"]["segments"] = json!("${SEGMENTS}");
    interpolated["source"]["mode"] = json!("${MODE:-scan}");
    interpolated["sink"]["gzip"] = json!("${GZIP}");
    let errors = schema_errors(&validator, &interpolated);
    assert!(errors.is_empty(), "{errors:?}");
}

/// `init` writes a pipeline that loads for every mode and sink: the schema does not check the
/// cross-field rules (`on_gap: resnapshot` into jsonl needs `resnapshot_deletes: false`).
#[test]
fn every_pipeline_init_writes_loads_with_every_rule() {
    for (what, text) in init_texts() {
        if let Err(errors) =
            super::parse(&text, std::path::Path::new("."), &|_| Some("x".to_string()))
        {
            panic!("{what}: {errors}\n{text}");
        }
    }
}
