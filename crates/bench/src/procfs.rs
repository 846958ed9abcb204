//! CPU time and peak memory of this process, read from `/proc` (Linux only; no `libc`, since
//! unsafe code is forbidden in the workspace).
//!
//! - CPU: fields 14 (`utime`) and 15 (`stime`) of `/proc/self/stat`, in clock ticks. They
//!   count every thread of the process, live or exited. The tick rate is read once from
//!   `getconf CLK_TCK`; when that fails, 100 (the value on every mainstream Linux build) is
//!   assumed and said so in the report.
//! - Memory: `VmHWM` of `/proc/self/status`, the peak resident set size. It only ever grows,
//!   which is why each client is measured in a process of its own.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// User and system CPU time of this process so far, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    /// `utime`.
    pub user: u64,
    /// `stime`.
    pub system: u64,
}

/// Reads `utime` and `stime` of `/proc/self/stat`.
pub fn cpu_ticks() -> anyhow::Result<CpuTicks> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("cannot read /proc/self/stat")?;
    parse_stat(&stat)
}

/// `utime` and `stime` of a `/proc/<pid>/stat` line. The command name (field 2) is in
/// parentheses and may hold spaces, so fields are counted from the last `)`.
fn parse_stat(stat: &str) -> anyhow::Result<CpuTicks> {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        bail!("unexpected /proc/self/stat: {stat:?}");
    };
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> anyhow::Result<u64> {
        let text = fields
            .get(n - 3)
            .with_context(|| format!("/proc/self/stat has no field {n}"))?;
        text.parse()
            .with_context(|| format!("field {n} of /proc/self/stat is not a number: {text:?}"))
    };
    Ok(CpuTicks {
        user: field(14)?,
        system: field(15)?,
    })
}

/// Peak resident set size of this process (`VmHWM`), in KiB.
pub fn peak_rss_kib() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    parse_hwm(&status)
}

fn parse_hwm(status: &str) -> anyhow::Result<u64> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .context("/proc/self/status has no VmHWM line")?;
    let kib = line.trim().trim_end_matches("kB").trim();
    kib.parse()
        .with_context(|| format!("unexpected VmHWM value {line:?}"))
}

/// Clock ticks per second, and whether it was measured (`getconf CLK_TCK`) or assumed (100).
pub fn clock_ticks_per_second() -> (u64, bool) {
    let measured = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .filter(|output| output.status.success())
        .and_then(|output| String::from_utf8(output.stdout).ok())
        .and_then(|text| text.trim().parse::<u64>().ok())
        .filter(|ticks| *ticks > 0);
    match measured {
        Some(ticks) => (ticks, true),
        None => (100, false),
    }
}

/// CPU and wall time of one phase of this process.
#[derive(Debug)]
pub struct Meter {
    started: Instant,
    cpu: CpuTicks,
}

/// What a [`Meter`] measured.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    /// Wall-clock time of the phase.
    pub wall: Duration,
    /// User CPU ticks spent in the phase.
    pub user_ticks: u64,
    /// System CPU ticks spent in the phase.
    pub system_ticks: u64,
}

impl Meter {
    /// Starts measuring now.
    pub fn start() -> anyhow::Result<Self> {
        Ok(Meter {
            cpu: cpu_ticks()?,
            started: Instant::now(),
        })
    }

    /// Stops measuring: the wall and CPU time since [`Meter::start`].
    pub fn stop(self) -> anyhow::Result<Measured> {
        let wall = self.started.elapsed();
        let cpu = cpu_ticks()?;
        Ok(Measured {
            wall,
            user_ticks: cpu.user.saturating_sub(self.cpu.user),
            system_ticks: cpu.system.saturating_sub(self.cpu.system),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let stat = "4242 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 123 45 0 0 20 0 9 0 100 0 0";
        let ticks = parse_stat(stat).expect("parses");
        assert_eq!(
            ticks,
            CpuTicks {
                user: 123,
                system: 45
            }
        );
    }

    #[test]
    fn peak_rss_is_read_from_vmhwm() {
        let status = "Name:\tx\nVmPeak:\t  9999 kB\nVmHWM:\t   12345 kB\nVmRSS:\t 100 kB\n";
        assert_eq!(parse_hwm(status).expect("parses"), 12345);
    }

    #[test]
    fn this_process_can_be_measured() {
        cpu_ticks().expect("stat");
        assert!(peak_rss_kib().expect("status") > 0);
    }
}
