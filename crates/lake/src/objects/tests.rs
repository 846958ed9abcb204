//! The tests of `objects`: a directory, and S3 answered in process (scripted faults, rule 4).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_s3::config::{Credentials, Region, RequestChecksumCalculation};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, SharedHttpConnector, http_client_fn,
};
use aws_smithy_runtime_api::client::orchestrator::HttpRequest;
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::http::{Response, StatusCode};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::retry::RetryConfig;

use super::*;

/// What the scripted S3 does with a request before answering it as S3 would.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// Answers with this status and error code, doing nothing.
    Refuse(u16, &'static str),
    /// Does what was asked, then the answer is lost (the connection reset).
    LoseAnswer,
    /// Takes no connection (refused): nothing is done.
    NoConnection,
}

/// A bucket whose requests are answered in process: PUT (with `If-None-Match: *`), GET and
/// DELETE of objects kept in a map, each request first meeting the next scripted fault.
#[derive(Debug, Clone, Default)]
struct ScriptedS3 {
    objects: Arc<Mutex<HashMap<String, Vec<u8>>>>,
    faults: Arc<Mutex<VecDeque<Fault>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

fn answer(status: u16, body: impl Into<SdkBody>) -> Response<SdkBody> {
    Response::new(StatusCode::try_from(status).unwrap(), body.into())
}

fn error(status: u16, code: &str) -> Response<SdkBody> {
    let xml = format!("<Error><Code>{code}</Code><Message>{code} here</Message></Error>");
    answer(status, xml)
}

impl HttpConnector for ScriptedS3 {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let method = request.method().to_string();
        let path = request.uri().split_once("://").map_or("", |(_, rest)| rest);
        let path = path.split('?').next().unwrap_or_default();
        let key = path.splitn(3, '/').nth(2).unwrap_or_default().to_string();
        (self.requests.lock().unwrap()).push(format!("{method} {key}"));
        let fault = self.faults.lock().unwrap().pop_front();
        match fault {
            Some(Fault::Refuse(status, code)) => {
                return HttpConnectorFuture::ready(Ok(error(status, code)));
            }
            Some(Fault::NoConnection) => {
                let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
                return HttpConnectorFuture::ready(Err(ConnectorError::io(refused.into())));
            }
            _ => {}
        }
        let mut objects = self.objects.lock().unwrap();
        let response = match method.as_str() {
            "PUT"
                if request.headers().get("if-none-match").is_some()
                    && objects.contains_key(&key) =>
            {
                error(412, "PreconditionFailed")
            }
            "PUT" => {
                let body = request.body().bytes().expect("an in-memory body").to_vec();
                objects.insert(key, body);
                answer(200, SdkBody::empty())
            }
            "GET" => match objects.get(&key) {
                Some(bytes) => answer(200, bytes.clone()),
                None => error(404, "NoSuchKey"),
            },
            "DELETE" => {
                objects.remove(&key);
                answer(204, SdkBody::empty())
            }
            other => panic!("the scripted S3 does not answer {other}"),
        };
        match fault {
            Some(Fault::LoseAnswer) => HttpConnectorFuture::ready(Err(ConnectorError::io(
                std::io::Error::from(std::io::ErrorKind::ConnectionReset).into(),
            ))),
            _ => HttpConnectorFuture::ready(Ok(response)),
        }
    }
}

impl ScriptedS3 {
    /// `s3://bucket/pre/` answered by this S3, retried within `max_retries`.
    fn objects(&self, max_retries: u32) -> Objects {
        let connector = SharedHttpConnector::new(self.clone());
        let config = aws_sdk_s3::Config::builder()
            .behavior_version_latest()
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("a", "b", None, None, "test"))
            .endpoint_url("http://s3.test")
            .force_path_style(true)
            .retry_config(RetryConfig::disabled())
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .http_client(http_client_fn(move |_, _| connector.clone()))
            .build();
        let retry = RetryPolicy {
            max_retries,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(5),
            attempt_timeout: Duration::from_secs(10),
        };
        let location = Location::parse("s3://bucket/pre").unwrap();
        Objects::new(&location, None, retry, || {
            aws_sdk_s3::Client::from_conf(config)
        })
    }

    fn fail_next(&self, faults: &[Fault]) {
        self.faults.lock().unwrap().extend(faults);
    }

    /// The requests answered since the last call, `<method> <key>`.
    fn requests(&self) -> Vec<String> {
        std::mem::take(&mut *self.requests.lock().unwrap())
    }
}

/// Rule 4: a throttle, a 5xx and a lost answer are tried again, for every kind of request.
#[tokio::test]
async fn s3_requests_are_retried_through_throttles_5xx_and_lost_answers() {
    use Fault::*;
    let s3 = ScriptedS3::default();
    let objects = s3.objects(8);
    s3.fail_next(&[
        Refuse(503, "SlowDown"),
        Refuse(500, "InternalError"),
        LoseAnswer,
    ]);
    let put = objects.put("data/1.parquet", b"rows".to_vec()).await;
    assert_eq!(put, Ok(()));
    assert_eq!(s3.requests(), ["PUT pre/data/1.parquet"; 4]);
    s3.fail_next(&[Refuse(503, "ServiceUnavailable"), LoseAnswer]);
    let got = objects.get("data/1.parquet").await;
    assert_eq!(got, Ok(Some(b"rows".to_vec())));
    assert_eq!(s3.requests().len(), 3);
    s3.fail_next(&[Refuse(500, "InternalError")]);
    assert_eq!(objects.delete("data/1.parquet").await, Ok(()));
    assert_eq!(objects.get("data/1.parquet").await, Ok(None));
    s3.fail_next(&[Refuse(409, "ConditionalRequestConflict")]);
    let created = objects.create("commits/1.json", b"one".to_vec()).await;
    assert_eq!(
        created,
        Ok(Created::Written),
        "a conflict in flight is tried again"
    );
}

/// Rule 4: a conditional write whose answer was lost, found taken when tried again, is its
/// own when the object holds its bytes, and another writer's otherwise.
#[tokio::test]
async fn a_retried_conditional_write_tells_its_own_landing_from_another_writers() {
    let s3 = ScriptedS3::default();
    let objects = s3.objects(8);
    s3.fail_next(&[Fault::LoseAnswer]);
    let created = objects.create("commits/1.json", b"ours".to_vec()).await;
    assert_eq!(
        created,
        Ok(Created::Written),
        "the lost answer's write landed"
    );
    let asked = [
        "PUT pre/commits/1.json",
        "PUT pre/commits/1.json",
        "GET pre/commits/1.json",
    ];
    assert_eq!(s3.requests(), asked);

    (s3.objects.lock().unwrap()).insert("pre/commits/2.json".into(), b"theirs".to_vec());
    s3.fail_next(&[Fault::Refuse(503, "SlowDown")]);
    let created = objects.create("commits/2.json", b"ours".to_vec()).await;
    assert_eq!(created, Ok(Created::Taken));
    assert_eq!(s3.requests().len(), 3, "read back to compare");
    let created = objects.create("commits/2.json", b"ours".to_vec()).await;
    assert_eq!(created, Ok(Created::Taken));
    assert_eq!(
        s3.requests(),
        ["PUT pre/commits/2.json"],
        "a first refusal is final"
    );
    let kept = s3.objects.lock().unwrap()["pre/commits/2.json"].clone();
    assert_eq!(kept, b"theirs");
}

/// Rules 3 and 4: the budget spent, or a refusal no retry mends (tried once), fails naming
/// the object, the attempts and S3's code.
#[tokio::test]
async fn a_spent_budget_or_a_refusal_fails_naming_the_object_and_the_attempts() {
    let s3 = ScriptedS3::default();
    let objects = s3.objects(2);
    s3.fail_next(&[Fault::Refuse(503, "SlowDown"); 3]);
    let failed = objects
        .put("x.parquet", b"rows".to_vec())
        .await
        .unwrap_err();
    assert!(
        failed.starts_with("cannot write s3://bucket/pre/x.parquet (3 attempts): SlowDown"),
        "{failed}"
    );
    s3.requests();
    s3.fail_next(&[Fault::Refuse(403, "AccessDenied")]);
    let failed = objects
        .put("x.parquet", b"rows".to_vec())
        .await
        .unwrap_err();
    assert!(
        failed.starts_with("cannot write s3://bucket/pre/x.parquet: AccessDenied"),
        "{failed}"
    );
    assert_eq!(s3.requests().len(), 1);
}

#[test]
fn locations_read_s3_urls_and_directories() {
    assert_eq!(
        Location::parse("s3://bucket/dynamodb/orders"),
        Ok(Location::S3 {
            bucket: "bucket".into(),
            prefix: "dynamodb/orders/".into()
        })
    );
    assert_eq!(
        Location::parse("s3://bucket"),
        Ok(Location::S3 {
            bucket: "bucket".into(),
            prefix: String::new()
        })
    );
    assert!(Location::parse("s3:///x").is_err());
    assert!(Location::parse("gs://bucket/x").is_err());
    assert_eq!(
        Location::parse("out/lake"),
        Ok(Location::Local(PathBuf::from("out/lake")))
    );
}

#[tokio::test]
async fn a_directory_creates_a_name_once_and_lists_what_it_holds() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let objects = Objects::Local(dir.path().to_path_buf());
    let created = objects.create("a/b/1.json", b"one".to_vec()).await;
    assert_eq!(created, Ok(Created::Written));
    let again = objects.create("a/b/1.json", b"two".to_vec()).await;
    assert_eq!(again, Ok(Created::Taken));
    assert_eq!(
        objects.get("a/b/1.json").await,
        Ok(Some(b"one".to_vec())),
        "the first write stays"
    );
    objects
        .put("c.parquet", b"x".to_vec())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut names = objects.list("").await.unwrap_or_else(|e| panic!("{e}"));
    names.sort();
    assert_eq!(names, vec!["a/b/1.json".to_string(), "c.parquet".into()]);
    assert_eq!(objects.list("a/").await.map(|n| n.len()), Ok(1));
    objects
        .delete("c.parquet")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(objects.get("c.parquet").await, Ok(None));
    assert_eq!(objects.delete("c.parquet").await, Ok(()));
}

/// Rule 4 with docs/errors.md §9.6: an S3 that never answered is asked three times when it
/// takes no connection (a wrong endpoint fails at once, naming it); once it has answered, the
/// same failure is retried by the whole budget (an endpoint restarting).
#[tokio::test]
async fn an_s3_never_reached_is_asked_three_times_one_that_answered_the_whole_budget() {
    let s3 = ScriptedS3::default();
    let objects = s3.objects(8);
    s3.fail_next(&[Fault::NoConnection; 5]);
    let failed = objects
        .put("x.parquet", b"rows".to_vec())
        .await
        .unwrap_err();
    assert!(failed.contains("(3 attempts)"), "{failed}");
    assert!(failed.contains("could not be reached"), "{failed}");
    assert_eq!(s3.requests().len(), 3);

    s3.faults.lock().unwrap().clear();
    assert_eq!(objects.put("x.parquet", b"rows".to_vec()).await, Ok(()));
    s3.requests();
    s3.fail_next(&[Fault::NoConnection; 5]);
    assert_eq!(objects.put("y.parquet", b"rows".to_vec()).await, Ok(()));
    assert_eq!(s3.requests().len(), 6, "five refused, then written");
}
