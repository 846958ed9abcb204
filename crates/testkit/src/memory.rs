//! An in-memory [`Sink`] that keeps every acknowledged line and batch.

use std::time::Duration;

use ddbpipe_pipeline::batch::Batch;
use ddbpipe_pipeline::sink::{Sink, SinkError, SinkErrorClass, Staged, Versioned};
use ddbpipe_source::streams::handover::StreamMark;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One acknowledged batch: where its lines are in [`MemorySink::lines`] and the stream marks
/// it carried.
#[derive(Debug, Clone)]
pub struct Acked {
    /// Index of its first line.
    pub first: usize,
    /// Lines in it.
    pub len: usize,
    /// Its stream position marks, in hand-over order.
    pub marks: Vec<StreamMark>,
}

/// Keeps every acknowledged line, decoded by its decoder (`String` by default), and every
/// acknowledged batch. It can be told to fail one batch, to take time for each write, to wait
/// a random time before and after each write (a crash during the wait after replays the
/// batch), and to look at something before each write.
pub struct MemorySink<L = String> {
    /// The acknowledged lines, in order.
    pub lines: Vec<L>,
    /// The acknowledged batches, in order.
    pub batches: Vec<Acked>,
    /// Fails (transiently) the write of the batch with this index among the acknowledged ones.
    pub fail_at: Option<usize>,
    /// Each write takes this long (tokio time).
    pub delay: Duration,
    /// Whether [`Sink::versioned`] answers with the sink (a test of a run that reads the
    /// stream during its snapshot says `true`).
    pub versioned: bool,
    decode: fn(&[u8]) -> L,
    jitter: Option<(StdRng, Duration)>,
    before_write: Option<Box<dyn FnMut(usize) + Send>>,
}

impl Default for MemorySink<String> {
    fn default() -> Self {
        MemorySink::decoding(|line| String::from_utf8(line.to_vec()).unwrap())
    }
}

impl<L> MemorySink<L> {
    /// A sink keeping each line as `decode` makes it.
    pub fn decoding(decode: fn(&[u8]) -> L) -> Self {
        MemorySink {
            lines: Vec::new(),
            batches: Vec::new(),
            fail_at: None,
            delay: Duration::ZERO,
            versioned: false,
            decode,
            jitter: None,
            before_write: None,
        }
    }

    /// Fails (transiently) the write of the batch with index `batch` among the acknowledged ones.
    pub fn failing_at(mut self, batch: usize) -> Self {
        self.fail_at = Some(batch);
        self
    }

    /// Makes each write take `delay` (tokio time).
    pub fn taking(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Waits up to `max` (seeded by `seed`) before and after each write.
    pub fn with_jitter(mut self, seed: u64, max: Duration) -> Self {
        if !max.is_zero() {
            self.jitter = Some((StdRng::seed_from_u64(seed), max));
        }
        self
    }

    /// Calls `look` before each write with the number of lines acknowledged so far.
    pub fn before_write(mut self, look: impl FnMut(usize) + Send + 'static) -> Self {
        self.before_write = Some(Box::new(look));
        self
    }

    async fn wait(&mut self) {
        if let Some((rng, max)) = &mut self.jitter {
            let wait = rng.random_range(0..=max.as_millis() as u64);
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }
}

impl<L: Send> Sink for MemorySink<L> {
    async fn write(&mut self, batch: &Batch, _state: Option<&Staged>) -> Result<(), SinkError> {
        if let Some(look) = &mut self.before_write {
            look(self.lines.len());
        }
        if self.fail_at == Some(self.batches.len()) {
            return Err(SinkError {
                sink: "memory".into(),
                message: "disk full".into(),
                class: SinkErrorClass::Transient,
            });
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.wait().await;
        let first = self.lines.len();
        self.lines
            .extend(batch.records.iter().map(|line| (self.decode)(line)));
        self.batches.push(Acked {
            first,
            len: batch.records.len(),
            marks: batch.shards.clone(),
        });
        // Written and durable; a crash during this wait replays the batch.
        self.wait().await;
        Ok(())
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn versioned(&self) -> Option<&impl Versioned> {
        self.versioned.then_some(self)
    }
}

/// When [`MemorySink::versioned`] is set: the run reads the stream beside a snapshot.
impl<L: Send> Versioned for MemorySink<L> {}
