//! moto's server (`moto_server`, `moto[server]==5.2.5`; `scripts/test.sh` installs it): the
//! tests' DynamoDB, S3, Glue and S3 Tables, one process per test.

use std::process::{Child, Command, Stdio};

use crate::free_port;

/// A moto server on loopback, killed when dropped.
pub struct Moto {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    child: Child,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Moto {
    /// Starts a fresh server. The port is free when chosen, but another test's server may take
    /// it before moto binds it (moto then exits): a server that is not this moto is retried on
    /// another port.
    ///
    /// # Panics
    /// When `moto_server` does not run, or listens on none of 3 ports within 60 s each.
    pub fn start() -> Moto {
        (0..3)
            .find_map(|_| {
                let port = free_port();
                let child = Command::new("moto_server")
                    .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect(
                        "moto_server runs: install it with `pip install 'moto[server]==5.2.5'` \
                         (scripts/test.sh does)",
                    );
                let mut moto = Moto {
                    endpoint: format!("http://127.0.0.1:{port}"),
                    child,
                };
                crate::answers(&mut moto.child, port, "/moto-api/data.json").then_some(moto)
            })
            .expect("moto_server listened on none of 3 free ports within 60 s each")
    }
}
