//! Load a pipeline file and run it, as `ddbpipe run` does, then print how it ended.
//!
//! ```text
//! cargo run --example yaml_pipeline -- orders.yaml
//! ```
//!
//! Ctrl-C stops the run cleanly: what was acknowledged is saved, and the next run resumes.

use std::path::Path;

/// Runs the pipeline file at `path` until it ends or `stop` fires.
pub async fn run_file(
    path: &Path,
    stop: ddbpipe::Cancel,
) -> Result<ddbpipe::Summary, ddbpipe::Error> {
    let pipeline = ddbpipe::Pipeline::from_path(path)?;
    for warning in pipeline.warnings() {
        eprintln!("warning: {warning}");
    }
    pipeline.run(stop).await
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args_os().nth(1) else {
        eprintln!("usage: yaml_pipeline PIPELINE.yaml");
        return std::process::ExitCode::from(2);
    };
    let (handle, stop) = ddbpipe::Cancel::new();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        handle.cancel();
    });
    match run_file(Path::new(&path), stop).await {
        Ok(summary) => {
            println!("{summary}");
            if let Some(note) = summary.note() {
                println!("{note}");
            }
            std::process::ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            for problem in error.config_errors() {
                eprintln!("  {}: {}", problem.path, problem.message);
            }
            if let Some(hint) = error.hint() {
                eprintln!("hint: {hint}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
