//! Which stream a streams or mirror run reads (docs/streams.md §4.2), from the config and the table's
//! description, and what its view type leaves out.
//!
//! # Rules
//! 1. A configured `stream_arn` is the stream; its view type is known when it is the table's
//!    current stream.
//! 2. Otherwise the table's enabled stream; a disabled stream or none is a definite error
//!    naming the remedy.
//! 3. A view type without both images is read, with a warning naming what envelopes miss.
//! 4. Keyed sinks and mirror mode need new images: a view without them ([`lacks_new_images`])
//!    is refused, by `check` and by the run alike, with [`NEW_IMAGES_REMEDY`].

use crate::api::TableDescription;
use crate::config::SourceConfig;

/// What to do about a stream without new images (rule 4): the same words in `check` and
/// `run`.
pub const NEW_IMAGES_REMEDY: &str = "change the table's stream view type (disable and re-enable \
     the stream), or use a jsonl sink with mode: streams";

/// Whether a stream of view type `view` carries no new images (rule 4).
pub fn lacks_new_images(view: &str) -> bool {
    matches!(view, "KEYS_ONLY" | "OLD_IMAGE")
}

/// The stream a run reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedStream {
    /// Its ARN.
    pub arn: String,
    /// `StreamViewType`, when known from `DescribeTable`.
    pub view_type: Option<String>,
}

/// Definite: the table has no stream to read (rule 2).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoStream {
    /// Definite: the table's stream is disabled.
    #[error(
        "the stream of table '{table}' is disabled — enable it, or set stream_arn to drain the old stream"
    )]
    Disabled {
        /// The configured table name.
        table: String,
    },
    /// Definite: the table has no stream.
    #[error(
        "table '{table}' has no stream — enable DynamoDB Streams with NEW_AND_OLD_IMAGES, or set stream_arn"
    )]
    Missing {
        /// The configured table name.
        table: String,
    },
}

/// The configured `stream_arn`, read without describing the table (rule 1, view unknown).
pub fn configured_stream(source: &SourceConfig) -> Option<ResolvedStream> {
    source.stream_arn.as_ref().map(|arn| ResolvedStream {
        arn: arn.clone(),
        view_type: None,
    })
}

/// The stream of `source` on the described `table` (rules 1–2).
pub fn resolve_stream(
    source: &SourceConfig,
    table: &TableDescription,
) -> Result<ResolvedStream, NoStream> {
    if let Some(arn) = &source.stream_arn {
        return Ok(ResolvedStream {
            arn: arn.clone(),
            view_type: table
                .stream
                .as_ref()
                .filter(|s| s.arn.as_deref() == Some(arn.as_str()))
                .and_then(|s| s.view_type.clone()),
        });
    }
    let table_name = &source.table_name;
    let missing = || NoStream::Missing {
        table: table_name.clone(),
    };
    match table.stream.clone() {
        Some(stream) if stream.enabled => match stream.arn {
            Some(arn) => Ok(ResolvedStream {
                arn,
                view_type: stream.view_type,
            }),
            None => Err(missing()),
        },
        Some(_) => Err(NoStream::Disabled {
            table: table_name.clone(),
        }),
        None => Err(missing()),
    }
}

/// What a jsonl streams run will miss with this view type, if anything (rule 3).
pub fn view_warning(view_type: Option<&str>) -> Option<String> {
    match view_type? {
        "KEYS_ONLY" => Some(
            "the stream view is KEYS_ONLY: envelopes carry keys but no before/after images".into(),
        ),
        "NEW_IMAGE" => Some("the stream view is NEW_IMAGE: envelopes carry no before image".into()),
        "OLD_IMAGE" => Some("the stream view is OLD_IMAGE: envelopes carry no after image".into()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::StreamInfo;
    use crate::plan::read_rate::tests::table;

    fn with_stream(enabled: bool, arn: Option<&str>) -> TableDescription {
        let mut described = table("PROVISIONED", Some(1), None);
        described.stream = Some(StreamInfo {
            enabled,
            view_type: Some("NEW_IMAGE".into()),
            arn: arn.map(str::to_string),
        });
        described
    }

    #[test]
    fn the_tables_enabled_stream_is_read_with_its_view_type() {
        let source = SourceConfig::new("orders");
        assert_eq!(
            resolve_stream(&source, &with_stream(true, Some("arn:s"))),
            Ok(ResolvedStream {
                arn: "arn:s".into(),
                view_type: Some("NEW_IMAGE".into())
            })
        );
    }

    #[test]
    fn a_configured_arn_knows_its_view_type_only_when_it_is_the_tables_stream() {
        let mut source = SourceConfig::new("orders");
        source.stream_arn = Some("arn:old".into());
        let resolved = resolve_stream(&source, &with_stream(true, Some("arn:new"))).unwrap();
        assert_eq!(
            (resolved.arn.as_str(), resolved.view_type),
            ("arn:old", None)
        );
        let current = resolve_stream(&source, &with_stream(false, Some("arn:old"))).unwrap();
        assert_eq!(current.view_type.as_deref(), Some("NEW_IMAGE"));
        assert_eq!(
            configured_stream(&source).map(|s| s.arn),
            Some("arn:old".into())
        );
    }

    #[test]
    fn a_disabled_or_missing_stream_names_the_remedy() {
        let source = SourceConfig::new("orders");
        let disabled = resolve_stream(&source, &with_stream(false, Some("arn:s")));
        assert!(
            disabled
                .unwrap_err()
                .to_string()
                .contains("set stream_arn to drain")
        );
        let bare = table("PROVISIONED", Some(1), None);
        assert_eq!(
            resolve_stream(&source, &bare).unwrap_err(),
            NoStream::Missing {
                table: "orders".into()
            }
        );
        assert!(configured_stream(&source).is_none());
    }

    #[test]
    fn a_view_without_both_images_is_warned_about() {
        assert!(view_warning(Some("KEYS_ONLY")).is_some());
        assert!(view_warning(Some("NEW_AND_OLD_IMAGES")).is_none());
        assert!(view_warning(None).is_none());
    }
}
