//! The metrics and logs a test observes: a counting recorder and a log capture, both for the
//! current thread (the tests run on tokio's current-thread runtime).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A metrics recorder of counters, for [`metrics::set_default_local_recorder`].
#[derive(Debug, Default, Clone)]
pub struct Counts(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counts {
    /// The counter `name{label=value,…}` (0 when never incremented).
    pub fn get(&self, key: &str) -> u64 {
        let counts = self.0.lock().expect("counts");
        counts.get(key).copied().unwrap_or(0)
    }
}

/// One registered counter.
struct Counted(Arc<Mutex<BTreeMap<String, u64>>>, String);

impl metrics::CounterFn for Counted {
    fn increment(&self, value: u64) {
        *self
            .0
            .lock()
            .expect("counts")
            .entry(self.1.clone())
            .or_default() += value;
    }

    fn absolute(&self, value: u64) {
        self.0.lock().expect("counts").insert(self.1.clone(), value);
    }
}

impl metrics::Recorder for Counts {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        metrics::Counter::from_arc(Arc::new(Counted(Arc::clone(&self.0), name)))
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// The log lines written on this thread while it lives.
///
/// One global subscriber (installed by the first capture) writes each event to the capture of
/// the thread that emits it, if any. A scoped subscriber per test (`set_default`) would be
/// simpler, but tracing recomputes its global level filter whenever one is created or dropped,
/// and a test on another thread doing that can make an event here be skipped.
pub struct Logs {
    lines: Arc<Mutex<Vec<u8>>>,
}

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Arc<Mutex<Vec<u8>>>>> =
        const { std::cell::RefCell::new(None) };
}

impl Logs {
    /// Captures from now on.
    pub fn capture() -> Logs {
        static INSTALLED: std::sync::Once = std::sync::Once::new();
        INSTALLED.call_once(|| {
            let subscriber = tracing_subscriber::fmt()
                .with_ansi(false)
                .with_max_level(tracing::Level::TRACE)
                .with_writer(|| Writer)
                .finish();
            tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        });
        let lines = Arc::new(Mutex::new(Vec::new()));
        CAPTURE.with(|capture| *capture.borrow_mut() = Some(Arc::clone(&lines)));
        Logs { lines }
    }

    /// What was written.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.lines.lock().expect("logs")).into_owned()
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        CAPTURE.with(|capture| capture.borrow_mut().take());
    }
}

/// Writes to the emitting thread's capture (nothing when it has none).
struct Writer;

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|capture| {
            if let Some(lines) = capture.borrow().as_ref() {
                lines.lock().expect("logs").extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
