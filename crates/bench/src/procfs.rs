//! CPU time and peak memory of this process, read from `/proc` (Linux only; no `libc`, since
//! unsafe code is forbidden in the workspace).
//!
//! - CPU: fields 14 (`utime`) and 15 (`stime`) of `/proc/self/stat`, in clock ticks. They
//!   count every thread of the process, live or exited. The tick rate is read once from
//!   `getconf CLK_TCK`; when that fails, 100 (the value on every mainstream Linux build) is
//!   assumed and said so in the report.
//! - Memory: `VmHWM` of `/proc/self/status`, the peak resident set size. It only ever grows,
//!   which is why each client is measured in a process of its own.
//! - Another process and its children (a PostgreSQL server: the postmaster, its backends and
//!   background workers): the root's `utime` and `stime`, the time of the children it has
//!   reaped (fields 16 and 17, `cutime` and `cstime`), and `utime` + `stime` of every live
//!   process whose parent (field 4) it is. A child that exits between two readings moves from
//!   the live sum to the reaped one once its parent waits for it, so differences of two
//!   readings count it either way.

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

/// `utime` and `stime` of a `/proc/<pid>/stat` line.
fn parse_stat(stat: &str) -> anyhow::Result<CpuTicks> {
    let fields = Stat::parse(stat)?;
    Ok(CpuTicks {
        user: fields.user,
        system: fields.system,
    })
}

/// The fields of a `/proc/<pid>/stat` line the bench reads.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stat {
    /// Field 2, without its parentheses.
    command: String,
    /// Field 4.
    parent: u32,
    /// Fields 14 and 15.
    user: u64,
    system: u64,
    /// Fields 16 and 17: the reaped children's time.
    children_user: u64,
    children_system: u64,
}

impl Stat {
    /// The command name (field 2) is in parentheses and may hold spaces, so fields are
    /// counted from the last `)`.
    fn parse(stat: &str) -> anyhow::Result<Self> {
        let Some((head, rest)) = stat.rsplit_once(')') else {
            bail!("unexpected /proc/<pid>/stat: {stat:?}");
        };
        let command = head
            .split_once('(')
            .map_or("", |(_, name)| name)
            .to_string();
        // `rest` starts at field 3 (state).
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |n: usize| -> anyhow::Result<u64> {
            let text = fields
                .get(n - 3)
                .with_context(|| format!("/proc/<pid>/stat has no field {n}"))?;
            text.parse()
                .with_context(|| format!("field {n} of /proc/<pid>/stat is not a number: {text:?}"))
        };
        Ok(Stat {
            command,
            parent: u32::try_from(field(4)?).context("field 4 of /proc/<pid>/stat")?,
            user: field(14)?,
            system: field(15)?,
            children_user: field(16)?,
            children_system: field(17)?,
        })
    }

    /// The stat of process `pid`; `None` when there is no such process (it exited, or lives
    /// in another pid namespace).
    fn of(pid: u32) -> anyhow::Result<Option<Self>> {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(text) => Self::parse(&text).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("cannot read /proc/{pid}/stat")),
        }
    }
}

/// The parent and command name of process `pid`; `None` when this machine has no such
/// process.
pub fn parent_of(pid: u32) -> anyhow::Result<Option<(u32, String)>> {
    Ok(Stat::of(pid)?.map(|stat| (stat.parent, stat.command)))
}

/// CPU ticks of process `root` and its children so far (see the module docs); `None` when
/// `root` is not a process of this machine.
pub fn tree_ticks(root: u32) -> anyhow::Result<Option<CpuTicks>> {
    let Some(stat) = Stat::of(root)? else {
        return Ok(None);
    };
    let mut ticks = CpuTicks {
        user: stat.user + stat.children_user,
        system: stat.system + stat.children_system,
    };
    for entry in std::fs::read_dir("/proc").context("cannot list /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process may exit while the list is read: it is then in its parent's reaped time
        // (or about to be).
        let Ok(Some(child)) = Stat::of(pid) else {
            continue;
        };
        if child.parent == root && pid != root {
            ticks.user += child.user;
            ticks.system += child.system;
        }
    }
    Ok(Some(ticks))
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
    fn stat_gives_the_parent_and_the_reaped_children_s_time() {
        let stat = "4242 (post gres) S 17 2 3 4 5 6 7 8 9 10 123 45 600 70 20 0 9 0 100 0 0";
        let fields = Stat::parse(stat).expect("parses");
        assert_eq!(fields.command, "post gres");
        assert_eq!(fields.parent, 17);
        assert_eq!((fields.children_user, fields.children_system), (600, 70));
    }

    #[test]
    fn this_process_tree_can_be_measured() {
        let me = std::process::id();
        let (parent, _) = parent_of(me).expect("stat").expect("this process exists");
        assert!(parent > 0);
        assert!(tree_ticks(me).expect("stat").is_some());
        assert!(tree_ticks(u32::MAX).expect("no such process").is_none());
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
