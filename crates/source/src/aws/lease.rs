//! [`LeaseTable`] on DynamoDB: one item per lease, every write an `UpdateItem`, `PutItem` or
//! `DeleteItem` with a `ConditionExpression` (docs/coordination.md §11.1, §11.2).
//!
//! # Layout
//! Partition key `pipeline` (S), sort key `unit` (S), so one table serves several pipelines
//! and a pipeline's leases are one consistent `Query`. The other attributes are `owner` (S,
//! absent when nobody holds it), `counter` (N), `state` (S), `checkpoint` (S), `parents` (L of
//! S, absent when empty), `owner_switches` (N) and `written_ms` (N). Every name goes through
//! `ExpressionAttributeNames`, since several are reserved words.
//!
//! # Error handling
//! `ConditionalCheckFailedException` is a [`LeaseError::Conflict`]; other codes are classified
//! as every other request's (docs/errors.md §9.1); an item that does not read as a lease is
//! fatal: a newer ddbpipe, or something else, wrote it.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ScalarAttributeType, TableStatus,
};
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::api_error;
use crate::lease::{
    Held, Lease, LeaseCounter, LeaseError, LeaseState, LeaseTable, PipelineName, UnitId, WorkerId,
};
use crate::position::LeaseCheckpoint;

const PIPELINE: &str = "pipeline";
const UNIT: &str = "unit";
const OWNER: &str = "owner";
const COUNTER: &str = "counter";
const STATE: &str = "state";
const CHECKPOINT: &str = "checkpoint";
const PARENTS: &str = "parents";
const SWITCHES: &str = "owner_switches";
const WRITTEN: &str = "written_ms";

/// The condition of every write by a holder.
const HELD: &str = "#counter = :held AND #owner = :me";

/// Leases in a DynamoDB table, through the AWS SDK client.
#[derive(Debug, Clone)]
pub struct AwsLeaseTable {
    client: Client,
    table: String,
}

fn s(text: impl Into<String>) -> AttributeValue {
    AttributeValue::S(text.into())
}

fn n(number: impl ToString) -> AttributeValue {
    AttributeValue::N(number.to_string())
}

/// The error of a request on `unit`: a failed condition is a conflict.
/// Counts one request to the lease table by what it does (`ddbpipe_lease_requests_total`):
/// `query`, `get`, `create`, `take`, `renew`, `checkpoint`, `release`, `delete`.
fn counted(request: &'static str) {
    metrics::counter!("ddbpipe_lease_requests_total", "request" => request).increment(1);
}

fn lease_error<E, R>(error: SdkError<E, R>, unit: &UnitId) -> LeaseError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    if error.code() == Some("ConditionalCheckFailedException") {
        return LeaseError::Conflict { unit: unit.clone() };
    }
    LeaseError::of_api(api_error(error))
}

fn malformed(what: &str, item: &HashMap<String, AttributeValue>) -> LeaseError {
    let unit = item
        .get(UNIT)
        .and_then(|u| u.as_s().ok())
        .map_or("?", |u| u);
    LeaseError::Fatal(format!("lease row '{unit}' is not a ddbpipe lease: {what}"))
}

fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Result<Option<u64>, LeaseError> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::N(text)) => text
            .parse()
            .map(Some)
            .map_err(|_| malformed(&format!("{name} is not a whole number"), item)),
        Some(_) => Err(malformed(&format!("{name} is not a number"), item)),
    }
}

fn text<'a>(
    item: &'a HashMap<String, AttributeValue>,
    name: &str,
) -> Result<Option<&'a str>, LeaseError> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::S(text)) => Ok(Some(text)),
        Some(_) => Err(malformed(&format!("{name} is not a string"), item)),
    }
}

fn unit(text: &str, item: &HashMap<String, AttributeValue>) -> Result<UnitId, LeaseError> {
    text.parse()
        .map_err(|e: crate::lease::BadUnit| malformed(&e.to_string(), item))
}

/// Reads one item as a lease.
fn lease_from_item(item: &HashMap<String, AttributeValue>) -> Result<Lease, LeaseError> {
    let id = text(item, UNIT)?.ok_or_else(|| malformed("no unit", item))?;
    let owner = match text(item, OWNER)? {
        Some(owner) => Some(WorkerId::new(owner).map_err(|e| malformed(&e.to_string(), item))?),
        None => None,
    };
    let state = text(item, STATE)?.ok_or_else(|| malformed("no state", item))?;
    let state = LeaseState::parse(state).ok_or_else(|| malformed("unknown state", item))?;
    let parents = match item.get(PARENTS) {
        None => Vec::new(),
        Some(AttributeValue::L(parents)) => parents
            .iter()
            .map(|parent| match parent {
                AttributeValue::S(parent) => unit(parent, item),
                _ => Err(malformed("a parent is not a string", item)),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(malformed("parents is not a list", item)),
    };
    let unit = unit(id, item)?;
    Ok(Lease {
        owner,
        counter: LeaseCounter(number(item, COUNTER)?.ok_or_else(|| malformed("no counter", item))?),
        checkpoint: text(item, CHECKPOINT)?.map(|text| unit.checkpoint(text)),
        unit,
        parents,
        state,
        owner_switches: number(item, SWITCHES)?.unwrap_or(0),
        written_ms: number(item, WRITTEN)?.map_or(0, |ms| i64::try_from(ms).unwrap_or(i64::MAX)),
    })
}

fn item_from_lease(pipeline: &PipelineName, lease: &Lease) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::from([
        (PIPELINE.to_string(), s(pipeline.as_str())),
        (UNIT.to_string(), s(lease.unit.to_string())),
        (COUNTER.to_string(), n(lease.counter.0)),
        (STATE.to_string(), s(lease.state.as_str())),
        (SWITCHES.to_string(), n(lease.owner_switches)),
        (WRITTEN.to_string(), n(lease.written_ms.max(0))),
    ]);
    if let Some(owner) = &lease.owner {
        item.insert(OWNER.to_string(), s(owner.as_str()));
    }
    if let Some(checkpoint) = &lease.checkpoint {
        item.insert(CHECKPOINT.to_string(), s(checkpoint.encode()));
    }
    if !lease.parents.is_empty() {
        let parents = lease.parents.iter().map(|p| s(p.to_string())).collect();
        item.insert(PARENTS.to_string(), AttributeValue::L(parents));
    }
    item
}

fn key(pipeline: &PipelineName, unit: &UnitId) -> HashMap<String, AttributeValue> {
    HashMap::from([
        (PIPELINE.to_string(), s(pipeline.as_str())),
        (UNIT.to_string(), s(unit.to_string())),
    ])
}

/// Sends an `UpdateItem` on `unit` and reads the row it returns (`ReturnValue::AllNew`).
async fn updated(update: UpdateItemFluentBuilder, unit: &UnitId) -> Result<Lease, LeaseError> {
    let output = update.send().await.map_err(|e| lease_error(e, unit))?;
    let item = output
        .attributes
        .ok_or_else(|| LeaseError::Fatal("an update returned no row".into()))?;
    lease_from_item(&item)
}

impl AwsLeaseTable {
    /// Leases in `table`, through a client built by [`super::lease_table`].
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        AwsLeaseTable {
            client,
            table: table.into(),
        }
    }

    /// The table's name.
    pub fn table_name(&self) -> &str {
        &self.table
    }

    /// Makes sure the table exists and is `ACTIVE` (docs/coordination.md §11.1): described;
    /// created on demand (`PAY_PER_REQUEST`) when missing, racing workers tolerated; then
    /// described every `poll` until active, at most `attempts` times. An existing table with
    /// another key schema is a fatal error naming it.
    pub async fn ensure_table(&self, poll: Duration, attempts: u32) -> Result<(), LeaseError> {
        for attempt in 0..attempts.max(1) {
            match self.status().await? {
                Some(true) => return Ok(()),
                Some(false) => {}
                None => self.create_table().await?,
            }
            if attempt + 1 < attempts {
                tokio::time::sleep(poll).await;
            }
        }
        Err(LeaseError::Transient(crate::error::ApiError::transport(
            format!("lease table '{}' did not become ACTIVE", self.table),
        )))
    }

    /// Whether the table exists (`DescribeTable`), refusing one whose key schema is not a
    /// lease table's; `check`, `state show` and `state reset` ask this, and create nothing.
    pub async fn exists(&self) -> Result<bool, LeaseError> {
        Ok(self.status().await?.is_some())
    }

    /// One `DescribeTable`: `None` when the table is missing, else whether it is `ACTIVE`; a
    /// table with another key schema is a fatal error naming it.
    async fn status(&self) -> Result<Option<bool>, LeaseError> {
        let described = self
            .client
            .describe_table()
            .table_name(&self.table)
            .send()
            .await;
        match described {
            Ok(output) => Ok(Some(match output.table {
                Some(table) => {
                    self.check_keys(table.key_schema())?;
                    table.table_status == Some(TableStatus::Active)
                }
                None => false,
            })),
            Err(error) if error.code() == Some("ResourceNotFoundException") => Ok(None),
            Err(error) => Err(lease_error(error, &UnitId::Leader)),
        }
    }

    async fn create_table(&self) -> Result<(), LeaseError> {
        let attribute = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let element = |name: &str, key_type| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(key_type)
                .build()
        };
        let fatal = |e: aws_sdk_dynamodb::error::BuildError| LeaseError::Fatal(e.to_string());
        let created = self
            .client
            .create_table()
            .table_name(&self.table)
            .attribute_definitions(attribute(PIPELINE).map_err(fatal)?)
            .attribute_definitions(attribute(UNIT).map_err(fatal)?)
            .key_schema(element(PIPELINE, KeyType::Hash).map_err(fatal)?)
            .key_schema(element(UNIT, KeyType::Range).map_err(fatal)?)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => Ok(()),
            // Another worker created it first.
            Err(error) if error.code() == Some("ResourceInUseException") => Ok(()),
            Err(error) => Err(lease_error(error, &UnitId::Leader)),
        }
    }

    fn check_keys(&self, schema: &[KeySchemaElement]) -> Result<(), LeaseError> {
        let has = |name: &str, key_type: KeyType| {
            schema
                .iter()
                .any(|e| e.attribute_name == name && e.key_type == key_type)
        };
        if schema.len() == 2 && has(PIPELINE, KeyType::Hash) && has(UNIT, KeyType::Range) {
            return Ok(());
        }
        Err(LeaseError::Fatal(format!(
            "table '{}' is not a lease table: its key must be {PIPELINE} (hash, S) and {UNIT} \
             (range, S); choose another coordination.lease_table",
            self.table
        )))
    }

    /// An `UpdateItem` of a held lease: `set` (and `remove`) conditional on [`HELD`], the
    /// counter bumped, the row returned.
    fn held_update(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
        set: &str,
        remove: Option<&str>,
    ) -> Result<UpdateItemFluentBuilder, LeaseError> {
        let next = held.counter.after(unit)?;
        let mut expression = format!("SET #counter = :next, #written = :now{set}");
        if let Some(remove) = remove {
            expression.push_str(" REMOVE ");
            expression.push_str(remove);
        }
        Ok(self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(pipeline, unit)))
            .update_expression(expression)
            .condition_expression(HELD)
            .expression_attribute_names("#counter", COUNTER)
            .expression_attribute_names("#owner", OWNER)
            .expression_attribute_names("#written", WRITTEN)
            .expression_attribute_values(":held", n(held.counter.0))
            .expression_attribute_values(":next", n(next.0))
            .expression_attribute_values(":me", s(held.owner.as_str()))
            .expression_attribute_values(":now", n(self.clock_ms().max(0)))
            .return_values(ReturnValue::AllNew))
    }
}

impl LeaseTable for AwsLeaseTable {
    async fn list(&self, pipeline: &PipelineName) -> Result<Vec<Lease>, LeaseError> {
        let mut leases = Vec::new();
        let mut start = None;
        loop {
            counted("query");
            let output = self
                .client
                .query()
                .table_name(&self.table)
                .key_condition_expression("#pipeline = :pipeline")
                .expression_attribute_names("#pipeline", PIPELINE)
                .expression_attribute_values(":pipeline", s(pipeline.as_str()))
                .consistent_read(true)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| lease_error(e, &UnitId::Leader))?;
            for item in output.items() {
                leases.push(lease_from_item(item)?);
            }
            match output.last_evaluated_key {
                Some(last) if !last.is_empty() => start = Some(last),
                _ => break,
            }
        }
        leases.sort_by(|a, b| a.unit.cmp(&b.unit));
        Ok(leases)
    }

    async fn get(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
    ) -> Result<Option<Lease>, LeaseError> {
        counted("get");
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(key(pipeline, unit)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| lease_error(e, unit))?;
        output.item.as_ref().map(lease_from_item).transpose()
    }

    async fn create(&self, pipeline: &PipelineName, lease: &Lease) -> Result<(), LeaseError> {
        counted("create");
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item_from_lease(pipeline, lease)))
            .condition_expression("attribute_not_exists(#unit)")
            .expression_attribute_names("#unit", UNIT)
            .send()
            .await
            .map_err(|e| lease_error(e, &lease.unit))?;
        Ok(())
    }

    async fn take(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        seen: LeaseCounter,
        owner: &WorkerId,
    ) -> Result<Lease, LeaseError> {
        let next = seen.after(unit)?;
        counted("take");
        let update = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(key(pipeline, unit)))
            .update_expression(
                "SET #owner = :me, #counter = :next, #written = :now, \
                 #switches = if_not_exists(#switches, :zero) + :one",
            )
            .condition_expression("#counter = :seen")
            .expression_attribute_names("#owner", OWNER)
            .expression_attribute_names("#counter", COUNTER)
            .expression_attribute_names("#written", WRITTEN)
            .expression_attribute_names("#switches", SWITCHES)
            .expression_attribute_values(":me", s(owner.as_str()))
            .expression_attribute_values(":seen", n(seen.0))
            .expression_attribute_values(":next", n(next.0))
            .expression_attribute_values(":now", n(self.clock_ms().max(0)))
            .expression_attribute_values(":zero", n(0))
            .expression_attribute_values(":one", n(1))
            .return_values(ReturnValue::AllNew);
        updated(update, unit).await
    }

    async fn renew(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
    ) -> Result<Lease, LeaseError> {
        let update = self.held_update(pipeline, unit, held, "", None)?;
        counted("renew");
        updated(update, unit).await
    }

    async fn checkpoint(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
        checkpoint: &LeaseCheckpoint,
    ) -> Result<Lease, LeaseError> {
        let state = LeaseState::of(checkpoint);
        let remove = state.is_finished().then_some("#owner");
        let update = self
            .held_update(
                pipeline,
                unit,
                held,
                ", #checkpoint = :checkpoint, #state = :state, #switches = :zero",
                remove,
            )?
            .expression_attribute_names("#checkpoint", CHECKPOINT)
            .expression_attribute_names("#state", STATE)
            .expression_attribute_names("#switches", SWITCHES)
            .expression_attribute_values(":checkpoint", s(checkpoint.encode()))
            .expression_attribute_values(":state", s(state.as_str()))
            .expression_attribute_values(":zero", n(0));
        counted("checkpoint");
        updated(update, unit).await
    }

    async fn release(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        held: &Held,
    ) -> Result<Lease, LeaseError> {
        let update = self.held_update(pipeline, unit, held, "", Some("#owner"))?;
        counted("release");
        updated(update, unit).await
    }

    async fn delete(
        &self,
        pipeline: &PipelineName,
        unit: &UnitId,
        seen: LeaseCounter,
    ) -> Result<(), LeaseError> {
        counted("delete");
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(key(pipeline, unit)))
            .condition_expression("#counter = :seen")
            .expression_attribute_names("#counter", COUNTER)
            .expression_attribute_values(":seen", n(seen.0))
            .send()
            .await
            .map_err(|e| lease_error(e, unit))?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "lease_tests.rs"]
mod tests;
