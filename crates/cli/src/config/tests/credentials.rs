//! The credentials section: every variant, wrong shapes, secrets never shown.

use super::*;

#[test]
fn credentials_read_every_variant() {
    let cases = [
        ("{type: default}", Credentials::Default),
        ("{type: web_identity}", Credentials::WebIdentity),
        (
            "{type: profile, config: {name: prod}}",
            Credentials::Profile {
                name: "prod".into(),
            },
        ),
        (
            "{type: access_key, config: {access_key_id: AKIA, secret_access_key: '${SECRET}', \
             session_token: tok}}",
            Credentials::AccessKey {
                access_key_id: "AKIA".into(),
                secret_access_key: Secret::new("wJalrXUtnFEMI"),
                session_token: Some(Secret::new("tok")),
            },
        ),
        (
            "{type: assume_role, config: {role_arn: 'arn:aws:iam::1:role/r'}}",
            Credentials::AssumeRole {
                role_arn: "arn:aws:iam::1:role/r".into(),
                session_name: "ddbpipe".into(),
                external_id: None,
            },
        ),
        (
            "{type: assume_role, config: {role_arn: r, session_name: s, external_id: e}}",
            Credentials::AssumeRole {
                role_arn: "r".into(),
                session_name: "s".into(),
                external_id: Some("e".into()),
            },
        ),
    ];
    for (yaml, expected) in cases {
        assert_eq!(
            source_of(&format!("credentials: {yaml}")).credentials,
            expected,
            "{yaml}"
        );
    }
}

#[test]
fn credentials_refuse_a_wrong_shape() {
    let cases = [
        (
            "{type: default, config: {name: x}}",
            vec!["source.credentials.config: credentials of type default take no config"],
        ),
        (
            "{type: profile}",
            vec!["source.credentials.config.name: missing required field"],
        ),
        (
            "{type: access_key, config: {access_key_id: a, secret_key: b}}",
            vec![
                "source.credentials.config.secret_key: unknown field",
                "source.credentials.config.secret_access_key: missing required field",
            ],
        ),
        (
            "{type: sso}",
            vec![
                // Issue 9 item 4(c): no value under credentials is shown, not even a type.
                "source.credentials.type: unknown value \"***\", expected one of default, \
                 profile, access_key, assume_role, web_identity",
            ],
        ),
        (
            "{config: {name: x}}",
            vec!["source.credentials.type: missing required field"],
        ),
    ];
    for (yaml, expected) in cases {
        let expected: Vec<String> = expected
            .iter()
            .map(|line| format!("config error: {line}"))
            .collect();
        assert_eq!(
            source_errors(&format!("credentials: {yaml}")),
            expected,
            "{yaml}"
        );
    }
}

#[test]
fn secrets_never_appear_in_debug_output_or_errors() {
    let credentials = source_of(
        "credentials: {type: access_key, config: {access_key_id: AKIAEXAMPLE, \
         secret_access_key: wJalrXUtnFEMI, session_token: sessiontok}}",
    )
    .credentials;
    let debug = format!("{credentials:?}");
    assert!(debug.contains("AKIAEXAMPLE"), "{debug}");
    assert!(debug.contains("***"), "{debug}");
    assert!(
        !debug.contains("wJalrXUtnFEMI") && !debug.contains("sessiontok"),
        "{debug}"
    );
    assert_eq!(Secret::new("x").to_string(), "***");

    let lines = source_errors(
        "credentials: {type: access_key, config: {access_key_id: a, secret_access_key: 12345}}",
    );
    assert_eq!(
        lines,
        [
            "config error: source.credentials.config.secret_access_key: expected a string, found a \
          number"
        ]
    );
}
