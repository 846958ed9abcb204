//! The DynamoDB lease table against dynoxide, embedded and served over HTTP on loopback: the
//! conditions are checked by the emulator, not by us.

use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};

use super::*;
use crate::ids::ShardId;
use crate::lease::{LeaseSettings, LocalTime, UnitSpec, Worker};

/// dynoxide on a loopback port of the test's runtime; its endpoint.
async fn emulator() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let db = dynoxide::Database::memory().unwrap();
    tokio::spawn(dynoxide::server::serve_on(listener, db));
    endpoint
}

fn client(endpoint: &str) -> Client {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "test"))
        .build();
    Client::from_conf(config)
}

async fn table(endpoint: &str) -> AwsLeaseTable {
    let table = AwsLeaseTable::new(client(endpoint), "ddbpipe-leases");
    table
        .ensure_table(Duration::from_millis(50), 100)
        .await
        .unwrap();
    table
}

fn pipeline(name: &str) -> PipelineName {
    PipelineName::new(name).unwrap()
}

fn worker(id: &str) -> WorkerId {
    WorkerId::new(id).unwrap()
}

fn shard(id: &str) -> UnitId {
    UnitId::Shard(ShardId::new(id))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_table_creates_an_on_demand_table_once() {
    let endpoint = emulator().await;
    let leases = table(&endpoint).await;
    leases
        .ensure_table(Duration::from_millis(50), 5)
        .await
        .unwrap();
    let described = client(&endpoint)
        .describe_table()
        .table_name("ddbpipe-leases")
        .send()
        .await
        .unwrap();
    let billing = described
        .table
        .and_then(|t| t.billing_mode_summary)
        .and_then(|b| b.billing_mode);
    assert_eq!(billing, Some(BillingMode::PayPerRequest));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_with_another_key_is_not_used_as_a_lease_table() {
    let endpoint = emulator().await;
    client(&endpoint)
        .create_table()
        .table_name("other")
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("pk")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("pk")
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap();
    let leases = AwsLeaseTable::new(client(&endpoint), "other");
    let error = leases
        .ensure_table(Duration::from_millis(50), 5)
        .await
        .unwrap_err();
    assert!(
        matches!(&error, LeaseError::Fatal(m) if m.contains("not a lease table")),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_is_conditional_on_the_counter_held() {
    let endpoint = emulator().await;
    let leases = table(&endpoint).await;
    let (p, unit) = (pipeline("orders"), shard("child"));
    let lease = Lease::new(unit.clone(), vec![shard("parent")], 5);
    leases.create(&p, &lease).await.unwrap();
    assert!(leases.create(&p, &lease).await.unwrap_err().is_conflict());
    assert_eq!(leases.get(&p, &unit).await.unwrap(), Some(lease.clone()));

    let taken = leases
        .take(&p, &unit, LeaseCounter(0), &worker("a"))
        .await
        .unwrap();
    assert_eq!(taken.owner, Some(worker("a")));
    assert_eq!((taken.counter, taken.owner_switches), (LeaseCounter(1), 1));
    assert_eq!(taken.parents, vec![shard("parent")]);
    let late = leases.take(&p, &unit, LeaseCounter(0), &worker("b")).await;
    assert!(late.unwrap_err().is_conflict());

    let held = Held {
        owner: worker("a"),
        counter: taken.counter,
    };
    let renewed = leases.renew(&p, &unit, &held).await.unwrap();
    assert_eq!(renewed.counter, LeaseCounter(2));
    let seven = after("7");
    let stale = leases.checkpoint(&p, &unit, &held, &seven);
    assert!(stale.await.unwrap_err().is_conflict(), "counter 1 is stale");
    let impostor = Held {
        owner: worker("b"),
        counter: renewed.counter,
    };
    assert!(
        leases
            .renew(&p, &unit, &impostor)
            .await
            .unwrap_err()
            .is_conflict()
    );

    let held = Held {
        owner: worker("a"),
        counter: renewed.counter,
    };
    let checkpointed = leases
        .checkpoint(&p, &unit, &held, &after("7"))
        .await
        .unwrap();
    assert_eq!(checkpointed.checkpoint, Some(after("7")));
    assert_eq!(
        (checkpointed.counter, checkpointed.owner_switches),
        (LeaseCounter(3), 0)
    );
    let held = Held {
        owner: worker("a"),
        counter: checkpointed.counter,
    };
    let ended = leases
        .checkpoint(&p, &unit, &held, &LeaseCheckpoint::ShardEnd)
        .await
        .unwrap();
    assert_eq!((&ended.owner, ended.state), (&None, LeaseState::ShardEnd));
    assert_eq!(leases.get(&p, &unit).await.unwrap(), Some(ended.clone()));

    assert!(
        leases
            .delete(&p, &unit, LeaseCounter(3))
            .await
            .unwrap_err()
            .is_conflict()
    );
    leases.delete(&p, &unit, ended.counter).await.unwrap();
    assert_eq!(leases.get(&p, &unit).await.unwrap(), None);
    let gone = leases.take(&p, &unit, ended.counter, &worker("a")).await;
    assert!(
        gone.unwrap_err().is_conflict(),
        "a deleted row cannot be taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_clears_the_owner_and_pipelines_keep_apart() {
    let endpoint = emulator().await;
    let leases = table(&endpoint).await;
    let (a, b) = (pipeline("a"), pipeline("b"));
    for (index, p) in [&a, &b, &a].into_iter().enumerate() {
        let unit = UnitId::Segment {
            index: index as u32,
            total: 3,
        };
        leases
            .create(p, &Lease::new(unit, Vec::new(), 0))
            .await
            .unwrap();
    }
    let listed = leases.list(&a).await.unwrap();
    let units: Vec<String> = listed.iter().map(|l| l.unit.to_string()).collect();
    assert_eq!(units, ["segment:0/3", "segment:2/3"]);
    assert_eq!(leases.list(&b).await.unwrap().len(), 1);

    let unit = listed[0].unit.clone();
    let taken = leases
        .take(&a, &unit, LeaseCounter(0), &worker("w"))
        .await
        .unwrap();
    let held = Held {
        owner: worker("w"),
        counter: taken.counter,
    };
    let released = leases.release(&a, &unit, &held).await.unwrap();
    assert_eq!((released.owner, released.counter), (None, LeaseCounter(2)));
    assert!(
        leases
            .release(&a, &unit, &held)
            .await
            .unwrap_err()
            .is_conflict()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_racing_for_a_lease_exactly_one_wins() {
    let endpoint = emulator().await;
    let first = table(&endpoint).await;
    let second = AwsLeaseTable::new(client(&endpoint), "ddbpipe-leases");
    let p = pipeline("race");
    for round in 0..20u32 {
        let unit = UnitId::Segment {
            index: round,
            total: 20,
        };
        first
            .create(&p, &Lease::new(unit.clone(), Vec::new(), 0))
            .await
            .unwrap();
        let (a, b) = (worker("a"), worker("b"));
        let (x, y) = tokio::join!(
            first.take(&p, &unit, LeaseCounter(0), &a),
            second.take(&p, &unit, LeaseCounter(0), &b),
        );
        let winner = match (x, y) {
            (Ok(row), Err(e)) | (Err(e), Ok(row)) => {
                assert!(e.is_conflict(), "round {round}: {e}");
                row.owner.unwrap()
            }
            (x, y) => panic!("round {round}: exactly one take must win: {x:?} {y:?}"),
        };
        let row = first.get(&p, &unit).await.unwrap().unwrap();
        assert_eq!((row.owner, row.counter), (Some(winner), LeaseCounter(1)));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_leads_creates_rows_parents_first_and_takes_them() {
    let endpoint = emulator().await;
    let leases = table(&endpoint).await;
    let settings = LeaseSettings::new(10).unwrap();
    let mut worker = Worker::new(leases.clone(), pipeline("w"), worker("w1"), settings);
    let first = worker.round(LocalTime::from_millis(0)).await.unwrap();
    assert!(first.leader && first.taken.is_empty());
    let discovered = [
        UnitSpec::new(shard("child"), vec![shard("parent")]),
        UnitSpec::new(shard("parent"), Vec::new()),
    ];
    let synced = worker.sync(&discovered).await.unwrap();
    assert_eq!(synced.created, vec![shard("parent"), shard("child")]);
    let next = worker.round(LocalTime::from_millis(3_400)).await.unwrap();
    let taken: Vec<&UnitId> = next.taken.iter().map(|t| &t.unit).collect();
    assert_eq!(taken, [&shard("parent")], "the child waits for its parent");
    let end = worker
        .checkpoint(
            &shard("parent"),
            &LeaseCheckpoint::ShardEnd,
            LocalTime::from_millis(4_000),
        )
        .await
        .unwrap();
    assert_eq!(end, LeaseCounter(2));
    let after = worker.round(LocalTime::from_millis(6_800)).await.unwrap();
    let taken: Vec<&UnitId> = after.taken.iter().map(|t| &t.unit).collect();
    assert_eq!(taken, [&shard("child")]);
    assert!(worker.release_all().await.is_empty());
    let rows = leases.list(&pipeline("w")).await.unwrap();
    assert!(rows.iter().all(|row| row.owner.is_none()), "{rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_is_never_written_past_its_largest_value() {
    let endpoint = emulator().await;
    let leases = table(&endpoint).await;
    let (p, unit) = (pipeline("orders"), shard("edited"));
    let mut lease = Lease::new(unit.clone(), Vec::new(), 5);
    lease.counter = LeaseCounter(LeaseCounter::MAX.0 - 1);
    leases.create(&p, &lease).await.unwrap();
    let last = leases
        .take(&p, &unit, lease.counter, &worker("a"))
        .await
        .unwrap();
    assert_eq!(last.counter, LeaseCounter::MAX);
    let held = Held {
        owner: worker("a"),
        counter: last.counter,
    };
    let refused = leases.renew(&p, &unit, &held).await.unwrap_err();
    assert!(
        matches!(&refused, LeaseError::Fatal(m) if m.contains("'shard:edited'") && m.contains("state reset")),
        "{refused}"
    );
    // A row edited by hand to u64::MAX: read, never taken.
    let edited = client(&endpoint)
        .update_item()
        .table_name("ddbpipe-leases")
        .set_key(Some(key(&p, &unit)))
        .update_expression("SET #counter = :max REMOVE #owner")
        .expression_attribute_names("#counter", COUNTER)
        .expression_attribute_names("#owner", OWNER)
        .expression_attribute_values(":max", n(u64::MAX))
        .send()
        .await;
    edited.unwrap();
    let row = leases.get(&p, &unit).await.unwrap().unwrap();
    assert_eq!(row.counter, LeaseCounter(u64::MAX));
    let refused = leases
        .take(&p, &unit, row.counter, &worker("b"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, LeaseError::Fatal(m) if m.contains("'shard:edited'") && m.contains(&u64::MAX.to_string())),
        "{refused}"
    );
    assert_eq!(
        leases.get(&p, &unit).await.unwrap(),
        Some(row),
        "not written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_with_one_worker_id_are_fenced_apart() {
    let endpoint = emulator().await;
    let leases = table(&endpoint).await;
    let (p, unit) = (pipeline("orders"), shard("s"));
    leases
        .create(&p, &Lease::new(unit.clone(), Vec::new(), 5))
        .await
        .unwrap();
    let first = worker("w1").of_process("host-a/4242/9f3c1a2b").unwrap();
    let second = worker("w1").of_process("host-b/4242/0b1c2d3e").unwrap();
    let taken = leases
        .take(&p, &unit, LeaseCounter(0), &first)
        .await
        .unwrap();
    for twin in [
        Held {
            owner: second.clone(),
            counter: taken.counter,
        },
        // A row of an earlier version names the id alone: no process of this version is it.
        Held {
            owner: worker("w1"),
            counter: taken.counter,
        },
    ] {
        assert!(
            leases
                .renew(&p, &unit, &twin)
                .await
                .unwrap_err()
                .is_conflict()
        );
        let seven = after("7");
        let checkpoint = leases.checkpoint(&p, &unit, &twin, &seven);
        assert!(checkpoint.await.unwrap_err().is_conflict());
        assert!(
            leases
                .release(&p, &unit, &twin)
                .await
                .unwrap_err()
                .is_conflict()
        );
    }
    assert_eq!(leases.get(&p, &unit).await.unwrap(), Some(taken));
}

/// A shard's checkpoint after sequence number `seq`.
fn after(seq: &str) -> LeaseCheckpoint {
    LeaseCheckpoint::after(crate::ids::SequenceNumber::parse(seq).unwrap())
}
