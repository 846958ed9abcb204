//! The fake stream's state: applying the script, the fault dice and the three calls' answers.

use super::*;

impl State {
    pub(super) fn wall_ms(&self, at: Instant) -> i64 {
        self.wall_origin_ms + at.saturating_duration_since(self.epoch).as_millis() as i64
    }

    /// The wall clock at `at` in unix µs, not rounded to the millisecond.
    pub(super) fn wall_micros(&self, at: Instant) -> i64 {
        self.wall_origin_ms * 1000 + at.saturating_duration_since(self.epoch).as_micros() as i64
    }

    pub(super) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    /// Applies every scripted change that is due, then the retention.
    pub(super) fn advance(&mut self, now: Instant) {
        let due = self.script.partition_point(|(t, _, _)| *t <= now);
        let changes: Vec<(Instant, u64, Change)> = self.script.drain(..due).collect();
        for (at, _, change) in changes {
            self.change(at, change);
        }
        if let Some(retention) = self.retention
            && let Some(horizon) = now.checked_sub(retention)
        {
            let horizon_ms = self.wall_ms(horizon);
            for shard in &mut self.shards {
                let old = shard
                    .records
                    .iter()
                    .take_while(|r| r.created_ms < horizon_ms)
                    .count();
                shard.trimmed = shard.trimmed.max(old);
            }
        }
    }

    pub(super) fn shard_mut(&mut self, id: &str) -> Option<&mut Shard> {
        let i = *self.index.get(&ShardId::new(id))?;
        Some(&mut self.shards[i])
    }

    pub(super) fn add_shard(
        &mut self,
        id: &str,
        parent: Option<ShardId>,
        range: (u32, u32),
        listed_at: Instant,
    ) {
        let id = ShardId::new(id);
        if self.index.contains_key(&id) {
            return;
        }
        self.index.insert(id.clone(), self.shards.len());
        self.shards.push(Shard {
            id,
            parent,
            range,
            records: Vec::new(),
            closed_at: None,
            listed_at,
            expired: false,
            trimmed: 0,
            reads: 0,
            scripted: None,
        });
    }

    pub(super) fn change(&mut self, at: Instant, change: Change) {
        match change {
            Change::Root { shard, range } => {
                self.add_shard(&shard, None, range.unwrap_or((0, HASH_SPACE)), at);
            }
            Change::Write { key, remove } => {
                let h = hash(&key);
                let target = self
                    .shards
                    .iter()
                    .position(|s| s.closed_at.is_none() && s.range.0 <= h && h < s.range.1);
                if let Some(i) = target {
                    self.write(at, i, key, remove);
                }
            }
            Change::WriteTo { shard, key } => {
                if let Some(&i) = self.index.get(&ShardId::new(&shard))
                    && self.shards[i].closed_at.is_none()
                {
                    self.write(at, i, key, false);
                }
            }
            Change::Reshard {
                parent,
                children,
                listed_after,
            } => {
                let Some(p) = self.shard_mut(&parent) else {
                    return;
                };
                if p.closed_at.is_some() {
                    return;
                }
                p.closed_at = Some(at);
                let (from, to) = p.range;
                let parent_id = p.id.clone();
                // A shard is never listed before its parent.
                let listed_at = (at + listed_after).max(p.listed_at);
                let n = children.len().max(1) as u32;
                for (k, child) in children.iter().enumerate() {
                    let k = k as u32;
                    let range = (from + (to - from) * k / n, from + (to - from) * (k + 1) / n);
                    self.add_shard(child, Some(parent_id.clone()), range, listed_at);
                }
            }
            Change::Close { shard } => {
                if let Some(s) = self.shard_mut(&shard) {
                    s.closed_at.get_or_insert(at);
                }
            }
            Change::Expire { shard } => {
                if let Some(s) = self.shard_mut(&shard) {
                    s.closed_at.get_or_insert(at);
                    s.expired = true;
                }
            }
            Change::Trim { shard, through } => {
                if let Some(s) = self.shard_mut(&shard) {
                    s.trimmed = s.trimmed.max((through + 1).min(s.records.len()));
                }
            }
        }
    }

    pub(super) fn write(&mut self, at: Instant, shard: usize, key: String, remove: bool) {
        let (version, exists) = self.versions.get(&key).copied().unwrap_or((0, false));
        let event = match (remove, exists) {
            (true, _) => "REMOVE",
            (false, true) => "MODIFY",
            (false, false) => "INSERT",
        };
        let version = version + 1;
        self.versions.insert(key.clone(), (version, !remove));
        let seq = self.next_seq;
        self.next_seq += 1;
        let delay = if self.chance(self.faults.late) {
            let max = self.faults.visibility_delay.as_millis().max(1) as u64;
            Duration::from_millis(self.rng.random_range(0..=max))
        } else {
            Duration::ZERO
        };
        let created_ms = self.wall_ms(at);
        self.history.push(TableWrite {
            micros: self.wall_micros(at),
            key: key.clone(),
            version,
            removed: remove,
        });
        let s = &mut self.shards[shard];
        let previous = s.records.last().map_or(at, |r| r.visible_at);
        let written = Written {
            shard: s.id.clone(),
            index: s.records.len(),
            seq: SequenceNumber::parse(&seq.to_string()).expect("a u128 prints as digits"),
            key,
            version,
            event,
        };
        s.records.push(Record {
            written: written.clone(),
            created_ms,
            visible_at: previous.max(at + delay),
            old_version: exists.then_some(version - 1),
        });
        self.written.push(written);
    }

    /// A scripted throttle or 5xx, if the dice say so.
    pub(super) fn random_fault(&mut self, what: &str) -> Option<ApiError> {
        if self.chance(self.faults.throttle) {
            return Some(api(
                "ProvisionedThroughputExceededException",
                format!("{what}: rate exceeded (fake)"),
            ));
        }
        if self.chance(self.faults.transient) {
            return Some(api(
                "InternalServerError",
                format!("{what}: internal error (fake)"),
            ));
        }
        None
    }

    pub(super) fn iterator(&self, shard: usize, pos: usize, now: Instant, fresh: bool) -> String {
        let issued = now.saturating_duration_since(self.epoch).as_millis();
        let kind = if fresh { 'f' } else { 'n' };
        format!("fake-iterator/{shard}/{pos}/{issued}/{kind}")
    }

    pub(super) fn image(key: &str, version: u64) -> Item {
        Item::from([
            ("pk".to_string(), Value::S(key.to_string())),
            ("v".to_string(), Value::N(Number::new(version.to_string()))),
        ])
    }

    pub(super) fn stream_record(record: &Record) -> StreamRecord {
        let w = &record.written;
        let keys = Item::from([("pk".to_string(), Value::S(w.key.clone()))]);
        StreamRecord {
            event_id: Some(format!("event-{}", w.seq)),
            event_name: Some(w.event.to_string()),
            change: Some(ChangeData {
                created_ms: Some(record.created_ms),
                keys: Some(keys),
                new_image: (w.event != "REMOVE").then(|| Self::image(&w.key, w.version)),
                old_image: record.old_version.map(|v| Self::image(&w.key, v)),
                sequence_number: Some(w.seq.clone()),
                size_bytes: Some(64),
                view_type: Some("NEW_AND_OLD_IMAGES".into()),
            }),
            user_identity: None,
        }
    }

    pub(super) fn get_records(
        &mut self,
        iterator: &str,
        limit: u32,
        now: Instant,
    ) -> Result<RecordsPage, ApiError> {
        let invalid = || {
            api(
                "ValidationException",
                format!("invalid shard iterator '{iterator}'"),
            )
        };
        let parts: Vec<&str> = iterator.split('/').collect();
        let [_, shard, pos, issued, kind] = parts[..] else {
            return Err(invalid());
        };
        let (Ok(i), Ok(pos), Ok(issued)) = (
            shard.parse::<usize>(),
            pos.parse::<usize>(),
            issued.parse::<u64>(),
        ) else {
            return Err(invalid());
        };
        if i >= self.shards.len() || pos > self.shards[i].records.len() {
            return Err(invalid());
        }
        let reads = self.shards[i].reads;
        if let Some((after, errors)) = &mut self.shards[i].scripted
            && reads >= *after
            && let Some(error) = errors.pop_front()
        {
            return Err(error);
        }
        if let Some(error) = self.random_fault("GetRecords") {
            return Err(error);
        }
        let age = now.saturating_duration_since(self.epoch + Duration::from_millis(issued));
        let expired =
            age > self.faults.iterator_ttl || (kind == "n" && self.chance(self.faults.expire));
        if expired {
            return Err(api("ExpiredIteratorException", "Iterator expired (fake)"));
        }
        let shard = &self.shards[i];
        if pos < shard.trimmed {
            return Err(api(
                "TrimmedDataAccessException",
                format!(
                    "records of {} before the trim horizon are gone (fake)",
                    shard.id
                ),
            ));
        }
        let closed = shard.closed_at.is_some_and(|t| t <= now);
        let visible = shard.records[pos..]
            .iter()
            .take_while(|r| r.visible_at <= now)
            .count();
        let take = if visible > 0 && self.chance(self.faults.empty) {
            0
        } else {
            visible.min(limit.max(1) as usize)
        };
        let shard = &self.shards[i];
        let records: Vec<StreamRecord> = shard.records[pos..pos + take]
            .iter()
            .map(Self::stream_record)
            .collect();
        let end = pos + take;
        let at_end = closed && end == shard.records.len();
        let next = if at_end && (take == 0 || self.chance(self.faults.last_page_ends)) {
            None
        } else {
            Some(self.iterator(i, end, now, false))
        };
        self.shards[i].reads += 1;
        Ok(RecordsPage {
            records,
            next_iterator: next,
        })
    }
}

impl State {
    pub(super) fn describe_stream(
        &mut self,
        stream_arn: &str,
        exclusive_start: Option<&ShardId>,
        child_of: Option<&ShardId>,
        now: Instant,
    ) -> Result<StreamPage, ApiError> {
        self.calls.describe += 1;
        if child_of.is_some() {
            self.calls.describe_children += 1;
        }
        if stream_arn != FAKE_STREAM_ARN {
            return Err(api(
                "ResourceNotFoundException",
                format!("no stream {stream_arn}"),
            ));
        }
        if let Some(error) = self.random_fault("DescribeStream") {
            return Err(error);
        }
        let describe = |s: &Shard| ShardDescription {
            id: s.id.clone(),
            parent: s.parent.clone(),
            closed: s.closed_at.is_some_and(|t| t <= now),
        };
        let listed = (self.shards.iter()).filter(|s| s.listed_at <= now && !s.expired);
        let mut page = StreamPage {
            status: Some("ENABLED".into()),
            view_type: Some("NEW_AND_OLD_IMAGES".into()),
            ..StreamPage::default()
        };
        if let Some(parent) = child_of {
            match self.faults.child_filter {
                ChildFilter::Honoured => {
                    page.shards = listed
                        .filter(|s| s.parent.as_ref() == Some(parent))
                        .map(describe)
                        .collect();
                    return Ok(page);
                }
                ChildFilter::Rejected => {
                    return Err(api(
                        "ValidationException",
                        "ShardFilter is not supported (fake)",
                    ));
                }
                ChildFilter::Ignored => {}
            }
        }
        let after: Vec<&Shard> = match exclusive_start {
            None => listed.collect(),
            Some(start) => listed.skip_while(|s| &s.id != start).skip(1).collect(),
        };
        page.shards = after.iter().take(PAGE).map(|s| describe(s)).collect();
        if after.len() > PAGE {
            page.last_evaluated_shard_id = page.shards.last().map(|s| s.id.clone());
        }
        Ok(page)
    }

    pub(super) fn shard_iterator(
        &mut self,
        stream_arn: &str,
        shard: &ShardId,
        start: &StartAt,
        now: Instant,
    ) -> Result<Option<String>, ApiError> {
        self.calls.shard_iterator += 1;
        let Some(&i) = (self.index.get(shard))
            .filter(|_| stream_arn == FAKE_STREAM_ARN)
            .filter(|&&i| !self.shards[i].expired)
        else {
            return Err(api(
                "ResourceNotFoundException",
                format!("no shard {shard}"),
            ));
        };
        if let Some(error) = self.random_fault("GetShardIterator") {
            return Err(error);
        }
        let s = &self.shards[i];
        let pos = match start {
            StartAt::TrimHorizon => s.trimmed,
            StartAt::Latest => s.records.len(),
            StartAt::After(seq) => {
                let Some(at) = s.records.iter().position(|r| &r.written.seq == seq) else {
                    return Err(api(
                        "ValidationException",
                        format!("sequence number {seq} is not in shard {shard}"),
                    ));
                };
                if s.trimmed > at + 1 {
                    return Err(api(
                        "TrimmedDataAccessException",
                        format!("records of {shard} after {seq} were trimmed (fake)"),
                    ));
                }
                at + 1
            }
        };
        Ok(Some(self.iterator(i, pos, now, true)))
    }

    /// Keeps the last calls and their answers, for a failing test to print.
    pub(super) fn note(&mut self, now: Instant, call: String, answer: String) {
        if self.journal.len() == JOURNAL {
            self.journal.pop_front();
        }
        let at = now.saturating_duration_since(self.epoch);
        self.journal.push_back(format!("{at:?} {call} -> {answer}"));
    }
}

pub(super) fn summary<T>(answer: &Result<T, ApiError>, ok: impl FnOnce(&T) -> String) -> String {
    match answer {
        Ok(value) => ok(value),
        Err(error) => error.to_string(),
    }
}
