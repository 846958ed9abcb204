//! The read rate of a scan (docs/scan.md §2.7): a fixed limit, a fraction of the table's capacity, or
//! both, decided from the config and a `DescribeTable` answer.
//!
//! # Rules
//! 1. The capacity base is the provisioned RCU of the table, or of the GSI named by
//!    `index_name` (an LSI shares the table's); an on-demand table's base is its maximum read
//!    request units. A base that is not positive is no base; a provisioned table without RCU
//!    falls back to its maximum.
//! 2. Without `read_capacity_fraction` the rate is `max_read_units_per_second` (or none).
//! 3. With a base, the rate is `base × fraction`, clamped into the limiter's bounds
//!    ([`clamp_rate`]), and at most the fixed limit when one is set.
//! 4. Without a base the fixed limit applies; with no fixed limit either, the fraction cannot
//!    be applied: a definite config error naming `max_read_units_per_second` as the remedy.
//! 5. A rate from a fraction is re-read now and then (auto-scaling changes the base): the
//!    new rate replaces the old one only while a base exists ([`ReadRule::refreshed`]).

use crate::api::{IndexKind, TableDescription};
use crate::capacity::clamp_rate;
use crate::config::SourceConfig;

/// The read-rate settings of a source: what docs/scan.md §2.7 needs besides the table's description.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReadRule {
    /// The configured table name (for messages).
    pub table_name: String,
    /// `index_name`: a GSI has its own capacity.
    pub index_name: Option<String>,
    /// `read_capacity_fraction`.
    pub fraction: Option<f64>,
    /// `max_read_units_per_second`.
    pub fixed: Option<f64>,
}

/// Definite: `read_capacity_fraction` has no base and no fixed limit replaces it (rule 4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "table '{table}' is on-demand (PAY_PER_REQUEST) with no maximum read throughput; \
     read_capacity_fraction needs a base — set source.max_read_units_per_second"
)]
pub struct NoCapacityBase {
    /// The configured table name.
    pub table: String,
}

impl ReadRule {
    /// The read-rate settings of `source`.
    pub fn of(source: &SourceConfig) -> Self {
        ReadRule {
            table_name: source.table_name.clone(),
            index_name: source.index_name.clone(),
            fraction: source.read_capacity_fraction,
            fixed: source.max_read_units_per_second,
        }
    }

    /// Whether the rate depends on the table's capacity, and so is re-read (rule 5).
    pub fn refreshes(&self) -> bool {
        self.fraction.is_some()
    }

    /// The base of `read_capacity_fraction` (rule 1).
    pub fn capacity_base(&self, table: &TableDescription) -> Option<f64> {
        let index = self.index_name.as_deref().and_then(|n| table.index(n));
        let (provisioned, maximum) = match index {
            Some(index) if index.kind == IndexKind::Gsi => {
                (index.read_capacity_units, index.max_read_request_units)
            }
            _ => (table.read_capacity_units, table.max_read_request_units),
        };
        let positive = |v: Option<i64>| v.filter(|v| *v > 0).map(|v| v as f64);
        if table.is_on_demand() {
            positive(maximum)
        } else {
            positive(provisioned).or(positive(maximum))
        }
    }

    /// The effective read rate for `table` (rules 2–4); `None` is unlimited.
    pub fn rate(&self, table: &TableDescription) -> Result<Option<f64>, NoCapacityBase> {
        let Some(fraction) = self.fraction else {
            return Ok(self.fixed);
        };
        match self.capacity_base(table) {
            Some(base) => {
                let from_fraction = clamp_rate(base * fraction);
                Ok(Some(
                    self.fixed.map_or(from_fraction, |f| f.min(from_fraction)),
                ))
            }
            None if self.fixed.is_some() => Ok(self.fixed),
            None => Err(NoCapacityBase {
                table: self.table_name.clone(),
            }),
        }
    }

    /// The rate a re-read description sets (rule 5): `None` keeps the current rate.
    pub fn refreshed(&self, table: &TableDescription) -> Option<f64> {
        match self.rate(table) {
            Ok(Some(rate)) if self.capacity_base(table).is_some() => Some(rate),
            _ => None,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::IndexDescription;

    /// A table billed `billing` with these read capacities.
    pub(crate) fn table(billing: &str, rcu: Option<i64>, max: Option<i64>) -> TableDescription {
        TableDescription {
            name: "t".into(),
            arn: None,
            status: None,
            item_count: None,
            size_bytes: None,
            billing_mode: Some(billing.into()),
            key_schema: Vec::new(),
            read_capacity_units: rcu,
            max_read_request_units: max,
            indexes: Vec::new(),
            stream: None,
        }
    }

    fn rule(fraction: Option<f64>, fixed: Option<f64>) -> ReadRule {
        ReadRule {
            table_name: "t".into(),
            index_name: None,
            fraction,
            fixed,
        }
    }

    #[test]
    fn without_a_fraction_the_fixed_limit_is_the_rate() {
        let on_demand = table("PAY_PER_REQUEST", None, None);
        assert_eq!(rule(None, Some(7.0)).rate(&on_demand), Ok(Some(7.0)));
        assert_eq!(rule(None, None).rate(&on_demand), Ok(None));
        assert!(!rule(None, Some(7.0)).refreshes());
    }

    #[test]
    fn a_fraction_of_the_provisioned_capacity_is_capped_by_the_fixed_limit() {
        let provisioned = table("PROVISIONED", Some(100), None);
        assert_eq!(rule(Some(0.5), None).rate(&provisioned), Ok(Some(50.0)));
        assert_eq!(
            rule(Some(0.5), Some(20.0)).rate(&provisioned),
            Ok(Some(20.0))
        );
        assert!(rule(Some(0.5), None).refreshes());
    }

    #[test]
    fn an_on_demand_table_bases_the_fraction_on_its_maximum_only() {
        let capped = table("PAY_PER_REQUEST", Some(100), Some(40));
        assert_eq!(rule(Some(0.5), None).rate(&capped), Ok(Some(20.0)));
        let provisioned_without_rcu = table("PROVISIONED", Some(0), Some(40));
        assert_eq!(
            rule(Some(0.5), None).capacity_base(&provisioned_without_rcu),
            Some(40.0)
        );
    }

    #[test]
    fn a_tiny_fraction_is_clamped_to_the_least_rate() {
        let provisioned = table("PROVISIONED", Some(1), None);
        assert_eq!(
            rule(Some(1e-6), None).rate(&provisioned),
            Ok(Some(crate::capacity::MIN_READ_RATE))
        );
    }

    #[test]
    fn no_base_falls_back_to_the_fixed_limit_or_fails_naming_the_remedy() {
        let on_demand = table("PAY_PER_REQUEST", None, None);
        assert_eq!(rule(Some(0.5), Some(9.0)).rate(&on_demand), Ok(Some(9.0)));
        let error = rule(Some(0.5), None).rate(&on_demand).unwrap_err();
        assert_eq!(
            error.to_string(),
            "table 't' is on-demand (PAY_PER_REQUEST) with no maximum read throughput; \
             read_capacity_fraction needs a base — set source.max_read_units_per_second"
        );
    }

    #[test]
    fn a_gsi_has_its_own_base_and_an_lsi_shares_the_tables() {
        let mut provisioned = table("PROVISIONED", Some(100), None);
        for (name, kind, rcu) in [("g", IndexKind::Gsi, 10), ("l", IndexKind::Lsi, 10)] {
            provisioned.indexes.push(IndexDescription {
                name: name.into(),
                kind,
                key_schema: Vec::new(),
                read_capacity_units: Some(rcu),
                max_read_request_units: None,
            });
        }
        let on = |index: &str| ReadRule {
            index_name: Some(index.into()),
            ..rule(Some(1.0), None)
        };
        assert_eq!(on("g").rate(&provisioned), Ok(Some(10.0)));
        assert_eq!(on("l").rate(&provisioned), Ok(Some(100.0)));
    }

    #[test]
    fn a_refresh_keeps_the_current_rate_when_the_base_is_gone() {
        let fraction = rule(Some(0.5), Some(9.0));
        assert_eq!(
            fraction.refreshed(&table("PROVISIONED", Some(10), None)),
            Some(5.0)
        );
        assert_eq!(
            fraction.refreshed(&table("PAY_PER_REQUEST", None, None)),
            None
        );
    }
}
