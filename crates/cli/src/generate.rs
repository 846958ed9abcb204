//! `ddbpipe completions` and `ddbpipe man`: shell completions and the manual page, generated
//! from the argument definitions in `args`, so they always match the binary.

use std::io::Write;

use anyhow::anyhow;
use clap::CommandFactory;

use crate::args::{Args, Shell};
use crate::failure::{Exit, Failure};

/// Prints the completion script of `shell` on stdout.
pub fn completions(shell: Shell) -> Result<Exit, Failure> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Args::command(), "ddbpipe", &mut out);
    print(&out)
}

/// Prints the manual page (roff) on stdout.
pub fn man() -> Result<Exit, Failure> {
    let mut out = Vec::new();
    clap_mangen::Man::new(Args::command())
        .render(&mut out)
        .map_err(|e| Failure::runtime(anyhow!("cannot render the manual page: {e}")))?;
    print(&out)
}

fn print(bytes: &[u8]) -> Result<Exit, Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(|e| Failure::runtime(anyhow!("cannot write to stdout: {e}")))?;
    Ok(Exit::Ok)
}
