//! The `ddbpipe` command line: `main` parses the arguments (no I/O), runs the command, and maps
//! its outcome to the documented exit codes: 0 success, 1 runtime failure, 2 bad config or usage.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use clap::Parser;
use ddbpipe_source::retry::{Cancel, CancelHandle};

use crate::args::{Args, Command, StateAction};
#[cfg(feature = "demo")]
use crate::demo;
use crate::failure::{Exit, Failure, report};
use crate::telemetry::{Line, say};
use crate::{check, discover, generate, init, lag, run_command, schema, state_cmd, telemetry};

/// After the first signal, the drain gets this long before the process exits anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(60);

/// The `ddbpipe` command: parses the arguments, runs the command and returns its exit code.
pub fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(error) = telemetry::init(&args.log_level, args.log_format) {
        return report(&Failure::usage(anyhow!(error)));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            return report(&Failure::runtime(anyhow!(
                "cannot start the runtime: {error}"
            )));
        }
    };
    let outcome = runtime.block_on(dispatch(args.command));
    // Pending reads and timers are abandoned; state was committed by the command.
    runtime.shutdown_timeout(Duration::from_millis(100));
    match outcome {
        Ok(exit) => exit.code(),
        Err(failure) => report(&failure),
    }
}

async fn dispatch(command: Command) -> Result<Exit, Failure> {
    match command {
        Command::Run {
            config,
            progress,
            metrics_addr,
            metrics_file,
        } => {
            let stop = signals();
            let metrics = telemetry::MetricsOutput {
                addr: metrics_addr,
                file: metrics_file,
            };
            run_command::run(&config, progress, &metrics, stop).await
        }
        Command::Check {
            config,
            json,
            timeout_secs,
        } => check::check(&config, json, Duration::from_secs(timeout_secs)).await,
        Command::Discover(args) => discover::discover(args).await,
        Command::State { action } => match action {
            StateAction::Show { config, json } => state_cmd::show(&config, json).await,
            StateAction::Reset { config, yes } => state_cmd::reset(&config, yes).await,
        },
        Command::Lag {
            config,
            json,
            max_lag_seconds,
        } => lag::lag(&config, json, max_lag_seconds).await,
        #[cfg(feature = "demo")]
        Command::Demo { dir, items, keep } => demo::demo(&dir, items, keep).await,
        Command::Init(args) => init::init(args).await,
        Command::Completions { shell } => generate::completions(shell),
        Command::Schema => schema::schema(),
        Command::Man => generate::man(),
    }
}

/// The first SIGINT, SIGTERM or SIGHUP (a closed terminal or ssh session) stops reading and
/// drains; a second one, or the drain limit, ends the process with exit 1 (committed state
/// only ever covers acknowledged batches).
fn signals() -> Cancel {
    let (handle, cancel) = Cancel::new();
    tokio::spawn(watch_signals(handle));
    cancel
}

async fn watch_signals(handle: CancelHandle) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::warn!(
            "Cannot install signal handlers; SIGINT/SIGTERM/SIGHUP will end the process at once."
        );
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
    tracing::info!("Signal received: stopping reads and draining (a second signal exits at once).");
    handle.cancel();
    let second = "error: second signal: exiting without waiting for the drain";
    tokio::select! {
        _ = int.recv() => say(Line::Error, second),
        _ = term.recv() => say(Line::Error, second),
        _ = hup.recv() => say(Line::Error, second),
        () = tokio::time::sleep(DRAIN_LIMIT) => say(Line::Error, "error: the drain took longer than 60 s: exiting"),
    }
    std::process::exit(1);
}
