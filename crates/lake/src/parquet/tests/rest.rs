//! The writer committing to an Iceberg table in a REST catalog (`catalog/rest.rs`, `iceberg`
//! rules 5 and 7), on the tests' REST catalog (pyiceberg's `SqlCatalog` behind the API's
//! routes: `ddbpipe_testkit::iceberg_rest`).

use ::iceberg::TableUpdate;
use ::iceberg::spec::TableMetadata;
use ddbpipe_source::config::Secret;
use ddbpipe_source::retry::RetryPolicy;
use ddbpipe_testkit::iceberg_rest::RestCatalogServer;

use super::*;
use crate::iceberg::{IcebergSettings, RestAuth, RestCatalog};

/// A fast retry budget: a test's faults pass in milliseconds.
fn retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 4,
        initial_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        attempt_timeout: Duration::from_secs(30),
    }
}

fn warehouse(dir: &Path) -> std::path::PathBuf {
    dir.join("warehouse")
}

/// The server of a test in `dir`, with `options`.
fn server(dir: &Path, options: &[&str]) -> RestCatalogServer {
    std::fs::create_dir_all(warehouse(dir)).unwrap();
    let warehouse = warehouse(dir).display().to_string();
    RestCatalogServer::start(dir, &warehouse, options)
}

fn catalog(server: &RestCatalogServer, auth: RestAuth) -> RestCatalog {
    RestCatalog::new(&server.uri, None, auth, retry()).unwrap()
}

fn rest_settings(dir: &Path, catalog: RestCatalog) -> ParquetSettings {
    ParquetSettings {
        objects: Objects::Local(warehouse(dir)),
        iceberg: Some(IcebergSettings {
            catalog: catalog.into(),
            namespace: "dynamodb".into(),
            table: "orders".into(),
            properties: Default::default(),
        }),
        ..settings(dir, Duration::ZERO)
    }
}

/// The table as the catalog holds it now.
async fn held(catalog: &RestCatalog) -> (String, TableMetadata) {
    catalog.load("dynamodb", "orders").await.unwrap().unwrap()
}

/// The scan branch's total of records.
fn scanned(metadata: &TableMetadata) -> String {
    let head = metadata.snapshot_for_ref("ddbpipe-scan").unwrap();
    head.summary().additional_properties["total-records"].clone()
}

/// Rules 5 and 7: the table is registered, each commit is the catalog's (the server writes
/// its metadata), another writer's commit in between is built on, and a new run's claim —
/// the claim branch moved — fences the first run, whose batch is not committed.
#[tokio::test]
async fn a_rest_catalog_takes_the_commits_and_a_new_claim_fences_the_old_run() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &["--prefix", "wh/one"]);
    let rest = catalog(&server, RestAuth::default());
    let (mut sink, mut store) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    assert_eq!(store.load("orders").await.unwrap(), None);
    sink.start(RunStart::Fresh).await.unwrap();
    let (first, staged) = batch(0, 10);
    sink.write(&first, Some(&staged)).await.unwrap();
    let (location, metadata) = held(&rest).await;
    assert!(location.contains("/metadata/"), "{location}");
    assert_eq!(scanned(&metadata), "10");
    // Rule 7: the table was created holding its creator's claim snapshot, no second version.
    let created = metadata
        .snapshot_for_ref("ddbpipe-claim")
        .unwrap()
        .snapshot_id();
    assert_eq!(
        metadata.snapshots().count(),
        2,
        "the claim's and the scan's"
    );

    // Another writer's commit (a property) in between: the next commit is built on it.
    let owner = TableUpdate::SetProperties {
        updates: [("owner".to_string(), "spark".to_string())].into(),
    };
    let refs = ["main"];
    let foreign = rest.commit("dynamodb", "orders", &metadata, &refs, vec![owner], None);
    assert!(foreign.await.unwrap().is_some());
    let (second, staged) = batch(10, 20);
    sink.write(&second, Some(&staged)).await.unwrap();
    let (_, metadata) = held(&rest).await;
    assert_eq!(metadata.properties()["owner"], "spark");
    assert_eq!(scanned(&metadata), "20");

    // A new run's claim moves the claim branch: the first run's next commit is refused by
    // the catalog, read again, and fenced.
    let (_, mut next) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    let entry = next.load("orders").await.unwrap().unwrap();
    assert_eq!(cursor(&entry), "k20");
    let (_, metadata) = held(&rest).await;
    let claim = metadata.snapshot_for_ref("ddbpipe-claim").unwrap();
    assert_eq!(claim.parent_snapshot_id(), None);
    assert!(
        metadata.snapshot_by_id(created).is_none(),
        "the earlier claim's is expired"
    );
    let (third, staged) = batch(20, 30);
    let refused = sink.write(&third, Some(&staged)).await.unwrap_err();
    assert_eq!(refused.class, SinkErrorClass::Fenced, "{refused:?}");
    let (_, metadata) = held(&rest).await;
    assert_eq!(scanned(&metadata), "20");

    // A third run's claim replaces the second's: one claim snapshot stays.
    let earlier = claim.snapshot_id();
    let (_, mut third_run) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    third_run.load("orders").await.unwrap();
    let (_, metadata) = held(&rest).await;
    assert!(metadata.snapshot_by_id(earlier).is_none());
    assert!(metadata.snapshot_for_ref("ddbpipe-claim").is_some());
}

/// Rule 5 (the catalogs' rule 5): every second commit is applied and its answer lost (502);
/// the retry's refusal is read back, the commit found there, and nothing is committed twice.
/// Every third request refused with 503 is retried.
#[tokio::test]
async fn a_commit_whose_answer_is_lost_is_read_back_not_made_twice() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(dir.path(), &["--lose-every", "2", "--fail-every", "3"]);
    let rest = catalog(&server, RestAuth::default());
    let (mut sink, mut store) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    for n in 0..6 {
        let (rows, staged) = batch(n * 5, n * 5 + 5);
        sink.write(&rows, Some(&staged)).await.unwrap();
    }
    let (_, metadata) = held(&rest).await;
    assert_eq!(scanned(&metadata), "30");
    let log = std::fs::read_to_string(dir.path().join("rest.log")).unwrap();
    assert!(log.contains(" 502"), "no answer was lost: {log}");
    assert!(log.contains(" 503"), "no request was refused: {log}");
    let (_, mut next) = ParquetSink::open(rest_settings(dir.path(), rest));
    assert_eq!(cursor(&next.load("orders").await.unwrap().unwrap()), "k30");
}

/// Rule 2: a credential is exchanged for a token at the catalog's token endpoint, again once
/// it expired; a wrong one fails at once, naming the setting, its secret in no message.
#[tokio::test]
async fn a_credential_is_exchanged_for_tokens_and_a_wrong_one_is_named_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let server = server(
        dir.path(),
        &["--client", "ddb:s3cr3t-Value", "--expires-in", "1"],
    );
    let auth = |credential: &str| RestAuth {
        credential: Some(Secret::new(credential)),
        ..RestAuth::default()
    };
    let rest = catalog(&server, auth("ddb:s3cr3t-Value"));
    let (mut sink, mut store) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    let (rows, staged) = batch(0, 5);
    sink.write(&rows, Some(&staged)).await.unwrap();
    // The token lasts a second: the next commit, later, asks for another first.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (rows, staged) = batch(5, 10);
    sink.write(&rows, Some(&staged)).await.unwrap();
    let log = std::fs::read_to_string(dir.path().join("rest.log")).unwrap();
    assert!(
        log.matches("POST /v1/oauth/tokens 200").count() >= 2,
        "{log}"
    );
    assert!(!log.contains(" 401"), "{log}");

    let wrong = catalog(&server, auth("ddb:not-the-Secret"));
    let refused = wrong.writable().await.unwrap_err();
    assert!(refused.contains("sink.catalog.credential"), "{refused}");
    assert!(refused.contains("HTTP 401"), "{refused}");
    assert!(!refused.contains("not-the-Secret"), "{refused}");
    assert!(!format!("{wrong:?}").contains("not-the-Secret"));
    let anonymous = catalog(&server, RestAuth::default());
    let refused = anonymous.writable().await.unwrap_err();
    assert!(refused.contains("sink.catalog.token"), "{refused}");
}

/// Rule 2: a credential is exchanged at `oauth2_server_uri` (an identity provider's, not the
/// catalog's own route) for `scope`; another scope is refused there, naming the settings.
#[tokio::test]
async fn a_credential_is_exchanged_at_its_token_server_for_its_scope() {
    let dir = tempfile::tempdir().unwrap();
    let options = [
        "--client",
        "ddb:s3cr3t",
        "--token-path",
        "/idp/token",
        "--scope",
        "PRINCIPAL_ROLE:ALL",
    ];
    let server = server(dir.path(), &options);
    let auth = |scope: &str| RestAuth {
        credential: Some(Secret::new("ddb:s3cr3t")),
        oauth2_server_uri: Some(format!("{}/idp/token", server.uri)),
        scope: Some(scope.to_string()),
        ..RestAuth::default()
    };
    catalog(&server, auth("PRINCIPAL_ROLE:ALL"))
        .writable()
        .await
        .unwrap();
    let refused = catalog(&server, auth("catalog"))
        .writable()
        .await
        .unwrap_err();
    assert!(
        refused.contains("/idp/token answered HTTP 400"),
        "{refused}"
    );
    assert!(refused.contains("sink.catalog.scope"), "{refused}");
    let log = std::fs::read_to_string(dir.path().join("rest.log")).unwrap();
    assert!(log.contains("POST /idp/token 200"), "{log}");
    assert!(!log.contains("/v1/oauth/tokens"), "{log}");
}

/// Rule 2: a token the catalog stops taking before it said it would expire (revoked, or a
/// clock apart) is refused with 401 once it has worked: a new one is asked and the request
/// tried again, and the run goes on.
#[tokio::test]
async fn a_token_refused_after_it_worked_is_renewed_and_the_request_retried() {
    let dir = tempfile::tempdir().unwrap();
    let options = ["--client", "ddb:s3cr3t", "--tokens-last", "0.5"];
    let server = server(dir.path(), &options);
    let auth = RestAuth {
        credential: Some(Secret::new("ddb:s3cr3t")),
        ..RestAuth::default()
    };
    let rest = catalog(&server, auth);
    let (mut sink, mut store) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    let (rows, staged) = batch(0, 5);
    sink.write(&rows, Some(&staged)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (rows, staged) = batch(5, 10);
    sink.write(&rows, Some(&staged)).await.unwrap();
    let log = std::fs::read_to_string(dir.path().join("rest.log")).unwrap();
    assert!(log.contains(" 401 NotAuthorizedException"), "{log}");
    assert!(
        log.matches("POST /v1/oauth/tokens 200").count() >= 2,
        "{log}"
    );
    let (_, metadata) = held(&rest).await;
    assert_eq!(scanned(&metadata), "10");
}

/// Rule 4: a principal that may not create namespaces writes into one that is there (it is
/// read first, not created); where it is not, the run stops naming the grant, its table not
/// made.
#[tokio::test]
async fn a_namespace_that_is_there_is_not_created_again() {
    let dir = tempfile::tempdir().unwrap();
    let options = ["--namespaces", "dynamodb", "--no-namespace-creation"];
    let server = server(dir.path(), &options);
    let rest = catalog(&server, RestAuth::default());
    let (mut sink, mut store) = ParquetSink::open(rest_settings(dir.path(), rest.clone()));
    store.load("orders").await.unwrap();
    sink.start(RunStart::Fresh).await.unwrap();
    let (rows, staged) = batch(0, 5);
    sink.write(&rows, Some(&staged)).await.unwrap();
    assert_eq!(scanned(&held(&rest).await.1), "5");

    let elsewhere = ParquetSettings {
        iceberg: Some(IcebergSettings {
            catalog: rest.clone().into(),
            namespace: "other".into(),
            table: "orders".into(),
            properties: Default::default(),
        }),
        ..rest_settings(dir.path(), rest.clone())
    };
    let (_, mut store) = ParquetSink::open(elsewhere);
    let refused = store.load("orders").await.unwrap_err().to_string();
    assert!(refused.contains("HTTP 403"), "{refused}");
    assert!(refused.contains("grant it in the catalog"), "{refused}");
    assert!(rest.load("other", "orders").await.unwrap().is_none());
}

/// Rule 6: a catalog that takes no connection fails after three attempts (a run's first
/// contact, docs/errors.md §9.6), naming the uri to check, its password masked.
#[tokio::test]
async fn a_catalog_never_reached_is_named_with_its_uri_masked() {
    let port = ddbpipe_testkit::free_port();
    let uri = format!("http://user:pa55word@127.0.0.1:{port}/api/catalog");
    let rest = RestCatalog::new(&uri, None, RestAuth::default(), retry()).unwrap();
    let failed = rest.writable().await.unwrap_err();
    assert!(failed.contains("(3 attempts)"), "{failed}");
    assert!(failed.contains("check sink.catalog.uri"), "{failed}");
    assert!(failed.contains("http://***@127.0.0.1"), "{failed}");
    assert!(!failed.contains("pa55word"), "{failed}");
}
