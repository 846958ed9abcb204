//! The tests' Iceberg REST catalog (`iceberg_rest.py` beside this file): the REST catalog API
//! served over pyiceberg's own `SqlCatalog`, one process per test, on a free loopback port.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::{free_port, repository};

/// A REST catalog server, killed when dropped.
pub struct RestCatalogServer {
    /// `http://127.0.0.1:<port>`: the catalog's `uri`.
    pub uri: String,
    /// The SQLite catalog it keeps the tables in (`sqlite:////…`), for a reader that opens it
    /// directly.
    pub sqlite_uri: String,
    child: Child,
}

impl Drop for RestCatalogServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RestCatalogServer {
    /// A server keeping its catalog in `dir` (a SQLite file made there) whose tables are under
    /// `warehouse`, with `options` (`--token`, `--client`, `--prefix`, `--fail-every`…, as
    /// `iceberg_rest.py` says); its requests logged in `dir/rest.log`.
    ///
    /// # Panics
    /// When python3 or pyiceberg is missing, or it answers on none of 3 ports within 60 s.
    pub fn start(dir: &Path, warehouse: &str, options: &[&str]) -> RestCatalogServer {
        let script = repository().join("crates/testkit/src/iceberg_rest.py");
        let sqlite_uri = format!("sqlite:///{}", dir.join("rest-catalog.db").display());
        (0..3)
            .find_map(|_| {
                let port = free_port();
                let log = std::fs::File::create(dir.join("rest.log")).unwrap();
                let child = Command::new("python3")
                    .arg(&script)
                    .args(["--port", &port.to_string(), "--catalog", &sqlite_uri])
                    .args(["--warehouse", warehouse])
                    .args(options)
                    .stdout(Stdio::null())
                    .stderr(log)
                    .spawn()
                    .expect("python3 runs (scripts/test.sh installs pyiceberg)");
                let mut server = RestCatalogServer {
                    uri: format!("http://127.0.0.1:{port}"),
                    sqlite_uri: sqlite_uri.clone(),
                    child,
                };
                crate::answers(&mut server.child, port, "/health").then_some(server)
            })
            .expect("the REST catalog answered on none of 3 free ports within 60 s each")
    }
}
