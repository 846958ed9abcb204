//! The Debian package (issue 24 item 17; docs/cli.md §8.8). `scripts/package.sh --profile dev`
//! packages the debug binary this test build made (CI makes no release build), with cargo-deb
//! (installed once by scripts/cargo-deb.sh); the .deb is read from outside (`dpkg-deb`) and
//! installed with `dpkg -i` into a scratch root, where the installed binary, manual page,
//! completions and systemd unit are checked. The package is built once for this file's tests.

// A failed unwrap in a test helper is a failed test, with its location.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use ddbpipe_testkit::repository;
use tempfile::TempDir;

/// Every part the package must hold: its path and mode as `dpkg-deb --contents` lists them.
const PARTS: &[(&str, &str)] = &[
    ("./usr/bin/ddbpipe", "-rwxr-xr-x"),
    ("./usr/share/man/man1/ddbpipe.1.gz", "-rw-r--r--"),
    (
        "./usr/share/bash-completion/completions/ddbpipe",
        "-rw-r--r--",
    ),
    ("./usr/share/zsh/vendor-completions/_ddbpipe", "-rw-r--r--"),
    (
        "./usr/share/fish/vendor_completions.d/ddbpipe.fish",
        "-rw-r--r--",
    ),
    ("./lib/systemd/system/ddbpipe@.service", "-rw-r--r--"),
    ("./etc/default/ddbpipe", "-rw-r--r--"),
    ("./usr/share/doc/ddbpipe/copyright", "-rw-r--r--"),
    ("./usr/share/doc/ddbpipe/README.md", "-rw-r--r--"),
];

/// The completion scripts: the shell `ddbpipe completions` takes and where the package puts it.
const COMPLETIONS: &[(&str, &str)] = &[
    ("bash", "usr/share/bash-completion/completions/ddbpipe"),
    ("zsh", "usr/share/zsh/vendor-completions/_ddbpipe"),
    ("fish", "usr/share/fish/vendor_completions.d/ddbpipe.fish"),
];

const UNIT: &str = "lib/systemd/system/ddbpipe@.service";

/// How long a stopped run may drain before it exits on its own (docs/cli.md §8.5; `DRAIN_LIMIT`
/// in main.rs): the unit must wait longer before it kills.
const DRAIN_LIMIT_SECS: u64 = 60;

/// The built package, and a scratch root it is installed in.
struct Package {
    deb: PathBuf,
    root: PathBuf,
    _dir: TempDir,
}

fn package() -> &'static Package {
    static PACKAGE: OnceLock<Package> = OnceLock::new();
    PACKAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let deb = build(&dir.path().join("out"));
        let root = dir.path().join("root");
        install(&root, &deb);
        Package {
            deb,
            root,
            _dir: dir,
        }
    })
}

/// The test build's binary, and the target directory it is in (`<target>/debug/ddbpipe`).
fn target_dir() -> PathBuf {
    let binary = Path::new(env!("CARGO_BIN_EXE_ddbpipe"));
    binary.parent().unwrap().parent().unwrap().to_path_buf()
}

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot start {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// `scripts/package.sh --profile dev --output OUT`: the .deb it writes.
fn build(out: &Path) -> PathBuf {
    run(Command::new(repository().join("scripts/package.sh"))
        .args(["--profile", "dev", "--output"])
        .arg(out)
        .env("CARGO_TARGET_DIR", target_dir()));
    let debs: Vec<PathBuf> = std::fs::read_dir(out)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "one package in {}: {debs:?}", out.display());
    debs.into_iter().next().unwrap()
}

/// `dpkg` on a scratch root: its own database, no log, maintainer scripts run outside a chroot
/// with `DPKG_ROOT` set (the root holds no shell), the libraries it depends on not required.
fn dpkg(root: &Path) -> Command {
    let mut command = Command::new("dpkg");
    command.arg(format!("--root={}", root.display())).args([
        "--force-not-root",
        "--force-script-chrootless",
        "--force-depends",
        "--log=/dev/null",
    ]);
    command
}

/// An empty dpkg database in `root`, and the package installed into it with `dpkg -i`.
fn install(root: &Path, deb: &Path) {
    let admin = root.join("var/lib/dpkg");
    for dir in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(admin.join(dir)).unwrap();
    }
    for file in ["status", "available"] {
        std::fs::write(admin.join(file), "").unwrap();
    }
    run(dpkg(root).arg("--install").arg(deb));
}

/// The parts of `PARTS` a `dpkg-deb --contents` listing lacks or lists with another mode.
fn missing_parts(listing: &str) -> Vec<String> {
    PARTS
        .iter()
        .filter(|(path, mode)| {
            !listing.lines().any(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                fields.first() == Some(mode) && fields.last() == Some(path)
            })
        })
        .map(|(path, mode)| format!("{path} ({mode})"))
        .collect()
}

/// The `key=value` lines of a unit, with their section, in order.
fn unit_entries(text: &str) -> Vec<(String, String, String)> {
    let mut section = String::new();
    let mut entries = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a key=value line in the unit: {line}"));
        entries.push((section.clone(), key.to_string(), value.to_string()));
    }
    entries
}

fn values<'a>(entries: &'a [(String, String, String)], section: &str, key: &str) -> Vec<&'a str> {
    entries
        .iter()
        .filter(|(s, k, _)| s == section && k == key)
        .map(|(_, _, v)| v.as_str())
        .collect()
}

/// A systemd time span in seconds (`90`, `90s`, `2min`, `1min 30s`).
fn seconds(span: &str) -> u64 {
    span.split_whitespace()
        .map(|part| {
            let digits: String = part.chars().take_while(char::is_ascii_digit).collect();
            let number: u64 = digits
                .parse()
                .unwrap_or_else(|_| panic!("not a time span: {span}"));
            match &part[digits.len()..] {
                "" | "s" | "sec" => number,
                "m" | "min" => number * 60,
                unit => panic!("unexpected unit {unit} in {span}"),
            }
        })
        .sum()
}

#[test]
fn the_package_holds_the_binary_manual_page_completions_and_unit() {
    let deb = &package().deb;
    let listing = stdout(&run(Command::new("dpkg-deb").arg("--contents").arg(deb)));
    let missing = missing_parts(&listing);
    assert!(missing.is_empty(), "missing: {missing:?}\n{listing}");

    let field = |name: &str| {
        let output = run(Command::new("dpkg-deb").arg("--field").arg(deb).arg(name));
        stdout(&output).trim().to_string()
    };
    assert_eq!(field("Package"), "ddbpipe");
    assert_eq!(field("Version"), format!("{}-1", env!("CARGO_PKG_VERSION")));
    let architecture = stdout(&run(Command::new("dpkg").arg("--print-architecture")));
    assert_eq!(field("Architecture"), architecture.trim());
    assert!(field("Depends").contains("libc6"), "{}", field("Depends"));
    assert!(field("Maintainer").contains('<'), "{}", field("Maintainer"));
    assert!(
        field("Description").contains("DynamoDB"),
        "{}",
        field("Description")
    );

    // The control archive: /etc/default/ddbpipe is a conffile (an edited copy survives an
    // upgrade), and the maintainer scripts that reload systemd are there.
    let conffiles = run(Command::new("dpkg-deb")
        .arg("--info")
        .arg(deb)
        .arg("conffiles"));
    assert_eq!(stdout(&conffiles).trim(), "/etc/default/ddbpipe");
    let info = stdout(&run(Command::new("dpkg-deb").arg("--info").arg(deb)));
    for script in ["postinst", "prerm", "postrm"] {
        assert!(info.contains(script), "no {script}:\n{info}");
    }
}

/// The check above fails on a package without any one of its parts.
#[test]
fn a_package_without_a_part_is_caught() {
    let listing = stdout(&run(Command::new("dpkg-deb")
        .arg("--contents")
        .arg(&package().deb)));
    assert!(missing_parts(&listing).is_empty());
    for (path, _) in PARTS {
        let without: String = listing
            .lines()
            .filter(|line| !line.ends_with(path))
            .map(|line| format!("{line}\n"))
            .collect();
        assert_eq!(missing_parts(&without).len(), 1, "{path}");
    }
    let writable: String = listing
        .lines()
        .map(|line| match line.strip_prefix("-rw-r--r-- ") {
            Some(rest) => format!("-rw-rw-rw- {rest}\n"),
            None => format!("{line}\n"),
        })
        .collect();
    assert_eq!(missing_parts(&writable).len(), PARTS.len() - 1);
}

#[test]
fn the_installed_binary_manual_page_and_completions_work() {
    let root = &package().root;
    let status = run(Command::new("dpkg-query")
        .arg(format!(
            "--admindir={}",
            root.join("var/lib/dpkg").display()
        ))
        .args(["--show", "--showformat=${Status} ${Version}", "ddbpipe"]));
    assert_eq!(
        stdout(&status),
        format!("install ok installed {}-1", env!("CARGO_PKG_VERSION"))
    );

    let binary = root.join("usr/bin/ddbpipe");
    let version = run(Command::new(&binary).arg("--version"));
    assert_eq!(
        stdout(&version).trim(),
        format!("ddbpipe {}", env!("CARGO_PKG_VERSION"))
    );

    // The manual page is the binary's own, compressed, and renders.
    let compressed = std::fs::read(root.join("usr/share/man/man1/ddbpipe.1.gz")).unwrap();
    let mut page = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(compressed.as_slice()),
        &mut page,
    )
    .unwrap();
    assert_eq!(page, stdout(&run(Command::new(&binary).arg("man"))));
    assert!(page.contains(".TH ddbpipe 1"), "{page}");
    if Command::new("man").arg("--version").output().is_ok() {
        let rendered = run(Command::new("man")
            .arg("-l")
            .arg(root.join("usr/share/man/man1/ddbpipe.1.gz"))
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100"));
        let rendered = stdout(&rendered);
        assert!(
            rendered.contains("ddbpipe-run") && rendered.contains("ddbpipe-discover"),
            "{rendered}"
        );
    }

    // Each completion script is the binary's own and names its commands and options.
    for (shell, path) in COMPLETIONS {
        let script = std::fs::read_to_string(root.join(path)).unwrap();
        assert_eq!(
            script,
            stdout(&run(Command::new(&binary).args(["completions", shell]))),
            "{path}"
        );
        for word in ["run", "check", "discover", "state", "metrics-addr"] {
            assert!(script.contains(word), "{path} lacks {word}");
        }
    }
}

#[test]
fn the_unit_runs_one_pipeline_per_instance_and_stops_gracefully() {
    let root = &package().root;
    let text = std::fs::read_to_string(root.join(UNIT)).unwrap();
    let unit = unit_entries(&text);
    let one = |section: &str, key: &str| {
        let found = values(&unit, section, key);
        assert_eq!(found.len(), 1, "[{section}] {key}: {found:?}");
        found[0].to_string()
    };
    assert_eq!(
        one("Service", "ExecStart"),
        "/usr/bin/ddbpipe run /etc/ddbpipe/%i.yaml"
    );
    assert_eq!(one("Service", "Restart"), "on-failure");
    // A bad pipeline file (exit 2) fails the same way again: not restarted.
    assert_eq!(one("Service", "RestartPreventExitStatus"), "2");
    assert_eq!(one("Service", "KillSignal"), "SIGTERM");
    let stop = seconds(&one("Service", "TimeoutStopSec"));
    assert!(
        stop > DRAIN_LIMIT_SECS,
        "TimeoutStopSec={stop}s kills a drain"
    );
    // State and outputs: a per-instance state directory, also the working directory.
    assert_eq!(one("Service", "StateDirectory"), "ddbpipe/%i");
    assert_eq!(one("Service", "WorkingDirectory"), "/var/lib/ddbpipe/%i");
    assert_eq!(one("Service", "DynamicUser"), "yes");
    assert_eq!(one("Service", "ProtectSystem"), "strict");
    assert_eq!(
        values(&unit, "Service", "EnvironmentFile"),
        ["-/etc/default/ddbpipe", "-/etc/ddbpipe/%i.env"]
    );
    assert_eq!(one("Install", "WantedBy"), "multi-user.target");

    // systemd's own reading, where systemd is installed: any message (an unknown key, a value it
    // cannot parse, a missing binary or manual page) fails. The unit is verified as an instance,
    // its binary the installed one, its manual page found in the scratch root.
    let Ok(analyze) = Command::new("systemd-analyze").arg("--version").output() else {
        return;
    };
    assert!(analyze.status.success());
    let dir = tempfile::tempdir().unwrap();
    let instance = dir.path().join("ddbpipe@orders.service");
    let binary = root.join("usr/bin/ddbpipe");
    std::fs::write(
        &instance,
        text.replace("/usr/bin/ddbpipe", binary.to_str().unwrap()),
    )
    .unwrap();
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&instance)
        .env("MANPATH", root.join("usr/share/man"))
        .output()
        .unwrap();
    let messages = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && messages.trim().is_empty(),
        "systemd-analyze verify: {messages}"
    );
}

#[test]
fn removing_the_package_keeps_the_conffile_until_purged() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    install(root, &package().deb);
    assert!(root.join("usr/bin/ddbpipe").exists());
    std::fs::write(root.join("etc/default/ddbpipe"), "AWS_REGION=eu-west-1\n").unwrap();
    run(dpkg(root).args(["--remove", "ddbpipe"]));
    assert!(!root.join("usr/bin/ddbpipe").exists());
    assert!(!root.join(UNIT).exists());
    assert_eq!(
        std::fs::read_to_string(root.join("etc/default/ddbpipe")).unwrap(),
        "AWS_REGION=eu-west-1\n"
    );
    run(dpkg(root).args(["--purge", "ddbpipe"]));
    assert!(!root.join("etc/default/ddbpipe").exists());
}
