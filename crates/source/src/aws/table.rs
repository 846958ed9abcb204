//! [`TableApi`] over `aws-sdk-dynamodb`.

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::scan::builders::ScanFluentBuilder;
use aws_sdk_dynamodb::types::{
    AttributeValue, BillingMode, KeySchemaElement, KeyType as SdkKeyType, ReturnConsumedCapacity,
    ScalarAttributeType,
};

use super::api_error;
use super::convert::{item_from_sdk, item_to_sdk, value_to_sdk};
use super::raw_body::{BodyBuffers, TakeBody};
use crate::api::{
    IndexDescription, IndexKind, KeyAttribute, KeyType, Page, ReadKind, ReadRequest, Render,
    RenderedPage, StreamInfo, TableApi, TableDescription, TableNames,
};
use crate::error::ApiError;
use crate::wire;

/// Reads tables through the AWS SDK client.
#[derive(Debug, Clone)]
pub struct AwsTableApi {
    client: Client,
    /// Reused buffers for the bodies of data-plane answers.
    buffers: Arc<BodyBuffers>,
}

impl AwsTableApi {
    /// Wraps a client built by [`super::table_api`].
    pub fn new(client: Client) -> Self {
        AwsTableApi {
            client,
            buffers: Arc::default(),
        }
    }

    /// One page of `ListTagsOfResource` of the table `arn`: its tags (key, value) and where
    /// the next page starts (`NextToken`). Table discovery by tag reads it (docs/config.md
    /// §1.5).
    pub async fn list_tags(
        &self,
        arn: &str,
        next: Option<&str>,
    ) -> Result<(Vec<(String, String)>, Option<String>), ApiError> {
        let output = self
            .client
            .list_tags_of_resource()
            .resource_arn(arn)
            .set_next_token(next.map(str::to_string))
            .send()
            .await
            .map_err(api_error)?;
        let tags = output
            .tags
            .unwrap_or_default()
            .into_iter()
            .map(|tag| (tag.key, tag.value))
            .collect();
        Ok((tags, output.next_token))
    }
}

fn non_empty<K, V>(map: HashMap<K, V>) -> Option<HashMap<K, V>> {
    (!map.is_empty()).then_some(map)
}

fn limit(value: Option<u32>) -> Option<i32> {
    value.map(|limit| limit.min(i32::MAX as u32) as i32)
}

fn page(
    items: Option<Vec<HashMap<String, AttributeValue>>>,
    last: Option<HashMap<String, AttributeValue>>,
    consumed: Option<aws_sdk_dynamodb::types::ConsumedCapacity>,
    table: &str,
) -> Result<Page, ApiError> {
    let unknown = |e: super::convert::UnknownType| {
        ApiError::fatal(format!(
            "unsupported attribute value type {} in table '{table}'",
            e.0
        ))
    };
    let items = items
        .unwrap_or_default()
        .into_iter()
        .map(item_from_sdk)
        .collect::<Result<Vec<_>, _>>()
        .map_err(unknown)?;
    let last_evaluated_key = match last {
        Some(key) if !key.is_empty() => Some(item_from_sdk(key).map_err(unknown)?),
        _ => None,
    };
    Ok(Page {
        items,
        last_evaluated_key,
        consumed_capacity: consumed.and_then(|c| c.capacity_units),
    })
}

fn key_schema(
    elements: Option<Vec<KeySchemaElement>>,
    types: &HashMap<String, ScalarAttributeType>,
) -> Vec<KeyAttribute> {
    let mut elements = elements.unwrap_or_default();
    // Hash key first, then range (docs/values.md §3.6).
    elements.sort_by_key(|e| !matches!(e.key_type, SdkKeyType::Hash));
    elements
        .into_iter()
        .map(|element| {
            let key_type = match types.get(&element.attribute_name) {
                Some(ScalarAttributeType::N) => KeyType::N,
                Some(ScalarAttributeType::B) => KeyType::B,
                _ => KeyType::S,
            };
            KeyAttribute {
                name: element.attribute_name,
                key_type,
            }
        })
        .collect()
}

impl AwsTableApi {
    /// The `Scan` of `request`, ready to send.
    fn scan(&self, request: &ReadRequest, segment: Option<(u32, u32)>) -> ScanFluentBuilder {
        let parts = RequestParts::of(request);
        self.client
            .scan()
            .table_name(&request.table_name)
            .set_index_name(request.index_name.clone())
            .set_projection_expression(request.projection.clone())
            .set_filter_expression(request.filter_expression.clone())
            .set_expression_attribute_names(parts.names)
            .set_expression_attribute_values(parts.values)
            .set_consistent_read(parts.consistent)
            .set_limit(limit(request.limit))
            .set_exclusive_start_key(parts.start)
            .set_segment(segment.map(|(s, _)| s as i32))
            .set_total_segments(segment.map(|(_, t)| t as i32))
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
    }

    /// The `Query` of `request`, ready to send.
    fn query(
        &self,
        request: &ReadRequest,
        key_condition: &str,
        scan_index_forward: bool,
    ) -> QueryFluentBuilder {
        let parts = RequestParts::of(request);
        self.client
            .query()
            .table_name(&request.table_name)
            .set_index_name(request.index_name.clone())
            .key_condition_expression(key_condition)
            .set_projection_expression(request.projection.clone())
            .set_filter_expression(request.filter_expression.clone())
            .set_expression_attribute_names(parts.names)
            .set_expression_attribute_values(parts.values)
            .set_consistent_read(parts.consistent)
            .scan_index_forward(scan_index_forward)
            .set_limit(limit(request.limit))
            .set_exclusive_start_key(parts.start)
            .return_consumed_capacity(ReturnConsumedCapacity::Total)
    }
}

/// The members `Scan` and `Query` share, in SDK types.
struct RequestParts {
    names: Option<HashMap<String, String>>,
    values: Option<HashMap<String, AttributeValue>>,
    start: Option<HashMap<String, AttributeValue>>,
    consistent: Option<bool>,
}

impl RequestParts {
    fn of(request: &ReadRequest) -> Self {
        RequestParts {
            names: non_empty(
                request
                    .expression_attribute_names
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            values: non_empty(
                request
                    .expression_attribute_values
                    .iter()
                    .map(|(k, v)| (k.clone(), value_to_sdk(v)))
                    .collect(),
            ),
            start: request.exclusive_start_key.as_ref().map(item_to_sdk),
            consistent: request.consistent_read.then_some(true),
        }
    }
}

impl TableApi for AwsTableApi {
    async fn read_page(&self, request: &ReadRequest) -> Result<Page, ApiError> {
        let table = request.table_name.as_str();
        match &request.kind {
            ReadKind::Scan { segment } => {
                let output = self
                    .scan(request, *segment)
                    .send()
                    .await
                    .map_err(api_error)?;
                page(
                    output.items,
                    output.last_evaluated_key,
                    output.consumed_capacity,
                    table,
                )
            }
            ReadKind::Query {
                key_condition,
                scan_index_forward,
            } => {
                let output = self
                    .query(request, key_condition, *scan_index_forward)
                    .send()
                    .await
                    .map_err(api_error)?;
                page(
                    output.items,
                    output.last_evaluated_key,
                    output.consumed_capacity,
                    table,
                )
            }
        }
    }

    /// The SDK sends the request and reads errors; a successful body is decoded here, straight
    /// into records (`wire`).
    async fn read_records(
        &self,
        request: &ReadRequest,
        render: &Render,
    ) -> Result<RenderedPage, ApiError> {
        let body = TakeBody::default();
        match &request.kind {
            ReadKind::Scan { segment } => {
                self.scan(request, *segment)
                    .customize()
                    .interceptor(body.clone())
                    .send()
                    .await
                    .map_err(api_error)?;
            }
            ReadKind::Query {
                key_condition,
                scan_index_forward,
            } => {
                self.query(request, key_condition, *scan_index_forward)
                    .customize()
                    .interceptor(body.clone())
                    .send()
                    .await
                    .map_err(api_error)?;
            }
        }
        wire::rendered_page(
            &body.collect(&self.buffers).await?,
            render,
            &request.table_name,
        )
    }

    async fn describe_table(&self, table_name: &str) -> Result<Option<TableDescription>, ApiError> {
        let output = self
            .client
            .describe_table()
            .table_name(table_name)
            .send()
            .await
            .map_err(api_error)?;
        let Some(table) = output.table else {
            return Ok(None);
        };
        let types: HashMap<String, ScalarAttributeType> = table
            .attribute_definitions
            .unwrap_or_default()
            .into_iter()
            .map(|d| (d.attribute_name, d.attribute_type))
            .collect();
        let mut indexes = Vec::new();
        for gsi in table.global_secondary_indexes.unwrap_or_default() {
            indexes.push(IndexDescription {
                name: gsi.index_name.unwrap_or_default(),
                kind: IndexKind::Gsi,
                key_schema: key_schema(gsi.key_schema, &types),
                read_capacity_units: gsi
                    .provisioned_throughput
                    .and_then(|p| p.read_capacity_units),
                max_read_request_units: gsi
                    .on_demand_throughput
                    .and_then(|o| o.max_read_request_units),
            });
        }
        for lsi in table.local_secondary_indexes.unwrap_or_default() {
            indexes.push(IndexDescription {
                name: lsi.index_name.unwrap_or_default(),
                kind: IndexKind::Lsi,
                key_schema: key_schema(lsi.key_schema, &types),
                read_capacity_units: None,
                max_read_request_units: None,
            });
        }
        indexes.sort_by(|a, b| a.name.cmp(&b.name));
        let billing_mode = table
            .billing_mode_summary
            .and_then(|b| b.billing_mode)
            .map(|m| m.as_str().to_string())
            .or_else(|| {
                // Tables created provisioned before billing modes existed report no summary.
                Some(BillingMode::Provisioned.as_str().to_string())
            });
        let stream = table.stream_specification.map(|spec| StreamInfo {
            enabled: spec.stream_enabled,
            view_type: spec.stream_view_type.map(|v| v.as_str().to_string()),
            arn: table.latest_stream_arn.clone(),
        });
        let stream = stream.or_else(|| {
            table.latest_stream_arn.clone().map(|arn| StreamInfo {
                enabled: false,
                view_type: None,
                arn: Some(arn),
            })
        });
        Ok(Some(TableDescription {
            name: table.table_name.unwrap_or_else(|| table_name.to_string()),
            arn: table.table_arn,
            status: table.table_status.map(|s| s.as_str().to_string()),
            item_count: table.item_count,
            size_bytes: table.table_size_bytes,
            billing_mode,
            key_schema: key_schema(table.key_schema, &types),
            read_capacity_units: table
                .provisioned_throughput
                .and_then(|p| p.read_capacity_units),
            max_read_request_units: table
                .on_demand_throughput
                .and_then(|o| o.max_read_request_units),
            indexes,
            stream,
        }))
    }

    async fn list_tables(&self, exclusive_start: Option<&str>) -> Result<TableNames, ApiError> {
        let output = self
            .client
            .list_tables()
            .set_exclusive_start_table_name(exclusive_start.map(str::to_string))
            .send()
            .await
            .map_err(api_error)?;
        Ok(TableNames {
            names: output.table_names.unwrap_or_default(),
            last_evaluated: output.last_evaluated_table_name,
        })
    }
}
