//! The metrics listener (`/metrics`, `/health`) and `--metrics-file`.

use std::path::PathBuf;
use std::time::Duration;

use ddbpipe_source::health::Health;
use metrics_exporter_prometheus::PrometheusHandle;
use metrics_tracing_context::TracingContextLayer;
use metrics_util::layers::Layer as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Where a run's Prometheus metrics go: served on an address, written to a file at the end
/// (for the node-exporter textfile collector: runs that end, from cron), or both.
#[derive(Debug, Clone, Default)]
pub struct MetricsOutput {
    /// `--metrics-addr`: served at `/metrics` while the run lasts.
    pub addr: Option<std::net::SocketAddr>,
    /// `--metrics-file`: the final values in the Prometheus text format, written when the run
    /// ends (temporary file, then renamed over it).
    pub file: Option<PathBuf>,
}

/// The installed recorder's handle, to write the final metrics.
pub struct Metrics {
    handle: PrometheusHandle,
    file: Option<PathBuf>,
}

/// Installs the Prometheus recorder when `output` asks for metrics: every series labelled
/// `pipeline` and `table`, every metric described (`# HELP`). With `--metrics-addr` the listener serves
/// `/metrics` and `/health`, which judges the run with the bound `stall` (docs/cli.md §8.6).
pub fn install_metrics(
    output: &MetricsOutput,
    pipeline: &str,
    stall: Duration,
) -> anyhow::Result<Option<Metrics>> {
    if output.addr.is_none() && output.file.is_none() {
        return Ok(None);
    }
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
        .add_global_label("pipeline", pipeline)
        .build_recorder();
    let handle = recorder.handle();
    // `table` from the run span a metric is recorded in (`crate::run`'s `Run::span`, whose
    // tasks are all in it): a file of several tables keeps each one's series apart.
    let recorder = TracingContextLayer::only_allow(["table"]).layer(recorder);
    metrics::set_global_recorder(recorder)
        .map_err(|e| anyhow::anyhow!("cannot set up metrics: {e}"))?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(UPKEEP_INTERVAL);
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    if let Some(addr) = output.addr {
        let listener = std::net::TcpListener::bind(addr)
            .and_then(|listener| {
                listener.set_nonblocking(true)?;
                tokio::net::TcpListener::from_std(listener)
            })
            .map_err(|e| anyhow::anyhow!("cannot listen on --metrics-addr {addr}: {e}"))?;
        tokio::spawn(serve(listener, handle.clone(), stall));
        tracing::info!(%addr, "Serving Prometheus metrics and health.");
    }
    ddbpipe_source::events::describe_metrics();
    ddbpipe_pipeline::events::describe_metrics();
    ddbpipe_keyed::describe_metrics();
    Ok(Some(Metrics {
        handle,
        file: output.file.clone(),
    }))
}

/// How often the recorder's upkeep runs (what the library's own listener did).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// The most a request's head may take, in bytes and in time: probes and scrapers send a line
/// and a few headers.
const REQUEST_HEAD_BYTES: usize = 16 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Answers each connection of the metrics listener on a task of its own.
async fn serve(listener: TcpListener, handle: PrometheusHandle, stall: Duration) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let handle = handle.clone();
                tokio::spawn(async move {
                    if let Err(error) = answer(stream, &handle, stall).await {
                        tracing::debug!(error = %error, "A metrics request failed.");
                    }
                });
            }
            Err(error) => {
                tracing::debug!(error = %error, "The metrics listener could not accept.");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// One HTTP/1.1 request, answered and closed: `GET /metrics` (or `/`) the Prometheus text,
/// `GET /health` the run's health as JSON with 200 or 503.
async fn answer(
    mut stream: TcpStream,
    handle: &PrometheusHandle,
    stall: Duration,
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REQUEST_HEAD_BYTES {
        let read = tokio::time::timeout(REQUEST_TIMEOUT, stream.read(&mut buffer))
            .await
            .map_err(|_| std::io::Error::other("request head timed out"))??;
        if read == 0 {
            break;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut words = head.lines().next().unwrap_or_default().split(' ');
    let method = words.next().unwrap_or_default();
    let path = words
        .next()
        .unwrap_or_default()
        .split('?')
        .next()
        .unwrap_or_default();
    let (status, kind, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics" | "/") => {
            ("200 OK", "text/plain; version=0.0.4", handle.render())
        }
        ("GET" | "HEAD", "/health") => {
            let health = ddbpipe_source::health::now(stall);
            let status = if health.state.healthy() {
                "200 OK"
            } else {
                "503 Service Unavailable"
            };
            (status, "application/json", health_json(&health, stall))
        }
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain",
            "not found: /metrics and /health are served\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET and HEAD are answered\n".to_string(),
        ),
    };
    let mut response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        response.push_str(&body);
    }
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The body of `/health`: the state, why, and the bound it was judged by.
fn health_json(health: &Health, stall: Duration) -> String {
    let round = |secs: f64| (secs * 10.0).round() / 10.0;
    serde_json::json!({
        "state": health.state.as_str(),
        "last_progress_secs": round(health.last_progress_secs),
        "last_commit_secs": health.last_commit_secs.map(round),
        "sink_write_secs": health.writing_secs.map(round),
        "stall_secs": stall.as_secs(),
        "error": health.error,
    })
    .to_string()
}

impl Metrics {
    /// Writes the final metrics to `--metrics-file`, if set: a temporary file beside it, then
    /// renamed over it, so a collector never reads half a file.
    pub fn write_final(&self) -> anyhow::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let temporary = path.with_file_name(format!(".{name}.tmp"));
        std::fs::write(&temporary, self.handle.render())
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| anyhow::anyhow!("cannot write --metrics-file {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn get(port: u16, path: &str) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    /// Issue 24 item 18: after a definite error `/health` answers 503 `failed` with the error,
    /// for as long as the process stays up; `/metrics` is still served.
    #[tokio::test]
    async fn health_answers_503_failed_with_the_error_after_a_definite_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let handle = metrics_exporter_prometheus::PrometheusBuilder::new()
            .build_recorder()
            .handle();
        tokio::spawn(serve(listener, handle, Duration::from_secs(300)));
        ddbpipe_source::health::start();
        ddbpipe_source::health::failed(&"scan of 'orders' failed after 1 attempt(s): denied");

        let answer = get(port, "/health").await;
        assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
        let body: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(body["state"], "failed", "{body}");
        assert_eq!(
            body["error"],
            "scan of 'orders' failed after 1 attempt(s): denied"
        );
        assert!(get(port, "/metrics").await.starts_with("HTTP/1.1 200 "));
        assert!(get(port, "/other").await.starts_with("HTTP/1.1 404 "));
    }
}
