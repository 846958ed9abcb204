//! The `credentials:` section of `source:` (docs/config.md §1.4): its field tables, one per
//! credential type, and their reading into [`Credentials`].

use ddbpipe_source::config::{Credentials, Secret, defaults};

use crate::yaml::fields::{Fields, Stage, join};
use crate::yaml::schema::{Field, Shape, Variant, defaulted, of, optional, required};
use crate::yaml::types::Choice;
use serde_json::json;

/// `source.credentials.type`.
pub(super) static CREDENTIALS_TYPE: Field = required(
    "type",
    of::<CredentialsType>(),
    "Where the credentials come from (docs/config.md §1.4).",
);

/// The variants of `source.credentials`, each with its `config`.
pub(super) static CREDENTIALS: &[Variant] = &[
    Variant {
        tag: "default",
        description: "The AWS default chain (environment, shared files, SSO, container, web \
                      identity, instance metadata); takes no config.",
        fields: &[],
    },
    Variant {
        tag: "profile",
        description: "A named profile of the shared AWS files.",
        fields: &[required(
            "config",
            Shape::Section(PROFILE),
            "The profile to use.",
        )],
    },
    Variant {
        tag: "access_key",
        description: "Static keys (use ${VAR} for the secret).",
        fields: &[required(
            "config",
            Shape::Section(ACCESS_KEY),
            "The keys; never printed.",
        )],
    },
    Variant {
        tag: "assume_role",
        description: "STS AssumeRole on top of the default chain.",
        fields: &[required(
            "config",
            Shape::Section(ASSUME_ROLE),
            "The role to assume.",
        )],
    },
    Variant {
        tag: "web_identity",
        description: "The default chain, stating that it uses a web identity; takes no config.",
        fields: &[],
    },
];

static PROFILE: &[Field] = &[required(
    "name",
    of::<String>(),
    "The profile name; it also drives the region.",
)];

static ACCESS_KEY: &[Field] = &[
    required(
        "access_key_id",
        of::<String>(),
        "The access key id; not empty.",
    ),
    required(
        "secret_access_key",
        of::<Secret>(),
        "The secret access key; not empty, never printed.",
    ),
    optional(
        "session_token",
        of::<Secret>(),
        "The session token of temporary keys; never printed.",
    ),
];

static ASSUME_ROLE: &[Field] = &[
    required("role_arn", of::<String>(), "The ARN of the role to assume."),
    defaulted(
        "session_name",
        of::<String>(),
        || json!(defaults::SESSION_NAME),
        "The role session name.",
    ),
    optional(
        "external_id",
        of::<String>(),
        "The external id the role's trust policy asks for.",
    ),
];

/// The `type` of `credentials`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CredentialsType {
    Default,
    Profile,
    AccessKey,
    AssumeRole,
    WebIdentity,
}

impl Choice for CredentialsType {
    fn all() -> &'static [Self] {
        &[
            CredentialsType::Default,
            CredentialsType::Profile,
            CredentialsType::AccessKey,
            CredentialsType::AssumeRole,
            CredentialsType::WebIdentity,
        ]
    }
    fn name(self) -> &'static str {
        match self {
            CredentialsType::Default => "default",
            CredentialsType::Profile => "profile",
            CredentialsType::AccessKey => "access_key",
            CredentialsType::AssumeRole => "assume_role",
            CredentialsType::WebIdentity => "web_identity",
        }
    }
}

/// `credentials: {type: <variant>, config: {...}}` (docs/config.md §1.4). A problem leaves the default
/// credentials in place; the run does not start anyway.
pub(super) fn read_credentials(mut f: Fields<'_>) -> Credentials {
    let Some(kind) = f.required::<CredentialsType>("type") else {
        // Without a known type the keys of `config` cannot be checked: skip it.
        f.skip("config");
        f.finish();
        return Credentials::Default;
    };
    f.select(kind.name());
    let credentials = match kind {
        CredentialsType::Default | CredentialsType::WebIdentity => {
            let message = format!("credentials of type {} take no config", kind.name());
            f.refuse("config", &message);
            if kind == CredentialsType::Default {
                Some(Credentials::Default)
            } else {
                Some(Credentials::WebIdentity)
            }
        }
        _ => f
            .section_or_empty("config")
            .and_then(|config| read_config(kind, config)),
    };
    f.finish();
    credentials.unwrap_or_default()
}

/// The `config` map of the credential types that take one.
fn read_config(kind: CredentialsType, mut f: Fields<'_>) -> Option<Credentials> {
    let credentials = match kind {
        CredentialsType::Profile => f.required("name").map(|name| Credentials::Profile { name }),
        CredentialsType::AccessKey => {
            let access_key_id = f.required::<String>("access_key_id");
            let secret_access_key = f.required::<Secret>("secret_access_key");
            for (key, empty) in [
                (
                    "access_key_id",
                    access_key_id.as_ref().is_some_and(String::is_empty),
                ),
                (
                    "secret_access_key",
                    secret_access_key
                        .as_ref()
                        .is_some_and(|s| s.expose().is_empty()),
                ),
            ] {
                if empty {
                    let path = join(f.path(), key);
                    let message =
                        format!("{key} must not be empty (is the variable it comes from set?)");
                    f.report().error(Stage::Type, &path, message);
                }
            }
            let session_token = f.get::<Secret>("session_token");
            access_key_id
                .zip(secret_access_key)
                .map(
                    |(access_key_id, secret_access_key)| Credentials::AccessKey {
                        access_key_id,
                        secret_access_key,
                        session_token,
                    },
                )
        }
        CredentialsType::AssumeRole => {
            let role_arn = f.required::<String>("role_arn");
            let session_name = f.or("session_name", defaults::SESSION_NAME.to_owned());
            let external_id = f.get("external_id");
            role_arn.map(|role_arn| Credentials::AssumeRole {
                role_arn,
                session_name,
                external_id,
            })
        }
        CredentialsType::Default | CredentialsType::WebIdentity => None,
    };
    f.finish();
    credentials
}
