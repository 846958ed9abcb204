//! `ddbpipe schema`: the JSON Schema of the pipeline file, for editors and linters.
//!
//! The schema is made of the same field declarations the config loader reads (see
//! `config::schema`), so it names exactly the keys `check` and `run` accept.

use std::io::Write;

use anyhow::anyhow;

use crate::config;
use crate::failure::{Exit, Failure};

/// Prints the JSON Schema (draft 2020-12) of the pipeline file on stdout.
pub fn schema() -> Result<Exit, Failure> {
    let text = serde_json::to_string_pretty(&config::json_schema())
        .map_err(|e| Failure::runtime(anyhow!("cannot write the schema as JSON: {e}")))?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::runtime(anyhow!("cannot write to stdout: {e}")))?;
    Ok(Exit::Ok)
}
